"""Leak candidates: allocations never freed before the capture ended, each
with the Python line (call site) that made it, and their sum per line."""

from __future__ import annotations

import polars as pl

from ..read import Capture
from .registry import PID, TID, columns, tool
from .sites import NO_STACK, allocation_sites
from .span import bounds

_SITE_DOC = "the Python line that allocated"
LEAKS = columns(
    PID, TID, ("api", pl.String, "", "allocation API"),
    ("kind", pl.String, "", "device, managed, host (pinned), async, virtual or physical (VMM)"),
    ("base", pl.UInt64, "handle", "the address; of VMM physical memory, its handle"),
    ("size", pl.UInt64, "bytes", "its bytes"),
    ("alloc_ts_ns", pl.Int64, "ts", "when it was allocated"),
    ("age_ns", pl.Int64, "ns", "capture end minus allocation time"),
    ("call_site", pl.String, "", f"{_SITE_DOC}; null: no stack"),
)
LEAK_SITES = columns(
    PID, ("call_site", pl.String, "", f"{_SITE_DOC}; (no stack): none"),
    ("leaked_bytes", pl.UInt64, "bytes", "bytes of its allocations never freed"),
    ("allocations", pl.UInt32, "count", "those allocations"),
)


def _never_freed(cap: Capture) -> pl.LazyFrame:
    return allocation_sites(cap, device_only=False).filter(pl.col("free_ts_ns").is_null())


@tool("leaks", "Leak candidates (never freed)", LEAKS,
      description="allocations with no free before the capture ended, largest first, with age at capture end")
def leak_candidates(cap: Capture) -> pl.DataFrame:
    """Allocations with no free before the capture ended, largest first."""
    _, end = bounds(cap)
    return (
        _never_freed(cap)
        .select(
            "pid", "tid", pl.col("api").cast(pl.String), pl.col("kind").cast(pl.String), "base", "size", pl.col("alloc_ts_ns"),
            (pl.lit(end, pl.Int64) - pl.col("alloc_ts_ns")).alias("age_ns"), "call_site",
        )
        .sort(["size", "alloc_ts_ns", "pid", "base"], descending=[True, False, False, False])
        .collect(engine="streaming")
    )


@tool("leak_call_sites", "Leaks by call site", LEAK_SITES,
      description="allocations never freed before the capture ended, by the Python line that made them")
def leaks_by_call_site(cap: Capture) -> pl.DataFrame:
    """The leak candidates summed per Python line, most bytes first."""
    return (
        _never_freed(cap).with_columns(pl.col("call_site").fill_null(NO_STACK))
        .group_by("pid", "call_site")
        .agg(pl.col("size").sum().alias("leaked_bytes"), pl.len().alias("allocations"))
        .sort(["leaked_bytes", "pid", "call_site"], descending=[True, False, False])
        .collect(engine="streaming")
    )
