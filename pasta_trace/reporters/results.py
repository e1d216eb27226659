"""What every reporter is given: the capture, the tools' results, and the
facts and key findings derived from them (computed once, on first use)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Callable

from ..merge.held import with_merged
from ..read import Capture
from ..tools.findings import Finding, key_findings
from ..tools.run import ToolResult, capture_facts, run_tools


@dataclass
class Results:
    cap: Capture
    tools: list[ToolResult]

    @cached_property
    def facts(self) -> dict:
        return capture_facts(self.cap)

    @cached_property
    def findings(self) -> list[Finding]:
        return key_findings(self.tools, self.facts["start_ts_ns"])


def gather(cap: Capture, names: list[str] | None = None, step: Callable[[str], None] = lambda _label: None) -> Results:
    """Merge once (held in memory, see with_merged), then run the selected
    tools; `step(label)` is called after each unit of work, for a progress bar."""
    cap = with_merged(cap)
    step("analysing")
    return Results(cap, run_tools(cap, names, on_done=lambda tool: step(tool.name)))
