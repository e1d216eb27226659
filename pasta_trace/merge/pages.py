"""Device pages, allocation touches and access samples, attributed to
allocation instances (see attribution.py for how)."""

from __future__ import annotations

import numpy as np
import polars as pl

from .. import schema
from ..read import Capture
from .allocations import allocations
from .attribution import LAUNCH_BITS, Segments, segments
from .kernels import TOLERANCE_NS, device_executions, host_launches, kernel_executions

#: Page size (as a shift) for access samples folded to pages, when the capture
#: has no page histogram to take it from: 64 KiB, the device module's default.
PAGE_SHIFT = 16
#: Page size of the per-kernel working set computed from access samples: 4 KiB.
WS_PAGE_SHIFT = 12


def _is_empty(lf: pl.LazyFrame) -> bool:
    return lf.select(pl.len()).collect().item() == 0


def launch_times(cap: Capture, tolerance_ns: int = TOLERANCE_NS, names: bool = True) -> pl.LazyFrame:
    """(pid, launch_id) -> t (host time of the launch) and, with `names`, the kernel name.

    t is the matched host launch's uprobe time, else the device's API-enter
    time, else the kernel's start on the host clock."""
    key = ("launch_times", tolerance_ns, names)
    if key not in cap.cache:
        host = host_launches(cap).select("pid", "launch_seq", pl.col("ts_ns").alias("host_ts"))
        dev = device_executions(cap, tolerance_ns).filter(pl.col("launch_id").is_not_null())
        out = dev.join(host, on=["pid", "launch_seq"], how="left").select(
            "pid", "launch_id", pl.coalesce("host_ts", "dev_ts", "gpu_start_ns").alias("t"),
            "launch_seq", pl.col("dev_name").alias("name"),
        )
        if names:
            by_seq = kernel_executions(cap, tolerance_ns).select("pid", "launch_seq", pl.col("name").alias("h_name"))
            out = out.join(by_seq, on=["pid", "launch_seq"], how="left").with_columns(
                pl.coalesce("h_name", "name").alias("name"))
        cap.cache[key] = out.select("pid", "launch_id", "t", "name").unique(["pid", "launch_id"], keep="first").collect()
    return cap.cache[key].lazy()


