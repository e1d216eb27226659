"""Tensor events a synthetic capture can add (pasta_trace.testing.synthetic,
Spec.tensors): what PyTorch's allocators report through libc10.so.  Per
process, CUDA tensors through reportMemoryUsageToProfiler with the caching
allocator's running totals (it held bytes from before the capture, and
reserves in 20 MiB segments that it never gives back), and CPU tensors
through ProfiledCPUMemoryReporter::New/Delete.  Three call sites: weights
made at the start and kept, activations made and freed all along, and a
cache that only grows in the second half (a leak).  Drawn from their own
random stream, so captures without them are unchanged."""

from __future__ import annotations

import numpy as np
import polars as pl

from ..probes import catalog

_NAMES = {a.symbol: a.api_name for a in catalog.for_family("c10")}
REPORT, NEW, DELETE = _NAMES[catalog.C10_REPORT], _NAMES[catalog.C10_CPU_NEW], _NAMES[catalog.C10_CPU_DELETE]
#: bytes the caching allocator held before the capture began
BEFORE_BYTES = 64 << 20
SEGMENT = 20 << 20
#: the call sites (synthetic.CALL_PATHS keys) and the share of tensors each makes
SITES = {"tensor_weights": 0.1, "tensor_activation": 0.75, "tensor_cache": 0.15}


def tensors(n: int, pids: np.ndarray, span_ns: int, t0: int, rng: np.random.Generator) -> pl.DataFrame:
    """n tensors in all: their tensor_alloc and tensor_free events, with a
    `site` column (a CALL_PATHS key) and the EVENTS_SCHEMA payload columns."""
    pid = pids[rng.integers(0, pids.size, n)]
    site = rng.choice(list(SITES), n, p=list(SITES.values()))
    cpu = (site == "tensor_activation") & (rng.random(n) < 0.3)
    alloc = np.where(site == "tensor_weights", rng.integers(0, span_ns // 20, n),
                     np.where(site == "tensor_cache", rng.integers(span_ns // 2, span_ns, n),
                              rng.integers(span_ns // 100, span_ns, n)))
    life = rng.integers(span_ns // 200, span_ns // 20, n)
    free = np.where(site == "tensor_activation", alloc + life, -1)
    free = np.where(free < span_ns, free, -1)  # past the end: still live
    size = (rng.integers(1, 2048, n) * 512).astype(np.uint64)
    ptr = np.where(cpu, 0x5500_0000_0000, 0x7E00_0000_0000) + np.arange(n) * 0x40_0000
    life_df = pl.DataFrame({
        "pid": pid, "tid": (pid + 1).astype(np.uint32), "site": site, "cpu": cpu, "ptr": ptr.astype(np.uint64),
        "size": size, "alloc": t0 + alloc, "free": pl.Series(t0 + free).replace(t0 - 1, None),
    })
    dev = pl.when(pl.col("cpu")).then(pl.lit("cpu")).otherwise(pl.lit("cuda:0"))
    allocs = life_df.select("pid", "tid", "site", "cpu", "ptr", "size", pl.col("alloc").alias("ts_ns"),
                            pl.lit("tensor_alloc").alias("kind"), pl.col("size").cast(pl.Int64).alias("delta"))
    frees = life_df.filter(pl.col("free").is_not_null()).select(
        "pid", "tid", "site", "cpu", "ptr", "size", pl.col("free").alias("ts_ns"), pl.lit("tensor_free").alias("kind"),
        -pl.col("size").cast(pl.Int64).alias("delta"))
    allocated = BEFORE_BYTES + pl.col("delta").cum_sum().over("pid", "device")
    reserved = ((allocated + SEGMENT - 1) // SEGMENT * SEGMENT).cum_max().over("pid", "device")
    report = ~pl.col("cpu")
    api = pl.when(report).then(pl.lit(REPORT)).when(pl.col("kind") == "tensor_alloc").then(pl.lit(NEW)) \
        .otherwise(pl.lit(DELETE))
    return (
        pl.concat([allocs, frees]).with_columns(dev.alias("device"))
        .sort(["pid", "device", "ts_ns"])
        .with_columns(
            api.alias("api"),
            pl.when(report).then(allocated).cast(pl.UInt64).alias("allocated_bytes"),
            pl.when(report).then(reserved).cast(pl.UInt64).alias("reserved_bytes"),
            pl.lit("framework").alias("layer"), pl.lit("worker").alias("comm"),
        )
        .drop("delta", "cpu")
    )
