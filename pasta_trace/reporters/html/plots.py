"""The HTML report's time plots, inline SVG generated in Python: the timeline
(API calls per host thread, kernel executions per GPU stream) and live device
memory per process, on one time axis that the page's script zooms and pans.

Marks are placed in data units (XS across the plotted window) inside a nested
<svg> stretched to the plot's width, so zooming is a change of its viewBox.
Strokes do not scale, so a mark keeps its thickness at any zoom.  Marks are
binned (BINS per lane, two per pixel at the default width), so a plot's size
does not grow with the capture: memory keeps each bin's minimum and maximum,
so short-lived frees and peaks both show."""

from __future__ import annotations

import math
from dataclasses import dataclass
from html import escape

import polars as pl

from ... import schema
from ...tools.render import human_bytes, human_ns

WIDTH = 1000  # the drawing's width until the page's script fits it to the window
LEFT = 190  # room for lane labels
RIGHT = 20
PLOT_W = WIDTH - LEFT - RIGHT
AXIS_H = 28
TICKS = 6
XS = 1_000_000  # data x units across the plotted window
BINS = 2 * PLOT_W  # twice per pixel at the default width: detail for a first zoom, at twice the size

#: Fill per event kind (classes ev-<kind> in the page's CSS use the same).
KIND_COLOURS = {
    "launch": "#4e79a7", "alloc": "#59a14f", "free": "#9c755f", "memcpy": "#f28e2b", "memset": "#edc948",
    "sync": "#e15759", "graph": "#76b7b2", "module": "#b07aa1", "other": "#bab0ac",
    "tensor_alloc": "#8cd17d", "tensor_free": "#d4a6c8",
}
SERIES_COLOURS = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7",
                  "#9c755f", "#bab0ac"]
KERNEL_COLOUR = "#2f4b7c"


def css() -> str:
    kinds = "".join(f".ev-{k}{{fill:{c};stroke:{c}}}" for k, c in KIND_COLOURS.items())
    return kinds + f".kern{{fill:{KERNEL_COLOUR};stroke:{KERNEL_COLOUR}}}"


def esc(e: pl.Expr) -> pl.Expr:
    """Escape text for SVG/HTML inside a Polars expression."""
    return (
        e.cast(pl.String).fill_null("?")
        .str.replace_all("&", "&amp;", literal=True)
        .str.replace_all("<", "&lt;", literal=True)
        .str.replace_all(">", "&gt;", literal=True)
        .str.replace_all('"', "&quot;", literal=True)
    )


@dataclass(frozen=True)
class Window:
    """The plotted time window [t0, t1] (ns CLOCK_MONOTONIC), and the origin
    its labels count from: the capture's start, as in the tables."""

    t0: int
    t1: int
    origin: int

    @property
    def span(self) -> int:
        return max(self.t1 - self.t0, 1)

    def bin(self, ts: pl.Expr) -> pl.Expr:
        return ((ts - self.t0) * BINS // self.span).clip(0, BINS - 1).cast(pl.Int64)

    def x(self, ts: pl.Expr) -> pl.Expr:
        """Data x of a timestamp, to a tenth of a unit (XS across the window)."""
        return ((ts - self.t0) * XS / self.span).clip(0, XS).round(1)

    def seconds(self, ts: pl.Expr) -> pl.Expr:
        """Seconds after the origin to the microsecond, as the tables write them ("0.000003", not "3e-6")."""
        us = (ts - self.origin + 500) // 1000  # to the nearest microsecond
        sign = pl.when(us < 0).then(pl.lit("-")).otherwise(pl.lit(""))
        return pl.format("{}{}.{}", sign, us.abs() // 1_000_000,
                         (us.abs() % 1_000_000).cast(pl.String).str.zfill(6))


def nice_step(span: float, ticks: int = TICKS) -> float:
    """A 1-2-5 step that cuts `span` into at most about `ticks` pieces."""
    raw = span / ticks
    mag = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1
    return next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)


def tick_label(ns: float, step: float) -> str:
    """A time after the origin in the unit of the tick step (the page's script does the same)."""
    # the largest unit in which the step has at most one decimal
    unit, scale = next(((u, s) for u, s in (("s", 1e9), ("ms", 1e6), ("µs", 1e3)) if step >= s / 10), ("ns", 1.0))
    places = max(0, -math.floor(math.log10(step / scale) + 1e-9))
    return f"{ns / scale:.{places}f} {unit}"


