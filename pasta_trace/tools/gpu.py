"""The analyses of device data (gpu_probes or CUPTI, merged onto the host
clock): GPU time, memory access hotness and UVM prefetch advice.

Launch gaps and GPU idle time, from device timing (CUPTI or device-module
launch records, already on the host clock after the merge).

Busy time is the union of kernel intervals: kernels that overlap (concurrent
streams) are not counted twice.  A gap opens when a kernel starts after every
earlier kernel in the group has ended.

Working set per kernel execution and hotness per allocation and per page,
from the device's page histograms attributed to allocation instances by the
merge (`merge.attributed_pages`).

`page` is address >> page_shift; `count` is thread-level accesses and `bytes`
the bytes accessed (null where the device source does not report bytes).

UVM prefetch advice: for managed allocations, the pages each kernel execution
touches first (no earlier launch of the process touched them), merged into
contiguous ranges.  Each range becomes one prefetch call to issue on the
kernel's stream before that launch, so the pages migrate in bulk instead of
faulting in one by one."""

from __future__ import annotations

import numpy as np
import polars as pl

from .. import merge
from ..hexfmt import hex_expr
from ..read import Capture
from .common import measured_sum
from .registry import PID, columns, tool

#: the bytes of a page of an attributed-pages row
PAGE_BYTES = pl.lit(2, pl.UInt64).pow(pl.col("page_shift"))

_GAPS = (
    ("kernels", pl.UInt32, "count", "kernel executions with device timing"),
    ("first_ts_ns", pl.Int64, "ts", "first kernel start (host clock)"),
    ("last_ts_ns", pl.Int64, "ts", "last kernel end"),
    ("span_ns", pl.Int64, "ns", "last end minus first start"),
    ("busy_ns", pl.Int64, "ns", "union of the execution intervals"),
    ("idle_ns", pl.Int64, "ns", "the gaps between them"),
    ("idle_share", pl.Float64, "share", "idle_ns over span_ns"),
    ("max_gap_ns", pl.Int64, "ns", "the longest gap"),
    ("launch_to_start_mean_ns", pl.Float64, "ns", "host launch call to kernel start, mean"),
    ("launch_to_start_max_ns", pl.Int64, "ns", "the same, longest"),
)
LAUNCH_GAPS = columns(PID, ("stream", pl.UInt64, "handle", "the stream"), *_GAPS)
GPU_IDLE = columns(("device", pl.UInt32, "", "GPU index"),
                   ("processes", pl.UInt32, "count", "processes that ran kernels on it"), *_GAPS)


def _timed(cap: Capture) -> pl.LazyFrame:
    return merge.kernel_executions(cap).filter(
        pl.col("gpu_start_ns").is_not_null() & pl.col("gpu_end_ns").is_not_null()
    )


def _gaps(timed: pl.LazyFrame, keys: list[str]) -> pl.LazyFrame:
    """Per group: span, busy (union), idle (sum of gaps), largest gap."""
    rows = timed.select(*keys, "ts_ns", "gpu_start_ns", "gpu_end_ns").collect()
    gap = _gap_column(rows, keys)
    if gap is None:
        return _sorted_gaps(timed, keys)
    return _summed(rows.lazy().with_columns(gap), keys)


def _sorted_gaps(timed: pl.LazyFrame, keys: list[str]) -> pl.LazyFrame:
    """_gaps by a sort of every row by (keys, start) and a window over the groups."""
    # kernels starting together need no order among them: whichever comes first, every
    # later one of them starts before its end, so their gaps are 0 (a sort key less)
    ordered = timed.sort([*keys, "gpu_start_ns"]).with_columns(
        pl.col("gpu_end_ns").cum_max().shift(1).over(keys).alias("busy_until")
    )
    gap = (pl.col("gpu_start_ns") - pl.col("busy_until")).clip(lower_bound=0).fill_null(0)
    return _summed(ordered.with_columns(gap.alias("gap_ns")), keys)


