"""`pasta-trace dump`: ask the running daemon to write its window now (docs/daemon.md)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HELP = "have the running daemon write the last window of events as a capture directory"

EXAMPLES = """\
  sudo pasta-trace dump                     every process's events of the window
  sudo pasta-trace dump --pid 1234          PID 1234's only
  sudo pasta-trace dump --socket /run/pt/daemon.sock   a daemon started with --socket
"""

#: a dump of a full window writes a few hundred MiB at most: seconds
DEFAULT_TIMEOUT_S = 120.0


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..daemon.control import DEFAULT_SOCKET
    from .arg_types import seconds

    p.add_argument("--pid", type=int, metavar="PID", help="only this process's events")
    p.add_argument("--socket", type=Path, default=DEFAULT_SOCKET, metavar="PATH",
                   help=f"the daemon's control socket (default {DEFAULT_SOCKET})")
    p.add_argument("--timeout", type=seconds, default=DEFAULT_TIMEOUT_S, metavar="SEC",
                   help=f"how long to wait for the dump to be written (default {DEFAULT_TIMEOUT_S:g})")


def run(args: argparse.Namespace) -> int:
    from ..daemon.control import request_dump

    answer = request_dump(args.socket, args.pid, args.timeout)
    print(answer["dir"])
    print(f"{answer['events']:,} events ({answer['dropped']:,} older dropped)", file=sys.stderr)
    print(f"You can now run: pasta-trace report {answer['dir']}", file=sys.stderr)
    return 0
