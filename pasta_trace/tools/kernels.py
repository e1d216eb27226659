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


def kernel_summary(cap: Capture) -> pl.DataFrame:
    dur_s = duration_ns(cap) / 1e9
    ex = merge.kernel_executions(cap).with_columns(
        pl.format("{}x{}x{}", "grid_x", "grid_y", "grid_z").alias("grid"),
        pl.format("{}x{}x{}", "block_x", "block_y", "block_z").alias("block"),
        (pl.col("gpu_end_ns") - pl.col("gpu_start_ns")).alias("gpu_ns"),
    )
    # most frequent shape per kernel; ties broken by the shape text so the
    # answer does not depend on row order
    top_shape = (
        ex.group_by([*_KEY, "grid", "block"])
        .len()
        .sort([*_KEY, "len", "grid", "block"], descending=[False, False, True, False, False])
        .group_by(_KEY, maintain_order=True)
        .agg(pl.col("grid").first().alias("top_grid"), pl.col("block").first().alias("top_block"))
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
    return (
        summary.join(top_shape, on=_KEY, how="left", nulls_equal=True)
        .with_columns(
            (pl.col("launches") / dur_s if dur_s > 0 else pl.lit(None, pl.Float64)).alias("launches_per_s"),
        )
        .select(
            "pid", "name", "launches", "launches_per_s", "shapes", "top_grid", "top_block",
            "first_ts_ns", "last_ts_ns", "api_ns", "api_mean_ns", "gpu_ns", "gpu_mean_ns",
        )
        .sort(["launches", "pid", "name"], descending=[True, False, False])
        .collect(engine="streaming")
    )


TOOLS = [
    Tool(
        name="kernels",
        title="Kernel summary",
        compute=kernel_summary,
        description="launches per kernel and process: count, rate, grid/block shapes, API time, GPU time",
        terminal_columns=(
            "pid", "name", "launches", "launches_per_s", "shapes", "top_grid", "top_block", "api_ns",
            "gpu_ns", "gpu_mean_ns",
        ),
    ),
]
