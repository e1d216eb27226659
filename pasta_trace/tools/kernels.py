"""Kernel summary: which kernels were launched, how often, in which shapes, and
how long the launch API and (with device timing) the GPU took; and the
launches per Python line (call site).  A launch call that returned an error
ran no kernel: it is counted apart (failed_launches), never in launches; the
API-errors tool names its code."""

from __future__ import annotations

import polars as pl

from .. import merge
from ..call_result import failed
from ..demangle import display_names
from ..read import Capture
from .common import duration_ns, measured_sum
from .registry import PID, TOP_CALL_SITE, columns, tool
from .sites import NO_STACK, top_site, with_launch_site

_KEY = ["pid", "name"]
_NAME = ("name", pl.String, "", "kernel name (unknown@0x<handle> when no name was seen)")
_DISPLAY = ("display_name", pl.String, "",
            "the name's display form: demangled, without return type and parameter list (docs/formats.md)")
_LAUNCHES = ("launches", pl.UInt64, "count",
             "kernels launched: launch calls that did not fail, and each kernel a CUDA graph launch ran")
_FAILED = ("failed_launches", pl.UInt64, "count",
           "launch calls that returned an error: no kernel ran (null: none, the column is left out where empty)")
_VIA_GRAPH = ("via_graph", pl.UInt64, "count",
              "of the launches: kernels run by a CUDA graph launch (null: none, the column is left out where empty)")
_TIMES = (
    ("first_ts_ns", pl.Int64, "ts", "first launch"),
    ("last_ts_ns", pl.Int64, "ts", "last launch"),
    ("api_ns", pl.Int64, "ns", "time in the launch API, where measured (null: entry-only probes)"),
    ("api_mean_ns", pl.Float64, "ns", "its mean"),
    ("gpu_ns", pl.Int64, "ns", "execution time on the GPU (device timing only)"),
    ("gpu_mean_ns", pl.Float64, "ns", "its mean"),
)
KERNELS = columns(
    PID, _NAME, _DISPLAY, _LAUNCHES, _FAILED, _VIA_GRAPH,
    ("launches_per_s", pl.Float64, "1/s", "launches over the capture's duration"),
    ("shapes", pl.UInt32, "count", "distinct (grid, block) shapes"),
    ("top_grid", pl.String, "", "the most frequent grid, XxYxZ"),
    ("top_block", pl.String, "", "the most frequent block, XxYxZ"),
    *_TIMES, TOP_CALL_SITE,
    ("name_reason", pl.String, "", "why the kernel has no name (null when it has one)"),
)
KERNEL_SITES = columns(PID, ("call_site", pl.String, "", "the Python line that launched; (no stack): none"),
                       _NAME, _DISPLAY, _LAUNCHES, _FAILED, *_TIMES)


def _launch_counts(weight: pl.Expr = pl.lit(1, pl.UInt64)) -> list[pl.Expr]:
    """launches (what ran) and failed_launches (null when none), each ``weight`` summed."""
    bad = weight.filter(failed()).sum().cast(pl.UInt64)
    return [weight.filter(~failed()).sum().cast(pl.UInt64).alias("launches"),
            pl.when(bad > 0).then(bad).alias("failed_launches")]


def _shaped(frame: pl.LazyFrame) -> pl.LazyFrame:
    return frame.with_columns(
        pl.format("{}x{}x{}", "grid_x", "grid_y", "grid_z").alias("grid"),
        pl.format("{}x{}x{}", "block_x", "block_y", "block_z").alias("block"),
    )


def _top_shape(shaped: pl.LazyFrame, weight: pl.Expr) -> pl.LazyFrame:
    """Most frequent shape per kernel; ties broken by the shape text so the
    answer does not depend on row order."""
    return (
        shaped.group_by([*_KEY, "grid", "block"])
        .agg(weight.alias("len"))
        .sort([*_KEY, "len", "grid", "block"], descending=[False, False, True, False, False])
        .group_by(_KEY, maintain_order=True)
        .agg(pl.col("grid").first().alias("top_grid"), pl.col("block").first().alias("top_block"))
    )


def _name_reasons(cap: Capture) -> pl.LazyFrame:
    """(pid, name, name_reason): why an unknown@ name has no kernel name, as
    the capture (or its offline naming) said for that handle."""
    named = (cap.names.filter((pl.col("source") == "unknown") & pl.col("reason").is_not_null())
             .group_by("pid", "name").agg(pl.col("reason").first().alias("name_reason")))
    graphs = merge.unknown_graph_names(cap)  # graph@0x<exec>: a graph whose kernels were not seen
    return pl.concat([named, graphs.lazy().select("pid", "name", pl.col("reason").alias("name_reason"))],
                     how="vertical_relaxed")


def _finish(cap: Capture, summary: pl.LazyFrame, top_shape: pl.LazyFrame, sites: pl.LazyFrame,
            dur_s: float) -> pl.DataFrame:
    return (
        summary.join(top_shape, on=_KEY, how="left", nulls_equal=True)
        .join(sites, on=_KEY, how="left", nulls_equal=True)
        .join(_name_reasons(cap), on=_KEY, how="left")
        .with_columns(
            pl.col("launches").cast(pl.UInt64),  # an --aggregate capture counts beyond 2**32
            (pl.col("launches") / dur_s if dur_s > 0 else pl.lit(None, pl.Float64)).alias("launches_per_s"),
        )
        .with_columns(pl.lit(None, pl.String).alias("display_name"))
        .select(list(KERNELS))
        .sort(["launches", "failed_launches", "pid", "name"], descending=[True, True, False, False],
              nulls_last=True)
        .collect(engine="streaming")
        .pipe(_with_display)
    )


