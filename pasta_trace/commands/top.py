"""`pasta-trace top`: a live per-process view of GPU API activity."""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path

import polars as pl

from ..call_result import failed

HELP = "live per-process view: launches/s, bytes allocated, copies, syncs, failed calls (refreshes every second)"

EXAMPLES = """\
  sudo pasta-trace top                 every process using libcuda, libamdhip64 or libnccl
  sudo pasta-trace top -p 1234 -d 30   one process, for 30 s
  sudo pasta-trace top | tee top.log   plain lines when stdout is not a terminal
"""

COLUMNS = ("pid", "comm", "launches/s", "allocs/s", "device_alloc_bytes", "pinned_alloc_bytes", "copies/s",
           "copy_bytes/s", "syncs/s", "failed/s")
_KEY = ["pid", "kind", "failed", "memory"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    from .. import schema
    from .record import _pids, _rows, _seconds

    p.add_argument("-p", "--pid", type=_pids, metavar="PID[,PID...]", help="only these processes")
    p.add_argument("-d", "--duration", type=_seconds, metavar="SEC", help="stop after SEC seconds")
    p.add_argument("-i", "--interval", type=_seconds, default=1.0, metavar="SEC", help="refresh interval (1 s)")
    p.add_argument("--aggregate-max", type=_rows, default=schema.DEFAULT_AGGREGATE_MAX, metavar="N",
                   help=f"rows the in-kernel counting map holds (default {schema.DEFAULT_AGGREGATE_MAX}); "
                        "raise it when calls are not counted")


def snapshot(session) -> pl.DataFrame:
    """Totals of the in-kernel aggregation so far, per process, call kind,
    failed or not, and memory (device or pinned host) for allocations."""
    from ..capture.decode import aggregate_frame
    from ..probes.catalog import API_NAMES

    keys, vals = session.aggregate()  # one row per (pid, api, kernel, shape, ret): a few thousand at most
    return snapshot_frame(aggregate_frame(keys, vals, list(API_NAMES)))


def snapshot_frame(aggregate: pl.DataFrame) -> pl.DataFrame:
    """snapshot() of the aggregation's rows (schema.AGGREGATE_SCHEMA): a
    failed call's row is its own and holds no bytes (bpf/pasta.h,
    pt_aggregate), so bytes count the calls that succeeded only."""
    from ..lifetimes import kind_from_api, memory

    return (
        aggregate
        .group_by("pid", pl.col("kind").cast(pl.String), failed().alias("failed"),
                  memory(kind_from_api(pl.col("api"))).cast(pl.String).alias("memory"))
        .agg(pl.col("count").sum(), pl.col("bytes").sum())
    )


def rates(prev: pl.DataFrame, now: pl.DataFrame, dt: float, comms: dict[int, str]) -> pl.DataFrame:
    """Per process: calls per second since `prev`, and bytes allocated so far.
    Failed calls count only in failed/s (and moved no bytes)."""
    d = now.join(prev, on=_KEY, how="left", suffix="_prev").with_columns(
        ((pl.col("count") - pl.col("count_prev").fill_null(0)) / dt).alias("rate"),
        ((pl.col("bytes") - pl.col("bytes_prev").fill_null(0)) / dt).alias("byte_rate"),
    )

    def of(kind: str, col: str, name: str, mem: str | None = None) -> pl.Expr:
        keep = (pl.col("kind") == kind) & ~pl.col("failed")
        if mem is not None:
            keep &= pl.col("memory") == mem
        return pl.col(col).filter(keep).sum().alias(name)

    return (
        d.group_by("pid")
        .agg(
            of("launch", "rate", "launches/s"),
            of("alloc", "rate", "allocs/s"),
            of("alloc", "bytes", "device_alloc_bytes", "device"),
            of("alloc", "bytes", "pinned_alloc_bytes", "pinned host"),
            of("memcpy", "rate", "copies/s"),
            of("memcpy", "byte_rate", "copy_bytes/s"),
            of("sync", "rate", "syncs/s"),
            pl.col("rate").filter(pl.col("failed")).sum().alias("failed/s"),
        )
        .with_columns(pl.col("pid").replace_strict(comms, default="?", return_dtype=pl.String).alias("comm"))
        .sort("launches/s", "pid", descending=[True, False])
        .select(COLUMNS)
    )


def loss_line(lost: dict[str, int], settings: dict[str, int]) -> str | None:
    """What top could not count so far, with the cure (None: nothing lost)."""
    from ..capture.summary import loss_lines

    if not any(lost.values()):
        return None
    return "; ".join(line.strip() for line in loss_lines(lost, settings))


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "(exited)"


def run(args: argparse.Namespace) -> int:
    from ..capture.options import Options
    from ..capture.session import Session

    opts = Options(mode="pid" if args.pid else "system", out_dir=Path("."), command_line=sys.argv[:],
                   pids=args.pid or [], aggregate=True, aggregate_max=args.aggregate_max, verbose=args.verbose)
    tty = sys.stdout.isatty()
    session = Session(opts, say=lambda m: print(m, file=sys.stderr, flush=True))
    session.check()
    session.setup()
    stop = False

    def _stop(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGINT, _stop)
    signal.signal(signal.SIGTERM, _stop)
    deadline = time.monotonic() + args.duration if args.duration else None
    prev, t_prev = snapshot(session), time.monotonic()
    comms: dict[int, str] = {}
    live = None
    if tty:
        from rich.live import Live

        live = Live("", refresh_per_second=2, screen=False)
        live.__enter__()
    try:
        while not stop and (deadline is None or time.monotonic() < deadline):
            end = time.monotonic() + args.interval
            while not stop and time.monotonic() < end:
                session.poll()  # late-loaded libraries: attach, resume
                time.sleep(0.02)
            now, t_now = snapshot(session), time.monotonic()
            for pid in now["pid"].unique().to_list():
                comms.setdefault(pid, _comm(pid))
            table = rates(prev, now, t_now - t_prev, comms)
            prev, t_prev = now, t_now
            lost = loss_line(session.lost(), opts.settings)
            if live is not None:
                live.update(_rich_table(table, lost))
            else:
                _print_plain(table, lost)
    finally:
        if live is not None:
            live.__exit__(None, None, None)
        session.detach()
    return 0


def _rich_table(frame: pl.DataFrame, lost: str | None):
    from rich.table import Table

    t = Table(title=f"pasta-trace top  {time.strftime('%H:%M:%S')}  (Ctrl-C to end)", caption=lost)
    for c in COLUMNS:
        t.add_column(c, justify="left" if c == "comm" else "right")
    for row in frame.iter_rows():
        t.add_row(*(f"{v:,.0f}" if isinstance(v, float) else str(v) for v in row))
    return t


def _print_plain(frame: pl.DataFrame, lost: str | None) -> None:
    stamp = time.strftime("%H:%M:%S")
    for row in frame.iter_rows(named=True):
        print(stamp, " ".join(f"{k}={v:.0f}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()),
              flush=True)
    if lost is not None:
        print(stamp, lost, flush=True)
