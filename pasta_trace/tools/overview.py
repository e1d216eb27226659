"""What ran and what failed.  The multi-process and multi-GPU overview: one
row per traced process, for system-wide captures where several programs
share the machine's GPUs.  API errors: the calls that returned an error
code, by process, API and code, with the code's name from the vendor
headers."""

from __future__ import annotations

import polars as pl

from .. import lifetimes, merge
from ..call_result import api_errors as _api_errors, done, failed
from ..read import Capture
from .common import capture_calls, is_aggregate, measured_sum
from .memory import peak_rows
from .registry import PID, columns, tool

PROCESSES = columns(
    PID, ("comm", pl.String, "", "command name"), ("cmdline", pl.String, "", "command line"),
    ("container_id", pl.String, "", "container (64-hex id from its cgroup); null outside containers"),
    ("threads", pl.UInt32, "count", "threads that made a traced call (null: --aggregate)"),
    ("api_calls", pl.UInt64, "count", "traced API calls"),
    ("failed_calls", pl.UInt64, "count", "those that returned an error"),
    ("launches", pl.UInt64, "count", "kernel launches that did not fail (a failed one is in failed_calls)"),
    ("kernels", pl.UInt32, "count", "distinct kernel names launched"),
    ("device_alloc_bytes", pl.UInt64, "bytes", "device memory allocated, pinned host memory apart (memory_totals)"),
    ("peak_live_bytes", pl.Int64, "bytes", "peak of live device bytes (memory_peaks; null: --aggregate)"),
    ("copy_bytes", pl.UInt64, "bytes", "bytes copied, every direction"),
    ("sync_ns", pl.Int64, "ns", "time blocked in syncs (0: no sync call; null: none measured, or --aggregate)"),
    ("gpus", pl.UInt32, "count", "GPUs the process used, as the device data saw them (null: no device data)"),
    ("gpu_ids", pl.String, "", "their ids, comma-separated"),
    ("first_ts_ns", pl.Int64, "ts", "first call"),
    ("last_ts_ns", pl.Int64, "ts", "end of the last call"),
)


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


def _from_events(cap: Capture) -> tuple[pl.LazyFrame, pl.LazyFrame, pl.LazyFrame]:
    """(per-process call facts, kernels, device memory) from the events."""
    per_pid = cap.events.group_by("pid").agg(
        pl.len().alias("api_calls"),
        failed().sum().alias("failed_calls"),
        pl.col("ts_ns").min().alias("first_ts_ns"),
        (pl.col("ts_ns") + pl.col("dur_ns").fill_null(0)).max().alias("last_ts_ns"),
        pl.col("tid").n_unique().alias("threads"),
        ((pl.col("kind") == "launch") & done()).sum().alias("launches"),
        pl.col("size").filter((pl.col("kind") == "memcpy") & done()).sum().alias("copy_bytes"),
        # no sync call blocked 0 ns; sync calls without measured durations: unknown
        pl.when((pl.col("kind") == "sync").sum() == 0).then(pl.lit(0, pl.Int64))
        .otherwise(measured_sum(pl.col("dur_ns").filter(pl.col("kind") == "sync"))).alias("sync_ns"),
    )
    allocated = (
        lifetimes.totals(merge.allocations(cap)).filter(pl.col("memory") == "device")
        .select("pid", pl.col("allocated_bytes").alias("device_alloc_bytes"))
    )
    kernels = merge.kernel_executions(cap).group_by("pid").agg(pl.col("name").n_unique().alias("kernels"))
    peaks = (
        peak_rows(cap).lazy().filter(pl.col("api") == "all")
        .group_by("pid").agg(pl.col("peak_bytes").max().alias("peak_live_bytes"))
    )
    memory = allocated.join(peaks, on="pid", how="full", coalesce=True).with_columns(
        pl.col("device_alloc_bytes", "peak_live_bytes").fill_null(0))
    return per_pid, kernels, memory


