"""Flame graphs: a weight per call (time blocked in a sync, bytes allocated,
bytes live at the peak) summed over the call stacks that made the calls.

Each stack in stacks.parquet is folded outermost frame first, under a frame
for its process, down to the frame that names its call site (tools.sites:
the user's line by default, so the library frames inside it fold into it;
every frame with --call-site innermost); calls without a stack fold under
NO_STACK.  One node per distinct path from the root: its x offset and width
are in the weight's units, so that each node spans exactly the calls beneath it.

Memory is weighed at one layer per process: its tensors (PyTorch's
allocators) where it has tensor events, else its driver allocations; the two
are views of the same bytes and are never summed."""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from ..call_result import done
from ..read import Capture
from . import tensors
from .memory import live_at_peak
from .sites import NO_STACK, site_depth

ROOT = "all"
_SEP = "\x1f"  # joins a path's labels into one key; sorts below any character of a label


@dataclass(frozen=True)
class Flame:
    name: str  # "sync", "allocated", "peak"
    title: str
    unit: str  # "ns" or "bytes": how the weights read
    #: one row per node: level (0 = ROOT), x0, width (weight units), label
    #: ("function (file:line)"), kind (python, native, process, none, root)
    nodes: pl.DataFrame
    total: int


def frame_label(function: pl.Expr, file: pl.Expr, line: pl.Expr, module: pl.Expr) -> pl.Expr:
    """"function (file:line)"; a native frame without a source line names its library."""
    where = pl.when(file.is_not_null() & line.is_not_null()).then(
        pl.format("{}:{}", file, line.cast(pl.String))
    ).otherwise(pl.coalesce(file, module, pl.lit("?")))
    return pl.format("{} ({})", function.fill_null("?"), where)


def fold(cap: Capture, weights: pl.LazyFrame) -> pl.DataFrame:
    """Nodes (level, x0, width, label, kind) of the weights (pid, stack_id,
    weight) folded over their stacks, below one ROOT node of the total."""
    per_stack = (
        weights.filter(pl.col("weight") > 0)
        .group_by("pid", "stack_id").agg(pl.col("weight").sum())
    )
    frames = (
        cap.stacks.join(site_depth(cap), on=["pid", "stack_id"], how="left")
        .filter(pl.col("depth") >= pl.col("site_depth").fill_null(0))
        .select(
            "pid", "stack_id", "depth",
            frame_label(pl.col("function"), pl.col("file"), pl.col("line"), pl.col("module")).alias("label"),
            pl.col("kind").cast(pl.String),
        )
        .group_by("pid", "stack_id")
        # outermost first: the root's children are the programs' entry points
        .agg(pl.col("label").sort_by("depth", descending=True), pl.col("kind").sort_by("depth", descending=True))
    )
    paths = (
        per_stack.join(frames, on=["pid", "stack_id"], how="left")
        .with_columns(
            pl.concat_list(pl.format("pid {}", "pid"), pl.col("label").fill_null(pl.lit([NO_STACK]))).alias("path"),
            pl.concat_list(pl.lit("process"), pl.col("kind").fill_null(pl.lit(["none"]))).alias("kinds"),
        )
        .with_columns(pl.col("path").list.join(_SEP).alias("key"))
        # stacks in path order: those beneath one node are next to each other
        .sort("key")
        .with_columns((pl.col("weight").cum_sum() - pl.col("weight")).alias("x"))
        .with_columns(pl.int_ranges(0, pl.col("path").list.len()).alias("level"))
        .explode("level")
        .with_columns(
            pl.col("path").list.slice(0, pl.col("level") + 1).list.join(_SEP).alias("prefix"),
            pl.col("path").list.get(pl.col("level")).alias("label"),
            pl.col("kinds").list.get(pl.col("level")).alias("kind"),
        )
    )
    nodes = (
        paths.group_by("level", "prefix")
        .agg(pl.col("x").min().alias("x0"), pl.col("weight").sum().alias("width"), pl.col("label").first(),
             pl.col("kind").first())
        .select((pl.col("level") + 1).cast(pl.Int64), "x0", "width", "label", "kind", "prefix")
        .sort("level", "prefix")
        .drop("prefix")
        .collect(engine="streaming")
    )
    total = int(nodes.filter(pl.col("level") == 1)["width"].sum()) if nodes.height else 0
    root = pl.DataFrame({"level": [0], "x0": [0], "width": [total], "label": [ROOT], "kind": ["root"]},
                        schema=nodes.schema)
    return pl.concat([root, nodes]) if total else nodes.clear()


def sync_weights(cap: Capture) -> pl.LazyFrame:
    """Time blocked in each sync call (calls without a measured duration weigh nothing)."""
    return cap.events.filter(pl.col("kind") == "sync").select("pid", "stack_id", pl.col("dur_ns").alias("weight"))


def _one_layer(driver: pl.LazyFrame, tensor: pl.LazyFrame, cap: Capture) -> pl.LazyFrame:
    """``tensor`` weights for the processes with tensor events, ``driver`` ones for the others."""
    with_tensors = tensors.tensor_events(cap).select("pid").unique()
    return pl.concat([driver.join(with_tensors, on="pid", how="anti"), tensor])


def allocated_weights(cap: Capture) -> pl.LazyFrame:
    """Bytes of each allocation call that succeeded, or of each tensor allocated."""
    driver = cap.events.filter((pl.col("kind") == "alloc") & done()).select(
        "pid", "stack_id", pl.col("size").cast(pl.Int64).alias("weight"))
    tensor = tensors.tensor_lifetimes(cap).select("pid", "stack_id", pl.col("size").cast(pl.Int64).alias("weight"))
    return _one_layer(driver, tensor, cap)


def peak_weights(cap: Capture) -> pl.LazyFrame:
    """Bytes of each device allocation live at its process's peak, or of
    each tensor live at its (process, device)'s peak of tensor memory."""
    driver = live_at_peak(cap).select("pid", "stack_id", pl.col("size").cast(pl.Int64).alias("weight"))
    tensor = tensors.live_at_peak(cap, tensors.peak_rows(cap)).select(
        "pid", "stack_id", pl.col("size").cast(pl.Int64).alias("weight"))
    return _one_layer(driver, tensor, cap)


def flames(cap: Capture) -> list[Flame]:
    """The three flame graphs of the HTML report."""
    out = []
    for name, title, unit, weights in (
        ("sync", "Time blocked in syncs", "ns", sync_weights),
        ("allocated", "Bytes allocated", "bytes", allocated_weights),
        ("peak", "Bytes live at the peak", "bytes", peak_weights),
    ):
        nodes = fold(cap, weights(cap))
        out.append(Flame(name, title, unit, nodes, int(nodes["width"][0]) if nodes.height else 0))
    return out
