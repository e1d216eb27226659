"""Allocation instances from the host's alloc and free calls, and the byte
totals they add up to.

The same address comes back again and again (caching allocators, pools), so an
allocation is an *instance*: (pid, base) plus its lifetime.  Each free is
paired with its own allocation: a forward as-of join alloc -> first free of
that (pid, base) at or after it, bounded by the next alloc of the same
(pid, base) (a free after that belongs to the next instance; the first one's
free was missed).  A freed byte is then a byte some allocation of the capture
allocated, so no total frees more than it allocated.

Failed calls (a return code that is not 0) allocated and freed nothing and are
left out.  Pinned host memory (`cuMemAllocHost`, `hipHostMalloc`, ...) is not
device memory: the totals name each for what it counts.

Used by the merge (allocation instances of a capture) and by the summary a
recording prints, so both count the same bytes.
"""

from __future__ import annotations

import polars as pl

from . import schema
from .call_result import done

#: allocations.kind values that are not device memory
HOST_KINDS = ("host",)
#: allocations.kind of VMM physical memory: `base` is its handle, no address
HANDLE_KINDS = ("physical",)
#: allocations.kind of address ranges with no memory of their own (VMM
#: mappings: the bytes are counted once, at the physical allocation)
RANGE_KINDS = ("mapping",)
#: the calls that map VMM physical memory at an address range, and that unmap it
MAP_APIS = ("cuMemMap", "hipMemMap")
UNMAP_APIS = ("cuMemUnmap", "hipMemUnmap")
#: the frees of VMM physical memory (by handle)
RELEASE_APIS = ("cuMemRelease", "hipMemRelease")
#: what each byte total counts, by the `memory` column of totals()
MEMORY_NAMES = ["device", "pinned host"]


def kind_from_api(api: pl.Expr) -> pl.Expr:
    a = api.cast(pl.String)
    return (
        pl.when(a.str.contains("Managed")).then(pl.lit("managed"))
        .when(a.str.contains("Async|FromPool")).then(pl.lit("async"))
        .when(a.str.contains("Host|hipHostMalloc")).then(pl.lit("host"))
        .when(a.str.contains("MemCreate")).then(pl.lit("physical"))
        .when(a.str.contains("Malloc|MemAlloc|Alloc")).then(pl.lit("device"))
        .otherwise(pl.lit("other"))
        .cast(pl.Enum(schema.ALLOC_KIND_NAMES))
    )


def holds_memory(kind: pl.Expr = pl.col("kind")) -> pl.Expr:
    """Whether an allocation instance's bytes are memory (not a VMM mapping's
    address range, whose memory is its physical allocation's)."""
    return ~kind.cast(pl.String).is_in(RANGE_KINDS)


def has_address(kind: pl.Expr = pl.col("kind")) -> pl.Expr:
    """Whether an allocation instance's base is an address (not a VMM handle)."""
    return ~kind.cast(pl.String).is_in(HANDLE_KINDS)


def memory(kind: pl.Expr = pl.col("kind")) -> pl.Expr:
    """"device" or "pinned host", from an allocation kind."""
    return pl.when(kind.cast(pl.String).is_in(HOST_KINDS)).then(pl.lit("pinned host")).otherwise(
        pl.lit("device")).cast(pl.Enum(MEMORY_NAMES))


#: Every address a process or its GPUs use lies below this: x86-64 and
#: aarch64 user space (47-48 bits, 4-level paging) and CUDA's unified address
#: space within it; merge.attribution keys an address as pid << 48 | address.
ADDRESS_BITS = 48


def in_address_space(base: pl.Expr, size: pl.Expr) -> pl.Expr:
    """Whether [base, base + size) lies in the address space: a range beyond
    it (2^64 - 1 as a pointer or a size) is no allocation any driver made, and
    its end would wrap around 2^64."""
    limit = 1 << ADDRESS_BITS
    return (base < limit) & (size <= pl.lit(limit, pl.UInt64) - base)