def _gap_column(rows: pl.DataFrame, keys: list[str]) -> pl.Series | None:
    """gap_ns of each row of `rows` (keys, gpu_start_ns, gpu_end_ns, the times
    not null): how long its group was idle before it started, 0 for a group's
    first kernel.  Worked out on numpy arrays: the rows are laid out group
    after group, each group's times shifted onto a range of its own above the
    one before, so one stable sort by start orders them within their groups
    (a stream's kernels come in start order already: its sorted runs) and one
    running maximum of the ends is each group's busy-until, where a Polars
    sort of every row by (keys, start) and a window over the groups took
    seconds at 9*10^6.  None where the shifted ranges would not fit in int64."""
    groups = rows.select(keys).with_row_index("_i").group_by(keys).agg("_i")["_i"]
    sizes = groups.list.len().to_numpy().astype(np.int64)
    at = groups.explode().to_numpy().astype(np.int64)  # the rows, group after group
    if at.size == 0:
        return pl.Series("gap_ns", [], dtype=pl.Int64)
    start, end = rows["gpu_start_ns"].to_numpy()[at], rows["gpu_end_ns"].to_numpy()[at]
    first = np.r_[0, np.cumsum(sizes)[:-1]]
    low = np.minimum(np.minimum.reduceat(start, first), np.minimum.reduceat(end, first))
    high = np.maximum(np.maximum.reduceat(start, first), np.maximum.reduceat(end, first))
    spans = [int(h) - int(lo) + 1 for lo, h in zip(low.tolist(), high.tolist())]
    if sum(spans) >= 1 << 62:
        return None
    shift = np.repeat(np.r_[0, np.cumsum(spans)[:-1]].astype(np.int64) - low, sizes)
    start, end = start + shift, end + shift
    order = np.argsort(start, kind="stable")
    start, end = start[order], end[order]
    gap = np.empty(at.size, dtype=np.int64)
    gap[1:] = np.maximum(start[1:] - np.maximum.accumulate(end)[:-1], 0)
    gap[first] = 0  # a group's first kernel: no gap before it (the group below ends under its range)
    out = np.empty(at.size, dtype=np.int64)
    out[at[order]] = gap
    return pl.Series("gap_ns", out, dtype=pl.Int64)


def _summed(with_gaps: pl.LazyFrame, keys: list[str]) -> pl.LazyFrame:
    return with_gaps.group_by(keys).agg(
        pl.len().alias("kernels"),
        pl.col("gpu_start_ns").min().alias("first_ts_ns"),
        pl.col("gpu_end_ns").max().alias("last_ts_ns"),
        pl.col("gap_ns").sum().alias("idle_ns"),
        pl.col("gap_ns").max().alias("max_gap_ns"),
        (pl.col("gpu_start_ns") - pl.col("ts_ns")).mean().alias("launch_to_start_mean_ns"),
        (pl.col("gpu_start_ns") - pl.col("ts_ns")).max().alias("launch_to_start_max_ns"),
    ).with_columns(
        (pl.col("last_ts_ns") - pl.col("first_ts_ns")).alias("span_ns"),
    ).with_columns(
        (pl.col("span_ns") - pl.col("idle_ns")).alias("busy_ns"),
        pl.when(pl.col("span_ns") > 0).then(pl.col("idle_ns") / pl.col("span_ns")).alias("idle_share"),
    )


_COLUMNS = [
    "kernels", "first_ts_ns", "last_ts_ns", "span_ns", "busy_ns", "idle_ns", "idle_share",
    "max_gap_ns", "launch_to_start_mean_ns", "launch_to_start_max_ns",
]


@tool("launch_gaps", "Launch gaps per stream", LAUNCH_GAPS, needs_device=True,
      description="per process and stream: kernels, busy and idle time, largest gap, launch-to-start latency",
      terminal_columns=("pid", "stream", "kernels", "span_ns", "busy_ns", "idle_ns", "idle_share", "max_gap_ns",
                        "launch_to_start_mean_ns"))
