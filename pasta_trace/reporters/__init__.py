"""Reporters: every way `report` and `export` write the tools' results, behind
one protocol, `render(results, out)`.  A verb gathers the Results once (the
merge, the capture's facts, every selected tool) and hands them to the
reporter it was asked for; a reporter only formats.

    results.py          Results and gather: what every reporter renders
    terminal.py         terminal tables (terminal_table.py fits them to the width)
    json_report.py      one JSON document (`report --json`)
    html/               one self-contained HTML page (`report --html`)
    csv_dir.py          a directory of CSV files (`export --format csv`)
    top_screen.py       the screen of `top`, from its live counts

The trace formats for viewers (Perfetto, Chrome) are in pasta_trace.export."""

from __future__ import annotations

from typing import Protocol, TypeVar

from .results import Results, gather

Out = TypeVar("Out", contravariant=True)


class Reporter(Protocol[Out]):
    def render(self, results: Results, out: Out) -> None:
        """Write `results` to `out` (a text stream, or for CSV a directory)."""


__all__ = ["Reporter", "Results", "gather"]