def _segments(cap: Capture) -> tuple[Segments, pl.DataFrame]:
    if ("segments",) not in cap.cache:
        allocs = allocations(cap).collect()
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
    segs, allocs = _segments(cap)
    times = launch_times(cap, tolerance_ns)
    hist = cap.device["page_hist"]
    if not _is_empty(hist):
        rows = hist.select(
            "pid", "launch_id", "page_shift", "page", "count", pl.lit(None, pl.UInt64).alias("bytes")
        ).with_columns(segs.expr("pid", pl.col("page") * pl.lit(2, pl.UInt64).pow(pl.col("page_shift"))).alias("seg_id"))
    else:
        shift = PAGE_SHIFT if page_shift is None else page_shift
        lanes = pl.col("lanes").bitwise_count_ones().cast(pl.UInt64)
        rows = (
            cap.device["access_samples"]
            .with_columns(segs.expr("pid", pl.col("address")).alias("seg_id"))
            .group_by("pid", "launch_id", "seg_id", (pl.col("address") // (1 << shift)).alias("page"))
            .agg(lanes.sum().alias("count"), (lanes * pl.col("size").cast(pl.UInt64)).sum().alias("bytes"))
            .with_columns(pl.lit(shift, pl.UInt32).alias("page_shift"))
        )
    out = _attribute(rows, segs, allocs, times)
    cols = schema.TIMELINE_FRAMES["pages"]
    return out.select([pl.col(k).cast(v) for k, v in cols.items()]).sort(["pid", "launch_id", "page"])


def alloc_touches(cap: Capture, tolerance_ns: int = TOLERANCE_NS) -> pl.LazyFrame:
    """Device ALLOC_TOUCH rows resolved to the allocation instance with that
    base live at the launch (schema.TIMELINE_FRAMES["alloc_touches"])."""
    merged = cap.merged.get("alloc_touches")
    if merged is not None:
        return merged
    segs, allocs = _segments(cap)
    rows = cap.device["alloc_touch"].with_columns(segs.expr("pid", pl.col("alloc_base")).alias("seg_id"))
    out = _attribute(rows.rename({"alloc_base": "dev_base"}), segs, allocs, launch_times(cap, tolerance_ns))
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
    lanes = pl.col("lanes").bitwise_count_ones().cast(pl.UInt64)
    cols = schema.TIMELINE_FRAMES["working_set"]
    samples = cap.device["access_samples"]
    sums = [pl.len().alias("samples"), lanes.sum().alias("accesses"),
            (lanes * pl.col("size").cast(pl.UInt64)).sum().alias("bytes")]
    page = pl.col("address") // (1 << page_shift)
    packing = _launch_page_packing(cap, page_shift)
    if packing is None:
        # distinct pages in two group-bys: a third less CPU than n_unique in the
        # streaming engine, and no more memory (measured at 1e7 and 1e8 rows)
        per_launch = samples.group_by("pid", "launch_id").agg(sums)
        pages = samples.group_by("pid", "launch_id", page.alias("page")).agg().group_by("pid", "launch_id").agg(
            pl.len().alias("pages"))
        return per_launch.join(pages, on=["pid", "launch_id"], how="left").select(
            [pl.col(k).cast(v) for k, v in cols.items()])
    # grouping on one packed UInt64 costs ~half of grouping on (pid, launch_id, page)
    pids, launch_bits, page_bits = packing
    lk = _pid_index(pids) * (1 << launch_bits) + pl.col("launch_id")
    per_launch = samples.group_by(lk.alias("lk")).agg(sums)
    pages = (
        samples.group_by((lk * (1 << page_bits) + page).alias("kp")).agg()
        .group_by((pl.col("kp") // (1 << page_bits)).alias("lk")).agg(pl.len().alias("pages"))
    )
    pid_of = pl.DataFrame({"pidx": np.arange(pids.size, dtype=np.uint64), "pid": pids}).lazy()
    return (
        per_launch.join(pages, on="lk", how="left")
        .with_columns((pl.col("lk") // (1 << launch_bits)).alias("pidx"),
                      (pl.col("lk") % (1 << launch_bits)).alias("launch_id"))
        .join(pid_of, on="pidx", how="left")
        .select([pl.col(k).cast(v) for k, v in cols.items()])
    )


def _pid_index(pids: np.ndarray) -> pl.Expr:
    """pid -> its index in `pids` (UInt64), as a when/then chain: native in
    the streaming engine, unlike replace_strict (which buffers the whole column)."""
    idx: pl.Expr = pl.lit(None, pl.UInt64)
    for i, p in enumerate(pids.tolist()):
        idx = pl.when(pl.col("pid") == p).then(pl.lit(i, pl.UInt64)).otherwise(idx)
    return idx


def _launch_page_packing(cap: Capture, page_shift: int) -> tuple[np.ndarray, int, int] | None:
    """(sorted pids, launch bits, page bits) when every sample's (pid index,
    launch_id, page) fits one UInt64 key; None otherwise (or with nulls).
    One cheap pass over three columns, cached on the capture."""
    key = ("launch_page_packing", page_shift)
    if key not in cap.cache:
        r = cap.device["access_samples"].select(
            pl.col("pid").unique().sort().implode().alias("pids"),
            pl.col("launch_id").max().alias("lmax"), pl.col("address").max().alias("amax"),
            (pl.col("pid").null_count() + pl.col("launch_id").null_count() + pl.col("address").null_count())
            .alias("nulls"),
        ).collect(engine="streaming").row(0, named=True)
        pids = np.array(r["pids"], dtype=np.int64)
        packing = None
        if pids.size and not r["nulls"]:
            pid_bits = max(1, int(pids.size - 1).bit_length())
            launch_bits = max(1, int(r["lmax"]).bit_length())
            page_bits = max(1, int(r["amax"] >> page_shift).bit_length())
            if pid_bits + launch_bits + page_bits <= 64:
                packing = (pids, launch_bits, page_bits)
        cap.cache[key] = packing
    return cap.cache[key]


def hotness(cap: Capture, tolerance_ns: int = TOLERANCE_NS) -> pl.LazyFrame:
    """Per allocation instance, from access samples: samples, thread-level
    accesses, bytes and launches touching it (schema.TIMELINE_FRAMES["hotness"]).
    Samples that no live allocation holds are left out here and counted by
    `stats` (unattributed_samples)."""
    merged = cap.merged.get("hotness")
    if merged is not None:
        return merged
    segs, allocs = _segments(cap)
    lanes = pl.col("lanes").bitwise_count_ones().cast(pl.UInt64)
    sums = [pl.len().alias("samples"), lanes.sum().alias("accesses"),
            (lanes * pl.col("size").cast(pl.UInt64)).sum().alias("bytes")]
    samples = cap.device["access_samples"]
    if segs.fits_launch_segment:
        per_seg = (
            samples.group_by(segs.launch_segment_expr("pid", pl.col("address"), "launch_id").alias("k")).agg(sums)
            .select((pl.col("k") // (1 << LAUNCH_BITS)).cast(pl.Int64).alias("seg_id") - 1,
                    (pl.col("k") % (1 << LAUNCH_BITS)).alias("launch_id"), "samples", "accesses", "bytes")
            # segment -1 (below every allocation, or a launch id out of range) holds nothing to attribute
            .filter(pl.col("seg_id") >= 0)
            .join(segs.segment_pids().lazy(), on="seg_id", how="left")
        )
    else:
        per_seg = (
            samples.with_columns(segs.expr("pid", pl.col("address")).alias("seg_id"))
            .group_by("pid", "launch_id", "seg_id").agg(sums)
        )
    times = launch_times(cap, tolerance_ns, names=False)
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