def launch_gaps(cap: Capture) -> pl.DataFrame:
    """Per process and stream: gaps between consecutive kernels on that stream."""
    keys = ["pid", "stream"]
    return _gaps(_timed(cap), keys).select(*keys, *_COLUMNS).sort(keys).collect(engine="streaming")


@tool("gpu_idle", "GPU idle time", GPU_IDLE, needs_device=True,
      description="per GPU: processes, span of kernel activity, busy time (union over streams and processes), "
                  "idle time",
      terminal_columns=("device", "processes", "kernels", "span_ns", "busy_ns", "idle_ns", "idle_share", "max_gap_ns",
                        "launch_to_start_mean_ns"))
def gpu_idle(cap: Capture) -> pl.DataFrame:
    """Per GPU, all processes and streams on it together: how much of the span
    of kernel activity the GPU did no work."""
    timed = _timed(cap)
    procs = timed.group_by("device").agg(pl.col("pid").n_unique().alias("processes"))
    return (
        _gaps(timed, ["device"]).join(procs, on="device")
        .select("device", "processes", *_COLUMNS).sort("device").collect(engine="streaming")
    )


_ACCESSES = ("accesses", pl.UInt64, "count", "thread-level accesses")
_ACCESSED = ("accessed_bytes", pl.UInt64, "bytes", "bytes accessed (null where the device source reports none)")
WORKING_SET = columns(
    PID, ("launch_id", pl.UInt64, "", "the launch (the device module's per-process counter)"),
    ("name", pl.String, "", "kernel name"),
    ("pages", pl.UInt32, "count", "distinct pages touched"),
    ("ws_bytes", pl.UInt64, "bytes", "pages x page size"),
    _ACCESSES, _ACCESSED,
    ("allocations", pl.UInt32, "count", "distinct allocations touched"),
    ("unattributed_pages", pl.UInt32, "count", "pages in no live allocation"),
)
ALLOC_HOTNESS = columns(
    PID, ("alloc_base", pl.UInt64, "handle", "the allocation's address"),
    ("alloc_size", pl.UInt64, "bytes", "its size"), ("alloc_api", pl.String, "", "its allocation API"),
    _ACCESSES, _ACCESSED,
    ("pages_touched", pl.UInt32, "count", "distinct pages of it touched"),
    ("pages_spanned", pl.UInt64, "count", "pages it spans, partial ones at either end included"),
    ("touched_share", pl.Float64, "share", "pages_touched over pages_spanned"),
    ("launches", pl.UInt32, "count", "launches that touched it"),
)
PAGE_HOTNESS = columns(
    PID, ("page", pl.UInt64, "", "address >> page shift"),
    ("alloc_base", pl.UInt64, "handle", "the allocation holding it; null: none"),
    _ACCESSES, _ACCESSED,
    ("launches", pl.UInt32, "count", "launches that touched it"),
    ("first_launch_id", pl.UInt64, "", "the first of them"),
)


@tool("working_set", "Working set per kernel execution", WORKING_SET, needs_device=True,
      description="per launch: distinct pages touched, their bytes, accesses, allocations touched")
def working_set(cap: Capture) -> pl.DataFrame:
    """Per kernel execution: the pages and allocations it touched."""
    return (
        merge.attributed_pages(cap)
        .group_by("pid", "launch_id", "name")
        .agg(
            pl.col("page").n_unique().alias("pages"),
            (pl.col("page").n_unique() * PAGE_BYTES.first()).alias("ws_bytes"),
            pl.col("count").sum().alias("accesses"),
            measured_sum(pl.col("bytes")).alias("accessed_bytes"),
            pl.col("alloc_id").drop_nulls().n_unique().alias("allocations"),
            pl.col("page").filter(pl.col("alloc_id").is_null()).n_unique().alias("unattributed_pages"),
        )
        .sort(["pid", "launch_id"])
        .collect(engine="streaming")
    )


@tool("alloc_hotness", "Hotness per allocation", ALLOC_HOTNESS, needs_device=True,
      description="per allocation: accesses, pages touched out of pages spanned, launches that touched it",
      terminal_columns=("pid", "alloc_base", "alloc_size", "alloc_api", "accesses", "pages_touched", "pages_spanned",
                        "touched_share", "launches"))
