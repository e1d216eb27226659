"""`pasta-trace daemon`: the node daemon's flight recorder (docs/daemon.md)."""

from __future__ import annotations

import argparse
import grp
import os
import re
import sys
from pathlib import Path

from ..errors import UsageError
from ..daemon.triggers import KINDS
from .arg_types import pages, seconds

HELP = "trace every GPU process, keep the last minute in memory, write it out on demand or on a failure"

EXAMPLES = """\
  sudo pasta-trace daemon -o /var/lib/pasta-trace        keep the last 60 s; dumps go there
  sudo pasta-trace daemon -o dumps/ --window 30 --window-bytes 256M --keep 10
  sudo pasta-trace dump                                  write the window of every process now
  sudo pasta-trace dump --pid 1234                       only PID 1234's events
  sudo kill -USR1 PID                                    the same (PID: the daemon's, in its banner)
  sudo pasta-trace daemon -o dumps/ --hang-after 120 --quiet-after 45 --after 10
                         dump on an NCCL call stuck 2 min, a GPU process silent 45 s; keep 10 s after each
  sudo pasta-trace daemon -o dumps/ --hang-after 0 --debounce 3600   no hang trigger; one dump an hour per cause
  sudo pasta-trace daemon -o dumps/ --triggers oom,cuda_error,nccl_hang   no dump on other failures
  sudo pasta-trace daemon -o dumps/ --triggers none   dumps only when asked (dump, SIGUSR1)
  sudo pasta-trace daemon -o dumps/ --socket-group gpuops   members of gpuops may ask for dumps too
  sudo pasta-trace daemon -o dumps/ --metrics 0.0.0.0:9464   Prometheus may scrape it from other machines
contrib/pasta-trace-daemon.service and contrib/pasta-trace-daemonset.yaml run it as a service (docs/daemon.md)
"""

DEFAULT_WINDOW_S = 60.0
DEFAULT_HANG_AFTER_S = 60.0
DEFAULT_DEBOUNCE_S = 300.0
DEFAULT_AFTER_S = 5.0
DEFAULT_WINDOW_BYTES = 1 << 30
DEFAULT_METRICS = "127.0.0.1:9464"
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def byte_size(text: str) -> int:
    """A size in bytes: 1048576, 512K, 256M, 2G (powers of 1024), at least 1 MiB."""
    m = re.fullmatch(r"\s*([0-9]+)\s*([kKmMgGtT]?)(i?[bB])?\s*", text)
    if m is None:
        raise argparse.ArgumentTypeError(f"not a size: {text!r}: try 256M or 2G")
    n = int(m.group(1)) * _UNITS[m.group(2).lower()]
    if n < 1 << 20:
        raise argparse.ArgumentTypeError(f"{text} is less than 1 MiB: try 256M")
    return n


