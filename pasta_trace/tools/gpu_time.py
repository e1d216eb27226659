"""Launch gaps and GPU idle time, from device timing (CUPTI or device-module
launch records, already on the host clock after the merge).

Busy time is the union of kernel intervals: kernels that overlap (concurrent
streams) are not counted twice.  A gap opens when a kernel starts after every
earlier kernel in the group has ended."""

from __future__ import annotations

import polars as pl

from .. import merge
from ..read import Capture
from .registry import PID, columns, tool

_GAPS = (
    ("kernels", pl.UInt32, "count", "kernel executions with device timing"),
    ("first_ts_ns", pl.Int64, "ts", "first kernel start (host clock)"),
    ("last_ts_ns", pl.Int64, "ts", "last kernel end"),
    ("span_ns", pl.Int64, "ns", "last end minus first start"),
    ("busy_ns", pl.Int64, "ns", "union of the execution intervals"),
    ("idle_ns", pl.Int64, "ns", "the gaps between them"),
    ("idle_share", pl.Float64, "share", "idle_ns over span_ns"),
    ("max_gap_ns", pl.Int64, "ns", "the longest gap"),
    ("launch_to_start_mean_ns", pl.Float64, "ns", "host launch call to kernel start, mean"),
    ("launch_to_start_max_ns", pl.Int64, "ns", "the same, longest"),
)
LAUNCH_GAPS = columns(PID, ("stream", pl.UInt64, "handle", "the stream"), *_GAPS)
GPU_IDLE = columns(("device", pl.UInt32, "", "GPU index"),
                   ("processes", pl.UInt32, "count", "processes that ran kernels on it"), *_GAPS)


def _timed(cap: Capture) -> pl.LazyFrame:
    return merge.kernel_executions(cap).filter(
        pl.col("gpu_start_ns").is_not_null() & pl.col("gpu_end_ns").is_not_null()
    )


def _gaps(timed: pl.LazyFrame, keys: list[str]) -> pl.LazyFrame:
    """Per group: span, busy (union), idle (sum of gaps), largest gap."""
    # kernels starting together need no order among them: whichever comes first, every
    # later one of them starts before its end, so their gaps are 0 (a sort key less)
    ordered = timed.sort([*keys, "gpu_start_ns"]).with_columns(
        pl.col("gpu_end_ns").cum_max().shift(1).over(keys).alias("busy_until")
    )
    gap = (pl.col("gpu_start_ns") - pl.col("busy_until")).clip(lower_bound=0).fill_null(0)
    return ordered.with_columns(gap.alias("gap_ns")).group_by(keys).agg(
        pl.len().alias("kernels"),
        pl.col("gpu_start_ns").min().alias("first_ts_ns"),
        pl.col("gpu_end_ns").max().alias("last_ts_ns"),
        pl.col("gap_ns").sum().alias("idle_ns"),
        pl.col("gap_ns").max().alias("max_gap_ns"),
        (pl.col("gpu_start_ns") - pl.col("ts_ns")).mean().alias("launch_to_start_mean_ns"),
        (pl.col("gpu_start_ns") - pl.col("ts_ns")).max().alias("launch_to_start_max_ns"),
    ).with_columns(
        (pl.col("last_ts_ns") - pl.col("first_ts_ns")).alias("span_ns"),
    ).with_columns(
        (pl.col("span_ns") - pl.col("idle_ns")).alias("busy_ns"),
        pl.when(pl.col("span_ns") > 0).then(pl.col("idle_ns") / pl.col("span_ns")).alias("idle_share"),
    )


_COLUMNS = [
    "kernels", "first_ts_ns", "last_ts_ns", "span_ns", "busy_ns", "idle_ns", "idle_share",
    "max_gap_ns", "launch_to_start_mean_ns", "launch_to_start_max_ns",
]


@tool("launch_gaps", "Launch gaps per stream", LAUNCH_GAPS, needs_device=True,
      description="per process and stream: kernels, busy and idle time, largest gap, launch-to-start latency",
      terminal_columns=("pid", "stream", "kernels", "span_ns", "busy_ns", "idle_ns", "idle_share", "max_gap_ns",
                        "launch_to_start_mean_ns"))
def launch_gaps(cap: Capture) -> pl.DataFrame:
    """Per process and stream: gaps between consecutive kernels on that stream."""
    keys = ["pid", "stream"]
    return _gaps(_timed(cap), keys).select(*keys, *_COLUMNS).sort(keys).collect(engine="streaming")


@tool("gpu_idle", "GPU idle time", GPU_IDLE, needs_device=True,
      description="per GPU: processes, span of kernel activity, busy time (union over streams and processes), "
                  "idle time",
      terminal_columns=("device", "processes", "kernels", "span_ns", "busy_ns", "idle_ns", "idle_share", "max_gap_ns",
                        "launch_to_start_mean_ns"))
def gpu_idle(cap: Capture) -> pl.DataFrame:
    """Per GPU, all processes and streams on it together: how much of the span
    of kernel activity the GPU did no work."""
    timed = _timed(cap)
    procs = timed.group_by("device").agg(pl.col("pid").n_unique().alias("processes"))
    return (
        _gaps(timed, ["device"]).join(procs, on="device")
        .select("device", "processes", *_COLUMNS).sort("device").collect(engine="streaming")
    )
