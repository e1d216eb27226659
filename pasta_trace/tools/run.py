"""Run the registered tools over one capture, and the facts every report heads with."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Callable

import polars as pl

from .. import merge, schema
from ..device.status import status_lines
from ..read import Capture
from . import REGISTRY
from .common import bounds, capture_calls
from .registry import Tool
from .tensors import TENSOR_KINDS


NO_TENSORS = "needs tensor events (a PyTorch program); this capture has none"


@dataclass
class ToolResult:
    tool: Tool
    frame: pl.DataFrame
    #: why the frame is empty when that is not a finding (no device data)
    note: str | None = None


def run_tools(
    cap: Capture,
    names: list[str] | None = None,
    on_done: Callable[[Tool], None] | None = None,
) -> list[ToolResult]:
    """Each selected tool (all by default, in registry order) on `cap`.  Tools
    that need device data still run without it, so their (empty) frames keep
    their columns for JSON and CSV, and carry a note saying why."""
    device = cap.has_device_data
    tensors = cap.events.filter(pl.col("kind").is_in(TENSOR_KINDS)).head(1).collect().height > 0
    out = []
    for name in names or list(REGISTRY):
        tool = REGISTRY[name]
        frame = tool.compute(cap)
        note = None
        if tool.needs_device and not device:
            note = "needs device data (gpu_probes or CUPTI); this capture has none"
        elif cap.aggregate is not None and not tool.reads_aggregate:
            note = "needs per-call events; an --aggregate capture keeps only counts and byte sums"
        elif tool.needs_tensors and not tensors:
            note = NO_TENSORS
        out.append(ToolResult(tool, frame, note))
        if on_done:
            on_done(tool)
    return out


def _utc(realtime_ns: int) -> str:
    return datetime.fromtimestamp(realtime_ns / 1e9, tz=timezone.utc).isoformat(timespec="seconds")


def capture_facts(cap: Capture) -> dict:
    """Header facts: what was traced, where, for how long, and what was lost."""
    m = cap.manifest
    start, end = bounds(cap)
    started = ((m.get("clock") or {}).get("start_sample") or {}).get("realtime_ns")
    calls = capture_calls(cap)
    pids = calls.select(pl.col("pid").unique().sort()).collect(engine="streaming")["pid"]
    return {
        "path": str(cap.path),
        "command": shlex.join(m["command_line"]) if m.get("command_line") else None,
        "mode": m.get("mode"),
        "host": m.get("host"),
        "kernel": m.get("kernel_release"),
        "started_utc": None if started is None else _utc(started),
        "start_ts_ns": start,
        "end_ts_ns": end,
        "duration_ns": None if start is None or end is None else end - start,
        "pids": pids.to_list(),
        "events": cap.events.select(pl.len()).collect(engine="streaming").item(),
        # --aggregate: the calls the kernel counted (there are no events); null otherwise
        "aggregate_calls": (calls.select(pl.col("count").sum()).collect(engine="streaming").item()
                            if cap.aggregate is not None else None),
        "lost_events": cap.lost_events,  # every kind of loss together; by kind in "losses"
        "losses": cap.losses,
        "complete": cap.complete,
        "problems": list(cap.problems),
        "device_data": cap.has_device_data,
        # the --device backend the capture asked for (null: none), so that "recorded nothing" is said
        "device_backend": m.get("device"),
        # what the host <-> device merge matched and what it could not (never dropped silently)
        "merge": merge.stats(cap).as_dict() if cap.has_device_data else None,
        # the Sanitizer injection's own account of its set-up calls, one line per process (device format 1.1)
        "device_status": status_lines(cap.device["tool_status"]) if "tool_status" in cap.device else [],
    }


def device_data_text(facts: dict) -> str:
    """The header's "device data" cell."""
    if facts["device_data"]:
        return "yes"
    backend = facts.get("device_backend")
    return f"none: --device {backend} recorded nothing" if backend else "no"


def lost_text(facts: dict) -> str:
    """Every kind of loss that counted ("5 events, 2 Python stacks"), or "0"."""
    return schema.loss_text(facts["losses"]) or "0"


def incomplete_banner(facts: dict) -> str | None:
    """The one line every report shows when anything was lost or cut short."""
    if facts["lost_events"] == 0 and facts["complete"] and not facts["problems"]:
        return None
    reasons = facts["problems"] or ([] if facts["complete"] else ["the capture did not finish"])
    tail = f" ({'; '.join(reasons)})" if reasons else ""
    return f"INCOMPLETE: {schema.loss_text(facts['losses']) or '0 events'} lost{tail}"