def alloc_hotness(cap: Capture) -> pl.DataFrame:
    """Per allocation instance touched, hottest first."""
    first_page = pl.col("alloc_base") // PAGE_BYTES
    last_page = (pl.col("alloc_base") + pl.col("alloc_size") - 1) // PAGE_BYTES
    return (
        merge.attributed_pages(cap)
        .filter(pl.col("alloc_id").is_not_null())
        .with_columns((last_page - first_page + 1).alias("pages_spanned"))
        .group_by("pid", "alloc_id", "alloc_base", "alloc_size", pl.col("alloc_api").cast(pl.String))
        .agg(
            pl.col("count").sum().alias("accesses"),
            measured_sum(pl.col("bytes")).alias("accessed_bytes"),
            pl.col("page").n_unique().alias("pages_touched"),
            pl.col("pages_spanned").first(),
            pl.col("launch_id").n_unique().alias("launches"),
        )
        .with_columns((pl.col("pages_touched") / pl.col("pages_spanned")).alias("touched_share"))
        .select("pid", "alloc_base", "alloc_size", "alloc_api", "accesses", "accessed_bytes",
                "pages_touched", "pages_spanned", "touched_share", "launches")
        # then every other column: instances at one reused address, in one order from run to run
        .sort(["accesses", "pid", "alloc_base", "alloc_size", "alloc_api", "accessed_bytes", "pages_touched",
               "launches"], descending=[True] + [False] * 7, nulls_last=True)
        .collect(engine="streaming")
    )


@tool("page_hotness", "Hotness per page", PAGE_HOTNESS, needs_device=True,
      description="per page: accesses, launches that touched it, first launch, owning allocation")
def page_hotness(cap: Capture) -> pl.DataFrame:
    """Per process and page, hottest first."""
    return (
        merge.attributed_pages(cap)
        .group_by("pid", "page", "alloc_base")
        .agg(
            pl.col("count").sum().alias("accesses"),
            measured_sum(pl.col("bytes")).alias("accessed_bytes"),
            pl.col("launch_id").n_unique().alias("launches"),
            pl.col("launch_id").min().alias("first_launch_id"),
        )
        # then every other column: a page of two allocations (or none), in one order from run to run
        .sort(["accesses", "pid", "page", "alloc_base", "accessed_bytes", "launches", "first_launch_id"],
              descending=[True] + [False] * 6, nulls_last=True)
        .collect(engine="streaming")
    )


def page_launch_matrix(cap: Capture, max_pages: int = 64, max_launches: int = 64) -> pl.DataFrame:
    """Accesses per (page, kernel execution): the cells of the HTML heat map.
    The first `max_launches` launches in host time order (every process
    together, so a system-wide capture shows all of them), then the
    `max_pages` pages those launches touched most."""
    counts = merge.attributed_pages(cap).group_by("pid", "page", "page_shift", "launch_id").agg(
        pl.col("name").first(), pl.col("count").sum()
    )
    launch_ts = merge.kernel_executions(cap).select("pid", "launch_id", pl.col("ts_ns").alias("launch_ts_ns"))
    first = (
        counts.select("pid", "launch_id").unique()
        .join(launch_ts, on=["pid", "launch_id"], how="left")
        .sort(["launch_ts_ns", "pid", "launch_id"], nulls_last=True)
        .head(max_launches)
    )
    chosen = counts.join(first, on=["pid", "launch_id"])
    hot = (
        chosen.group_by("pid", "page").agg(pl.col("count").sum().alias("total"))
        .sort(["total", "pid", "page"], descending=[True, False, False])
        .head(max_pages)
    )
    return (
        chosen.join(hot.select("pid", "page"), on=["pid", "page"], how="semi")
        .sort(["pid", "page", "launch_ts_ns", "launch_id"])
        .collect(engine="streaming")
    )