def metrics_address(text: str) -> tuple[str, int] | None:
    """--metrics: where /metrics is served, or None (off)."""
    from ..daemon.metrics import parse_address

    try:
        return parse_address(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def seconds_or_off(text: str) -> float | None:
    """--hang-after, --quiet-after: seconds, or 0 / off: the trigger is off."""
    return None if text.strip().lower() in ("0", "off") else seconds(text)


def seconds_or_zero(text: str) -> float:
    """--after: 0 or a positive number of seconds."""
    return 0.0 if text.strip() in ("0", "0.0") else seconds(text)


def trigger_kinds(text: str) -> frozenset[str]:
    """--triggers: all, none, or a comma-separated list of KINDS."""
    words = {w.strip() for w in text.split(",") if w.strip()}
    if words in ({"all"}, {"none"}):
        return frozenset(KINDS) if words == {"all"} else frozenset()
    unknown = sorted(words - set(KINDS))
    if unknown or not words:
        raise argparse.ArgumentTypeError(f"{', '.join(unknown) or repr(text)}: not a trigger (all, none, or some "
                                         f"of {','.join(KINDS)})")
    return frozenset(words)


def count(text: str) -> int:
    """--keep: a number of dumps, 1 or more."""
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"not a number of dumps (1 or more): {text!r}: try 20")
    return int(text)


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..capture.session.options import DEFAULT_BUFFER_PAGES
    from ..daemon.control import DEFAULT_SOCKET

    p.add_argument("-o", "--output", type=Path, metavar="DIR", required=True,
                   help="where dumps go, each a capture directory DIR/dump-<UTC time>-<trigger>[-pid<PID>]")
    p.add_argument("--window", type=seconds, default=DEFAULT_WINDOW_S, metavar="SEC",
                   help=f"seconds of events kept in memory (default {DEFAULT_WINDOW_S:g}); older ones are dropped, "
                        "and counted in each dump's manifest")
    p.add_argument("--window-bytes", type=byte_size, default=DEFAULT_WINDOW_BYTES, metavar="N",
                   help=f"the most memory the window's events may take (default {DEFAULT_WINDOW_BYTES >> 20}M); "
                        "past it the oldest go first, whatever the event rate")
    p.add_argument("--keep", type=count, metavar="N", help="keep the N newest dumps in DIR, remove older ones")
    p.add_argument("--keep-bytes", type=byte_size, metavar="N",
                   help="remove the oldest dumps while DIR's dumps take more than N bytes (the newest stays)")
    p.add_argument("--socket", type=Path, default=DEFAULT_SOCKET, metavar="PATH",
                   help=f"the control socket `pasta-trace dump` talks to (default {DEFAULT_SOCKET}), root's only")
    p.add_argument("--socket-group", metavar="GROUP",
                   help="let members of GROUP ask for dumps too (the socket becomes 0660 and the group's)")
    p.add_argument("--buffer-pages", type=pages, default=DEFAULT_BUFFER_PAGES, metavar="N",
                   help=f"ring buffer size in pages, a power of two (default {DEFAULT_BUFFER_PAGES}); "
                        "raise it when events are lost")
    g = p.add_argument_group("automatic triggers", "a dump of every process, named by the trigger and its PID, on "
                             "out of memory,\nan illegal address, a launch failure, cuInit failing, a hang suspect,\n"
                             "or a process with GPU calls killed by a signal or exiting non-zero\n(docs/daemon.md)")
    g.add_argument("--triggers", type=trigger_kinds, default=frozenset(KINDS), metavar="LIST",
                   help=f"the triggers that make a dump: all (the default), none, or some of {','.join(KINDS)}; "
                        "the others are still counted in the metrics")
    g.add_argument("--hang-after", type=seconds_or_off, default=DEFAULT_HANG_AFTER_S, metavar="SEC",
                   help=f"an NCCL collective (or send/recv, communicator creation) entered and not returned after "
                        f"SEC seconds fires nccl_hang (default {DEFAULT_HANG_AFTER_S:g}; 0: off)")
    g.add_argument("--quiet-after", type=seconds_or_off, default=None, metavar="SEC",
                   help="a process with GPU calls that makes none for SEC seconds while it lives fires quiet "
                        "(default off: a healthy program may pause for long); less than --window")
    g.add_argument("--debounce", type=seconds, default=DEFAULT_DEBOUNCE_S, metavar="SEC",
                   help=f"one dump per trigger kind per process per SEC seconds (default {DEFAULT_DEBOUNCE_S:g}); "
                        "the others are counted, and said with -v")
    g.add_argument("--after", type=seconds_or_zero, default=DEFAULT_AFTER_S, metavar="SEC",
                   help=f"a trigger's dump keeps the window before it and SEC seconds after it (default "
                        f"{DEFAULT_AFTER_S:g}): it is written SEC seconds after the trigger fired")
    p.add_argument("--no-stacks", action="store_true",
                   help="record no Python stacks (each event's Python call site, as -a records by default)")
    p.add_argument("--metrics", type=metrics_address, default=DEFAULT_METRICS, metavar="ADDR",
                   help=f"serve Prometheus metrics on http://ADDR/metrics (default {DEFAULT_METRICS}, this machine "
                        "only; HOST:PORT, [IPv6]:PORT, PORT; 0.0.0.0:PORT for every interface; off: none)")
    p.add_argument("--no-bpf-cache", action="store_true",
                   help="compile every BPF handler again instead of loading those compiled before")


def _group(name: str | None) -> int | None:
    if name is None:
        return None
    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        if name.isdigit():
            return int(name)
        raise UsageError(f"--socket-group {name}: no such group", hint="give a group name or number") from None


def run(args: argparse.Namespace) -> int:
    from ..daemon.service import Daemon, DaemonOptions

    opts = DaemonOptions(out_dir=args.output, window_s=args.window, window_bytes=args.window_bytes,
                         socket=args.socket, socket_group=_group(args.socket_group), keep=args.keep,
                         keep_bytes=args.keep_bytes, buffer_pages=args.buffer_pages, command_line=sys.argv[:],
                         verbose=args.verbose, bpf_cache=not args.no_bpf_cache,
                         stacks=not args.no_stacks, hang_after_s=args.hang_after, quiet_after_s=args.quiet_after,
                         debounce_s=args.debounce, after_s=args.after, metrics=args.metrics,
                         triggers=args.triggers)
    if opts.quiet_after_s is not None and opts.quiet_after_s >= opts.window_s:
        # its dump keeps the window before it: none of the quiet process's calls would be in it
        raise UsageError(f"--quiet-after {opts.quiet_after_s:g} is not less than --window {opts.window_s:g}",
                         hint="a quiet process's last calls must still be in the window: raise --window")
    if os.path.lexists(opts.out_dir) and not os.path.isdir(opts.out_dir):
        raise UsageError(f"output path {opts.out_dir} exists and is not a directory")
    return Daemon(opts, say=lambda m: print(m, file=sys.stderr, flush=True)).run()
