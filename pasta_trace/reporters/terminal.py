"""The terminal report: key findings first, then the capture's facts, one table
per tool that found something, and one line each for the tools that found
nothing and those that could not run, all fitted to the terminal's width."""

from __future__ import annotations

import io
from typing import TextIO

from rich.console import Console, RenderableType
from rich.table import Table
from rich.text import Text

from .. import merge
from ..tools.run import ToolResult, device_data_text, incomplete_banner, lost_text
from .results import Results
from .terminal_table import table

TOPIC_W = 12  # the findings' and facts' left column


def _pairs(rows: list[tuple[str, str]], style: str = "bold") -> Table:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(justify="right", style=style, no_wrap=True, width=TOPIC_W)
    grid.add_column()
    for k, v in rows:
        grid.add_row(k, Text(v))
    return grid


def _facts(facts: dict) -> list[tuple[str, str]]:
    started = facts["started_utc"]
    head = [
        ("capture", facts["path"]), ("command", facts["command"]), ("host", facts["host"]),
        # every time in the tables below counts from here
        ("started", None if started is None else f"{started} (times below: s after this)"),
        ("duration", None if facts["duration_ns"] is None else f"{facts['duration_ns'] / 1e9:.6f} s"),
        ("processes", ", ".join(map(str, facts["pids"])) or "none"), ("events", facts["events"]),
        ("calls counted", None if facts["aggregate_calls"] is None else f"{facts['aggregate_calls']} (--aggregate)"),
        ("lost", lost_text(facts)), ("device data", device_data_text(facts)),
    ]
    rows = [(k, str(v)) for k, v in head if v is not None]
    if facts["merge"]:
        rows += [("merge", line) for line in merge.MergeStats(**facts["merge"]).lines()]
    rows += [("tool status", line) for line in facts.get("device_status") or ()]
    return rows


def _folded(results: list[ToolResult]) -> list[str]:
    """One line for the tools that found nothing, and one per reason some could not run."""
    by_reason: dict[str, list[str]] = {}
    for r in results:
        if r.note:
            by_reason.setdefault(r.note[0].upper() + r.note[1:], []).append(r.tool.name)
        elif r.frame.height == 0:
            by_reason.setdefault("Nothing found", []).append(r.tool.name)
    nothing = by_reason.pop("Nothing found", None)
    lines = [f"Nothing found: {', '.join(nothing)}"] if nothing else []
    return lines + [f"{reason}: {', '.join(names)}" for reason, names in by_reason.items()]


def _trim_call_sites(frame):
    from ..tools.call_sites import render_call_sites

    return render_call_sites(frame)


#: tools whose terminal table leaves out the columns that are zero on every row
_TRIMMED = {"call_sites": _trim_call_sites}

#: --stacks: each view's heading
_STACK_VIEWS = (("bytes", "by bytes allocated"), ("time", "by time blocked in syncs"))


def _stacks(results: Results, limit: int) -> list[RenderableType]:
    """The top caller stacks in full, ranked by bytes allocated and by time
    blocked in syncs; said once when the capture has none."""
    from ..tools.call_sites import render_stacks, top_stacks

    out: list[RenderableType] = []
    for by, heading in _STACK_VIEWS:
        top = top_stacks(results.cap, limit, by)
        if top.height:
            out += [Text(""), Text(f"Top {limit} caller stacks {heading} (> the call site)", style="bold"),
                    Text(render_stacks(top, by))]
    if not out:
        out = [Text(""), Text("No caller stacks allocated or blocked (recorded with --no-stacks, or no Python "
                              "callers)")]
    return out


class TerminalReporter:
    def __init__(self, limit: int = 20, stacks: bool = False, width: int | None = None) -> None:
        self.limit = limit
        self.stacks = stacks
        self.width = width

    def renderables(self, results: Results, width: int) -> list[RenderableType]:
        facts = results.facts
        out: list[RenderableType] = []
        if banner := incomplete_banner(facts):
            out.append(Text(banner, style="bold white on red"))
        room = width - TOPIC_W - 2
        if results.findings:
            out += [Text("Key findings", style="bold"),
                    _pairs([(f.topic, f.line(room)) for f in results.findings]), Text("")]
        out.append(_pairs(_facts(facts), style="dim"))
        t0 = facts["start_ts_ns"]
        for r in results.tools:
            if r.note or r.frame.height == 0:
                continue
            out.append(Text(""))
            if r.tool.render_text:
                out += [Text(r.tool.title, style="bold"), Text(r.tool.render_text(r.frame).rstrip("\n"))]
            else:
                cols = r.tool.terminal_columns or r.frame.columns
                frame = r.frame.select([c for c in cols if c in r.frame.columns])
                if r.tool.name in _TRIMMED:
                    frame = _TRIMMED[r.tool.name](frame)
                out.append(table(frame, r.tool.title, t0, self.limit, width))
        folded = _folded(results.tools)
        if folded:
            out.append(Text(""))
            out += [Text(line) for line in folded]
        if self.stacks:
            out += _stacks(results, self.limit)
        return out

    def render(self, results: Results, out: TextIO) -> None:
        """Styles when `out` is a terminal; lines without trailing blanks."""
        probe = Console(file=out)
        width = self.width or probe.width
        buf = io.StringIO()
        console = Console(file=buf, width=width, force_terminal=probe.is_terminal, highlight=False,
                          color_system=probe.color_system, no_color=probe.no_color)
        for part in self.renderables(results, width):
            console.print(part)
        out.write("".join(line.rstrip() + "\n" for line in buf.getvalue().splitlines()))
