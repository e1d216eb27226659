"""--print-bpf and --dry-run: what a capture would load and attach, without
root, BCC or any change to the system."""

from __future__ import annotations

import argparse
import os
import shutil
from dataclasses import dataclass

from ...probes import program
from ..procs import discovery, reach
from ..procs.launch import check_command
from .options import Options
from ..bpf.probe_set import program_spec
from ..procs.needed import needed_files
from ..procs.targets import check_pids, launch_candidates, ld_cache, unreadable


def bpf_text(args: argparse.Namespace) -> str:
    stacks = None if args.no_stacks or args.aggregate else args.stack_depth
    return program.build(program_spec(
        buffer_pages=args.buffer_pages, aggregate=args.aggregate, filter_pids=not args.system_wide,
        stack_depth=stacks, stack_pages=args.stack_buffer_pages, aggregate_max=args.aggregate_max,
        native_stacks=None if args.aggregate else args.native_stacks, native_pages=args.native_stack_buffer_pages,
        allowed_uid=reach.traced_uid()))


@dataclass
class ProbePlan:
    attach: list[str]  # symbols that would be probed
    missing: list[str]  # probed symbols the file lacks
    aliases: dict[str, str]  # symbols reported under another (same address, or a jump to it)

    def line(self) -> str:
        fwd = f" ({len(self.aliases)} more reported under the functions they jump to)" if self.aliases else ""
        return f"would attach {len(self.attach)} functions{fwd}, {len(self.missing)} missing"


def probe_plan(path: str, family: str) -> ProbePlan:
    """What attach.attach_library would do with ``path``, without attaching."""
    from ...probes import attach, catalog, elf

    wanted = [a.symbol for a in catalog.for_family(family)]
    syms = elf.probe_symbols(path, set(wanted))
    aliases = attach.forwarders(path, syms)
    first: dict[int, str] = {}
    for s in wanted:
        if s in syms and s not in aliases and first.setdefault(syms[s].vaddr, s) != s:
            aliases[s] = first[syms[s].vaddr]
    return ProbePlan([s for s in wanted if s in syms and s not in aliases], [s for s in wanted if s not in syms],
                     aliases)


def launch_cudart(argv: list[str], libs: list[discovery.Library]) -> str:
    """Where the CUDA runtime of a command to launch will live: among the
    libraries it loads at start (capture.procs.needed), a libcudart.so.N, or those
    of ``libs`` (launch_candidates) it is linked into."""
    env = dict(os.environ)
    exe = shutil.which(argv[0], path=env.get("PATH"))
    if exe is None:
        return "none found"
    start = {os.path.realpath(exe), *needed_files(exe, env, ld_cache())}
    shared = [discovery.Library("cudart", f, f, 0, 0, 0) for f in sorted(start) if discovery.family_of(f) == "cudart"]
    linked = [lib for lib in libs if lib.path in start and not discovery.family_of(lib.path)]
    return discovery.cudart_places(shared + linked).replace("none mapped", "none (a libcudart.so* opened later "
                                                                          "is caught when opened)")


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
                lines.append(f"PID {pid}: no libcuda/libcudart/libamdhip64/libc10/libnccl mapped yet ({others}); "
                             "would wait for one")
        libs = discovery.unique_libraries(found)
        lines += [discovery.process_cudart(p) for p in found]
    elif opts.mode == "system":
        found = discovery.scan_all(skip={os.getpid()}, uid=reach.traced_uid())
        libs = discovery.unique_libraries(found)
        lines += [discovery.process_cudart(p) for p in found if any(lib.family == "cudart" for lib in p.traced)]
    else:
        check_command(opts.command, dict(os.environ))
        libs = launch_candidates(dict(os.environ), opts.command)
        lines.append(f"would start: {' '.join(opts.command)}")
        lines.append(f"its CUDA runtime at start: {launch_cudart(opts.command, libs)}")
    lines.append(f"mode {opts.mode}: {len(libs)} libraries")
    for lib in libs:
        p = probe_plan(lib.attach_path, lib.family)
        what = lib.family if discovery.family_of(lib.path) else f"{lib.family}: the CUDA runtime linked in"
        lines.append(f"{lib.path} ({what}, dev {lib.dev} inode {lib.inode}, via {lib.attach_path}): {p.line()}")
        if opts.verbose and p.missing:
            lines.append("  missing: " + ", ".join(p.missing))
        if opts.verbose and p.aliases:
            lines.append("  reported under another: " + ", ".join(f"{a} -> {b}" for a, b in p.aliases.items()))
    lines.append("later loads of libcuda.so*/libcudart.so*/libamdhip64.so*/libc10.so*/libnccl.so* "
                 "would be caught when opened")
    return "\n".join(lines) + "\n"
