"""`pasta-trace top`: a live per-process view of GPU API activity.

The probes run as for a recording without stacks; top drains their events
itself (no capture is written), counts them per refresh (capture/session/top_counts)
and draws the screen (reporters/top_screen)."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

from .arg_types import pages, seconds
from .common import add_duration_option, add_pid_option

HELP = "live per-process view: calls per second by kind, and the memory each process holds (refreshes every second)"

EXAMPLES = """\
  sudo pasta-trace top                 every process using libcuda, libamdhip64, libc10 or libnccl
  sudo pasta-trace top -p 1234 -d 30   one process, for 30 s
  sudo pasta-trace top | tee top.log   plain lines, every column, when stdout is not a terminal
"""

POLL_S = 0.01  # as the recording's drain: a ring of the default size holds ~0.1 s of a 1 M calls/s flood


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..capture.session.options import DEFAULT_BUFFER_PAGES

    who = p.add_mutually_exclusive_group()
    add_pid_option(who, "only these processes")
    who.add_argument("-a", "--system-wide", action="store_true",
                     help="every process that uses a traced library, including later ones (the default)")
    add_duration_option(p)
    p.add_argument("-i", "--interval", type=seconds, default=1.0, metavar="SEC", help="refresh interval (1 s)")
    p.add_argument("--buffer-pages", type=pages, default=DEFAULT_BUFFER_PAGES, metavar="N",
                   help=f"ring buffer size in pages, a power of two (default {DEFAULT_BUFFER_PAGES}); "
                        "raise it when calls are lost")
    p.add_argument("--no-bpf-cache", action="store_true",
                   help="compile every BPF handler again instead of loading those compiled before")


def loss_line(lost: dict[str, int], settings: dict[str, int]) -> str | None:
    """What top could not count so far, with the cure (None: nothing lost)."""
    from ..capture.session.summary import loss_lines

    if not any(lost.values()):
        return None
    return "; ".join(line.strip() for line in loss_lines(lost, settings))


def watching(pid_list: list[int], comms: dict[int, str], libraries: list[str]) -> str:
    """What top watches: the processes, and the libraries probed so far."""
    if pid_list:
        who = "PID " + ", ".join(f"{p} ({comms[p]})" if p in comms else str(p) for p in pid_list)
    else:
        who = "every process (-a)"
    names = list(dict.fromkeys(Path(lib).name for lib in libraries))
    if not names:
        return (f"{who}: no libcuda, libcudart, libamdhip64, libc10 or libnccl loaded yet, "
                "each probed as soon as it is")
    return f"{who}: {', '.join(names)}"


def _comm(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return None


def run(args: argparse.Namespace) -> int:
    from .. import schema
    from ..capture.session.options import Options
    from ..capture.bpf.ringbuf import open_table
    from ..capture.session.session import Session
    from ..capture.session.top_counts import TopCounts
    from ..probes.catalog import API_NAMES
    from ..reporters import top_screen

    opts = Options(mode="pid" if args.pid else "system", out_dir=Path("."), command_line=sys.argv[:],
                   pids=args.pid or [], buffer_pages=args.buffer_pages, stacks=False, verbose=args.verbose,
                   bpf_cache=not args.no_bpf_cache)
    tty = sys.stdout.isatty()
    session = Session(opts, say=lambda m: print(m, file=sys.stderr, flush=True), banner=False)
    session.check()
    session.setup()
    comms: dict[int, str] = {p: c for p in opts.pids if (c := _comm(p)) is not None}
    print(f"Watching {watching(opts.pids, comms, session.libraries())}; refreshing every {args.interval:g} s. "
          "Ctrl-C to end.", file=sys.stderr, flush=True)
    stop = False

    def _stop(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGINT, _stop)
    signal.signal(signal.SIGTERM, _stop)
    deadline = time.monotonic() + args.duration if args.duration else None
    events = open_table(session.bpf, "events", schema.HOST_EVENT.dtype, reuse=True)
    names = open_table(session.bpf, "names", schema.HOST_NAME.dtype, reuse=True)  # drained so as not to fill
    counts = TopCounts(list(API_NAMES))
    since, t_prev = time.strftime("%H:%M:%S"), time.monotonic()
    ever: set[str] = set()
    screen = _Screen() if tty else None
    try:
        while not stop and (deadline is None or time.monotonic() < deadline):
            end = time.monotonic() + args.interval
            while not stop and time.monotonic() < end:
                counts.add(events.drain())
                names.drain()
                session.poll()  # late-loaded libraries: attach, resume
                time.sleep(POLL_S)
            counts.add(events.drain())
            counts.forget([p for p in counts.holding() if not os.path.exists(f"/proc/{p}")])
            interval, totals, held = counts.take()
            t_now = time.monotonic()
            for pid in set(interval["pid"].to_list()) | set(held["pid"].to_list()):
                if pid not in comms and (c := _comm(pid) or counts.comms.get(pid)) is not None:
                    comms[pid] = c
            frame = top_screen.table_frame(interval, held, t_now - t_prev, comms)
            t_prev = t_now
            ever |= {c for c in totals.columns if c != "pid" and totals[c].sum()}
            ever |= {c for c in held.columns if c != "pid" and held[c].sum()}
            lost = loss_line(session.lost(), opts.settings)
            if screen is not None:
                title = (f"pasta-trace top  {time.strftime('%H:%M:%S')}  "
                         f"{watching(opts.pids, comms, session.libraries())}  (Ctrl-C to end)")
                screen.show(frame, title, top_screen.totals_line(totals, since), ever, [lost] if lost else [])
            else:
                stamp = time.strftime("%H:%M:%S")
                for line in top_screen.plain_lines(frame, stamp):
                    print(line, flush=True)
                print(stamp, top_screen.totals_line(totals, since), flush=True)
                if lost is not None:
                    print(stamp, lost, flush=True)
    finally:
        if screen is not None:
            screen.close()
        events.close()
        names.close()
        session.detach()
    return 0


class _Screen:
    """The table redrawn in place on the terminal (rich), sized to it at each refresh."""

    def __init__(self) -> None:
        from rich.console import Console
        from rich.live import Live

        self._console = Console()
        self._live = Live("", console=self._console, auto_refresh=False)
        self._live.__enter__()

    def show(self, frame, title: str, totals: str, ever: set[str], notes: list[str]) -> None:
        from rich.text import Text

        from ..reporters import top_screen

        size = os.get_terminal_size(sys.stdout.fileno())
        screen = top_screen.render(frame, width=size.columns, height=size.lines, title=title, totals=totals,
                                   ever=ever, notes=notes)
        self._live.update(Text("\n".join(screen.lines), no_wrap=True, overflow="crop"), refresh=True)

    def close(self) -> None:
        self._live.__exit__(None, None, None)
