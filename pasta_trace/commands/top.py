"""`pasta-trace top`: a live per-process view of GPU API activity."""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path

import polars as pl

HELP = "live per-process view: launches/s, bytes allocated, copies, syncs (refreshes every second)"

EXAMPLES = """\
  sudo pasta-trace top                 every process using libcuda or libamdhip64
  sudo pasta-trace top -p 1234 -d 30   one process, for 30 s
  sudo pasta-trace top | tee top.log   plain lines when stdout is not a terminal
"""

COLUMNS = ("pid", "comm", "launches/s", "allocs/s", "alloc_bytes", "copies/s", "copy_bytes/s", "syncs/s")


def add_arguments(p: argparse.ArgumentParser) -> None:
    from .record import _pids, _seconds

    p.add_argument("-p", "--pid", type=_pids, metavar="PID[,PID...]", help="only these processes")
    p.add_argument("-d", "--duration", type=_seconds, metavar="SEC", help="stop after SEC seconds")
    p.add_argument("-i", "--interval", type=_seconds, default=1.0, metavar="SEC", help="refresh interval (1 s)")


def snapshot(session) -> pl.DataFrame:
    """Per (pid, kind) totals of the in-kernel aggregation so far."""
    keys, vals = session.aggregate()  # one row per (pid, api, kernel, shape): a few thousand at most
    return (
        pl.DataFrame({"pid": keys["pid"], "kind": keys["kind"], "count": vals["count"], "bytes": vals["bytes"]})
        .group_by("pid", "kind")
        .agg(pl.col("count").sum(), pl.col("bytes").sum())
    )


def rates(prev: pl.DataFrame, now: pl.DataFrame, dt: float, comms: dict[int, str]) -> pl.DataFrame:
    from ..schema import Kind

    d = now.join(prev, on=["pid", "kind"], how="left", suffix="_prev").with_columns(
        ((pl.col("count") - pl.col("count_prev").fill_null(0)) / dt).alias("rate"),
        ((pl.col("bytes") - pl.col("bytes_prev").fill_null(0)) / dt).alias("byte_rate"),
    )

    def of(kind: Kind, col: str, name: str) -> pl.Expr:
        return pl.col(col).filter(pl.col("kind") == int(kind)).sum().alias(name)

    return (
        d.group_by("pid")
        .agg(
            of(Kind.launch, "rate", "launches/s"),
            of(Kind.alloc, "rate", "allocs/s"),
            of(Kind.alloc, "bytes", "alloc_bytes"),
            of(Kind.memcpy, "rate", "copies/s"),
            of(Kind.memcpy, "byte_rate", "copy_bytes/s"),
            of(Kind.sync, "rate", "syncs/s"),
        )
        .with_columns(pl.col("pid").replace_strict(comms, default="?", return_dtype=pl.String).alias("comm"))
        .sort("launches/s", "pid", descending=[True, False])
        .select(COLUMNS)
    )


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "(exited)"


def run(args: argparse.Namespace) -> int:
    from ..capture.options import Options
    from ..capture.session import Session

    opts = Options(mode="pid" if args.pid else "system", out_dir=Path("."), command_line=sys.argv[:],
                   pids=args.pid or [], aggregate=True, verbose=args.verbose)
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
            if live is not None:
                live.update(_rich_table(table))
            else:
                _print_plain(table)
    finally:
        if live is not None:
            live.__exit__(None, None, None)
        session.detach()
    return 0


def _rich_table(frame: pl.DataFrame):
    from rich.table import Table

    t = Table(title=f"pasta-trace top  {time.strftime('%H:%M:%S')}  (Ctrl-C to end)")
    for c in COLUMNS:
        t.add_column(c, justify="left" if c == "comm" else "right")
    for row in frame.iter_rows():
        t.add_row(*(f"{v:,.0f}" if isinstance(v, float) else str(v) for v in row))
    return t


def _print_plain(frame: pl.DataFrame) -> None:
    stamp = time.strftime("%H:%M:%S")
    for row in frame.iter_rows(named=True):
        print(stamp, " ".join(f"{k}={v:.0f}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()),
              flush=True)
