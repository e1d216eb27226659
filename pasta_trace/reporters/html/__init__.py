"""The HTML report (`report --html`): one self-contained page.

    page.py         the page builder: facts, findings, sections, tool tables; HtmlReporter
    plots.py        the time plots (timeline, device memory) on one zoomable axis
    tensors.py      tensor memory stacked by call site, on the same axis
    flame.py        flame graphs as SVG
    heatmap.py      the hotness heat map (pages x kernel executions)
    page.html       the page's skeleton, a string.Template
    style.css       its style sheet
    script.js       its one small script

The three files are package data, inlined into every page when it is
rendered: the page loads nothing from anywhere.  The script only adds to a
page that reads well without it: it fits the time plots to the window, zooms
them (drag across a plot to zoom into that range; ctrl+wheel; the buttons),
labels kernels where their names fit, sorts tables by a click on a header,
and shows the frame under the pointer in a flame graph."""

from .page import HtmlReporter, render_html

__all__ = ["HtmlReporter", "render_html"]
