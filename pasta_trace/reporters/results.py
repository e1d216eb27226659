"""What every reporter is given: the capture, the tools' results, and the
facts and key findings derived from them (computed once, on first use)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import cached_property
from typing import Callable

from .. import schema
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
    cap = with_merged(without_counters(cap))
    step("analysing")
    return Results(cap, run_tools(cap, names, on_done=lambda tool: step(tool.name)))


#: the per-kernel counters of the device's kernel summaries (instructions, loads, stores,
#: ...): the kernels frame carries them for a timeline or an export, and no tool reads them
COUNTERS = tuple(c for c in schema.DEVICE_FRAMES["kernel_summaries"]
                 if c in schema.TIMELINE_FRAMES["kernels"] and c not in ("pid", "launch_id"))


def without_counters(cap: Capture) -> Capture:
    """`cap` with its kernel summaries' counters left out, so that the merge a
    report holds neither decodes nor keeps them (14 columns of every kernel
    execution: 1 GB at 9*10^6); its kernels frame has no such columns, so a
    reader asking for one fails rather than reading nulls.  A merged timeline
    is returned as it is."""
    if cap.merged or "kernel_summaries" not in cap.device:
        return cap
    lean = cap.device["kernel_summaries"].drop(COUNTERS, strict=False)
    return dataclasses.replace(cap, device=cap.device.replaced("kernel_summaries", lean), cache=dict(cap.cache))