def _with_display(df: pl.DataFrame) -> pl.DataFrame:
    """``df`` with display_name filled from name (one c++filt run for its distinct names)."""
    shown = display_names(df["name"].drop_nulls().unique().to_list())
    return df.with_columns(pl.col("name").replace_strict(shown, default=None, return_dtype=pl.String)
                           .alias("display_name"))


def _aggregate_summary(cap: Capture, dur_s: float) -> pl.DataFrame:
    """An --aggregate capture: the kernel's counts per (kernel, shape); no
    per-call durations or stacks, so the time and call-site columns are null."""
    shaped = _shaped(merge.aggregate_launches(cap))
    summary = shaped.group_by(_KEY).agg(
        *_launch_counts(pl.col("count")),
        pl.lit(None, pl.UInt64).alias("via_graph"),  # graphs are not followed by --aggregate
        pl.struct("grid", "block").n_unique().alias("shapes"),
        pl.col("first_ts_ns").min(),
        pl.col("last_ts_ns").max(),
        *(pl.lit(None, pl.Int64).alias(c) for c in ("api_ns", "gpu_ns")),
        *(pl.lit(None, pl.Float64).alias(c) for c in ("api_mean_ns", "gpu_mean_ns")),
    )
    no_sites = pl.LazyFrame(schema={"pid": pl.UInt32, "name": pl.String, "top_call_site": pl.String})
    return _finish(cap, summary, _top_shape(shaped, pl.col("count").sum()), no_sites, dur_s)


def _executions(cap: Capture) -> pl.LazyFrame:
    """Each launch with its device execution, GPU time and call site
    (Categorical, null: no stack; made text once grouped)."""
    ex = merge.kernel_executions(cap)
    if cap.stacks.select(pl.len()).collect().item():
        ex = with_launch_site(ex, cap)
    else:  # no stacks: no call sites to put onto millions of launches
        ex = ex.with_columns(pl.lit(None, pl.Categorical).alias("call_site"))
    return ex.with_columns((pl.col("gpu_end_ns") - pl.col("gpu_start_ns")).alias("gpu_ns"))


def _times() -> list[pl.Expr]:
    return [
        pl.col("ts_ns").min().alias("first_ts_ns"),
        pl.col("ts_ns").max().alias("last_ts_ns"),
        measured_sum(pl.col("dur_ns")).alias("api_ns"),
        pl.col("dur_ns").mean().alias("api_mean_ns"),
        measured_sum(pl.col("gpu_ns")).alias("gpu_ns"),
        pl.col("gpu_ns").mean().alias("gpu_mean_ns"),
    ]


@tool("kernels", "Kernel summary", KERNELS, reads_aggregate=True,
      description="launches per kernel and process: count, rate, grid/block shapes, API time, GPU time",
      terminal_columns=("pid", "display_name", "launches", "failed_launches", "via_graph", "launches_per_s", "shapes",
                        "top_grid", "top_block", "api_ns", "gpu_ns", "gpu_mean_ns", "top_call_site"))
def kernel_summary(cap: Capture) -> pl.DataFrame:
    """Per process and kernel name, most launched first."""
    dur_s = duration_ns(cap) / 1e9
    if cap.aggregate is not None:
        return _aggregate_summary(cap, dur_s)
    ex = _executions(cap)
    # shapes formatted once per distinct (kernel, grid, block), not per launch
    dims = ["grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z"]
    shaped = _shaped(ex.group_by([*_KEY, *dims]).agg(pl.len().alias("_n")))
    shapes = shaped.group_by(_KEY).agg(pl.struct("grid", "block").n_unique().alias("shapes"))
    via = pl.col("via_graph").sum().cast(pl.UInt64)
    summary = ex.group_by(_KEY).agg(*_launch_counts(), pl.when(via > 0).then(via).alias("via_graph"),
                                    *_times()).join(
        shapes, on=_KEY, how="left", nulls_equal=True)
    return _finish(cap, summary, _top_shape(shaped, pl.col("_n").sum()), top_site(ex, _KEY, pl.len()), dur_s)


@tool("kernel_call_sites", "Launches by call site", KERNEL_SITES,
      description="launches, API and GPU time per Python line and kernel",
      terminal_columns=("pid", "call_site", "display_name", "launches", "failed_launches", "api_ns", "gpu_ns",
                        "gpu_mean_ns"))
def kernel_by_call_site(cap: Capture) -> pl.DataFrame:
    """Launches per Python line and kernel, most first; launches without a
    stack together under (no stack).  Empty for an --aggregate capture."""
    return (
        _executions(cap).group_by("pid", "call_site", "name")
        .agg(*_launch_counts(), *_times())
        .with_columns(pl.col("call_site").cast(pl.String).fill_null(NO_STACK),
                      pl.lit(None, pl.String).alias("display_name"))
        .select(list(KERNEL_SITES))
        .sort(["launches", "failed_launches", "pid", "call_site", "name"],
              descending=[True, True, False, False, False], nulls_last=True)
        .collect(engine="streaming")
        .pipe(_with_display)
    )
