"""The HTML report's tensor memory chart: per process and device, the tensor
bytes held over time stacked by the call site that allocated them (the way
PyTorch's memory_viz shows them), the bytes the allocator held from before
the capture at the bottom, and what it reserved as a line on top.  Each plot
shares the time axis of the timeline and zooms with it (plots.py).

Values are taken at the end of each bin (plots.BINS per window), and a
band is drawn only at the bins where some band changed, so the drawing grows
with the events, not with the window."""

from __future__ import annotations

from html import escape

import polars as pl

from ...tools.render import human_bytes
from ...tools.tensors import BEFORE
from .plots import AXIS_H, BINS, LEFT, SERIES_COLOURS, XS, Window, byte_ticks, time_plot

#: call sites drawn on their own; the others are one band
TOP_SITES = 8
OTHERS = "(other call sites)"
BEFORE_COLOUR = "#d9d9d9"
OTHERS_COLOUR = "#bab0ac"
RESERVED_COLOUR = "#333333"


def _bands(steps: pl.DataFrame, timeline: pl.DataFrame) -> pl.DataFrame:
    """(band, order, delta_bytes, ts_ns) of one process and device: the top
    sites, the rest as OTHERS, and BEFORE (held - live where the allocator
    gives its total) as deltas."""
    live = steps.sort("ts_ns").with_columns(pl.col("delta_bytes").cum_sum().over("call_site").alias("_v"))
    rank = live.group_by("call_site").agg(pl.col("_v").max()).sort(["_v", "call_site"], descending=[True, False])
    top = rank["call_site"].head(TOP_SITES).to_list()
    order = pl.DataFrame({"band": [BEFORE, *top, OTHERS], "order": list(range(len(top) + 2))})
    sites = steps.with_columns(
        pl.when(pl.col("call_site").is_in(top)).then(pl.col("call_site")).otherwise(pl.lit(OTHERS)).alias("band"))
    before = timeline.sort("ts_ns", "delta_bytes").select(
        pl.lit(BEFORE).alias("band"), "ts_ns",
        (pl.col("held_bytes") - pl.col("live_bytes")).clip(lower_bound=0).diff().fill_null(
            (pl.col("held_bytes") - pl.col("live_bytes")).clip(lower_bound=0).first()).alias("delta_bytes"))
    return pl.concat([sites.select("band", "ts_ns", "delta_bytes"), before]).join(order, on="band")


def _stack(bands: pl.DataFrame, w: Window) -> pl.DataFrame:
    """Per band and per bin where anything changed: the band's bottom and top
    (bytes, stacked in band order), at the end of the bin."""
    at_bin = (
        bands.with_columns(w.bin(pl.col("ts_ns")).alias("bin"))
        .sort("ts_ns")
        .with_columns(pl.col("delta_bytes").cum_sum().over("band").alias("value"))
        .group_by("band", "order", "bin").agg(pl.col("value").last())
    )
    bins = at_bin.select("bin").unique()
    grid = bins.join(at_bin.select("band", "order").unique(), how="cross")
    return (
        grid.join(at_bin, on=["band", "order", "bin"], how="left")
        .sort("order", "bin")
        .with_columns(pl.col("value").forward_fill().over("band").fill_null(0).clip(lower_bound=0))
        .with_columns(pl.col("value").cum_sum().over("bin", order_by="order").alias("top"))
        .with_columns((pl.col("top") - pl.col("value")).alias("bottom"))
    )


