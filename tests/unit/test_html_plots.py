"""The HTML report's time plots: memory keeps each bin's minimum and maximum
(a free between two allocations in one bin still shows), and marks sit in
data units across the plotted window."""

from __future__ import annotations

import re

import polars as pl

from pasta_trace.reporters.html import plots as html_plots
from pasta_trace.reporters.html.plots import XS, Window


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


def test_tensor_memory_is_stacked_by_call_site_over_the_bytes_from_before() -> None:
    """Site A holds 100 B from 0.25 s to 0.75 s, site B 50 B from 0.5 s; the allocator also held 40 B from before
    the capture, and reserved 404 B (y = 212 - bytes / 2 on a 240 px plot)."""
    from pasta_trace.reporters.html.tensors import tensor_memory_svg

    steps = pl.DataFrame({"pid": [1] * 3, "device": ["cuda:0"] * 3, "call_site": ["a.py:1 A", "b.py:2 B", "a.py:1 A"],
                          "ts_ns": [250_000_000, 500_000_000, 750_000_000], "delta_bytes": [100, 50, -100]})
    timeline = pl.DataFrame({"pid": [1] * 3, "device": ["cuda:0"] * 3, "ts_ns": steps["ts_ns"],
                             "delta_bytes": [100, 50, -100], "live_bytes": [100, 150, 50], "held_bytes": [140, 190, 90],
                             "reserved_bytes": [404] * 3})
    svg = tensor_memory_svg(steps, timeline, Window(0, 1_000_000_000, 0), height=240)
    bands = re.findall(r'<path class="band" data-band="([^"]*)" fill="([^"]*)"[^>]* d="([^"]*)"', svg)
    x = ["250000.0", "500000.0", "750000.0"]
    assert bands == [
        ("(allocated before the capture)", "#d9d9d9",
         f"M0,212 H{x[0]} V192.0 H{x[1]} V192.0 H{x[2]} V192.0 H{XS} "
         f"V212.0 H{x[2]} V212.0 H{x[1]} V212.0 H{x[0]} V212 Z"),
        ("a.py:1 A", "#4e79a7",
         f"M0,212 H{x[0]} V142.0 H{x[1]} V142.0 H{x[2]} V192.0 H{XS} "
         f"V192.0 H{x[2]} V192.0 H{x[1]} V192.0 H{x[0]} V212 Z"),
        ("b.py:2 B", "#f28e2b",
         f"M0,212 H{x[0]} V142.0 H{x[1]} V117.0 H{x[2]} V167.0 H{XS} "
         f"V192.0 H{x[2]} V142.0 H{x[1]} V142.0 H{x[0]} V212 Z"),
    ]
    reserved = re.search(r'<path class="reserved"[^>]* d="([^"]*)"', svg).group(1)
    assert reserved == f"M0,212 H{x[0]} V10.0 H{x[1]} V10.0 H{x[2]} V10.0 H{XS}"
    assert re.findall(r"</svg>([^<]+)</span>", svg) == [
        "(allocated before the capture) (at most 40 B)", "a.py:1 A (at most 100 B)", "b.py:2 B (at most 50 B)",
        "reserved (at most 404 B)"]
    assert re.findall(r"<h3>([^<]+)</h3>", svg) == ["pid 1 cuda:0"]
    assert 'id="tensor-plot-1-cuda-0" class="plot tplot"' in svg
