"""--print-bpf and --dry-run: what a capture would load and attach, without
root, BCC or any change to the system."""

from __future__ import annotations

import argparse
import os

from . import discovery
from .launch import check_command
from .options import Options
from .probe_set import program_text
from .targets import check_pids, launch_candidates, unreadable


def bpf_text(args: argparse.Namespace) -> str:
    stacks = None if args.no_stacks or args.aggregate else args.stack_depth
    return program_text(buffer_pages=args.buffer_pages, aggregate=args.aggregate, filter_pids=not args.system_wide,
                        stack_depth=stacks, stack_pages=args.stack_buffer_pages, aggregate_max=args.aggregate_max)


def probe_plan(path: str, family: str) -> tuple[list[str], list[str]]:
    """(symbols that would be probed, probed symbols the file lacks)."""
    from ..probes import catalog, elf

    exports = elf.exported_symbols(path)
    wanted = [a.symbol for a in catalog.for_family(family)]
    return [s for s in wanted if s in exports], [s for s in wanted if s not in exports]


def plan(opts: Options) -> str:
    lines = []
    if opts.mode == "pid":
        check_pids(opts.pids)
        found = []
        for pid in opts.pids:
            try:
                p = discovery.scan_pid(pid)
            except OSError as e:
                raise unreadable(pid, e) from None
            found.append(p)
            if not p.traced:
                others = ", ".join(os.path.basename(x) for x in p.other_gpu) or "no GPU library"
                lines.append(f"PID {pid}: no libcuda/libamdhip64/libc10/libnccl mapped yet ({others}); "
                             "would wait for one")
        libs = discovery.unique_libraries(found)
    elif opts.mode == "system":
        libs = discovery.unique_libraries(discovery.scan_all(skip={os.getpid()}))
    else:
        check_command(opts.command, dict(os.environ))
        libs = launch_candidates(dict(os.environ), opts.command)
        lines.append(f"would start: {' '.join(opts.command)}")
    lines.append(f"mode {opts.mode}: {len(libs)} libraries")
    for lib in libs:
        attach, missing = probe_plan(lib.attach_path, lib.family)
        lines.append(f"{lib.path} ({lib.family}, dev {lib.dev} inode {lib.inode}, via {lib.attach_path}): "
                     f"would attach {len(attach)} functions, {len(missing)} missing")
        if opts.verbose and missing:
            lines.append("  missing: " + ", ".join(missing))
    lines.append("later loads of libcuda.so*/libamdhip64.so*/libc10.so*/libnccl.so* would be caught when opened")
    return "\n".join(lines) + "\n"
