"""The JSON report: the capture's facts, the key findings and every tool's
full table (columns and rows), for scripts."""

from __future__ import annotations

import json
from typing import TextIO

from ..tools.run import incomplete_banner
from .results import Results


def _default(v: object) -> object:
    return str(v)


class JsonReporter:
    def document(self, results: Results) -> dict:
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
                    "rows": r.frame.to_dicts(),
                }
                for r in results.tools
            },
        }

    def render(self, results: Results, out: TextIO) -> None:
        out.write(json.dumps(self.document(results), indent=1, default=_default, allow_nan=False) + "\n")
