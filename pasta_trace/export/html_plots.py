"""Inline SVG plots for the HTML report, generated in Python: no script, no
network.  Marks are built as columns of SVG text with Polars expressions and
thinned to one per pixel, so a plot's size does not grow with the capture."""

from __future__ import annotations

import math
from html import escape

import polars as pl

from .. import schema
from ..tools.render import human_bytes, human_ns

WIDTH = 1000
LEFT = 190  # room for lane labels
RIGHT = 20
PLOT_W = WIDTH - LEFT - RIGHT
AXIS_H = 28
TICKS = 6

#: Fill per event kind (classes ev-<kind> in the page's CSS use the same).
KIND_COLOURS = {
    "launch": "#4e79a7", "alloc": "#59a14f", "free": "#9c755f", "memcpy": "#f28e2b", "memset": "#edc948",
    "sync": "#e15759", "graph": "#76b7b2", "module": "#b07aa1", "other": "#bab0ac",
}
SERIES_COLOURS = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7",
                  "#9c755f", "#bab0ac"]
KERNEL_COLOUR = "#2f4b7c"


def css() -> str:
    kinds = "".join(f".ev-{k}{{fill:{c}}}" for k, c in KIND_COLOURS.items())
    return kinds + f".kern{{fill:{KERNEL_COLOUR}}}"


def _esc(e: pl.Expr) -> pl.Expr:
    """Escape text for SVG/HTML inside a Polars expression."""
    return (
        e.cast(pl.String).fill_null("?")
        .str.replace_all("&", "&amp;", literal=True)
        .str.replace_all("<", "&lt;", literal=True)
        .str.replace_all(">", "&gt;", literal=True)
        .str.replace_all('"', "&quot;", literal=True)
    )


def _px(ts: pl.Expr, t0: int, span: int) -> pl.Expr:
    # integer pixel column of a timestamp, clamped into the plot
    return ((ts - t0) * PLOT_W // span).clip(0, PLOT_W - 1).cast(pl.Int64)


def _seconds(ts: pl.Expr, t0: int) -> pl.Expr:
    return ((ts - t0) / 1e9).round(6).cast(pl.String)


def nice_step(span: float, ticks: int = TICKS) -> float:
    """A 1-2-5 step that cuts `span` into at most about `ticks` pieces."""
    raw = span / ticks
    mag = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1
    return next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)


