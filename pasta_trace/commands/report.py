"""`pasta-trace report PATH`: every analysis as terminal tables, JSON, or one HTML page."""

from __future__ import annotations

import argparse
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, TextIO

from rich.console import Console
from rich.progress import Progress

from .. import merge
from ..dask_cluster import address as scheduler_address
from ..damage import left_out, reading
from ..errors import UsageError
from ..read import Capture
from ..reporters import Reporter, Results, gather
from ..reporters.html import HtmlReporter
from ..reporters.json_report import JsonReporter
from ..reporters.terminal import TerminalReporter
from ..safe_output import OutputFile
from ..tools import REGISTRY
from ..tools.run import ToolResult, incomplete_banner
from .common import add_call_site_arguments, add_input_path, apply_call_site

HELP = "summaries of a capture or timeline: terminal tables, --json, or --html"
EXAMPLES = """\
  pasta-trace report pasta-host-20261202T1200/
  pasta-trace report timeline.parquet --tool kernels --tool memory_peaks
  pasta-trace report pasta-host-20261202T1200/ --json > report.json
  pasta-trace report pasta-host-20261202T1200/ --html report.html
  pasta-trace report pasta-host-20261202T1200/ --stacks --call-site innermost
  pasta-trace report pasta-host-20261202T1200/ --user-code ~/src/mylib --user-code train.py
  pasta-trace report cluster.parquet --cluster tcp://scheduler:8786
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_input_path(p)
    p.add_argument("--json", action="store_true", help="write every table as JSON to stdout, nothing else")
    p.add_argument("--html", metavar="OUT", type=Path, help="write one self-contained HTML report to OUT")
    p.add_argument("--force", action="store_true", help="overwrite OUT if it exists")
    p.add_argument(
        "--tool", action="append", choices=list(REGISTRY), metavar="NAME",
        help=f"only this tool (repeatable): {', '.join(REGISTRY)}",
    )
    p.add_argument("--limit", type=int, default=20, metavar="N", help="rows per terminal table (default 20)")
    p.add_argument("--cluster", metavar="SCHEDULER_ADDR", type=scheduler_address,
                   help="run the cross-rank tools (stragglers, straggler_ranks, hangs, collectives) of a cluster "
                        "timeline on this Dask scheduler (tcp://host:8786); PATH must be readable by its workers; "
                        "needs pasta-trace[cluster]")
    p.add_argument("--stacks", action="store_true",
                   help="also print the top --limit caller stacks in full: by bytes allocated (driver and tensor "
                        "memory) and by time blocked in syncs")
    add_call_site_arguments(p)


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
    with reading(lambda: merge.load(args.path), verbose=args.verbose) as cap:
        _report(args, cap, html)
    left_out(cap)  # exit 1 naming each damaged file, after reporting the rest
    return 0


def _report(args: argparse.Namespace, cap: Capture, html: OutputFile | None) -> None:
    apply_call_site(args, cap)
    if args.cluster is not None:
        results = _on_cluster(args, cap)
    else:
        names = args.tool or list(REGISTRY)
        with _progress(len(names) + 1) as step:
            results = gather(cap, names, step)
    banner = incomplete_banner(results.facts)
    if args.json:
        if banner:
            print(f"pasta-trace: warning: {banner}", file=sys.stderr)
        JsonReporter().render(results, sys.stdout)
    elif not args.html:
        TerminalReporter(args.limit, stacks=args.stacks).render(results, sys.stdout)
    if html is not None:
        html.write(lambda path: _write_text(path, HtmlReporter(), results))
        print(f"Wrote {args.html}  (open it in a browser; no network needed)", file=sys.stderr)
        if banner:
            print(f"pasta-trace: warning: {banner}", file=sys.stderr)


def _on_cluster(args: argparse.Namespace, cap) -> Results:
    from .. import dask_cluster  # Dask only where asked for

    names = args.tool or list(dask_cluster.TOOLS)
    others = [n for n in names if n not in dask_cluster.TOOLS]
    if others:
        raise UsageError(f"--cluster runs {', '.join(dask_cluster.TOOLS)}; not {others[0]}")
    client = dask_cluster.connect(args.cluster)
    try:
        frames = dask_cluster.analyse(Path(args.path).resolve(), client)
    finally:
        client.close()
    return Results(cap, [ToolResult(REGISTRY[n], frames[n]) for n in names])


def _write_text(path: str, reporter: Reporter[TextIO], results: Results) -> None:
    with open(path, "w", encoding="utf-8") as f:
        reporter.render(results, f)
