"""Working set per kernel execution and hotness per allocation and per page,
from the device's page histograms attributed to allocation instances by the
merge (`merge.attributed_pages`).

`page` is address >> page_shift; `count` is thread-level accesses and `bytes`
the bytes accessed (null where the device source does not report bytes)."""

from __future__ import annotations

import polars as pl

from .. import merge
from ..read import Capture
from .exprs import measured_sum
from .registry import PID, columns, tool

PAGE_BYTES = pl.lit(2, pl.UInt64).pow(pl.col("page_shift"))
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
        .sort(["accesses", "pid", "alloc_base"], descending=[True, False, False])
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
        .sort(["accesses", "pid", "page"], descending=[True, False, False])
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
