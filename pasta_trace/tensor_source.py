"""Tensor events from one source per process and device, and the tensors
they make: read by the tools (tools.tensors) and by the record summary
(capture.session.summary), so that both count the same tensors.

The CUDA and ROCm caching allocators report every block to
reportMemoryUsageToProfiler; CPU tensors go through
ProfiledCPUMemoryReporter::New/Delete, which also call
reportMemoryUsageToProfiler while a PyTorch profiler records memory.  So a
"cpu" device is read from New/Delete when the capture has them, any other
from reportMemoryUsageToProfiler, and a tensor is never counted twice."""

from __future__ import annotations

import polars as pl

from . import lifetimes
from .probes import catalog

_NAMES = {a.symbol: a.api_name for a in catalog.for_family("c10")}
REPORT_API = _NAMES[catalog.C10_REPORT]
CPU_APIS = (_NAMES[catalog.C10_CPU_NEW], _NAMES[catalog.C10_CPU_DELETE])
TENSOR_KINDS = ("tensor_alloc", "tensor_free")


def tensor_events(events: pl.LazyFrame) -> pl.LazyFrame:
    """The tensor events of ``events`` (schema.EVENTS_SCHEMA), one source per
    (pid, device): pid, tid, ts_ns, api, kind, ptr, size, device,
    allocated_bytes, reserved_bytes, stack_id, at_exit (made while the
    interpreter was finalizing; false where not seen); api, kind and device
    as strings."""
    api, device = pl.col("api"), pl.col("device")
    rank = (
        pl.when(device == "cpu").then(pl.when(api.is_in(CPU_APIS)).then(0).when(api == REPORT_API).then(1).otherwise(2))
        .otherwise(pl.when(api == REPORT_API).then(0).otherwise(1))
    )
    return (
        events.filter(pl.col("kind").is_in(TENSOR_KINDS) & device.is_not_null())  # on the Enum: no text per event
        .select("pid", "tid", "ts_ns", pl.col("api").cast(pl.String), pl.col("kind").cast(pl.String), "ptr", "size",
                pl.col("device").cast(pl.String), "allocated_bytes", "reserved_bytes", "stack_id",
                pl.col("at_exit").fill_null(False))
        .with_columns(rank.alias("_rank"))
        .filter(pl.col("_rank") == pl.col("_rank").min().over("pid", "device"))
        .drop("_rank")
    )


def tensor_lifetimes(ev: pl.LazyFrame) -> pl.LazyFrame:
    """One row per tensor allocated in ``ev`` (`tensor_events`): pid, tid,
    device, base, size, api, alloc_ts_ns, stack_id, free_ts_ns and free_api
    (null: not freed by the end), freed_at_exit (freed while the interpreter
    was finalizing: CPython frees what a program leaves).  An address handed
    out again is a new tensor."""
    allocs = ev.filter((pl.col("kind") == "tensor_alloc") & pl.col("ptr").is_not_null()).select(
        "pid", "tid", "device", pl.col("ptr").alias("base"), pl.col("size").fill_null(0), "api",
        pl.col("ts_ns").alias("alloc_ts_ns"), "stack_id")
    frees = ev.filter(pl.col("kind") == "tensor_free").select(
        "pid", "device", pl.col("ptr").alias("base"), pl.col("ts_ns").alias("free_ts_ns"), pl.col("api").alias("free_api"))
    exits = ev.filter((pl.col("kind") == "tensor_free") & pl.col("at_exit")).select(
        "pid", "device", pl.col("ptr").alias("base"), pl.col("ts_ns").alias("free_ts_ns"),
        pl.lit(True).alias("freed_at_exit")).unique(["pid", "device", "base", "free_ts_ns"])
    return (lifetimes.pair(allocs, frees, by=("pid", "device", "base"))
            .join(exits, on=["pid", "device", "base", "free_ts_ns"], how="left")
            .with_columns(pl.col("freed_at_exit").fill_null(False)))


def left_at_exit() -> pl.Expr:
    """A tensor_lifetimes row that was never freed, or only by the
    interpreter's finalization: what the program itself left."""
    return pl.col("free_ts_ns").is_null() | pl.col("freed_at_exit")


def device_totals(events: pl.LazyFrame) -> pl.DataFrame:
    """Per device, all processes together: tensors (allocated during the
    capture), allocated_bytes, peak_bytes (the most held at once, summed over
    processes at each one's own peak), end_bytes (held at the last event),
    left (tensors never freed or freed only at exit), left_bytes, at_exit
    (freed only at exit), at_exit_bytes.  Held bytes are the allocator's own
    total where it gives one, else the tensors seen allocated and not freed."""
    ev = tensor_events(events)
    life = tensor_lifetimes(ev)
    size = pl.col("size").cast(pl.Int64)
    steps = pl.concat([
        life.select("pid", "device", pl.col("alloc_ts_ns").alias("ts_ns"), size.alias("d")),
        life.filter(pl.col("free_ts_ns").is_not_null()).select("pid", "device", pl.col("free_ts_ns").alias("ts_ns"),
                                                               (-size).alias("d")),
    ]).sort("pid", "device", "ts_ns", "d").with_columns(pl.col("d").cum_sum().over("pid", "device").alias("live"))
    reported = ev.group_by("pid", "device").agg(
        pl.col("allocated_bytes").cast(pl.Int64).max().alias("_rmax"),
        pl.col("allocated_bytes").cast(pl.Int64).sort_by("ts_ns").drop_nulls().last().alias("_rend"))
    per_pid = steps.group_by("pid", "device").agg(pl.col("live").max().alias("_lmax"), pl.col("live").last().alias("_lend"))
    held = per_pid.join(reported, on=["pid", "device"], how="full", coalesce=True).select(
        "device", pl.coalesce("_rmax", "_lmax", pl.lit(0)).alias("peak_bytes"),
        pl.coalesce("_rend", "_lend", pl.lit(0)).alias("end_bytes"))
    counts = life.group_by("device").agg(
        pl.len().alias("tensors"), size.sum().alias("allocated_bytes"),
        left_at_exit().sum().alias("left"), size.filter(left_at_exit()).sum().alias("left_bytes"),
        pl.col("freed_at_exit").sum().alias("at_exit"), size.filter(pl.col("freed_at_exit")).sum().alias("at_exit_bytes"))
    return (counts.join(held.group_by("device").agg(pl.col("peak_bytes").sum(), pl.col("end_bytes").sum()),
                        on="device", how="full", coalesce=True)
            .fill_null(0).sort("device").collect())
