"""`pasta-trace merge DIR [DEVICE_FILES...] -o OUT`: one timeline from a capture
and device record files (docs/merge.md); `pasta-trace merge DIR1 DIR2 ... -o OUT`:
one cluster timeline from many captures, one per node or rank (docs/cluster.md)."""

from __future__ import annotations

import argparse
import sys
from contextlib import nullcontext
from pathlib import Path

import polars as pl

from .. import merge
from ..damage import left_out, reading, reading_all
from ..errors import FormatError, UsageError
from ..read import open_capture, read_device
from .arg_types import microseconds
from .common import say_wrote, warn_problems

HELP = ("join host events and device data into one timeline (Parquet directory), or captures of many nodes "
        "or ranks into one cluster timeline")
EXAMPLES = """\
  pasta-trace merge pasta-host-20261202T1200/ -o timeline.parquet
  pasta-trace merge pasta-host-20261202T1200/ gpu_probes.4242.sanitizer.bin -o timeline.parquet
  pasta-trace merge pasta-host-20261202T1200/ -o timeline.parquet --force
  pasta-trace merge node0/pasta-host-*/ node1/pasta-host-*/ -o cluster.parquet
  pasta-trace merge node*/pasta-host-*/ -o cluster.parquet --clock-sync-us 1
  pasta-trace report timeline.parquet
"""

#: CLOCK_REALTIME of two hosts under NTP agree to within milliseconds at worst.
CLOCK_SYNC_US = 10_000.0

#: Inputs above this many rows show a progress bar (when stderr is a terminal).
PROGRESS_ROWS = 1_000_000


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("inputs", metavar="DIR|DEVICE_FILE", nargs="+", type=Path,
                   help="capture directories (from `pasta-trace record`; several: one timeline of all of them, "
                        "one per node or rank) and, with one capture, device record files (gpu_probes.*.bin) "
                        "beyond those in DIR/device/")
    p.add_argument("-o", "--output", metavar="OUT", type=Path, required=True,
                   help="timeline directory to write (e.g. timeline.parquet)")
    p.add_argument("--force", action="store_true", help="replace OUT if it is an earlier timeline or a file")
    p.add_argument("--tolerance-us", type=microseconds, default=merge.TOLERANCE_NS / 1000, metavar="US",
                   help="host/device launch time tolerance for matching by time (default %(default)g)")
    p.add_argument("--clock-sync-us", type=microseconds, default=CLOCK_SYNC_US, metavar="US",
                   help="several captures: how far apart the hosts' CLOCK_REALTIME may be (NTP: ~1000, PTP: ~1); "
                        "collective entry times refine the alignment within it (default %(default)g)")


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


def _cluster(args: argparse.Namespace, dirs: list[Path]) -> int:
    out = merge.timeline_output(args.output, force=args.force)

    def load() -> list:
        try:
            return [open_capture(d) for d in dirs]
        except BaseException:
            out.discard()
            raise

    with reading_all(load, verbose=args.verbose) as caps:
        offsets = merge.write_cluster(caps, out, sync_ns=int(args.clock_sync_us * 1000))
    for cap in caps:
        warn_problems(cap, f"{cap.path}: ")
        if cap.has_device_data:
            print(f"pasta-trace: warning: {cap.path}: its device data is not in the cluster timeline "
                  f"(see its kernels with: pasta-trace merge {cap.path} -o OUT)", file=sys.stderr)
    print(f"{'capture':<40} {'node':<16} {'offset':>16} {'+/-':>10}  method", file=sys.stderr)
    for r in offsets.iter_rows(named=True):
        unc = "?" if r["uncertainty_ns"] is None else f"{r['uncertainty_ns'] / 1000:.1f} us"
        print(f"{r['path'][-40:]:<40} {r['node'][:16]:<16} {r['offset_ns'] / 1000:>13.1f} us {unc:>10}  "
              f"{r['method']}", file=sys.stderr)
    if "none" in offsets["method"].to_list():
        print("pasta-trace: warning: captures with neither clock samples nor collectives shared with the first "
              "are not aligned (offset 0)", file=sys.stderr)
    say_wrote(args.output)
    left_out(*caps)  # as one capture's merge: the timeline holds the rest, its problems say what is missing
    return 0


def run(args: argparse.Namespace) -> int:
    missing = [p for p in args.inputs if not p.exists()]
    if missing:
        what = "device record file" if missing[0].suffix == ".bin" else "file or directory"
        raise FormatError(f"{missing[0]}: no such {what}")
    # the first input is the capture even when it is not a directory (open_capture says why not)
    dirs = args.inputs[:1] + [p for p in args.inputs[1:] if p.is_dir()]
    args.device_files = [p for p in args.inputs[1:] if not p.is_dir()]
    if len(dirs) > 1:
        if args.device_files:
            raise UsageError("device record files go with one capture", hint="merge each capture with its own first")
        timelines = [d for d in dirs if merge.is_timeline(d)]
        if timelines:
            raise UsageError(f"{timelines[0]} is already a merged timeline", hint="give capture directories")
        return _cluster(args, dirs)
    src = dirs[0]
    if merge.is_timeline(src):
        raise UsageError(f"{src} is already a merged timeline", hint="give the capture directory")
    out = merge.timeline_output(args.output, force=args.force)  # a bad -o fails before any work
    with reading(lambda: _inputs(src, args.device_files, out), verbose=args.verbose) as cap:
        stats = _merge(cap, out, int(args.tolerance_us * 1000))
    warn_problems(cap)
    for line in stats.lines():
        print(line, file=sys.stderr)
    if cap.aggregate is not None:
        counted = cap.aggregate.filter(pl.col("kind") == "launch").select(pl.col("count").sum()).collect().item()
        print(f"note: an --aggregate capture: {counted or 0:,} launches counted per kernel and shape, no single "
              "launch to match with device data; the counts are carried into the timeline", file=sys.stderr)
    say_wrote(args.output)
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
