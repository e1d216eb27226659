"""Leak candidates: allocations never freed before the capture ended."""

from __future__ import annotations

import polars as pl

from .. import merge
from ..read import Capture
from .registry import Tool
from .span import bounds


def leak_candidates(cap: Capture) -> pl.DataFrame:
    _, end = bounds(cap)
    return (
        merge.allocations(cap)
        .filter(pl.col("free_ts_ns").is_null())
        .select(
            "pid", "tid", pl.col("api").cast(pl.String), pl.col("kind").cast(pl.String), "base", "size", pl.col("alloc_ts_ns"),
            (pl.lit(end, pl.Int64) - pl.col("alloc_ts_ns")).alias("age_ns"),
        )
        .sort(["size", "alloc_ts_ns", "pid", "base"], descending=[True, False, False, False])
        .collect(engine="streaming")
    )


TOOLS = [
    Tool(
        name="leaks",
        title="Leak candidates (never freed)",
        compute=leak_candidates,
        description="allocations with no free before the capture ended, largest first, with age at capture end",
    ),
]