PLAN = columns(
    PID, ("launch_id", pl.UInt64, "", "the launch to prefetch for"), ("name", pl.String, "", "its kernel"),
    ("stream", pl.UInt64, "handle", "its stream"),
    ("alloc_api", pl.String, "", "the managed allocation's API"),
    ("alloc_base", pl.UInt64, "handle", "the managed allocation"),
    ("page_first", pl.UInt64, "", "first page of the range (address >> page shift)"),
    ("page_last", pl.UInt64, "", "last page of the range"),
    ("pages", pl.UInt64, "count", "pages in the range"),
    ("prefetch_ptr", pl.UInt64, "handle", "the range's address, within the allocation"),
    ("bytes", pl.UInt64, "bytes", "its length, within the allocation"),
    ("advice", pl.String, "", "the call to make, e.g. cudaMemPrefetchAsync((void*)0x20000, 8192, 0, (cudaStream_t)0x5)"),
)


@tool("prefetch", "UVM prefetch plan (managed memory)", PLAN, needs_device=True,
      description="per launch and managed allocation: page ranges first touched by that launch, as prefetch calls",
      terminal_columns=("pid", "launch_id", "name", "pages", "bytes", "advice"))
def prefetch_plan(cap: Capture) -> pl.DataFrame:
    """Per launch and managed allocation: the page ranges that launch touches
    first, each as one prefetch to issue on its stream before it."""
    managed_ids = merge.allocations(cap).filter(pl.col("kind") == "managed").select("pid", "alloc_id")
    pages = merge.attributed_pages(cap).join(managed_ids, on=["pid", "alloc_id"], how="semi")
    first_touch = pages.group_by("pid", "alloc_id", "alloc_base", "alloc_size", "alloc_api", "page_shift", "page").agg(
        pl.col("launch_id").min()
    )
    group = ["pid", "launch_id", "alloc_id"]
    runs = first_touch.sort([*group, "page"]).with_columns(
        (pl.col("page").diff().over(group).fill_null(0) != 1).cum_sum().alias("run")
    )
    ranges = (
        runs.group_by(*group, "alloc_base", "alloc_size", "alloc_api", "page_shift", "run")
        .agg(pl.col("page").min().alias("page_first"), pl.col("page").max().alias("page_last"))
        .with_columns(
            # clip the page range to the allocation: its first and last pages may be shared
            pl.max_horizontal("alloc_base", pl.col("page_first") * PAGE_BYTES).alias("prefetch_ptr"),
            pl.min_horizontal(
                pl.col("alloc_base") + pl.col("alloc_size"), (pl.col("page_last") + 1) * PAGE_BYTES
            ).alias("range_end"),
            (pl.col("page_last") - pl.col("page_first") + 1).alias("pages"),
        )
        .with_columns((pl.col("range_end") - pl.col("prefetch_ptr")).alias("bytes"))
    )
    launches = merge.kernel_executions(cap).filter(pl.col("launch_id").is_not_null()).select(
        "pid", "launch_id", "name", "stream", "device"
    )
    plan = (
        ranges.join(launches, on=["pid", "launch_id"], how="left")
        .sort(["pid", "launch_id", "alloc_base", "page_first"])
        .collect(engine="streaming")
    )
    hip = pl.col("alloc_api").cast(pl.String).str.starts_with("hip")
    advice = pl.format(
        "{}((void*){}, {}, {}, {})",
        pl.when(hip).then(pl.lit("hipMemPrefetchAsync")).otherwise(pl.lit("cudaMemPrefetchAsync")),
        hex_expr(pl.col("prefetch_ptr")),
        pl.col("bytes"),
        pl.col("device").cast(pl.String).fill_null("dev"),
        pl.format(
            "({}){}",
            pl.when(hip).then(pl.lit("hipStream_t")).otherwise(pl.lit("cudaStream_t")),
            hex_expr(pl.col("stream")).fill_null("0"),
        ),
    )
    return plan.with_columns(advice.alias("advice")).select(
        "pid", "launch_id", "name", "stream", pl.col("alloc_api").cast(pl.String), "alloc_base",
        "page_first", "page_last", "pages", "prefetch_ptr", "bytes", "advice",
    )
