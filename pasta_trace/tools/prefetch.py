"""UVM prefetch advice: for managed allocations, the pages each kernel execution
touches first (no earlier launch of the process touched them), merged into
contiguous ranges.  Each range becomes one prefetch call to issue on the
kernel's stream before that launch, so the pages migrate in bulk instead of
faulting in one by one."""

from __future__ import annotations

import polars as pl

from .. import merge
from ..hexfmt import hex_expr
from ..read import Capture
from .registry import PID, columns, tool

PAGE_BYTES = pl.lit(2, pl.UInt64).pow(pl.col("page_shift"))
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
