"""`pasta-trace export PATH --format perfetto|chrome|csv`: a capture or merged
timeline as a trace for ui.perfetto.dev / chrome://tracing, or as CSV files."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from .. import merge
from ..errors import PastaError, UsageError
from ..read import Capture

HELP = "a capture or timeline as a Perfetto trace, Chrome trace JSON, or CSV files"
EXAMPLES = """\
  pasta-trace export pasta-host-20261202T1200/ --format perfetto      -> pasta-host-20261202T1200.pftrace
  pasta-trace export timeline/ --format chrome -o trace.json
  pasta-trace export pasta-host-20261202T1200/ --format csv -o csv/   -> csv/events.csv, csv/<tool>.csv
  open .pftrace files at https://ui.perfetto.dev, .json at chrome://tracing or ui.perfetto.dev
"""

FORMATS = {"perfetto": ".pftrace", "chrome": ".json", "csv": "-csv"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", metavar="PATH", help="capture directory or merged timeline")
    p.add_argument("--format", "-f", dest="format", metavar="FORMAT", default="perfetto",
                   help="perfetto (default; .pftrace), chrome (trace-event JSON) or csv (a directory)")
    p.add_argument("-o", "--output", metavar="OUT", type=Path,
                   help="output file (a directory for csv); default: PATH's name + .pftrace/.json/-csv, "
                        "in the current directory")
    p.add_argument("--force", action="store_true", help="overwrite OUT if it exists")


def _owned(path: Path) -> None:
    """Written under sudo: the file belongs to the user who ran sudo."""
    uid, gid = os.environ.get("SUDO_UID"), os.environ.get("SUDO_GID")
    if os.geteuid() == 0 and uid and gid:
        os.chown(path, int(uid), int(gid))


def _publish(tmp: Path, final: Path) -> None:
    _owned(tmp)
    os.replace(tmp, final)


def output_path(path: str, fmt: str, out: Path | None) -> Path:
    if out is not None:
        return out
    src = Path(path.rstrip("/") or path).resolve()
    return Path((src.stem if src.suffix == ".parquet" else src.name) + FORMATS[fmt])


def _check_output(out: Path, fmt: str, force: bool) -> None:
    if out.exists() and not force:
        raise PastaError(f"{out} exists", hint="use --force to overwrite it, or -o to choose another name")
    if out.exists() and (fmt == "csv") != out.is_dir():
        raise PastaError(f"{out} exists and is not a {'directory' if fmt == 'csv' else 'file'}")
    if not out.parent.is_dir():
        raise PastaError(f"{out.parent}: no such directory")


OPEN_HINT = {"perfetto": "open it at https://ui.perfetto.dev (Open trace file)",
             "chrome": "open it at chrome://tracing or https://ui.perfetto.dev"}


def _csv(cap: Capture, out: Path) -> tuple[str, list[str]]:
    from ..export import csv

    out.mkdir(exist_ok=True)
    _owned(out)
    results = csv.write(cap, out, _publish)
    empty = [r.tool.name for r in results if r.note]
    notes = [f"note: {', '.join(empty)}: header only (they need device data)"] if empty else []
    return f"events.csv and {len(results)} tool tables", notes


def _trace(cap: Capture, out: Path, fmt: str) -> tuple[str, list[str]]:
    from ..export import chrome, perfetto, trace_model

    model = trace_model.build(cap)
    if model.api.height == 0:
        why = " (an --aggregate capture keeps counts only: see pasta-trace report)" if cap.aggregate is not None else ""
        print(f"pasta-trace: warning: {cap.path} holds no API calls{why}", file=sys.stderr)
    if fmt == "chrome" and model.n_events > chrome.LARGE_EVENTS:
        print(f"pasta-trace: warning: {model.n_events} events make a large JSON trace that chrome://tracing "
              "may not load; --format perfetto is smaller and faster", file=sys.stderr)
    tmp = out.with_name(f".{out.name}.tmp")
    try:
        n = (perfetto if fmt == "perfetto" else chrome).write_file(model, tmp)
        _publish(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return f"{n} events", [OPEN_HINT[fmt]]


def run(args: argparse.Namespace) -> int:
    if args.format not in FORMATS:
        raise UsageError(f"unknown format {args.format!r}; choose one of: {', '.join(FORMATS)}")
    out = output_path(args.path, args.format, args.output)
    _check_output(out, args.format, args.force)
    cap = merge.load(args.path)
    for problem in cap.problems:
        print(f"pasta-trace: warning: {problem}", file=sys.stderr)
    t0 = time.perf_counter()
    what, hints = _csv(cap, out) if args.format == "csv" else _trace(cap, out, args.format)
    print(f"Wrote {out} ({what}, {time.perf_counter() - t0:.1f} s)", file=sys.stderr)
    for line in hints:
        print(line, file=sys.stderr)
    if cap.lost_events:
        print(f"pasta-trace: warning: INCOMPLETE: {cap.lost_events} events were lost during capture",
              file=sys.stderr)
    return 0
