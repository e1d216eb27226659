"""Flame graphs in the HTML report: self-contained SVG, one <rect> per frame
node (tools.flame), the root on top and each caller above its callees, widths
in percent so that the graph fills the page at any width.  Hovering a frame
shows "function (file:line)", its weight and share (its <title>, and the line
under the graph, which the page's script fills)."""

from __future__ import annotations

from html import escape

import polars as pl

from ...tools.flame import Flame
from ...tools.render import scale
from .plots import esc

ROW_H = 18
#: frames narrower than this share of the whole (half a pixel at 1000 px) are left out
MIN_SHARE = 0.0005
#: frames at least this wide get a label (clipped to the frame)
LABEL_SHARE = 0.02
#: warm colours for Python frames, cool ones for native frames, picked by the label's hash
WARM = ["#f2a65a", "#ee8f4b", "#e9724c", "#f3c26b", "#e4584e", "#f0b35e", "#dd6b3d", "#f6d27c"]
COOL = ["#7fb3d5", "#76a5c8", "#8cc0d6", "#6f97bd"]
PLAIN = {"root": "#9aa5b1", "process": "#bcc5cf", "none": "#d9dee4"}


def _pick(colours: list[str], h: pl.Expr) -> pl.Expr:
    return pl.concat_list([pl.lit(c) for c in colours]).list.get((h % len(colours)).cast(pl.Int64))


def _fill(kind: pl.Expr, label: pl.Expr) -> pl.Expr:
    h = label.hash(seed=7)
    fill = pl.when(kind == "native").then(_pick(COOL, h))
    for k, c in PLAIN.items():
        fill = fill.when(kind == k).then(pl.lit(c))
    return fill.otherwise(_pick(WARM, h))


def flame_svg(flame: Flame) -> str:
    """The graph, or a note when nothing weighs anything."""
    if flame.total <= 0:
        return '<p class="note">nothing to show</p>'
    unit, div, places = scale("weight_ns" if flame.unit == "ns" else "weight_bytes", flame.total)
    share = pl.col("width") / flame.total
    nodes = flame.nodes.filter(share >= MIN_SHARE)
    height = (int(nodes["level"].max()) + 1) * ROW_H
    x = (pl.col("x0") * 100 / flame.total).round(4)
    w = (pl.col("width") * 100 / flame.total).round(4)
    y = pl.col("level") * ROW_H
    title = pl.format("{} · {} {} ({}%)", esc(pl.col("label")), (pl.col("width") / div).round(places),
                      pl.lit(unit), (share * 100).round(1))
    label = pl.when(share >= LABEL_SHARE).then(
        pl.format('<svg class="fl" x="{}%" y="{}" width="{}%" height="{}"><text x="4" y="13">{}</text></svg>',
                  x, y, w, pl.lit(ROW_H - 1), esc(pl.col("label")))
    ).otherwise(pl.lit(""))
    marks = nodes.select(
        pl.format('<rect class="fr" x="{}%" y="{}" width="{}%" height="{}" fill="{}"><title>{}</title></rect>{}',
                  x, y, w, pl.lit(ROW_H - 1), _fill(pl.col("kind"), pl.col("label")), title, label).alias("svg")
    )["svg"]
    return (
        f'<svg id="flame-{flame.name}" class="flame" width="100%" height="{height}" role="img" '
        f'aria-label="flame graph: {escape(flame.title)}">' + "".join(marks) + "</svg>"
        f'<div class="flame-detail" id="flame-{flame.name}-detail">hover over a frame for its details</div>'
    )
