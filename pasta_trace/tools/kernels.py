"""Kernel summary: which kernels were launched, how often, in which shapes, and
how long the launch API and (with device timing) the GPU took."""

from __future__ import annotations

import polars as pl

from .. import merge
from ..read import Capture
from .exprs import measured_sum
from .registry import Tool
from .span import duration_ns

_KEY = ["pid", "name"]
_COLUMNS = (
    "pid", "name", "launches", "launches_per_s", "shapes", "top_grid", "top_block",
    "first_ts_ns", "last_ts_ns", "api_ns", "api_mean_ns", "gpu_ns", "gpu_mean_ns",
)


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


def _finish(summary: pl.LazyFrame, top_shape: pl.LazyFrame, dur_s: float) -> pl.DataFrame:
    return (
        summary.join(top_shape, on=_KEY, how="left", nulls_equal=True)
        .with_columns(
            pl.col("launches").cast(pl.UInt64),  # an --aggregate capture counts beyond 2**32
            (pl.col("launches") / dur_s if dur_s > 0 else pl.lit(None, pl.Float64)).alias("launches_per_s"),
        )
        .select(_COLUMNS)
        .sort(["launches", "pid", "name"], descending=[True, False, False])
        .collect(engine="streaming")
    )


def _aggregate_summary(cap: Capture, dur_s: float) -> pl.DataFrame:
    """An --aggregate capture: the kernel's counts per (kernel, shape); no
    per-call durations, so the time columns are null."""
    shaped = _shaped(merge.aggregate_launches(cap))
    summary = shaped.group_by(_KEY).agg(
        pl.col("count").sum().alias("launches"),
        pl.struct("grid", "block").n_unique().alias("shapes"),
        pl.col("first_ts_ns").min(),
        pl.col("last_ts_ns").max(),
        *(pl.lit(None, pl.Int64).alias(c) for c in ("api_ns", "gpu_ns")),
        *(pl.lit(None, pl.Float64).alias(c) for c in ("api_mean_ns", "gpu_mean_ns")),
    )
    return _finish(summary, _top_shape(shaped, pl.col("count").sum()), dur_s)


def kernel_summary(cap: Capture) -> pl.DataFrame:
    dur_s = duration_ns(cap) / 1e9
    if cap.aggregate is not None:
        return _aggregate_summary(cap, dur_s)
    ex = _shaped(merge.kernel_executions(cap)).with_columns(
        (pl.col("gpu_end_ns") - pl.col("gpu_start_ns")).alias("gpu_ns"),
    )
    summary = ex.group_by(_KEY).agg(
        pl.len().alias("launches"),
        pl.struct("grid", "block").n_unique().alias("shapes"),
        pl.col("ts_ns").min().alias("first_ts_ns"),
        pl.col("ts_ns").max().alias("last_ts_ns"),
        measured_sum(pl.col("dur_ns")).alias("api_ns"),
        pl.col("dur_ns").mean().alias("api_mean_ns"),
        measured_sum(pl.col("gpu_ns")).alias("gpu_ns"),
        pl.col("gpu_ns").mean().alias("gpu_mean_ns"),
    )
    return _finish(summary, _top_shape(ex, pl.len()), dur_s)


TOOLS = [
    Tool(
        name="kernels",
        reads_aggregate=True,
        title="Kernel summary",
        compute=kernel_summary,
        description="launches per kernel and process: count, rate, grid/block shapes, API time, GPU time",
        terminal_columns=(
            "pid", "name", "launches", "launches_per_s", "shapes", "top_grid", "top_block", "api_ns",
            "gpu_ns", "gpu_mean_ns",
        ),
    ),
]
