"""Allocation instances: each alloc paired with the free that ended it
(pasta_trace.lifetimes), from the host's calls and, for processes the host
probes did not see allocate, from the device module's ALLOC/FREE records.
"""

from __future__ import annotations

import polars as pl

from .. import schema
from ..lifetimes import RELEASE_APIS, has_address, host_allocs, host_frees, host_mappings, in_address_space, pair
from ..read import Capture

_SCHEMA = schema.TIMELINE_FRAMES["allocations"]

#: device ALLOC record `kind` -> allocations.kind
_DEVICE_KIND = {int(k): k.name.rstrip("_") for k in schema.DeviceAllocKind}


def _device_allocs(cap: Capture, host_pids: pl.LazyFrame) -> tuple[pl.LazyFrame, pl.LazyFrame]:
    """Device-module ALLOC/FREE records, for processes the host probes did not see allocate."""
    kind = pl.col("kind").replace_strict(_DEVICE_KIND, default="other", return_dtype=pl.String)
    allocs = cap.device["allocs"].join(host_pids, on="pid", how="anti").filter(
        in_address_space(pl.col("address"), pl.col("size").fill_null(0))).select(
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
    h_allocs, h_frees = host_allocs(cap.events), host_frees(cap.events)
    d_allocs, d_frees = _device_allocs(cap, h_allocs.select("pid").unique())
    maps, unmaps = host_mappings(cap.events)
    cast = {k: v for k, v in _SCHEMA.items() if k not in ("alloc_id", "free_ts_ns", "free_api")}
    free_cast = {"pid": pl.UInt32, "base": pl.UInt64, "free_api": pl.Categorical}
    allocs = pl.concat([h_allocs.cast(cast), d_allocs.cast(cast)], how="vertical")
    frees = pl.concat([h_frees.cast(free_cast), d_frees.cast(free_cast)], how="vertical")
    # three spaces of `base`, each paired apart: VMM handles (released by handle), address ranges
    # mapped to them (ended by an unmap inside them), and the addresses of every other allocation
    handle = ~has_address()
    release = pl.col("free_api").cast(pl.String).is_in(RELEASE_APIS)
    return (
        pl.concat([
            pair(allocs.filter(handle), frees.filter(release)),
            pair(allocs.filter(~handle), frees.filter(~release)),
            pair(maps.cast(cast), unmaps.cast(free_cast)),
        ], how="vertical_relaxed")
        .sort(["alloc_ts_ns", "pid", "base"])
        .with_row_index("alloc_id")
        .select([pl.col(k).cast(v) for k, v in _SCHEMA.items()])
    )
