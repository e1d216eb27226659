"""Reporters: every way `report` and `export` write the tools' results, behind
one protocol, `render(results, out)`: terminal tables, a JSON document, one
HTML page and CSV files.  A verb gathers the Results once (the merge, the
capture's facts, every selected tool) and hands them to the reporter it was
asked for; a reporter only formats."""

from __future__ import annotations

from typing import Protocol, TypeVar

from .results import Results, gather

Out = TypeVar("Out", contravariant=True)


class Reporter(Protocol[Out]):
    def render(self, results: Results, out: Out) -> None:
        """Write `results` to `out` (a text stream, or for CSV a directory)."""


__all__ = ["Reporter", "Results", "gather"]