def host_allocs(events: pl.LazyFrame) -> pl.LazyFrame:
    """Successful allocations: pid, tid, base, size, api, kind, alloc_ts_ns.
    A VMM physical allocation (kind "physical") has its handle as `base`.
    An allocation outside the address space (damaged data) is left out: its
    free finds nothing and is counted with the frees of unknown memory."""
    size = pl.col("size").fill_null(0)
    handle = pl.col("api").cast(pl.String).is_in(["cuMemCreate", "hipMemCreate"])
    return events.filter(
        (pl.col("kind") == "alloc") & done() & pl.col("ptr").is_not_null() & (pl.col("ptr") != 0)
        # a handle is no address, but its size is bytes like any other
        & pl.when(handle).then(size <= 1 << ADDRESS_BITS).otherwise(in_address_space(pl.col("ptr"), size))
    ).select(
        "pid", "tid", pl.col("ptr").alias("base"), size.alias("size"), "api",
        kind_from_api(pl.col("api")).alias("kind"), pl.col("ts_ns").alias("alloc_ts_ns"),
    )


def host_mappings(events: pl.LazyFrame) -> tuple[pl.LazyFrame, pl.LazyFrame]:
    """VMM mappings as allocations (kind "mapping": base and size of the
    range, host_allocs' columns) and the unmaps that end them (host_frees'
    columns), each unmap's `base` the mapping's whose range holds its address."""
    api = pl.col("api").cast(pl.String)
    maps = events.filter(
        api.is_in(MAP_APIS) & done() & pl.col("ptr").is_not_null() & (pl.col("ptr") != 0)
        & in_address_space(pl.col("ptr"), pl.col("size").fill_null(0))
    ).select(
        "pid", "tid", pl.col("ptr").alias("base"), pl.col("size").fill_null(0), "api",
        pl.lit("mapping").cast(pl.Enum(schema.ALLOC_KIND_NAMES)).alias("kind"), pl.col("ts_ns").alias("alloc_ts_ns"),
    )
    # each range start with the largest range mapped there: an unmap anywhere inside it ends it
    starts = maps.group_by("pid", "base").agg(pl.col("size").max().alias("_size")).with_columns(
        pl.col("base").alias("_at")).sort("pid", "_at")
    unmaps = events.filter(api.is_in(UNMAP_APIS) & done() & pl.col("ptr").is_not_null()).select(
        "pid", pl.col("ptr").alias("_at"), pl.col("ts_ns").alias("free_ts_ns"), pl.col("api").alias("free_api"),
    ).sort("pid", "_at")
    # both sides sorted just above (the check cannot see it through `by`)
    ends = unmaps.join_asof(starts, on="_at", by="pid", strategy="backward", check_sortedness=False).filter(
        pl.col("_at") < pl.col("base") + pl.col("_size")
    ).select("pid", "base", "free_ts_ns", "free_api")
    return maps, ends


def host_frees(events: pl.LazyFrame) -> pl.LazyFrame:
    """Frees that did not fail: pid, base, free_ts_ns, free_api."""
    return events.filter((pl.col("kind") == "free") & done() & pl.col("ptr").is_not_null()).select(
        "pid", pl.col("ptr").alias("base"), pl.col("ts_ns").alias("free_ts_ns"), pl.col("api").alias("free_api"),
    )


