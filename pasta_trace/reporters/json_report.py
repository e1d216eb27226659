"""The JSON report: the capture's facts, the key findings and every tool's
full table (columns and rows), for scripts."""

from __future__ import annotations

import json
import uuid
from typing import Callable, TextIO

import polars as pl

from ..tools.run import incomplete_banner
from .results import Results


def _default(v: object) -> object:
    return str(v)


class JsonReporter:
    @staticmethod
    def _document(results: Results, rows: Callable[[pl.DataFrame], str]) -> dict:
        """The document, each table's rows as ``rows`` of its frame."""
        return {
            "capture": results.facts,
            "incomplete": incomplete_banner(results.facts),
            "key_findings": [
                {"topic": f.topic, "text": f.line(), "subject": f.subject, "tool": f.tool} for f in results.findings
            ],
            "tools": {
                r.tool.name: {
                    "title": r.tool.title,
                    "needs_device": r.tool.needs_device,
                    "note": r.note,
                    "columns": r.frame.columns,
                    "rows": rows(r.frame),
                }
                for r in results.tools
            },
        }

    def render(self, results: Results, out: TextIO) -> None:
        """The document, each table's rows written by Polars (row objects, a
        float that is not a number as null): Python's encoder took 11 s for
        the 770,000 rows of a 10^7-event capture's memory table."""
        mark = f"pasta-trace-rows-{uuid.uuid4().hex}-"
        frames: list[pl.DataFrame] = []

        def placeholder(frame: pl.DataFrame) -> str:
            frames.append(frame)
            return f"{mark}{len(frames) - 1}"

        text = json.dumps(self._document(results, placeholder), indent=1, default=_default, allow_nan=False)
        pieces = text.split(f'"{mark}')
        out.write(pieces[0])
        for piece in pieces[1:]:
            i, rest = piece.split('"', 1)
            out.write(frames[int(i)].write_json())
            out.write(rest)
        out.write("\n")