def _one(key: tuple, steps: pl.DataFrame, timeline: pl.DataFrame, w: Window, height: int,
         colours: dict[str, str]) -> str:
    pid, device = key
    stacked = _stack(_bands(steps, timeline), w)
    reserved = timeline.filter(pl.col("reserved_bytes").is_not_null()).sort("ts_ns", "delta_bytes")
    ymax = max(int(stacked["top"].max() or 0), int(reserved["reserved_bytes"].max() or 0), 1)
    top_px = 10
    plot_h = height - AXIS_H - top_px
    base = top_px + plot_h
    bin_w = XS / BINS

    def y(v: pl.Expr) -> pl.Expr:
        return (top_px + plot_h - v * plot_h / ymax).round(1)

    # steps as plots.memory_svg draws them: a level holds from the start of its bin
    paths = (
        stacked.sort("order", "bin")
        .with_columns((pl.col("bin") * bin_w).round(1).alias("x0"), y(pl.col("top")).alias("yt"),
                      y(pl.col("bottom")).alias("yb"))
        .group_by("band", "order", maintain_order=True)
        .agg(pl.format("H{} V{}", "x0", "yt").str.join(" ").alias("upper"),
             pl.format("V{} H{}", "yb", "x0").reverse().str.join(" ").alias("lower"),
             pl.col("value").max().alias("most"))
        .filter(pl.col("most") > 0)
        .sort("order")
    )
    inner, outer, legend = [], [], []
    for v in byte_ticks(ymax):
        yy = round(top_px + plot_h - plot_h * v / ymax, 1)
        inner.append(f'<line class="grid" x1="0" y1="{yy}" x2="{XS}" y2="{yy}"/>')
        outer.append(f'<text class="tlabel" x="{LEFT - 6}" y="{yy + 4}" text-anchor="end">{human_bytes(v)}</text>')
    for row in paths.iter_rows(named=True):  # one row per band: ten at most
        colour = colours.get(row["band"], OTHERS_COLOUR)
        label = escape(row["band"])
        inner.append(
            f'<path class="band" data-band="{label}" fill="{colour}" stroke="{colour}" stroke-width="0.5" '
            f'd="M0,{base} {row["upper"]} H{XS} {row["lower"]} V{base} Z">'
            f"<title>{label}: at most {human_bytes(row['most'])}</title></path>"
        )
        legend.append(f'<span class="key"><svg width="10" height="10"><rect width="10" height="10" fill="{colour}"/>'
                      f"</svg>{label} (at most {human_bytes(row['most'])})</span>")
    if reserved.height:
        segs = reserved.with_columns(w.bin(pl.col("ts_ns")).alias("bin")).group_by("bin", maintain_order=True).agg(
            pl.col("reserved_bytes").last()).select(
            pl.format("H{} V{}", (pl.col("bin") * bin_w).round(1), y(pl.col("reserved_bytes")))).to_series()
        inner.append(f'<path class="reserved" fill="none" stroke="{RESERVED_COLOUR}" stroke-width="1.4" '
                     f'stroke-dasharray="4 3" d="M0,{base} {" ".join(segs)} H{XS}"><title>reserved by the allocator'
                     f"</title></path>")
        legend.append(f'<span class="key"><svg width="14" height="10"><line x1="0" y1="5" x2="14" y2="5" '
                      f'stroke="{RESERVED_COLOUR}" stroke-dasharray="4 3" stroke-width="2"/></svg>reserved '
                      f"(at most {human_bytes(int(reserved['reserved_bytes'].max()))})</span>")
    name = f"pid {pid} {device}"
    plot_id = "tensor-plot-" + "".join(c if c.isalnum() else "-" for c in f"{pid}-{device}")
    return (f"<h3>{escape(name)}</h3>" + time_plot(plot_id, f"tensor memory of {escape(name)}", w, height, outer, inner)
            + f'<div class="legend">{"".join(legend)}</div>')


def tensor_memory_svg(steps: pl.DataFrame, timeline: pl.DataFrame, w: Window, height: int = 240) -> str:
    """One stacked plot per (pid, device): `steps` from tools.tensors.site_steps,
    `timeline` from tools.tensors.tensor_timeline."""
    # one colour per call site on every plot, the most allocating sites first
    sites = steps.group_by("call_site").agg(pl.col("delta_bytes").clip(lower_bound=0).sum().alias("b")).sort(
        ["b", "call_site"], descending=[True, False])["call_site"].to_list()
    palette = [c for c in SERIES_COLOURS if c != OTHERS_COLOUR]
    colours = {BEFORE: BEFORE_COLOUR, OTHERS: OTHERS_COLOUR} | {
        site: palette[i % len(palette)] for i, site in enumerate(sites)}
    parts = []
    for key, part in timeline.group_by("pid", "device", maintain_order=True):
        mine = steps.filter((pl.col("pid") == key[0]) & (pl.col("device") == key[1]))
        parts.append(_one(key, mine, part, w, height, colours))
    return "".join(parts)