def pair(allocs: pl.LazyFrame, frees: pl.LazyFrame, by: tuple[str, ...] = ("pid", "base")) -> pl.LazyFrame:
    """`allocs` with free_ts_ns and free_api of the free that ended each
    instance (null: not freed during the capture); computed when called.  An
    instance is keyed by `by` (tensors: pid, device and base)."""
    keys = list(by)
    # Allocs and frees in one frame sorted by (keys, time), a free after an
    # alloc of the same time: the first free at or after an alloc is then the
    # next free row, and the next alloc of the address the next alloc row,
    # both found by filling row numbers backwards (a join_asof(by=) over
    # hundreds of thousands of addresses costs microseconds an allocation).
    both = pl.concat([
        allocs.with_columns(pl.col("alloc_ts_ns").alias("_ts"), pl.lit(False).alias("_free")),
        frees.select(*keys, pl.col("free_ts_ns").alias("_ts"), "free_api", pl.lit(True).alias("_free")),
    ], how="diagonal_relaxed").sort([*keys, "_ts", "_free"]).with_row_index("_i")
    row = pl.col("_i").cast(pl.Int64)
    next_free = pl.when(pl.col("_free")).then(row).fill_null(strategy="backward")
    next_alloc = pl.when(~pl.col("_free")).then(row).shift(-1).fill_null(strategy="backward")

    def at(i: pl.Expr, col: str) -> pl.Expr:
        """`col` of row i where it has this row's keys; null otherwise."""
        j = i.fill_null(0)
        same = pl.all_horizontal(i.is_not_null(), *(pl.col(k).gather(j) == pl.col(k) for k in keys))
        return pl.when(same).then(pl.col(col).gather(j))

    paired = both.with_columns(
        at(next_free, "_ts").alias("free_ts_ns"), at(next_free, "free_api").alias("free_api"),
        at(next_alloc, "_ts").alias("_next_alloc"),
    ).filter(~pl.col("_free"))
    late = pl.col("_next_alloc").is_not_null() & (pl.col("free_ts_ns") > pl.col("_next_alloc"))
    # gathers by computed row numbers need the whole frame: run here by the
    # in-memory engine (the streaming one panicked on them, Polars 2.1.0)
    return paired.with_columns(
        pl.when(late).then(None).otherwise(pl.col("free_ts_ns")).alias("free_ts_ns"),
        pl.when(late).then(None).otherwise(pl.col("free_api")).alias("free_api"),
    ).drop("_next_alloc", "_ts", "_free", "_i").collect(engine="in-memory").lazy()


#: totals() columns
TOTALS_SCHEMA: dict[str, pl.DataType] = {
    "pid": pl.UInt32,
    "memory": pl.Enum(MEMORY_NAMES),
    "allocations": pl.UInt32,
    "allocated_bytes": pl.UInt64,
    "freed": pl.UInt32,  # allocations of the capture freed during it
    "freed_bytes": pl.UInt64,
    "held_bytes": pl.UInt64,  # allocated and not freed by the end of the capture
}


def totals(allocations: pl.LazyFrame) -> pl.LazyFrame:
    """Per process and memory (device, pinned host): bytes allocated, freed
    and still held, from allocation instances (pair() or merge.allocations)."""
    freed = pl.col("free_ts_ns").is_not_null()
    return (
        allocations.filter(holds_memory()).group_by("pid", memory().alias("memory"))
        .agg(
            pl.len().alias("allocations"),
            pl.col("size").sum().alias("allocated_bytes"),
            freed.sum().alias("freed"),
            pl.col("size").filter(freed).sum().alias("freed_bytes"),
            pl.col("size").filter(~freed).sum().alias("held_bytes"),
        )
        .select([pl.col(k).cast(v) for k, v in TOTALS_SCHEMA.items()])
        .sort("pid", "memory")
    )


def aggregate_totals(aggregate: pl.LazyFrame) -> pl.LazyFrame:
    """totals() of an --aggregate capture (schema.AGGREGATE_SCHEMA): the
    kernel kept counts and byte sums per API, not the frees' sizes, so the
    freed and held columns are null."""
    return (
        aggregate.filter((pl.col("kind") == "alloc") & done())
        .group_by("pid", memory(kind_from_api(pl.col("api"))).alias("memory"))
        .agg(pl.col("count").sum().alias("allocations"), pl.col("bytes").sum().alias("allocated_bytes"))
        .with_columns(pl.lit(None).alias(c) for c in ("freed", "freed_bytes", "held_bytes"))
        .select([pl.col(k).cast(v) for k, v in TOTALS_SCHEMA.items()])
        .sort("pid", "memory")
    )


def unpaired_frees(events: pl.LazyFrame, allocations: pl.LazyFrame) -> pl.LazyFrame:
    """Frees no allocation of the capture made (memory allocated before it
    began): per process, how many.  Their sizes are unknown and counted nowhere."""
    paired = allocations.filter(pl.col("free_ts_ns").is_not_null()).select(
        "pid", "base", pl.col("free_ts_ns").alias("ts_ns"))
    frees = host_frees(events).filter(pl.col("base") != 0).select("pid", "base", pl.col("free_ts_ns").alias("ts_ns"))
    return frees.join(paired, on=["pid", "base", "ts_ns"], how="anti").group_by("pid").agg(
        pl.len().cast(pl.UInt32).alias("unpaired_frees"))