def _from_aggregate(cap: Capture) -> tuple[pl.LazyFrame, pl.LazyFrame, pl.LazyFrame]:
    """The same from an --aggregate capture's counts: no threads, no
    durations, no live-memory curve (those columns are null)."""
    per_pid = capture_calls(cap).group_by("pid").agg(
        pl.col("count").sum().alias("api_calls"),
        pl.col("count").filter(failed()).sum().alias("failed_calls"),
        pl.col("first_ts_ns").min(),
        pl.col("last_ts_ns").max(),
        pl.lit(None, pl.UInt32).alias("threads"),
        pl.col("count").filter((pl.col("kind") == "launch") & done()).sum().alias("launches"),
        pl.col("bytes").filter((pl.col("kind") == "memcpy") & done()).sum().alias("copy_bytes"),
        pl.lit(None, pl.Int64).alias("sync_ns"),
    )
    kernels = merge.aggregate_launches(cap).group_by("pid").agg(pl.col("name").n_unique().alias("kernels"))
    memory = (
        lifetimes.aggregate_totals(cap.aggregate).filter(pl.col("memory") == "device")
        .select("pid", pl.col("allocated_bytes").fill_null(0).alias("device_alloc_bytes"),
                pl.lit(None, pl.Int64).alias("peak_live_bytes"))
    )
    return per_pid, kernels, memory


@tool("processes", "Processes and GPUs", PROCESSES, reads_aggregate=True,
      description="per process: command, threads, API calls, launches, kernels, device memory, copies, syncs, "
                  "GPUs used",
      terminal_columns=("pid", "comm", "api_calls", "failed_calls", "launches", "kernels", "device_alloc_bytes",
                        "peak_live_bytes", "copy_bytes", "sync_ns", "gpus"))
def overview(cap: Capture) -> pl.DataFrame:
    """One row per traced process.  From an --aggregate capture, the kernel's
    counts and byte sums; threads, sync_ns and peak_live_bytes are null there."""
    per_pid, kernels, memory = (_from_aggregate if is_aggregate(cap) else _from_events)(cap)
    procs = cap.processes.select("pid", "comm", "cmdline", "container_id").unique("pid", keep="first")
    return (
        per_pid.join(procs, on="pid", how="left")
        .join(kernels, on="pid", how="left")
        .join(memory, on="pid", how="left")
        .join(_devices(cap), on="pid", how="left")
        .select(
            "pid", "comm", "cmdline", "container_id", "threads",
            # an --aggregate capture counts beyond 2**32: one type for both
            *(pl.col(c).cast(pl.UInt64) for c in ("api_calls", "failed_calls", "launches")),
            pl.col("kernels").fill_null(0), pl.col("device_alloc_bytes").fill_null(0), "peak_live_bytes",
            "copy_bytes", "sync_ns", "gpus", "gpu_ids", "first_ts_ns", "last_ts_ns",
        )
        .sort("pid")
        .collect(engine="streaming")
    )


API_ERRORS = columns(
    PID, ("api", pl.String, "", "the API"),
    ("error", pl.String, "", "the code's name from the vendor headers, e.g. CUDA_ERROR_NOT_INITIALIZED"),
    ("ret", pl.Int32, "", "the return code"),
    ("failed", pl.UInt64, "count", "calls of api that returned it"),
    ("calls", pl.UInt64, "count", "every call of api by the process"),
    ("first_ts_ns", pl.Int64, "ts", "first such failure (--aggregate: of the counted group)"),
    ("last_ts_ns", pl.Int64, "ts", "last such failure"),
)


@tool("api_errors", "API errors (failed calls)", API_ERRORS, reads_aggregate=True,
      description="calls that returned an error, per process, API and return code, out of all calls of that API",
      terminal_columns=("pid", "api", "error", "failed", "calls", "first_ts_ns", "last_ts_ns"))
def api_errors(cap: Capture) -> pl.DataFrame:
    """The calls that returned an error, per process, API and code: every
    call whose return code the probes read (all but the events of a capture
    made before launches, copies, memsets and frees had return probes)."""
    return _api_errors(capture_calls(cap)).collect(engine="streaming")
