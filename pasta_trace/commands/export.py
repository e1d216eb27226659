"""`pasta-trace export PATH --format perfetto|chrome|csv`: a capture or merged
timeline as a trace for ui.perfetto.dev / chrome://tracing, or as CSV files."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import polars as pl

from .. import merge, schema
from ..damage import left_out, reading
from ..errors import UsageError
from ..read import Capture
from ..safe_output import OutputDir, OutputFile, invoking_user
from .common import add_call_site_arguments, add_input_path, apply_call_site, warn_problems

HELP = "a capture or timeline as a Perfetto trace, Chrome trace JSON, or CSV files"
EXAMPLES = """\
  pasta-trace export pasta-host-20261202T1200/ --format perfetto      -> pasta-host-20261202T1200.pftrace
  pasta-trace export timeline/ --format chrome -o trace.json
  pasta-trace export pasta-host-20261202T1200/ --format csv -o csv/   -> csv/events.csv, csv/<tool>.csv
  open .pftrace files at https://ui.perfetto.dev, .json at chrome://tracing or ui.perfetto.dev
"""

FORMATS = {"perfetto": ".pftrace", "chrome": ".json", "csv": "-csv"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_input_path(p)
    p.add_argument("--format", "-f", dest="format", metavar="FORMAT", default="perfetto",
                   help="perfetto (default; .pftrace), chrome (trace-event JSON) or csv (a directory)")
    p.add_argument("-o", "--output", metavar="OUT", type=Path,
                   help="output file (a directory for csv); default: PATH's name + .pftrace/.json/-csv, "
                        "in the current directory")
    p.add_argument("--force", action="store_true", help="overwrite OUT if it exists")
    add_call_site_arguments(p)


def output_path(path: str, fmt: str, out: Path | None) -> Path:
    if out is not None:
        return out
    src = Path(path.rstrip("/") or path).resolve()
    return Path((src.stem if src.suffix == ".parquet" else src.name) + FORMATS[fmt])


def _target(out: Path, fmt: str, force: bool) -> OutputDir | OutputFile:
    """The output, checked (and for csv created) before any work."""
    if fmt == "csv":
        return OutputDir.claim(out, force=force, reuse_empty=False)
    return OutputFile(out, force=force, example=f"trace{FORMATS[fmt]}")


OPEN_HINT = {"perfetto": "open it at https://ui.perfetto.dev (Open trace file)",
             "chrome": "open it at chrome://tracing or https://ui.perfetto.dev"}


def _csv(cap: Capture, out: OutputDir) -> tuple[str, list[str]]:
    from ..reporters import Results
    from ..reporters.csv_dir import CsvReporter, notes
    from ..tools.run import run_tools

    results = Results(cap, run_tools(cap))
    CsvReporter().render(results, out)
    out.hand_over(invoking_user())  # root's own use: a directory taken over gets its owner and mode back
    out.close()
    return f"events.csv and {len(results.tools)} tool tables", notes(results.tools)


def _trace(cap: Capture, out: OutputFile, fmt: str) -> tuple[str, list[str]]:
    from ..export import chrome, perfetto, trace_model

    model = trace_model.build(cap)
    if model.api.height == 0:
        why = " (an --aggregate capture keeps counts only: see pasta-trace report)" if cap.aggregate is not None else ""
        print(f"pasta-trace: warning: {cap.path} holds no API calls{why}", file=sys.stderr)
    if fmt == "chrome" and model.n_events > chrome.LARGE_EVENTS:
        print(f"pasta-trace: warning: {model.n_events} events make a large JSON trace that chrome://tracing "
              "may not load; --format perfetto is smaller and faster", file=sys.stderr)
    written: list[int] = []
    out.write(lambda path: written.append((perfetto if fmt == "perfetto" else chrome).write_file(model, Path(path))))
    return f"{written[0]} events", [OPEN_HINT[fmt], *(_hta_notes(model) if fmt == "chrome" else [])]


def _hta_notes(model) -> list[str]:
    """What Holistic Trace Analysis can make of a Chrome export: its
    breakdowns need GPU kernels with device timing, and its parser needs at
    least one event with a duration."""
    if model.kernels.filter(pl.col("dur_ns").is_not_null()).height:
        return []
    if model.api.filter(pl.col("dur_ns").is_not_null()).height == 0:
        return ["note: no event in it has a duration (only instants: tensor events, entry-only calls), so "
                "HolisticTraceAnalysis cannot load it; chrome://tracing and ui.perfetto.dev show it"]
    return ["note: host only (no GPU kernel with device timing): HolisticTraceAnalysis loads it but has no kernel "
            "or temporal breakdown to give; record with --device cupti for one"]


def run(args: argparse.Namespace) -> int:
    if args.format not in FORMATS:
        raise UsageError(f"unknown format {args.format!r}; choose one of: {', '.join(FORMATS)}")
    out = output_path(args.path, args.format, args.output)
    target = _target(out, args.format, args.force)
    try:
        with reading(lambda: merge.load(args.path), verbose=args.verbose) as cap:
            apply_call_site(args, cap)
            warn_problems(cap)
            t0 = time.perf_counter()
            what, hints = _csv(cap, target) if isinstance(target, OutputDir) else _trace(cap, target, args.format)
    except BaseException:
        if isinstance(target, OutputDir) and target.fd >= 0:
            # a directory made for the tables (or tables half written into one of
            # the user's) would block the rerun, or pass for a whole export
            target.discard()
        raise
    print(f"Wrote {out} ({what}, {time.perf_counter() - t0:.1f} s)", file=sys.stderr)
    for line in hints:
        print(line, file=sys.stderr)
    if cap.losses:
        print(f"pasta-trace: warning: INCOMPLETE: {schema.loss_text(cap.losses)} were lost during capture",
              file=sys.stderr)
    left_out(cap)
    return 0
