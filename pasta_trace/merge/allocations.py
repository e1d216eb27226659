"""Allocation instances: each alloc paired with the free that ended it.

The same address comes back again and again (caching allocators, pools), so an
allocation is an *instance*: (pid, base) plus its lifetime.  The pairing is a
forward as-of join alloc -> first free of that (pid, base) at or after it,
bounded by the next alloc of the same (pid, base): a free after that belongs
to the next instance (the first one's free was missed).
"""

from __future__ import annotations

import polars as pl

from .. import schema
from ..read import Capture

_SCHEMA = schema.TIMELINE_FRAMES["allocations"]

#: device ALLOC record `kind` -> allocations.kind
_DEVICE_KIND = {0: "device", 1: "managed", 2: "host", 3: "async", 4: "virtual"}


def _kind_from_api(api: pl.Expr) -> pl.Expr:
    a = api.cast(pl.String)
    return (
        pl.when(a.str.contains("Managed")).then(pl.lit("managed"))
        .when(a.str.contains("Async|FromPool")).then(pl.lit("async"))
        .when(a.str.contains("Host|hipHostMalloc")).then(pl.lit("host"))
        .when(a.str.contains("MemCreate|MemMap|AddressReserve")).then(pl.lit("virtual"))
        .when(a.str.contains("Malloc|MemAlloc|Alloc")).then(pl.lit("device"))
        .otherwise(pl.lit("other"))
        .cast(pl.Enum(schema.ALLOC_KIND_NAMES))
    )


def _ok(ev: pl.LazyFrame) -> pl.LazyFrame:
    # a failed call (ret != 0, when the return code was read) allocated or freed nothing
    return ev.filter(pl.col("ret").is_null() | (pl.col("ret") == 0))


def _host_allocs(cap: Capture) -> tuple[pl.LazyFrame, pl.LazyFrame]:
    ev = _ok(cap.events)
    allocs = ev.filter(
        (pl.col("kind") == "alloc") & pl.col("ptr").is_not_null() & (pl.col("ptr") != 0)
    ).select(
        "pid", "tid", pl.col("ptr").alias("base"), pl.col("size").fill_null(0), "api",
        _kind_from_api(pl.col("api")).alias("kind"), pl.col("ts_ns").alias("alloc_ts_ns"),
    )
    frees = ev.filter(pl.col("kind") == "free").select(
        "pid", pl.col("ptr").alias("base"), pl.col("ts_ns").alias("free_ts_ns"),
        pl.col("api").alias("free_api"),
    )
    return allocs, frees


def _device_allocs(cap: Capture, host_pids: pl.LazyFrame) -> tuple[pl.LazyFrame, pl.LazyFrame]:
    """Device-module ALLOC/FREE records, for processes the host probes did not see allocate."""
    kind = pl.col("kind").replace_strict(_DEVICE_KIND, default="other", return_dtype=pl.String)
    allocs = cap.device["allocs"].join(host_pids, on="pid", how="anti").select(
        "pid", pl.lit(None, pl.UInt32).alias("tid"), pl.col("address").alias("base"), "size",
        pl.format("device:{}", kind).cast(pl.Categorical).alias("api"),
        kind.cast(pl.Enum(schema.ALLOC_KIND_NAMES)).alias("kind"),
        pl.col("host_mono").cast(pl.Int64).alias("alloc_ts_ns"),
    )
    frees = cap.device["frees"].join(host_pids, on="pid", how="anti").select(
        "pid", pl.col("address").alias("base"), pl.col("host_mono").cast(pl.Int64).alias("free_ts_ns"),
        pl.lit("device:free").cast(pl.Categorical).alias("free_api"),
    )
    return allocs, frees


def allocations(cap: Capture) -> pl.LazyFrame:
    """One row per allocation instance (schema.TIMELINE_FRAMES["allocations"])."""
    merged = cap.merged.get("allocations")
    if merged is not None:
        return merged
    h_allocs, h_frees = _host_allocs(cap)
    d_allocs, d_frees = _device_allocs(cap, h_allocs.select("pid").unique())
    cast = {k: v for k, v in _SCHEMA.items() if k not in ("alloc_id", "free_ts_ns", "free_api")}
    allocs = pl.concat([h_allocs.cast(cast), d_allocs.cast(cast)], how="vertical")
    frees = pl.concat(
        [h_frees.cast({"pid": pl.UInt32, "base": pl.UInt64, "free_api": pl.Categorical}),
         d_frees.cast({"pid": pl.UInt32, "base": pl.UInt64, "free_api": pl.Categorical})],
        how="vertical",
    )
    # join_asof(by=...) does not check sortedness: sort both sides explicitly
    allocs = allocs.sort(["pid", "base", "alloc_ts_ns"]).with_columns(
        pl.col("alloc_ts_ns").shift(-1).over(["pid", "base"]).alias("_next_alloc")
    )
    frees = frees.sort(["pid", "base", "free_ts_ns"])
    paired = allocs.join_asof(
        frees, left_on="alloc_ts_ns", right_on="free_ts_ns", by=["pid", "base"], strategy="forward",
        check_sortedness=False,
    )
    late = pl.col("_next_alloc").is_not_null() & (pl.col("free_ts_ns") > pl.col("_next_alloc"))
    return (
        paired.with_columns(
            pl.when(late).then(None).otherwise(pl.col("free_ts_ns")).alias("free_ts_ns"),
            pl.when(late).then(None).otherwise(pl.col("free_api")).alias("free_api"),
        )
        .sort(["alloc_ts_ns", "pid", "base"])
        .with_row_index("alloc_id")
        .select([pl.col(k).cast(v) for k, v in _SCHEMA.items()])
    )
