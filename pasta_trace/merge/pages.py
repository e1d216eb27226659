"""Device pages, allocation touches and access samples, attributed to
allocation instances (see attribution.py for how)."""

from __future__ import annotations

import polars as pl

from .. import schema
from ..lifetimes import ADDRESS_BITS, has_address
from ..read import Capture
from .allocations import allocations
from .attribution import Segments, segments
from .kernels import TOLERANCE_NS, device_executions, kernel_executions
from .launches import launch_order
from .numpy_pages import ordinary_pages
from .samples import SampleSums, packing, sample_sums

#: Page size (as a shift) for access samples folded to pages, when the capture
#: has no page histogram to take it from: 64 KiB, the device module's default.
PAGE_SHIFT = 16
#: Page size of the per-kernel working set computed from access samples: 4 KiB.
WS_PAGE_SHIFT = 12


def _is_empty(lf: pl.LazyFrame) -> bool:
    return lf.select(pl.len()).collect().item() == 0


def launch_times(cap: Capture, keys: pl.LazyFrame, tolerance_ns: int = TOLERANCE_NS,
                 names: bool = True) -> pl.LazyFrame:
    """(pid, launch_id) -> t (host time of the launch) and, with `names`, the
    kernel name, for the launches named in `keys` (pid, launch_id): device
    rows name a small part of millions of launches, and only those are looked
    up, by semi-joins that hash the small side.

    t is the matched host launch's uprobe time, else the device's API-enter
    time, else the kernel's start on the host clock."""
    dtypes = schema.DEVICE_FRAMES["launches"]
    want = keys.select(pl.col("pid").cast(dtypes["pid"]), pl.col("launch_id").cast(dtypes["launch_id"])).unique()
    dev = (device_executions(cap, tolerance_ns).join(want, on=["pid", "launch_id"], how="semi")
           .select("pid", "launch_id", "launch_seq", "dev_ts", "gpu_start_ns", "dev_name").collect())
    seqs = dev.lazy().select("pid", "launch_seq").drop_nulls()
    host = launch_order(cap).lazy().select("pid", "launch_seq", pl.col("ts_ns").alias("host_ts")).join(
        seqs, on=["pid", "launch_seq"], how="semi")
    out = dev.lazy().join(host, on=["pid", "launch_seq"], how="left").select(
        "pid", "launch_id", pl.coalesce("host_ts", "dev_ts", "gpu_start_ns").alias("t"),
        "launch_seq", pl.col("dev_name").cast(pl.String).alias("name"),
    )
    if names:
        by_seq = kernel_executions(cap, tolerance_ns).select("pid", "launch_seq", pl.col("name").alias("h_name")).join(
            seqs, on=["pid", "launch_seq"], how="semi")
        out = out.join(by_seq, on=["pid", "launch_seq"], how="left").with_columns(
            pl.coalesce("h_name", "name").alias("name"))
    return out.select("pid", "launch_id", "t", "name").unique(["pid", "launch_id"], keep="first").collect().lazy()


def _segments(cap: Capture) -> tuple[Segments, pl.DataFrame]:
    if ("segments",) not in cap.cache:
        # a VMM handle is no address: its memory is found through the ranges mapped to it
        allocs = allocations(cap).filter(has_address()).collect()
        with ordinary_pages():
            cap.cache[("segments",)] = (segments(allocs), allocs)
    return cap.cache[("segments",)]


def _attribute(rows: pl.LazyFrame, segs: Segments, allocs: pl.DataFrame, times: pl.LazyFrame) -> pl.LazyFrame:
    """rows carry pid, launch_id, seg_id: add alloc_id/base/size/api and name."""
    inst = allocs.lazy().select("alloc_id", pl.col("base").alias("alloc_base"),
                                pl.col("size").alias("alloc_size"), pl.col("api").alias("alloc_api"))
    return (
        rows.join(times, on=["pid", "launch_id"], how="left")
        .with_columns(segs.instance_expr(pl.col("seg_id"), pl.col("t")).alias("alloc_id"))
        .join(inst, on="alloc_id", how="left")
    )


