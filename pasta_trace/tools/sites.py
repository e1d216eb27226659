"""Call sites: the Python line that made a call, from the innermost frame of
its stack in stacks.parquet ("file:line function"), joined onto any frame
that has pid and stack_id.  The tools group by it (`call_sites` and the
`*_call_sites` tools) or name each row's top one (`top_call_site`)."""

from __future__ import annotations

import polars as pl

from .. import lifetimes, merge
from ..read import Capture

#: the call site of a call without a stack (no Python, --no-stacks, or a lost stack)
NO_STACK = "(no stack)"


def sites(cap: Capture) -> pl.LazyFrame:
    """(pid, stack_id) -> call_site "file:line function", from each stack's innermost frame."""
    return cap.stacks.filter(pl.col("depth") == 0).select(
        "pid", "stack_id",
        pl.format("{}:{} {}", pl.col("file").fill_null("?"), pl.col("line").cast(pl.String).fill_null("?"),
                  pl.col("function").fill_null("?")).alias("call_site"),
    ).unique(["pid", "stack_id"])


def with_site(frame: pl.LazyFrame, cap: Capture, no_stack: str | None = NO_STACK) -> pl.LazyFrame:
    """``frame`` (with pid and stack_id) plus its call_site column; calls
    without a stack get ``no_stack`` (None: null)."""
    out = frame.join(sites(cap), on=["pid", "stack_id"], how="left")
    return out if no_stack is None else out.with_columns(pl.col("call_site").fill_null(no_stack))


def top_site(frame: pl.LazyFrame, keys: list[str], *weights: pl.Expr) -> pl.LazyFrame:
    """keys + top_call_site: per group of ``frame`` (with a call_site column,
    null for calls without a stack), the site with the largest ``weights``
    (aggregations, compared in order; ties to the first site by name).  A
    group none of whose calls has a stack is absent: join it back with
    how="left" and it reads null."""
    named = [w.alias(f"_w{i}") for i, w in enumerate(weights)]
    order = [pl.col(f"_w{i}") for i in range(len(weights))]
    return (
        frame.filter(pl.col("call_site").is_not_null())
        .group_by(*keys, "call_site").agg(*named)
        .with_columns(pl.col("call_site").cast(pl.String))  # ties go to the first by name, not by category
        .group_by(keys).agg(
            pl.col("call_site").sort_by([*order, pl.col("call_site")], descending=[*(True,) * len(order), False],
                                        nulls_last=True).first().alias("top_call_site"))
    )


def with_top_site(result: pl.LazyFrame, calls: pl.LazyFrame, keys: list[str], *weights: pl.Expr) -> pl.LazyFrame:
    """``result`` (one row per ``keys``) plus the top_call_site of its ``calls``
    (`top_site`).  Keys may be null (a sync with no stream): nulls match."""
    return result.join(top_site(calls, keys, *weights), on=keys, how="left", nulls_equal=True,
                       maintain_order="left")


def with_launch_site(frame: pl.LazyFrame, cap: Capture) -> pl.LazyFrame:
    """``frame`` (launches: pid, launch_seq, as the merge numbers them) plus
    the call_site of each (Categorical; null: no stack), gathered from the
    launch's row of launch_order (merge.order_position), not joined on
    (pid, launch_seq) across millions of launches."""
    key = ("launch_sites",)
    if key not in cap.cache:
        cap.cache[key] = (
            merge.launch_order(cap).lazy().select("pid", "stack_id")
            .join(sites(cap).with_columns(pl.col("call_site").cast(pl.Categorical)), on=["pid", "stack_id"],
                  how="left", maintain_order="left")
            .collect()["call_site"]
        )
    at = merge.order_position(merge.launch_order(cap), pl.col("pid"), pl.col("launch_seq"))
    return frame.with_columns(pl.lit(cap.cache[key]).gather(at).alias("call_site"))


def allocation_sites(cap: Capture, device_only: bool = True) -> pl.LazyFrame:
    """Allocation instances (device memory only, unless ``device_only`` is
    False: pinned host memory too) with the line of the call that made them
    (same process, thread and entry time as its event; null call_site: no
    stack, or a device-module record)."""
    calls = cap.events.filter(pl.col("kind") == "alloc").select(
        "pid", "tid", pl.col("ts_ns").alias("alloc_ts_ns"), "stack_id").unique(["pid", "tid", "alloc_ts_ns"], keep="first")
    allocs = merge.allocations(cap).filter(lifetimes.holds_memory())  # a VMM mapping's bytes are its memory's
    if device_only:
        allocs = allocs.filter(pl.col("kind") != "host")
    return with_site(allocs.join(calls, on=["pid", "tid", "alloc_ts_ns"], how="left"), cap, None)
