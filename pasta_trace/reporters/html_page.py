"""The HTML report: one self-contained page (see export.html)."""

from __future__ import annotations

from typing import TextIO

from ..export.html import render_html
from .results import Results


class HtmlReporter:
    def render(self, results: Results, out: TextIO) -> None:
        out.write(render_html(results.cap, results.facts, results.tools, results.findings))
