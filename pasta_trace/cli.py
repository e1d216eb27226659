"""`pasta-trace` entry point: argparse verbs and flags only, no logic."""

from __future__ import annotations

import argparse
import difflib
import importlib
import os
import shlex
import sys
import traceback

from polars.exceptions import PanicException

from . import __version__
from .capture.procs import own_process
from .commands import VERBS
from .errors import EXIT_NOPERM, EXIT_RUNTIME, EXIT_USAGE, PastaError, UsageError
from .privilege import drop_to_user

DESCRIPTION = """\
pasta-trace: see what a GPU program does (CUDA driver and HIP API calls via eBPF
uprobes, device-side memory events via gpu_probes) without restarting it.

verbs (default: record):
  record   record a running process, the whole machine, or a launched command
  top      live per-process view
  daemon   trace every GPU process, keep the last minute in memory (a flight recorder)
  dump     have the daemon write its window now, as a capture
  doctor   check kernel, BPF, BCC, headers, libraries and say what to fix
  merge    join host and device data into one timeline; many captures into one
  report   summaries in the terminal, as JSON, or as an HTML page
  export   Perfetto, Chrome trace JSON, or CSV
"""

EPILOG = """\
examples:
  sudo pasta-trace -p 1234 -d 10            record PID 1234 for 10 s
  sudo pasta-trace -a                       record every process until Ctrl-C
  sudo pasta-trace -- python train.py       launch and record a command
  pasta-trace report pasta-host-20261202T1200/
  pasta-trace export pasta-host-20261202T1200/ --format perfetto

sudo does not search a virtual environment: there, run `sudo .venv/bin/pasta-trace ...`

exit codes: 0 ok, 1 runtime error, 2 usage error, 77 missing privileges, 130 interrupted (Ctrl-C;
record, top and daemon end on Ctrl-C with 0)

under sudo, only record, top and daemon keep root, and only for the probes; report, merge, export, dump and
doctor's reading run as the user who ran sudo (docs/security.md)
"""

#: 128 + SIGINT, as a shell reports a command Ctrl-C ended
EXIT_INTERRUPTED = 130
#: verbs that need no privilege: under sudo they become the user before
#: reading anything (doctor does, after the checks that need root); dump
#: connects to the daemon's socket as the user (daemon.control)
AS_USER = ("report", "merge", "export", "dump")
#: verbs for which Ctrl-C is how they end, not an interruption
ENDED_BY_CTRL_C = ("record", "top", "daemon")


def _load(verb: str):
    return importlib.import_module(f".commands.{VERBS[verb]}", __package__)


class Parser(argparse.ArgumentParser):
    """argparse that reports a usage error as one line with its fix (a
    UsageError for main() to print), never the whole usage block."""

    def error(self, message: str):
        # flag values checked by our own types already say what to give instead;
        # argparse's own messages (a missing value, an unknown flag) point at --help
        fixed = "try " in message or "choose from" in message
        raise UsageError(message, hint=None if fixed else f"see `{self.prog} --help`")


def build_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="pasta-trace", description=DESCRIPTION, epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"pasta-trace {__version__}")
    sub = p.add_subparsers(dest="verb", metavar="VERB")
    for verb in VERBS:
        mod = _load(verb)
        sp = sub.add_parser(
            verb, help=mod.HELP, description=mod.HELP, epilog="examples:\n" + mod.EXAMPLES,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        sp.add_argument("-v", "--verbose", action="store_true", help="show details and tracebacks")
        mod.add_arguments(sp)
        sp.set_defaults(_run=mod.run)
    return p


def _with_default_verb(argv: list[str]) -> list[str]:
    """`record` is the default verb when the arguments start with a flag (or
    `--`); a first word that is not a verb is a mistake, never a command to run."""
    if not argv or argv[0] in ("-h", "--help", "--version") or argv[0] in VERBS:
        return argv
    if argv[0].startswith("-"):
        return ["record", *argv]
    close = difflib.get_close_matches(argv[0], VERBS, n=1)
    if close:
        hint = f"did you mean `pasta-trace {shlex.join([close[0], *argv[1:]])}`?"
    else:
        hint = f"verbs: {', '.join(VERBS)}; to launch a command: `pasta-trace -- {shlex.join(argv)}`"
    raise UsageError(f"unknown verb {argv[0]!r}", hint=hint)


def main(argv: list[str] | None = None) -> int:
    own_process.mark()  # before any thread starts, so every thread shows the name (ps, top)
    given = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    if not given:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        args, extra = parser.parse_known_args(_with_default_verb(given))
        if extra:  # named here, where the verb is known, so that the hint is its --help
            raise UsageError(f"unrecognized arguments: {' '.join(extra)}",
                             hint=f"see `pasta-trace {args.verb} --help`")
    except PastaError as e:
        print(f"pasta-trace: error: {e.one_line()}", file=sys.stderr)
        return e.exit_code
    try:
        if args.verb in AS_USER:
            drop_to_user()
        return int(args._run(args) or 0)
    except PermissionError as e:
        if getattr(args, "verbose", False):
            traceback.print_exc()
        print(f"pasta-trace: error: {_denied(str(e), args)}", file=sys.stderr)
        return EXIT_NOPERM
    except PastaError as e:
        if getattr(args, "verbose", False):
            traceback.print_exc()
        if isinstance(e.__context__, PermissionError) and e.exit_code == EXIT_RUNTIME:
            # an input the user may not read (the reader said which, `from None`)
            print(f"pasta-trace: error: {_denied(e.one_line(), args)}", file=sys.stderr)
            return EXIT_NOPERM
        print(f"pasta-trace: error: {e.one_line()}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        return 0 if args.verb in ENDED_BY_CTRL_C else EXIT_INTERRUPTED
    except BrokenPipeError:
        return 0
    except (Exception, PanicException) as e:  # a bug (a Polars panic is no Exception): still one line unless -v
        if getattr(args, "verbose", False):
            traceback.print_exc()
        print(f"pasta-trace: internal error: {type(e).__name__}: {e} (run with -v for the traceback)",
              file=sys.stderr)
        return EXIT_RUNTIME


def _denied(what: str, args: argparse.Namespace) -> str:
    """`what` was refused for lack of permission: one line, with what to do (py-spy style)."""
    if os.geteuid() != 0 and os.environ.get("SUDO_UID", "0") != "0":  # dropped to the user who ran sudo
        user = os.environ.get("SUDO_USER") or str(os.getuid())
        if args.verb not in AS_USER:
            return f"{what} (under sudo pasta-trace reads as {user}, not as root)"
        given = getattr(args, "path", None) or next(iter(getattr(args, "inputs", None) or []), "CAPTURE")
        return (f"{what} (under sudo pasta-trace reads as {user}, not as root; to read a capture of root's, "
                f"give it to {user} first: `sudo chown -R {user} {shlex.quote(str(given))}`)")
    return what if os.geteuid() == 0 else f"{what} (run it as a user who may read it)"


if __name__ == "__main__":
    raise SystemExit(main())
