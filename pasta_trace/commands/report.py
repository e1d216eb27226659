"""`pasta-trace report PATH`: every analysis as terminal tables, JSON, or one HTML page."""

from __future__ import annotations

import argparse
import json
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from rich.console import Console
from rich.markup import escape
from rich.progress import Progress
from rich.text import Text

from .. import merge
from ..errors import UsageError
from ..export.html import write_html
from ..safe_output import OutputFile
from ..tools import REGISTRY
from ..tools.render import table
from ..tools.run import ToolResult, capture_facts, device_data_text, incomplete_banner, run_tools, with_merged

HELP = "summaries of a capture or timeline: terminal tables, --json, or --html"
EXAMPLES = """\
  pasta-trace report pasta-host-20261202T1200/
  pasta-trace report timeline.parquet --tool kernels --tool memory_peaks
  pasta-trace report pasta-host-20261202T1200/ --json > report.json
  pasta-trace report pasta-host-20261202T1200/ --html report.html
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", metavar="PATH", help="capture directory or merged timeline")
    p.add_argument("--json", action="store_true", help="write every table as JSON to stdout, nothing else")
    p.add_argument("--html", metavar="OUT", type=Path, help="write one self-contained HTML report to OUT")
    p.add_argument("--force", action="store_true", help="overwrite OUT if it exists")
    p.add_argument(
        "--tool", action="append", choices=list(REGISTRY), metavar="NAME",
        help=f"only this tool (repeatable): {', '.join(REGISTRY)}",
    )
    p.add_argument("--limit", type=int, default=20, metavar="N", help="rows per terminal table (default 20)")
    p.add_argument("--stacks", action="store_true",
                   help="also print the top --limit caller stacks in full (most time blocked, then most calls)")


def _json_default(v: object) -> object:
    return str(v)


def to_json(facts: dict, results: list[ToolResult]) -> str:
    doc = {
        "capture": facts,
        "incomplete": incomplete_banner(facts),
        "tools": {
            r.tool.name: {
                "title": r.tool.title,
                "needs_device": r.tool.needs_device,
                "note": r.note,
                "columns": r.frame.columns,
                "rows": r.frame.to_dicts(),
            }
            for r in results
        },
    }
    return json.dumps(doc, indent=1, default=_json_default, allow_nan=False)


def print_terminal(console: Console, facts: dict, results: list[ToolResult], limit: int) -> None:
    banner = incomplete_banner(facts)
    if banner:
        console.print(Text(banner, style="bold white on red"))
    head = [
        ("capture", facts["path"]), ("command", facts["command"]), ("host", facts["host"]),
        ("started", facts["started_utc"]),
        ("duration", None if facts["duration_ns"] is None else f"{facts['duration_ns'] / 1e9:.6f} s"),
        ("processes", ", ".join(map(str, facts["pids"])) or "none"), ("events", facts["events"]),
        ("calls counted", None if facts["aggregate_calls"] is None else f"{facts['aggregate_calls']} (--aggregate)"),
        ("lost events", facts["lost_events"]), ("device data", device_data_text(facts)),
    ]
    for k, v in head:
        if v is not None:
            console.print(f"[bold]{k:>12}[/bold]  {escape(str(v))}", highlight=False)
    if facts["merge"]:
        for line in merge.MergeStats(**facts["merge"]).lines():
            console.print(f"{'merge':>12}  {line}", highlight=False)
    t0 = facts["start_ts_ns"]
    for r in results:
        console.print()
        if r.note:
            console.print(f"[bold]{r.tool.title}[/bold]: [dim]{r.note}[/dim]")
        elif r.frame.height == 0:
            console.print(f"[bold]{r.tool.title}[/bold]: [dim]nothing found[/dim]")
        elif r.tool.render_text:
            console.print(f"[bold]{r.tool.title}[/bold]")
            console.print(r.tool.render_text(r.frame), highlight=False, markup=False)
        else:
            cols = r.tool.terminal_columns or r.frame.columns
            frame = r.frame.select([c for c in cols if c in r.frame.columns])
            console.print(table(frame, r.tool.title, t0, limit))


@contextmanager
def _progress(total: int) -> Iterator[Callable[[str], None]]:
    """A progress bar on stderr when it is a terminal (stdout carries data only);
    otherwise nothing.  Yields `step(label)`, called after each unit of work."""
    if not sys.stderr.isatty():
        yield lambda _label: None
        return
    with Progress(console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("merging", total=total)
        yield lambda label: bar.update(task, advance=1, description=label)


def run(args: argparse.Namespace) -> int:
    if args.limit < 1:
        raise UsageError("--limit must be at least 1")
    # the output is checked before any work: a bad --html fails in a second, not after the analysis
    html = OutputFile(args.html, force=args.force, example="report.html") if args.html else None
    cap = merge.load(args.path)
    names = args.tool or list(REGISTRY)
    with _progress(len(names) + 1) as step:
        cap = with_merged(cap)
        step("analysing")
        facts = capture_facts(cap)
        results = run_tools(cap, names, on_done=lambda tool: step(tool.name))
    banner = incomplete_banner(facts)
    if args.json:
        if banner:
            print(f"pasta-trace: warning: {banner}", file=sys.stderr)
        sys.stdout.write(to_json(facts, results) + "\n")
    elif not args.html:
        print_terminal(Console(), facts, results, args.limit)
        if args.stacks:
            from ..tools.call_sites import render_stacks, top_stacks

            print(f"\nTop {args.limit} caller stacks (innermost frame first)")
            print(render_stacks(top_stacks(cap, args.limit)))
    if html is not None:
        write_html(html, cap, facts, results)
        print(f"Wrote {args.html}  (open it in a browser; no network needed)", file=sys.stderr)
        if banner:
            print(f"pasta-trace: warning: {banner}", file=sys.stderr)
    return 0