def attributed_pages(cap: Capture, page_shift: int | None = None,
                     tolerance_ns: int = TOLERANCE_NS) -> pl.LazyFrame:
    """Device pages with the allocation live there when the kernel launched
    (schema.TIMELINE_FRAMES["pages"]).

    From the page histogram when the capture has one; otherwise from access
    samples folded to pages of `page_shift` (default PAGE_SHIFT).  A page is
    attributed by its first byte."""
    merged = cap.merged.get("pages")
    if merged is not None:
        return merged
    cols = schema.TIMELINE_FRAMES["pages"]
    hist = cap.device["page_hist"]
    from_hist = not _is_empty(hist)
    if not from_hist and cap.device.rows("access_samples") == 0:
        # no device pages: nothing to attribute (and no segments or launch times to build)
        return schema.empty_frame(cols).lazy()
    segs, allocs = _segments(cap)
    samples = None if from_hist else cap.device["access_samples"]  # read by Polars: checked first
    times = launch_times(cap, hist if from_hist else samples, tolerance_ns)
    if from_hist:
        # a page beyond the address space (a page_shift or page no device writes: damaged data)
        # is nobody's, and its address, page << page_shift, would not fit 64 bits
        hist = hist.filter((pl.col("page_shift") < ADDRESS_BITS)
                           & (pl.col("page") < pl.lit(1 << ADDRESS_BITS, pl.UInt64) // pl.lit(
                               2, pl.UInt64).pow(pl.col("page_shift"))))
        rows = hist.select(
            "pid", "launch_id", "page_shift", "page", "count", pl.lit(None, pl.UInt64).alias("bytes")
        ).with_columns(segs.expr("pid", pl.col("page") * pl.lit(2, pl.UInt64).pow(pl.col("page_shift"))).alias("seg_id"))
    else:
        shift = PAGE_SHIFT if page_shift is None else page_shift
        lanes = pl.col("lanes").bitwise_count_ones().cast(pl.UInt64)
        rows = (
            samples.with_columns(segs.expr("pid", pl.col("address")).alias("seg_id"))
            .group_by("pid", "launch_id", "seg_id", (pl.col("address") // (1 << shift)).alias("page"))
            .agg(lanes.sum().alias("count"), (lanes * pl.col("size").cast(pl.UInt64)).sum().alias("bytes"))
            .with_columns(pl.lit(shift, pl.UInt32).alias("page_shift"))
        )
    out = _attribute(rows, segs, allocs, times)
    return out.select([pl.col(k).cast(v) for k, v in cols.items()]).sort(["pid", "launch_id", "page"])


def alloc_touches(cap: Capture, tolerance_ns: int = TOLERANCE_NS) -> pl.LazyFrame:
    """Device ALLOC_TOUCH rows resolved to the allocation instance with that
    base live at the launch (schema.TIMELINE_FRAMES["alloc_touches"])."""
    merged = cap.merged.get("alloc_touches")
    if merged is not None:
        return merged
    segs, allocs = _segments(cap)
    rows = cap.device["alloc_touch"].with_columns(segs.expr("pid", pl.col("alloc_base")).alias("seg_id"))
    out = _attribute(rows.rename({"alloc_base": "dev_base"}), segs, allocs,
                     launch_times(cap, cap.device["alloc_touch"], tolerance_ns))
    # the device names the base it matched: a different live base is not this touch's allocation
    out = out.with_columns(
        pl.when(pl.col("alloc_base") == pl.col("dev_base")).then(pl.col(c)).alias(c)
        for c in ("alloc_id", "alloc_base", "alloc_size", "alloc_api")
    ).with_columns(pl.coalesce("alloc_base", "dev_base").alias("alloc_base"))
    cols = schema.TIMELINE_FRAMES["alloc_touches"]
    return out.select([pl.col(k).cast(v) for k, v in cols.items()]).sort(["pid", "launch_id", "alloc_base"])


def working_set(cap: Capture, page_shift: int = WS_PAGE_SHIFT) -> pl.LazyFrame:
    """Per kernel execution, from access samples: samples, thread-level
    accesses, bytes and distinct pages (schema.TIMELINE_FRAMES["working_set"])."""
    merged = cap.merged.get("working_set")
    if merged is not None:
        return merged
    cols = schema.TIMELINE_FRAMES["working_set"]
    shared = _sample_sums(cap, page_shift)
    if shared is not None:
        return shared.per_launch.lazy().select([pl.col(k).cast(v) for k, v in cols.items()])
    # keys too wide for the sorting pass: hash group-bys, distinct pages in two
    # of them (a third less CPU than n_unique in the streaming engine, no more memory)
    samples = cap.device["access_samples"]
    lanes = pl.col("lanes").bitwise_count_ones().cast(pl.UInt64)
    per_launch = samples.group_by("pid", "launch_id").agg(
        pl.len().alias("samples"), lanes.sum().alias("accesses"),
        (lanes * pl.col("size").cast(pl.UInt64)).sum().alias("bytes"))
    pages = samples.group_by("pid", "launch_id", (pl.col("address") // (1 << page_shift)).alias("page")).agg(
    ).group_by("pid", "launch_id").agg(pl.len().alias("pages"))
    return per_launch.join(pages, on=["pid", "launch_id"], how="left").select(
        [pl.col(k).cast(v) for k, v in cols.items()])


def _sample_sums(cap: Capture, page_shift: int) -> SampleSums | None:
    """The one pass over the samples that the working set and the hotness
    share (samples.py), when its keys fit 64 bits."""
    pk = packing(cap, page_shift)
    if pk is None:
        return None
    segs, _ = _segments(cap)
    return sample_sums(cap, segs, pk, page_shift) if pk.fits(segs) else None


def hotness(cap: Capture, tolerance_ns: int = TOLERANCE_NS) -> pl.LazyFrame:
    """Per allocation instance, from access samples: samples, thread-level
    accesses, bytes and launches touching it (schema.TIMELINE_FRAMES["hotness"]).
    Samples that no live allocation holds are left out here and counted by
    `stats` (unattributed_samples)."""
    merged = cap.merged.get("hotness")
    if merged is not None:
        return merged
    segs, allocs = _segments(cap)
    shared = _sample_sums(cap, WS_PAGE_SHIFT)
    if shared is not None:
        per_seg = keys = shared.per_segment.lazy()
    else:
        keys = cap.device["access_samples"]  # the same launches, without a second pass of the group-by
        lanes = pl.col("lanes").bitwise_count_ones().cast(pl.UInt64)
        per_seg = (
            cap.device["access_samples"].with_columns(segs.expr("pid", pl.col("address")).alias("seg_id"))
            .group_by("pid", "launch_id", "seg_id")
            .agg(pl.len().alias("samples"), lanes.sum().alias("accesses"),
                 (lanes * pl.col("size").cast(pl.UInt64)).sum().alias("bytes"))
        )
    times = launch_times(cap, keys, tolerance_ns, names=False)
    cols = schema.TIMELINE_FRAMES["hotness"]
    return (
        per_seg.join(times, on=["pid", "launch_id"], how="left")
        .with_columns(segs.instance_expr(pl.col("seg_id"), pl.col("t")).alias("alloc_id"))
        .drop_nulls("alloc_id")
        .group_by("alloc_id")
        .agg(pl.col("samples").sum(), pl.col("accesses").sum(), pl.col("bytes").sum(),
             pl.col("launch_id").n_unique().alias("launches"))
        .join(allocs.lazy().select("alloc_id", "pid", "base", "size", "api"), on="alloc_id", how="left")
        .select([pl.col(k).cast(v) for k, v in cols.items()])
        .sort(["accesses", "pid", "base"], descending=[True, False, False])
    )