def _time_axis(y: int, span: int) -> str:
    parts = [f'<line class="axis" x1="{LEFT}" y1="{y}" x2="{LEFT + PLOT_W}" y2="{y}"/>']
    step = nice_step(span)
    for i in range(int(span // step) + 1):
        x = LEFT + PLOT_W * (i * step) / span
        parts.append(
            f'<line class="tick" x1="{x:.1f}" y1="{y}" x2="{x:.1f}" y2="{y + 4}"/>'
            f'<text class="tlabel" x="{x:.1f}" y="{y + 16}" text-anchor="middle">+{human_ns(i * step)}</text>'
        )
    return "".join(parts)


def _byte_ticks(top: int) -> list[int]:
    """Tick values for a byte axis: 1-2-5 steps in the binary unit that fits `top`."""
    unit = 1024 ** min(4, max(0, int(math.log(max(top, 1), 1024))))
    step = max(1, int(nice_step(top / unit, 4) * unit))
    return list(range(0, top + 1, step))


def timeline_svg(events: pl.LazyFrame, kernels: pl.LazyFrame, t0: int, t1: int) -> str:
    """One lane per host thread (a thin band per event kind) and one per GPU
    stream (kernel executions, with device timing)."""
    span = max(t1 - t0, 1)
    host = (
        events.select("pid", "tid", pl.col("kind").cast(pl.String), "ts_ns")
        .with_columns(_px(pl.col("ts_ns"), t0, span).alias("px"))
        .group_by("pid", "tid", "kind", "px")
        .agg(pl.len().alias("n"), pl.col("ts_ns").min())
        .collect(engine="streaming")
    )
    kinds = [k for k in schema.KIND_NAMES if k in set(host["kind"].to_list())]
    band = 4
    host_lanes = host.select("pid", "tid").unique().sort(["pid", "tid"]).with_row_index("lane")
    lane_h = max(band * len(kinds), 12) + 6
    gpu = (
        kernels.filter(pl.col("gpu_start_ns").is_not_null() & pl.col("gpu_end_ns").is_not_null())
        .with_columns(
            _px(pl.col("gpu_start_ns"), t0, span).alias("px0"),
            _px(pl.col("gpu_end_ns"), t0, span).alias("px1"),
        )
        .group_by("pid", "device", "stream", "px0", "px1")
        .agg(pl.len().alias("n"), pl.col("name").first(), pl.col("gpu_start_ns").min(), pl.col("gpu_end_ns").max())
        .collect(engine="streaming")
    )
    gpu_lanes = gpu.select("pid", "device", "stream").unique().sort(["pid", "device", "stream"]).with_row_index("lane")
    top = 6
    gpu_top = top + host_lanes.height * lane_h
    height = gpu_top + gpu_lanes.height * 20 + AXIS_H + 6

    kind_idx = pl.DataFrame({"kind": kinds, "k": list(range(len(kinds)))})
    ev_marks = (
        host.join(host_lanes, on=["pid", "tid"]).join(kind_idx, on="kind")
        .select(
            pl.format(
                '<rect class="ev ev-{}" x="{}" y="{}" width="2" height="{}"><title>{} {} call(s) · pid {} tid {} · +{} s</title></rect>',
                "kind", LEFT + pl.col("px"), top + pl.col("lane") * lane_h + pl.col("k") * band, pl.lit(band),
                "n", "kind", "pid", "tid", _seconds(pl.col("ts_ns"), t0),
            ).alias("svg")
        )["svg"]
    )
    k_marks = (
        gpu.join(gpu_lanes, on=["pid", "device", "stream"], nulls_equal=True)
        .select(
            pl.format(
                '<rect class="kern" x="{}" y="{}" width="{}" height="14"><title>{} kernel(s): {} · pid {} · +{} s to +{} s</title></rect>',
                LEFT + pl.col("px0"), gpu_top + pl.col("lane") * 20, (pl.col("px1") - pl.col("px0")).clip(2),
                "n", _esc(pl.col("name")), "pid", _seconds(pl.col("gpu_start_ns"), t0),
                _seconds(pl.col("gpu_end_ns"), t0),
            ).alias("svg")
        )["svg"]
    )
    labels = [
        f'<text class="lane" x="{LEFT - 8}" y="{top + i * lane_h + lane_h / 2}" text-anchor="end">pid {pid} tid {tid}</text>'
        for i, pid, tid in host_lanes.select("lane", "pid", "tid").iter_rows()
    ] + [
        f'<text class="lane" x="{LEFT - 8}" y="{gpu_top + i * 20 + 11}" text-anchor="end">'
        f'pid {pid} gpu{"?" if dev is None else dev} {"?" if stream is None else hex(stream)}</text>'
        for i, pid, dev, stream in gpu_lanes.select("lane", "pid", "device", "stream").iter_rows()
    ]
    legend = "".join(
        f'<span class="key"><svg width="10" height="10"><rect class="ev-{k}" width="10" height="10"/></svg>{k}</span>'
        for k in kinds
    ) + (f'<span class="key"><svg width="10" height="10"><rect class="kern" width="10" height="10"/></svg>GPU kernel</span>'
         if gpu.height else "")
    return (
        f'<svg id="timeline-plot" class="plot" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" '
        f'role="img" aria-label="timeline">'
        + "".join(labels) + "".join(ev_marks) + "".join(k_marks)
        + _time_axis(height - AXIS_H, span) + "</svg>"
        + f'<div class="legend">{legend}</div>'
    )


def memory_svg(timeline: pl.DataFrame, t0: int, t1: int, height: int = 260) -> str:
    """Live device bytes per process as step lines (one path per process), with
    the peak marked.  Within one pixel the line rises to that pixel's maximum and
    settles at its last value, so no peak is lost to thinning."""
    span = max(t1 - t0, 1)
    ymax = max(int(timeline["live_bytes"].max() or 0), 1)
    plot_h = height - AXIS_H - 10
    top = 10

    def y(v: pl.Expr) -> pl.Expr:
        return (top + plot_h - v * plot_h / ymax).round(1)

    pts = (
        timeline.lazy().sort(["pid", "ts_ns", "delta_bytes"])
        .with_columns(_px(pl.col("ts_ns"), t0, span).alias("px"))
        .group_by(["pid", "px"], maintain_order=True)
        .agg(pl.col("live_bytes").max().alias("hi"), pl.col("live_bytes").last().alias("last"))
        .with_columns(pl.format("H{} V{} V{}", LEFT + pl.col("px"), y(pl.col("hi")), y(pl.col("last"))).alias("seg"))
        .group_by("pid", maintain_order=True)
        .agg(pl.col("seg").str.join(" "), pl.col("last").last(), pl.col("hi").max().alias("peak"),
             pl.col("px").get(pl.col("hi").arg_max()).alias("peak_px"))
        .sort("pid")
        .collect(engine="streaming")
    )
    parts = []
    legend = []
    base = top + plot_h
    for i, row in enumerate(pts.iter_rows(named=True)):
        colour = SERIES_COLOURS[i % len(SERIES_COLOURS)]
        label = f"pid {row['pid']}"
        end_y = round(top + plot_h - row["last"] * plot_h / ymax, 1)
        parts.append(
            f'<path class="series" data-series="{escape(label)}" fill="none" stroke="{colour}" stroke-width="1.6" '
            f'd="M{LEFT},{base} {row["seg"]} H{LEFT + PLOT_W} V{end_y}"><title>{escape(label)}</title></path>'
        )
        peak_y = round(top + plot_h - row["peak"] * plot_h / ymax, 1)
        parts.append(
            f'<circle class="peak" cx="{LEFT + row["peak_px"]}" cy="{peak_y}" r="3.5" fill="{colour}">'
            f'<title>{escape(label)} peak {human_bytes(row["peak"])}</title></circle>'
        )
        legend.append(
            f'<span class="key"><svg width="14" height="10"><line x1="0" y1="5" x2="14" y2="5" stroke="{colour}" '
            f'stroke-width="2"/></svg>{escape(label)} (peak {human_bytes(row["peak"])})</span>'
        )
    for v in _byte_ticks(ymax):
        yy = round(top + plot_h - plot_h * v / ymax, 1)
        parts.append(
            f'<line class="grid" x1="{LEFT}" y1="{yy}" x2="{LEFT + PLOT_W}" y2="{yy}"/>'
            f'<text class="tlabel" x="{LEFT - 6}" y="{yy + 4}" text-anchor="end">{human_bytes(v)}</text>'
        )
    return (
        f'<svg id="memory-plot" class="plot" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" '
        f'role="img" aria-label="live device memory">'
        + "".join(parts) + _time_axis(height - AXIS_H, span) + "</svg>"
        + f'<div class="legend">{"".join(legend)}</div>'
    )


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
                pl.lit(round(ch - 0.5, 1)), *channel, "pid", "page", "launch_id", _esc(pl.col("name")), "count",
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
    cstep = max(1, math.ceil(12 / cw))
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
