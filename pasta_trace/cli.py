"""`pasta-trace` entry point: argparse verbs and flags only, no logic."""

from __future__ import annotations

import argparse
import difflib
import importlib
import shlex
import sys
import traceback

from polars.exceptions import PanicException

from . import __version__
from .capture import own_process
from .commands import VERBS
from .errors import EXIT_RUNTIME, EXIT_USAGE, PastaError, UsageError

DESCRIPTION = """\
pasta-trace: see what a GPU program does (CUDA driver and HIP API calls via eBPF
uprobes, device-side memory events via gpu_probes) without restarting it.

verbs (default: record):
  record   record a running process, the whole machine, or a launched command
  top      live per-process view
  doctor   check kernel, BPF, BCC, headers, libraries and say what to fix
  merge    join host and device data into one timeline
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

exit codes: 0 ok, 1 runtime error, 2 usage error, 77 missing privileges
"""


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
    own_process.mark()  # before any thread starts: no pasta-trace process is ever stopped by a tracer
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
        return int(args._run(args) or 0)
    except PastaError as e:
        if getattr(args, "verbose", False):
            traceback.print_exc()
        print(f"pasta-trace: error: {e.one_line()}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        return 0
    except BrokenPipeError:
        return 0
    except (Exception, PanicException) as e:  # a bug (a Polars panic is no Exception): still one line unless -v
        if getattr(args, "verbose", False):
            traceback.print_exc()
        print(f"pasta-trace: internal error: {type(e).__name__}: {e} (run with -v for the traceback)",
              file=sys.stderr)
        return EXIT_RUNTIME


if __name__ == "__main__":
    raise SystemExit(main())
