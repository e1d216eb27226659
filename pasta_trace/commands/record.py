"""`pasta-trace record` (the default verb): trace CUDA driver and HIP API calls."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from .. import schema
from ..errors import PastaError, UsageError
from .arg_types import depth, pages, rows
from .common import add_duration_option, add_pid_option

HELP = "record a running process (-p), the whole machine (-a), or a launched command (-- CMD)"

EXAMPLES = """\
  sudo pasta-trace -p 1234                  trace PID 1234 until Ctrl-C
  sudo pasta-trace -p 1234,1240 -d 30       trace two processes for 30 s
  sudo pasta-trace -a -d 10 -o capture/     every process using a traced library, 10 s
  sudo pasta-trace -- python train.py       launch a command (as you, under sudo) and trace it
  sudo pasta-trace --buffer-pages 16384 -p 1234  a bigger ring buffer when events are lost
  sudo pasta-trace --aggregate -p 1234      counts per kernel and shape in the kernel, no events
  sudo pasta-trace --no-stacks -p 1234      without the caller's Python stack on each event
  sudo pasta-trace --stack-depth 16 -- python train.py   keep the 16 innermost Python frames
  sudo pasta-trace --native-stacks -- ./app also the C/C++ stack of allocations,
                                            frees, copies, syncs and failed calls
                                            (costly: README's OVERHEAD)
  sudo pasta-trace --device cupti -- ./app  add device-side data (docs/device.md)
  sudo pasta-trace --device cupti -p 1234   kernels, copies and memsets of a running CUDA
                                            process from now on (its collector loaded by ptrace)
  pasta-trace --print-bpf                   show the BPF program (no root needed)
  pasta-trace --dry-run -p 1234             show what would be attached (no root needed)
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..capture.session.options import (
        DEFAULT_BUFFER_PAGES,
        DEFAULT_NATIVE_PAGES,
        DEFAULT_STACK_PAGES,
        MAX_RING_PAGES,
    )
    from ..probes.compiled_cache import DEFAULT_DIR as DEFAULT_BPF_CACHE

    who = p.add_argument_group("what to trace (one of)")
    add_pid_option(who, "running processes; events from these PIDs (and children they start) only")
    who.add_argument("-a", "--system-wide", action="store_true",
                     help="every process that uses libcuda, libamdhip64 or libnccl, including later ones and containers")
    who.add_argument("command", nargs="*", metavar="-- CMD ARGS",
                     help="start CMD (as SUDO_USER under sudo), trace it and its children, stop when it exits")
    add_duration_option(p)
    p.add_argument("-o", "--output", type=Path, metavar="DIR",
                   help="capture directory (default pasta-<host>-<YYYYmmddTHHMMSS>)")
    p.add_argument("--force", action="store_true", help="overwrite the capture in an existing DIR")
    p.add_argument("--buffer-pages", type=pages, default=DEFAULT_BUFFER_PAGES, metavar="N",
                   help=f"ring buffer size in pages, a power of two (default {DEFAULT_BUFFER_PAGES} = "
                        f"{DEFAULT_BUFFER_PAGES * os.sysconf('SC_PAGE_SIZE') >> 20} MiB, at most {MAX_RING_PAGES}); "
                        "raise it when events are lost")
    p.add_argument("--aggregate", action="store_true",
                   help="count calls per (pid, API, kernel, grid, block) in the kernel instead of recording "
                        "events; writes aggregate.parquet")
    p.add_argument("--aggregate-max", type=rows, default=schema.DEFAULT_AGGREGATE_MAX, metavar="N",
                   help=f"rows the --aggregate map holds (default {schema.DEFAULT_AGGREGATE_MAX}); "
                        "raise it when calls are not counted")
    p.add_argument("--no-stacks", action="store_true",
                   help="do not record the caller's Python stack on each event (on by default)")
    p.add_argument("--stack-depth", type=depth, default=schema.DEFAULT_STACK_DEPTH, metavar="N",
                   help=f"Python frames kept per stack, innermost first (default {schema.DEFAULT_STACK_DEPTH}, "
                        f"at most {schema.MAX_STACK_DEPTH}); deeper stacks are marked truncated")
    p.add_argument("--stack-buffer-pages", type=pages, default=DEFAULT_STACK_PAGES, metavar="N",
                   help=f"ring buffer for new stacks, in pages, a power of two (default {DEFAULT_STACK_PAGES}); "
                        "raise it when stacks are lost")
    p.add_argument("--native-stacks", nargs="?", const="default", choices=("default", "all"), metavar="all",
                   help="also record the caller's native (C/C++) stack, unwound by the tracer from .eh_frame: of "
                        "allocations, frees, copies, syncs and failed calls; =all: of every event, launches "
                        f"included.  Costly: an {schema.NATIVE_STACK_BYTES // 1024} KiB stack copy per event")
    p.add_argument("--native-stack-buffer-pages", type=pages, default=DEFAULT_NATIVE_PAGES, metavar="N",
                   help=f"ring buffer for native stacks, in pages, a power of two (default {DEFAULT_NATIVE_PAGES}); "
                        "raise it when native stacks are lost")
    p.add_argument("--device", choices=("sanitizer", "nvbit", "cupti"),
                   help="also record device-side data with this backend (with -- CMD; cupti also with -p, "
                        "loaded into the running process through ptrace)")
    p.add_argument("--no-bpf-cache", action="store_true",
                   help="compile every BPF handler again instead of loading those compiled before for the same "
                        f"program (kept by root in {DEFAULT_BPF_CACHE}, or $PASTA_TRACE_BPF_CACHE)")
    p.add_argument("--print-bpf", action="store_true", help="print the BPF program and exit (no root needed)")
    p.add_argument("--dry-run", action="store_true",
                   help="show the libraries and probes that would be attached, and exit (no root needed)")


def _options(args: argparse.Namespace):
    from ..capture.session.options import Options, default_out_dir

    chosen = [bool(args.pid), bool(args.system_wide), bool(args.command)]
    if sum(chosen) != 1 and not args.print_bpf:
        raise UsageError("say what to trace: exactly one of -p PID, -a, or -- CMD ARGS")
    if args.device and args.pid and args.device != "cupti":
        raise UsageError(f"--device {args.device} needs a launched command (-- CMD ARGS): only cupti "
                         "attaches to a running process (-p)")
    if args.device and args.system_wide:
        raise UsageError("--device needs a launched command (-- CMD ARGS) or, with cupti, -p PID")
    mode = "pid" if args.pid else "system" if args.system_wide else "launch"
    return Options(
        mode=mode, out_dir=args.output or default_out_dir(), command_line=sys.argv[:],
        pids=args.pid or [], command=args.command, duration=args.duration, force=args.force,
        buffer_pages=args.buffer_pages, aggregate=args.aggregate, aggregate_max=args.aggregate_max,
        verbose=args.verbose, device=args.device,
        stacks=not args.no_stacks, stack_depth=args.stack_depth, stack_pages=args.stack_buffer_pages,
        native_stacks=args.native_stacks, native_pages=args.native_stack_buffer_pages,
        bpf_cache=not args.no_bpf_cache,
    )


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    from ..capture.session import dry_run, summary
    from ..capture.session.session import Session

    if args.print_bpf:
        sys.stdout.write(dry_run.bpf_text(args))
        return 0
    opts = _options(args)
    if args.dry_run:
        sys.stdout.write(dry_run.plan(opts))
        return 0
    with _status_line() as status:
        result = Session(opts, say=status.say, status=status.update if status.live else None).run()
    if result.exit_code is not None:
        _say(f"{' '.join(opts.command)} exited with code {result.exit_code}")
    _say(summary.render(result.out_dir, result.by_kind, result.names, result.manifest.counts, opts.settings,
                        result.manifest.notes))
    if (device := summary.device_line(opts.device, result.manifest.device_files)) is not None:
        _say(device)
    _say(f"Wrote {result.out_dir}")
    if result.write_error:
        raise PastaError(_write_failure(result))
    _say(f"You can now run: pasta-trace report {result.out_dir}")
    return 0


def _write_failure(result) -> str:
    """One line for a capture that did not all reach the disk (a full disk)."""
    counts = result.manifest.counts
    unwritten = counts.get("lost_unwritten", 0) + counts.get("lost_writer_died", 0)
    kept = f"{result.events:,} events were written" + (f", {unwritten:,} were not" if unwritten else "")
    if not result.manifest_written:
        return (f"writing {result.out_dir} failed ({result.write_error}): {kept}; manifest.json still says "
                "complete: false")
    return f"writing {result.out_dir} failed ({result.write_error}): {kept} (counted in manifest.json)"


class _status_line:
    """A live one-line status on stderr when it is a terminal (rich); messages
    print above it.  Without a terminal there is no status line at all."""

    def __init__(self) -> None:
        self.live = sys.stderr.isatty()
        self._live = None

    def __enter__(self) -> "_status_line":
        if self.live:
            from rich.console import Console
            from rich.live import Live

            self._live = Live("", console=Console(stderr=True), refresh_per_second=4, transient=True)
            self._live.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self._live is not None:
            self._live.__exit__(*exc)

    def update(self, text: str) -> None:
        if self._live is not None:
            self._live.update(text)

    def say(self, msg: str) -> None:
        if self._live is not None:
            self._live.console.print(msg, markup=False, highlight=False)
        else:
            _say(msg)
