"""The calls of a capture, read the same from its events and from an
--aggregate capture's in-kernel counts (which has no events)."""

from __future__ import annotations

import polars as pl

from ..call_result import calls
from ..read import Capture


def is_aggregate(cap: Capture) -> bool:
    return cap.aggregate is not None


def capture_calls(cap: Capture) -> pl.LazyFrame:
    """call_result.CALLS_SCHEMA rows: sum `count` to count calls."""
    return calls(cap.aggregate if cap.aggregate is not None else cap.events)
