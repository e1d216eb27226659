"""Synchronisation: time blocked in synchronising calls, per thread, API and
stream, and per Python line (call site)."""

from __future__ import annotations

import polars as pl

from ..read import Capture
from .common import duration_ns, measured_sum
from .registry import PID, TID, TOP_CALL_SITE, columns, tool
from .sites import NO_STACK, with_site, with_top_site

_MEASURES = (
    ("calls", pl.UInt32, "count", "sync calls"),
    ("blocked_ns", pl.Int64, "ns", "time blocked in them (null: no duration measured)"),
    ("max_blocked_ns", pl.Int64, "ns", "the longest one"),
    ("mean_blocked_ns", pl.Float64, "ns", "their mean"),
    ("share", pl.Float64, "share", "blocked_ns over the capture's duration"),
)
SYNC = columns(
    PID, TID, ("api", pl.String, "", "the sync API"),
    ("stream", pl.UInt64, "handle", "the stream waited for; null: context- or device-wide"),
    *_MEASURES, TOP_CALL_SITE,
)
SYNC_SITES = columns(PID, ("call_site", pl.String, "", "the Python line (file:line function); (no stack): none"),
                     ("api", pl.String, "", "the sync API"), *_MEASURES)


def _syncs(cap: Capture, no_stack: str | None) -> pl.LazyFrame:
    return with_site(cap.events.filter(pl.col("kind") == "sync"), cap, no_stack).with_columns(
        pl.col("api").cast(pl.String))


def _summary(syncs: pl.LazyFrame, keys: list[str], span: int) -> pl.LazyFrame:
    return (
        syncs.group_by(keys)
        .agg(
            pl.len().alias("calls"),
            measured_sum(pl.col("dur_ns")).alias("blocked_ns"),
            pl.col("dur_ns").max().alias("max_blocked_ns"),
            pl.col("dur_ns").mean().alias("mean_blocked_ns"),
        )
        # share of the whole capture spent blocked in this row
        .with_columns((pl.col("blocked_ns") / span if span else pl.lit(None, pl.Float64)).alias("share"))
    )


@tool("sync", "Synchronisation (time blocked)", SYNC,
      description="calls and time blocked per process, thread, sync API and stream (null stream: context/device-wide)")
def synchronisation(cap: Capture) -> pl.DataFrame:
    """Per process, thread, sync API and stream, most time blocked first."""
    keys = ["pid", "tid", "api", "stream"]
    syncs = _syncs(cap, None)
    return (
        with_top_site(_summary(syncs, keys, duration_ns(cap)), syncs, keys,
                      measured_sum(pl.col("dur_ns")), pl.len())
        .sort(["blocked_ns", "pid", "tid", "api"], descending=[True, False, False, False])
        .collect(engine="streaming")
    )


@tool("sync_call_sites", "Time blocked by call site", SYNC_SITES,
      description="calls and time blocked per Python line and sync API")
def sync_by_call_site(cap: Capture) -> pl.DataFrame:
    """Time blocked per Python line and sync API, most first; the calls
    without a stack together under (no stack)."""
    keys = ["pid", "call_site", "api"]
    return (
        _summary(_syncs(cap, NO_STACK), keys, duration_ns(cap))
        .sort(["blocked_ns", "calls", "pid", "call_site", "api"], descending=[True, True, False, False, False],
              nulls_last=True)
        .collect(engine="streaming")
    )
