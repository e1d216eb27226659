"""The HTML report's hotness heat map: pages (rows) x kernel executions
(columns), inline SVG scaled to the page's width."""

from __future__ import annotations

import math
from html import escape

import polars as pl

from .plots import LEFT, PLOT_W, WIDTH, esc

_LIGHT = (255, 245, 235)
_DARK = (127, 39, 4)


def heatmap_svg(matrix: pl.DataFrame) -> str:
    """Pages (rows, address order) x kernel executions (columns, in launch time order);
    colour is log(1 + accesses) against the hottest cell."""
    rows = matrix.select("pid", "page", "page_shift").unique(["pid", "page"]).sort(["pid", "page"]).with_row_index("r")
    cols = (
        matrix.select("pid", "launch_id", "name", "launch_ts_ns").unique(["pid", "launch_id"])
        .sort(["launch_ts_ns", "pid", "launch_id"], nulls_last=True).with_row_index("c")
    )
    cw = max(min(16.0, PLOT_W / max(cols.height, 1)), 2.0)
    ch = max(min(12.0, 640 / max(rows.height, 1)), 2.0)
    top = 8
    col_label_h = 70
    height = int(top + rows.height * ch + col_label_h)
    peak = math.log1p(int(matrix["count"].max()))
    t = pl.col("count").log1p() / peak
    channel = [(_LIGHT[i] + (pl.lit(_DARK[i] - _LIGHT[i]) * t)).round(0).cast(pl.Int64) for i in range(3)]
    cells = (
        matrix.join(rows.select("pid", "page", "r"), on=["pid", "page"])
        .join(cols.select("pid", "launch_id", "c"), on=["pid", "launch_id"])
        .select(
            pl.format(
                '<rect class="cell" x="{}" y="{}" width="{}" height="{}" fill="rgb({},{},{})">'
                "<title>pid {} page {} · launch {} {} · {} accesses</title></rect>",
                (LEFT + pl.col("c") * cw).round(1), (top + pl.col("r") * ch).round(1), pl.lit(round(cw - 0.5, 1)),
                pl.lit(round(ch - 0.5, 1)), *channel, "pid", "page", "launch_id", esc(pl.col("name")), "count",
            ).alias("svg")
        )["svg"]
    )
    step = max(1, math.ceil(12 / ch))  # label every page only when rows are tall enough
    labels = [
        f'<text class="lane" x="{LEFT - 6}" y="{top + r * ch + ch - 1:.1f}" text-anchor="end">'
        f"pid {pid} 0x{page << shift:x}</text>"
        for r, pid, page, shift in rows.select("r", "pid", "page", "page_shift").iter_rows()
        if r % step == 0
    ]
    cstep = max(1, math.ceil(18 / cw))  # rotated labels need about 18 px apart not to overlap
    yl = top + rows.height * ch + 6
    labels += [
        f'<text class="tlabel" transform="translate({LEFT + c * cw + cw / 2:.1f},{yl:.1f}) rotate(60)">'
        f"{pid}#{lid} {escape(str(name or '?'))[:14]}</text>"
        for c, pid, lid, name in cols.select("c", "pid", "launch_id", "name").iter_rows()
        if c % cstep == 0
    ]
    return (
        f'<svg id="heatmap-plot" class="plot" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" '
        f'role="img" aria-label="hotness heat map">' + "".join(labels) + "".join(cells) + "</svg>"
        + '<div class="legend"><span class="key">fewer accesses</span>'
        + '<span class="ramp"></span><span class="key">more (log scale)</span></div>'
    )
