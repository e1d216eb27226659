#!/usr/bin/env python3
"""CPU time to compile the probes program, per variant (run as root).

Every ``pasta-trace record`` / ``top`` compiles the BPF program (clang +
LLVM, in this process) before tracing starts, so this is what a user waits
for.  One run builds, in this process, ``bcc.BPF(text=...)`` for:

* ``floor``: the program with no handlers (``apis=()``): maps, headers and
  the discover program, the part no handler change can cut;
* ``default``: every handler of the catalog, as ``record -p``/``--`` loads it
  (pid filter on);
* ``system``: the same for ``-a`` (no pid filter);
* ``stacks``: with Python stacks (``--stack-depth 32``);
* ``native``: with Python and native stacks (``--native-stacks``);
* ``aggregate``: ``--aggregate``.

Each is the CPU time of this process (``time.process_time``: clang runs in
it) around ``bcc.BPF``, the median of ``--reps`` builds, and its ratio to the
floor's median measured in the same run.  The machine's load average is
printed with the figures (CPU time moves less with load than wall time, but
a loaded machine still slows caches).  The functions are compiled, not
loaded into the kernel: BCC loads each at attach, and the verifier's time is
counted with the attach (``--load`` adds it: every function loaded once).

    sudo .venv/bin/python scripts/bench_compile.py --reps 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pasta_trace.capture.probe_set import discover_text, names_pages, program_text  # noqa: E402
from pasta_trace.probes import program  # noqa: E402

VARIANTS = {
    "floor": dict(filter_pids=True, apis=()),
    "default": dict(filter_pids=True),
    "system": dict(filter_pids=False),
    "stacks": dict(filter_pids=True, stack_depth=32),
    "native": dict(filter_pids=True, stack_depth=32, native_stacks="default"),
    "aggregate": dict(filter_pids=True, aggregate=True),
}


def text_of(variant: str) -> str:
    """The C text a capture of ``variant`` compiles (probe_set.program_text; the floor: no handlers)."""
    kw = dict(VARIANTS[variant])
    if "apis" in kw:
        return (program.build_bpf_text(ring_pages=1024, names_pages=names_pages(1024), **kw)
                + discover_text(filter_pids=kw["filter_pids"]))
    return program_text(buffer_pages=1024, aggregate=kw.pop("aggregate", False), **kw)


def build(bcc, text: str, load: bool) -> tuple[float, int]:
    """(CPU seconds, functions) for one compile (and load, with ``load``)."""
    t0 = time.process_time()
    b = bcc.BPF(text=text.encode())
    n = 0
    if load:  # every function, as the attach would (the discover program's raw tracepoints as such)
        for i in range(bcc.lib.bpf_num_functions(b.module)):
            name = bcc.lib.bpf_function_name(b.module, i)
            b.load_func(name, bcc.BPF.RAW_TRACEPOINT if name.startswith(b"raw_tracepoint__") else bcc.BPF.KPROBE)
            n += 1
    dt = time.process_time() - t0
    b.cleanup()
    return dt, n


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated, of: " + ", ".join(VARIANTS))
    ap.add_argument("--load", action="store_true", help="also load every function (the verifier's time)")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("bench_compile: run as root (BCC needs it)", file=sys.stderr)
        return 77
    import bcc

    variants = [v for v in args.variants.split(",") if v]
    if "floor" not in variants:
        variants.insert(0, "floor")
    texts = {v: text_of(v) for v in variants}
    times: dict[str, list[float]] = {v: [] for v in variants}
    loaded: dict[str, int] = {}
    for _ in range(args.reps):  # interleaved, so load changes hit every variant alike
        for v in variants:
            dt, n = build(bcc, texts[v], args.load)
            times[v].append(dt)
            loaded[v] = n
    load1, load5, _ = os.getloadavg()
    floor = statistics.median(times["floor"])
    print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load average {load1:.1f} / {load5:.1f} "
          f"on {os.cpu_count()} CPUs, {args.reps} reps{', with load' if args.load else ''}")
    print(f"{'variant':<10} {'C KiB':>6} {'median s':>9} {'min s':>7} {'max s':>7} {'x floor':>8}"
          + (f" {'loaded':>6}" if args.load else ""))
    for v in variants:
        t = times[v]
        med = statistics.median(t)
        print(f"{v:<10} {len(texts[v]) / 1024:>6.0f} {med:>9.2f} {min(t):>7.2f} {max(t):>7.2f} {med / floor:>8.2f}"
              + (f" {loaded[v]:>6}" if args.load else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
