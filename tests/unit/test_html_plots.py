"""The HTML report's time plots: memory keeps each bin's minimum and maximum
(a free between two allocations in one bin still shows), and marks sit in
data units across the plotted window."""

from __future__ import annotations

import re

import polars as pl

from pasta_trace.export import html_plots
from pasta_trace.export.html_plots import XS, Window


def test_memory_keeps_each_bins_minimum_and_maximum() -> None:
    # one bin is 1e9 / BINS ns wide: 100 -> 150 -> 0 -> 100 bytes live within 30 ns at 0.5 s
    ts = [500_000_000 + i for i in (0, 10, 20, 30)]
    tl = pl.DataFrame({"pid": [1] * 4, "ts_ns": ts, "delta_bytes": [100, 50, -150, 100]})
    tl = tl.with_columns(pl.col("delta_bytes").cum_sum().alias("live_bytes"))
    svg = html_plots.memory_svg(tl, Window(0, 1_000_000_000, 0), height=260)
    path = re.search(r'<path class="series"[^>]* d="([^"]*)"', svg).group(1)
    # plot area: y = 10 (150 bytes) to 232 (0 bytes); the bin rises to 150, drops to 0, settles at 100
    assert path == f"M0,232 H{XS // 2}.0 V10.0 V232.0 V84.0 H{XS}"


def test_marks_are_placed_in_data_units_with_labels_from_the_capture_start() -> None:
    w = Window(t0=2_000_000_000, t1=4_000_000_000, origin=1_000_000_000)
    assert html_plots.tick_label(1_500_000_000, 500_000_000) == "1.5 s"
    assert html_plots.tick_label(2_000_000, 1_000_000) == "2 ms"
    assert html_plots.tick_label(250_000, 50_000) == "250 µs"
    axis = html_plots._time_axis(100, w)
    # the window is 1 s to 3 s after the capture started: ticks every 0.5 s, from 1.0 s
    assert re.findall(r'>([^<]+)</text>', axis) == ["1.0 s", "1.5 s", "2.0 s", "2.5 s", "3.0 s"]
    assert pl.select(w.x(pl.lit(3_000_000_000))).item() == XS / 2