def _time_axis(y: int, w: Window) -> str:
    """Ticks for the whole window, at the default width, until the script redraws them."""
    step = nice_step(w.span)
    a = w.t0 - w.origin
    first = math.ceil(a / step) * step
    parts = [f'<line class="axis" x1="{LEFT}" y1="{y}" x2="{LEFT + PLOT_W}" y2="{y}"/>']
    for i in range(int((a + w.span - first) // step) + 1):
        t = first + i * step
        x = LEFT + PLOT_W * (t - a) / w.span
        parts.append(
            f'<line class="tick" x1="{x:.1f}" y1="{y}" x2="{x:.1f}" y2="{y + 4}"/>'
            f'<text class="tlabel" x="{x:.1f}" y="{y + 16}" text-anchor="middle">{tick_label(t, step)}</text>'
        )
    return f'<g class="taxis">{"".join(parts)}</g>'


def time_plot(pid: str, label: str, w: Window, height: int, outer: list[str], inner: list[str]) -> str:
    """The outer SVG (labels, axis) around the zoomable view of the marks."""
    view_h = height - AXIS_H
    return (
        f'<svg id="{pid}" class="plot tplot" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" '
        f'role="img" aria-label="{label}" data-offset="{w.t0 - w.origin}" data-span="{w.span}" data-xs="{XS}" '
        f'data-left="{LEFT}" data-right="{RIGHT}">'
        + "".join(outer)
        + f'<svg class="view" x="{LEFT}" y="0" width="{PLOT_W}" height="{view_h}" '
        f'viewBox="0 0 {XS} {view_h}" preserveAspectRatio="none">'
        + f'<rect class="bg" x="0" y="0" width="{XS}" height="{view_h}"/>'
        + "".join(inner) + "</svg>"
        + '<g class="klabels"></g>' + _time_axis(height - AXIS_H, w) + "</svg>"
    )


def timeline_svg(events: pl.LazyFrame, kernels: pl.LazyFrame, w: Window) -> str:
    """One lane per host thread (a thin band per event kind) and one per GPU
    stream (kernel executions, with device timing)."""
    host = (
        events.select("pid", "tid", pl.col("kind").cast(pl.String), "ts_ns",
                      (pl.col("ts_ns") + pl.col("dur_ns").fill_null(0)).alias("end_ns"))
        .with_columns(w.bin(pl.col("ts_ns")).alias("bin"))
        .group_by("pid", "tid", "kind", "bin")
        .agg(pl.len().alias("n"), pl.col("ts_ns").min(), pl.col("end_ns").max())
        .collect(engine="streaming")
    )
    kinds = [k for k in schema.KIND_NAMES if k in set(host["kind"].to_list())]
    band = 4
    host_lanes = host.select("pid", "tid").unique().sort(["pid", "tid"]).with_row_index("lane")
    lane_h = max(band * len(kinds), 12) + 6
    gpu = (
        kernels.filter(pl.col("gpu_start_ns").is_not_null() & pl.col("gpu_end_ns").is_not_null())
        .with_columns(w.bin(pl.col("gpu_start_ns")).alias("b0"), w.bin(pl.col("gpu_end_ns")).alias("b1"))
        .group_by("pid", "device", "stream", "b0", "b1")
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
                '<rect class="ev ev-{}" x="{}" y="{}" width="{}" height="{}"><title>{} {} call(s) · pid {} tid {} · '
                "{} s to {} s</title></rect>",
                # from the bin's first call to the end of its last: what a closer look finds there; 2 px of
                # stroke around keep a mark visible at any zoom, and fill its band
                "kind", w.x(pl.col("ts_ns")), top + 1 + pl.col("lane") * lane_h + pl.col("k") * band,
                (w.x(pl.col("end_ns")) - w.x(pl.col("ts_ns"))).clip(0.1).round(1), pl.lit(band - 2),
                "n", "kind", "pid", "tid", w.seconds(pl.col("ts_ns")), w.seconds(pl.col("end_ns")),
            ).alias("svg")
        )["svg"]
    )
    k_marks = (
        gpu.join(gpu_lanes, on=["pid", "device", "stream"], nulls_equal=True)
        .select(
            pl.format(
                '<rect class="kern" x="{}" y="{}" width="{}" height="14" data-name="{}"><title>{} kernel(s): {} · '
                "pid {} · {} s to {} s</title></rect>",
                w.x(pl.col("gpu_start_ns")), gpu_top + pl.col("lane") * 20,
                (w.x(pl.col("gpu_end_ns")) - w.x(pl.col("gpu_start_ns"))).round(1), esc(pl.col("name")),
                "n", esc(pl.col("name")), "pid", w.seconds(pl.col("gpu_start_ns")), w.seconds(pl.col("gpu_end_ns")),
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
    ) + ('<span class="key"><svg width="10" height="10"><rect class="kern" width="10" height="10"/></svg>GPU kernel</span>'
         if gpu.height else "")
    return (time_plot("timeline-plot", "timeline", w, height, labels, [*ev_marks, *k_marks])
            + f'<div class="legend">{legend}</div>')


def byte_ticks(top: int) -> list[int]:
    """Tick values for a byte axis: 1-2-5 steps in the binary unit that fits `top`."""
    unit = 1024 ** min(4, max(0, int(math.log(max(top, 1), 1024))))
    step = max(1, int(nice_step(top / unit, 4) * unit))
    return list(range(0, top + 1, step))


def memory_svg(timeline: pl.DataFrame, w: Window, height: int = 260) -> str:
    """Live device bytes per process as step lines (one path per process), with
    the peak marked.  Within one bin the line spans the bin's minimum and
    maximum and settles at its last value, so neither a peak nor a dip is lost."""
    ymax = max(int(timeline["live_bytes"].max() or 0), 1)
    top = 10
    plot_h = height - AXIS_H - top
    bin_w = XS / BINS

    def y(v: pl.Expr) -> pl.Expr:
        return (top + plot_h - v * plot_h / ymax).round(1)

    pts = (
        timeline.lazy().sort(["pid", "ts_ns", "delta_bytes"])
        .with_columns(w.bin(pl.col("ts_ns")).alias("bin"))
        .group_by(["pid", "bin"], maintain_order=True)
        .agg(pl.col("live_bytes").max().alias("hi"), pl.col("live_bytes").min().alias("lo"),
             pl.col("live_bytes").last().alias("last"),
             pl.col("ts_ns").get(pl.col("live_bytes").arg_max()).alias("hi_ts"))
        .with_columns(pl.format("H{} V{} V{} V{}", (pl.col("bin") * bin_w).round(1), y(pl.col("hi")),
                                y(pl.col("lo")), y(pl.col("last"))).alias("seg"))
        .group_by("pid", maintain_order=True)
        .agg(pl.col("seg").str.join(" "), pl.col("last").last(), pl.col("hi").max().alias("peak"),
             pl.col("bin").get(pl.col("hi").arg_max()).alias("peak_bin"),
             pl.col("hi_ts").get(pl.col("hi").arg_max()).alias("peak_ts"))
        .sort("pid")
        .collect(engine="streaming")
    )
    inner, outer, legend = [], [], []
    base = top + plot_h
    for v in byte_ticks(ymax):
        yy = round(top + plot_h - plot_h * v / ymax, 1)
        inner.append(f'<line class="grid" x1="0" y1="{yy}" x2="{XS}" y2="{yy}"/>')
        outer.append(f'<text class="tlabel" x="{LEFT - 6}" y="{yy + 4}" text-anchor="end">{human_bytes(v)}</text>')
    for i, row in enumerate(pts.iter_rows(named=True)):  # one row per process
        colour = SERIES_COLOURS[i % len(SERIES_COLOURS)]
        label = f"pid {row['pid']}"
        inner.append(
            f'<path class="series" data-series="{escape(label)}" fill="none" stroke="{colour}" stroke-width="1.6" '
            f'd="M0,{base} {row["seg"]} H{XS}"><title>{escape(label)}</title></path>'
        )
        # a round cap on a line of no length: a dot that stays round however the view stretches
        px, py = round(row["peak_bin"] * bin_w, 1), round(top + plot_h - row["peak"] * plot_h / ymax, 1)
        inner.append(
            f'<line class="peak" x1="{px}" y1="{py}" x2="{px}" y2="{py}" stroke="{colour}">'
            f'<title>{escape(label)} peak {human_bytes(row["peak"])} at '
            f'{(row["peak_ts"] - w.origin) / 1e9:.6f} s</title></line>'
        )
        legend.append(
            f'<span class="key"><svg width="14" height="10"><line x1="0" y1="5" x2="14" y2="5" stroke="{colour}" '
            f'stroke-width="2"/></svg>{escape(label)} (peak {human_bytes(row["peak"])})</span>'
        )
    return (time_plot("memory-plot", "live device memory", w, height, outer, inner)
            + f'<div class="legend">{"".join(legend)}</div>')


def time_span_note(w: Window) -> str:
    late = w.t0 - w.origin
    return f" ({human_ns(late)} after tracing started)" if late > 0 else ""
