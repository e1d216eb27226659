"""What several verbs share: the options they spell alike (-p, -d, the input
PATH, --call-site and --user-code), the warnings about an input's problems and
the closing lines that say where the output went.  A verb imports these from
here, never from another verb."""

from __future__ import annotations

import argparse
import sys

from ..read import Capture
from ..tools.sites import MODES, set_policy
from .arg_types import pids, seconds


def add_pid_option(group: argparse._ActionsContainer, text: str) -> None:
    """-p PID[,PID...] (record, top)."""
    group.add_argument("-p", "--pid", type=pids, metavar="PID[,PID...]", help=text)


def add_duration_option(p: argparse.ArgumentParser) -> None:
    """-d SEC (record, top)."""
    p.add_argument("-d", "--duration", type=seconds, metavar="SEC", help="stop after SEC seconds")


def add_input_path(p: argparse.ArgumentParser) -> None:
    """The PATH that report and export read."""
    p.add_argument("path", metavar="PATH", help="capture directory or merged timeline")


def add_call_site_arguments(p: argparse.ArgumentParser) -> None:
    """--call-site and --user-code (report and export)."""
    p.add_argument("--call-site", choices=MODES, default="user",
                   help="which frame of a stack names its call site: user (default: the innermost frame in your "
                        "code, outside the standard library, site-packages/dist-packages and frozen modules) or "
                        "innermost (the frame that made the call, inside a library or not)")
    p.add_argument("--user-code", action="append", metavar="PATH", default=[],
                   help="a file or directory that is your code (repeatable); then only frames there are yours")


def apply_call_site(args: argparse.Namespace, cap: Capture) -> None:
    set_policy(cap, args.call_site, args.user_code)


def warn_problems(cap: Capture, prefix: str = "") -> None:
    """A warning for each problem of the input that did not end the run
    (`prefix`: what names the input when there are several)."""
    for problem in cap.problems:
        if problem not in cap.damaged:  # those end the run, as its error
            print(f"pasta-trace: warning: {prefix}{problem}", file=sys.stderr)


def say_wrote(out: object) -> None:
    """The closing lines of a verb whose output `report` reads next."""
    print(f"Wrote {out}", file=sys.stderr)
    print(f"You can now run: pasta-trace report {out}", file=sys.stderr)
