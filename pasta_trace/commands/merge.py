"""`pasta-trace merge DIR [DEVICE_FILES...] -o OUT`: one timeline from a capture
and device record files (docs/merge.md)."""

from __future__ import annotations

import argparse
import sys
from contextlib import nullcontext
from pathlib import Path

import polars as pl

from .. import merge
from ..damage import left_out, reading
from ..errors import FormatError, UsageError
from ..read import open_capture, read_device

HELP = "join host events and device data into one timeline (Parquet directory)"
EXAMPLES = """\
  pasta-trace merge pasta-host-20261202T1200/ -o timeline.parquet
  pasta-trace merge pasta-host-20261202T1200/ gpu_probes.4242.sanitizer.bin -o timeline.parquet
  pasta-trace merge pasta-host-20261202T1200/ -o timeline.parquet --force
  pasta-trace report timeline.parquet
"""

#: Inputs above this many rows show a progress bar (when stderr is a terminal).
PROGRESS_ROWS = 1_000_000


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("capture", metavar="DIR", help="capture directory (from `pasta-trace record`)")
    p.add_argument("device_files", metavar="DEVICE_FILES", nargs="*", type=Path,
                   help="device record files (gpu_probes.*.bin) beyond those in DIR/device/")
    p.add_argument("-o", "--output", metavar="OUT", type=Path, required=True,
                   help="timeline directory to write (e.g. timeline.parquet)")
    p.add_argument("--force", action="store_true", help="replace OUT if it is an earlier timeline or a file")
    p.add_argument("--tolerance-us", type=float, default=merge.TOLERANCE_NS / 1000, metavar="US",
                   help="host/device launch time tolerance for matching by time (default %(default)g)")


def _rows(cap) -> int:
    frames = [cap.events, *cap.device.values()]
    return sum(f.select(pl.len()).collect().item() for f in frames)


def _inputs(src: Path, device_files: list[Path], out):
    """The capture with the device frames of `device_files` added to its own
    (DIR/device/); a file that is one of DIR's own is read once."""
    try:
        cap = open_capture(src)
        missing = [str(f) for f in device_files if not f.is_file()]
        if missing:
            raise FormatError(f"{missing[0]}: no such device record file")
        own = list((src / "device").glob("*.bin"))
        extra = [f for f in dict.fromkeys(device_files) if not any(f.samefile(o) for o in own)]
        if extra:
            frames, problems = read_device(extra)
            for name, frame in frames.items():
                cap.device[name] = pl.concat([cap.device[name], frame], how="vertical_relaxed")
            cap.problems.extend(problems)
    except BaseException:
        out.discard()
        raise
    return cap


def run(args: argparse.Namespace) -> int:
    if args.tolerance_us < 0:
        raise UsageError("--tolerance-us must be >= 0")
    src = Path(args.capture)
    if merge.is_timeline(src):
        raise UsageError(f"{src} is already a merged timeline", hint="give the capture directory")
    out = merge.timeline_output(args.output, force=args.force)  # a bad -o fails before any work
    with reading(lambda: _inputs(src, args.device_files, out), verbose=args.verbose) as cap:
        stats = _merge(cap, out, int(args.tolerance_us * 1000))
    for problem in cap.problems:
        if problem not in cap.damaged:  # those end the run, as its error
            print(f"pasta-trace: warning: {problem}", file=sys.stderr)
    for line in stats.lines():
        print(line, file=sys.stderr)
    if cap.aggregate is not None:
        counted = cap.aggregate.filter(pl.col("kind") == "launch").select(pl.col("count").sum()).collect().item()
        print(f"note: an --aggregate capture: {counted or 0:,} launches counted per kernel and shape, no single "
              "launch to match with device data; the counts are carried into the timeline", file=sys.stderr)
    print(f"Wrote {args.output}", file=sys.stderr)
    print(f"You can now run: pasta-trace report {args.output}", file=sys.stderr)
    left_out(cap)  # the timeline holds the rest; its problems say what is missing
    return 0


def _merge(cap, out, tolerance_ns: int) -> merge.MergeStats:
    try:
        show = sys.stderr.isatty() and _rows(cap) >= PROGRESS_ROWS
    except BaseException:  # write_timeline discards `out` itself from here on
        out.discard()
        raise
    progress = _progress() if show else nullcontext(None)
    with progress as bar:
        task = bar.add_task("merging", total=len(STEPS)) if bar else None

        def step(name: str) -> None:
            if bar:
                bar.update(task, description=f"merging: {name}", advance=1)

        return merge.write_timeline(cap, out, step=step, tolerance_ns=tolerance_ns)


STEPS = ["host frames", "device frames", "kernels", "allocations", "pages", "alloc_touches", "working_set",
         "hotness", "statistics"]


def _progress():
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(), transient=True,
                    console=Console(stderr=True))
