"""Polars expressions the tools share."""

from __future__ import annotations

import polars as pl


def measured_sum(e: pl.Expr) -> pl.Expr:
    """Sum of the non-null values; null when none was measured.  Entry-only
    probes leave `dur_ns` null and some device sources leave `bytes` null:
    "not measured" must not read as "zero"."""
    return pl.when(e.count() > 0).then(e.sum())
