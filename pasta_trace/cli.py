"""`pasta-trace` entry point: argparse verbs and flags only, no logic."""

from __future__ import annotations

import argparse
import importlib
import sys
import traceback

from polars.exceptions import PanicException

from . import __version__
from .capture import own_process
from .commands import VERBS
from .errors import EXIT_RUNTIME, EXIT_USAGE, PastaError

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

exit codes: 0 ok, 1 runtime error, 2 usage error, 77 missing privileges
"""


def _load(verb: str):
    return importlib.import_module(f".commands.{VERBS[verb]}", __package__)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
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
    if not argv or argv[0] in ("-h", "--help", "--version"):
        return argv
    if argv[0] in VERBS:
        return argv
    return ["record", *argv]


def main(argv: list[str] | None = None) -> int:
    own_process.mark()  # before any thread starts: no pasta-trace process is ever stopped by a tracer
    argv = _with_default_verb(list(sys.argv[1:] if argv is None else argv))
    parser = build_parser()
    if not argv:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    args = parser.parse_args(argv)
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
