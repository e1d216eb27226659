"""Synchronisation: time blocked in synchronising calls, per thread, API and stream."""

from __future__ import annotations

import polars as pl

from ..read import Capture
from .exprs import measured_sum
from .registry import Tool
from .span import duration_ns


def synchronisation(cap: Capture) -> pl.DataFrame:
    span = duration_ns(cap)
    return (
        cap.events.filter(pl.col("kind") == "sync")
        .group_by("pid", "tid", pl.col("api").cast(pl.String), "stream")
        .agg(
            pl.len().alias("calls"),
            measured_sum(pl.col("dur_ns")).alias("blocked_ns"),
            pl.col("dur_ns").max().alias("max_blocked_ns"),
            pl.col("dur_ns").mean().alias("mean_blocked_ns"),
        )
        # share of the whole capture this thread spent blocked in this call site
        .with_columns((pl.col("blocked_ns") / span if span else pl.lit(None, pl.Float64)).alias("share"))
        .sort(["blocked_ns", "pid", "tid", "api"], descending=[True, False, False, False])
        .collect(engine="streaming")
    )


TOOLS = [
    Tool(
        name="sync",
        title="Synchronisation (time blocked)",
        compute=synchronisation,
        description="calls and time blocked per process, thread, sync API and stream (null stream: context/device-wide)",
    ),
]
