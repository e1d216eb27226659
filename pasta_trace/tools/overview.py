"""Multi-process and multi-GPU overview: one row per traced process, for
system-wide captures where several programs share the machine's GPUs."""

from __future__ import annotations

import polars as pl

from .. import merge
from ..read import Capture
from .memory import memory_peaks
from .exprs import measured_sum
from .registry import Tool


def _devices(cap: Capture) -> pl.LazyFrame:
    """GPUs each process used, as the device data saw them (none without it)."""
    seen = [
        cap.device[name].select("pid", pl.col("device").cast(pl.UInt32))
        for name in ("launches", "cupti_kernels")
    ]
    return pl.concat(seen).group_by("pid").agg(
        pl.col("device").n_unique().alias("gpus"),
        pl.col("device").unique().sort().cast(pl.String).str.join(",").alias("gpu_ids"),
    )


def overview(cap: Capture) -> pl.DataFrame:
    ev = cap.events
    per_pid = ev.group_by("pid").agg(
        pl.len().alias("api_calls"),
        pl.col("ts_ns").min().alias("first_ts_ns"),
        (pl.col("ts_ns") + pl.col("dur_ns").fill_null(0)).max().alias("last_ts_ns"),
        pl.col("tid").n_unique().alias("threads"),
        (pl.col("kind") == "launch").sum().alias("launches"),
        pl.col("size").filter(pl.col("kind") == "memcpy").sum().alias("copy_bytes"),
        # no sync call blocked 0 ns; sync calls without measured durations: unknown
        pl.when((pl.col("kind") == "sync").sum() == 0).then(pl.lit(0, pl.Int64))
        .otherwise(measured_sum(pl.col("dur_ns").filter(pl.col("kind") == "sync"))).alias("sync_ns"),
    )
    allocated = (
        merge.allocations(cap).filter(pl.col("kind") != "host")
        .group_by("pid").agg(pl.col("size").sum().alias("device_alloc_bytes"))
    )
    kernels = merge.kernel_executions(cap).group_by("pid").agg(pl.col("name").n_unique().alias("kernels"))
    peaks = (
        memory_peaks(cap).lazy().filter(pl.col("api") == "all")
        .group_by("pid").agg(pl.col("peak_bytes").max().alias("peak_live_bytes"))
    )
    procs = cap.processes.select("pid", "comm", "cmdline", "container_id").unique("pid", keep="first")
    return (
        per_pid.join(procs, on="pid", how="left")
        .join(kernels, on="pid", how="left")
        .join(allocated, on="pid", how="left")
        .join(peaks, on="pid", how="left")
        .join(_devices(cap), on="pid", how="left")
        .select(
            "pid", "comm", "cmdline", "container_id", "threads", "api_calls", "launches",
            pl.col("kernels").fill_null(0), pl.col("device_alloc_bytes").fill_null(0), pl.col("peak_live_bytes").fill_null(0),
            "copy_bytes", "sync_ns", "gpus", "gpu_ids", "first_ts_ns", "last_ts_ns",
        )
        .sort("pid")
        .collect(engine="streaming")
    )


TOOLS = [
    Tool(
        name="processes",
        title="Processes and GPUs",
        compute=overview,
        description="per process: command, threads, API calls, launches, kernels, device memory, copies, syncs, GPUs used",
        terminal_columns=(
            "pid", "comm", "api_calls", "launches", "kernels", "device_alloc_bytes", "peak_live_bytes", "copy_bytes",
            "sync_ns", "gpus",
        ),
    ),
]
