"""CUDA virtual memory management (what PyTorch's expandable_segments does):
cuMemCreate returns an opaque handle, not an address; cuMemMap maps that
handle's physical memory at a reserved address range.  Physical bytes are
counted at cuMemCreate/cuMemRelease by handle; device addresses are
attributed to the cuMemMap ranges, ended by a cuMemUnmap anywhere inside
them; a handle is never read as an address."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from pasta_trace import merge
from pasta_trace.tools import REGISTRY

import merge_fixtures as fx

#: pid 10 of the merge fixtures, with a VMM segment of two 2 MiB chunks beside its allocations
VA = 0x7F0000000000  # the reserved range
H1, H2 = 0x5555AAAA0000, 0x5555AAB00000  # handles: values that would be addresses of nothing
S = 2 << 20
VMM = [
    fx.ev(101, 10, 11, "cuMemAddressReserve", "other", ptr=VA, size=4 * S, ret=0),
    fx.ev(110, 10, 11, "cuMemCreate", "alloc", ptr=H1, size=S, ret=0),
    fx.ev(120, 10, 11, "cuMemCreate", "alloc", ptr=H2, size=S, ret=0),
    fx.ev(130, 10, 11, "cuMemMap", "other", ptr=VA, size=S, src=H1, ret=0),
    fx.ev(140, 10, 11, "cuMemMap", "other", ptr=VA + S, size=S, src=H2, ret=0),
    fx.ev(145, 10, 11, "cuMemMap", "other", ptr=VA + 2 * S, size=S, src=H2, ret=1),  # failed: maps nothing
    # the second chunk unmapped by an address inside it, then released
    fx.ev(650, 10, 11, "cuMemUnmap", "other", ptr=VA + S + 0x1000, size=S - 0x1000, ret=0),
    fx.ev(660, 10, 11, "cuMemRelease", "free", ptr=H2, ret=0),
]


def _sample(launch_id: int, address: int) -> dict:
    return {"pid": 10, "launch_id": launch_id, "address": address, "gpu_time": 0, "block": 0, "warp": 0, "size": 4,
            "flags": 0, "lanes": 0x1}


def _capture(tmp: Path) -> Path:
    dev = {k: v for k, v in fx.DEVICE.items() if k != "page_hist"}  # pages folded from these samples
    dev["access_samples"] = [
        _sample(2, VA + 0x10),  # launch 2 (t=500): first chunk
        _sample(2, VA + S + 0x20),  # second chunk
        _sample(2, H1 + 0x10),  # the handle's value: no address of anything
        _sample(3, VA + S + 0x20),  # launch 3 (t=800): the second chunk was unmapped at 650
        _sample(3, VA + 0x30),  # the first is still mapped
    ]
    return fx.write(tmp / "c", events=fx.EVENTS_10 + VMM, dev=dev)


def test_physical_bytes_are_counted_by_handle(tmp_path: Path) -> None:
    cap = merge.load(_capture(tmp_path))
    allocs = merge.allocations(cap).filter(pl.col("kind").is_in(["physical", "mapping"])).collect()
    assert allocs.select("base", "size", pl.col("api").cast(pl.String), pl.col("kind").cast(pl.String),
                         "alloc_ts_ns", "free_ts_ns").rows() == [
        (H1, S, "cuMemCreate", "physical", 110, None),
        (H2, S, "cuMemCreate", "physical", 120, 660),
        (VA, S, "cuMemMap", "mapping", 130, None),
        (VA + S, S, "cuMemMap", "mapping", 140, 650),
    ]
    totals = REGISTRY["memory_totals"].compute(cap).filter(pl.col("pid") == 10)
    # cuMemAlloc_v2 A and B, cuMemAllocManaged C, and the two physical chunks: never the mappings
    assert totals.select("allocations", "allocated_bytes", "freed", "freed_bytes", "held_bytes").rows() == [
        (5, 0x20000 + 0x10000 + 0x8000 + 2 * S, 3, 0x20000 + 0x10000 + S, 0x8000 + S)]
    live = REGISTRY["memory"].compute(cap).filter(pl.col("pid") == 10)
    assert live.select("ts_ns", "api", "live_bytes").rows() == [
        (100, "cuMemAlloc_v2", 0x20000), (110, "cuMemCreate", 0x20000 + S),
        (120, "cuMemCreate", 0x20000 + 2 * S), (150, "cuMemAllocManaged", 0x30000 + 2 * S),
        (300, "cuMemAlloc_v2", 0x10000 + 2 * S), (400, "cuMemAlloc_v2", 0x18000 + 2 * S),
        (660, "cuMemCreate", 0x18000 + S), (700, "cuMemAllocManaged", 0x8000 + S)]
    leaks = REGISTRY["leaks"].compute(cap).filter(pl.col("pid") == 10)
    assert leaks.select("api", "kind", "base", "size").sort("base").rows() == [
        ("cuMemAlloc_v2", "device", 0x10000, 0x8000), ("cuMemCreate", "physical", H1, S)]


def test_device_addresses_resolve_to_the_mapping(tmp_path: Path) -> None:
    cap = merge.load(_capture(tmp_path))
    pages = merge.attributed_pages(cap).collect().sort("launch_id", "page")
    got = pages.select("launch_id", pl.col("page") * pl.lit(2, pl.UInt64).pow(pl.col("page_shift")), "alloc_base",
                       "alloc_size",
                       pl.col("alloc_api").cast(pl.String)).rows()
    assert got == [
        (2, H1, None, None, None),
        (2, VA, VA, S, "cuMemMap"),
        (2, VA + S, VA + S, S, "cuMemMap"),
        (3, VA, VA, S, "cuMemMap"),
        (3, VA + S, None, None, None),
    ]
    out = tmp_path / "tl"
    merge.write_timeline(cap, merge.timeline_output(out))
    again = merge.load(out)
    assert merge.attributed_pages(again).collect().sort("launch_id", "page").select(
        "launch_id", "alloc_base").rows() == [(lid, base) for lid, _, base, _, _ in got]
