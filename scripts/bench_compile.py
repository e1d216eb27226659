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

With ``--cache``, each variant but the floor is also built the way a
capture builds it (probes/compiled_cache, in a temporary cache emptied at
each rep): ``<variant>+miss`` compiles it and saves its handlers,
``<variant>+hit`` then compiles the text without handlers and takes the
handlers from the cache; the last column gives each against the plain
compile of the same variant.

Each is the CPU time of this process (``time.process_time``: clang runs in
it) around ``bcc.BPF``, the median of ``--reps`` builds, and its ratio to the
floor's median measured in the same run.  The machine's load average is
printed with the figures (CPU time moves less with load than wall time, but
a loaded machine still slows caches).  The functions are compiled, not
loaded into the kernel: BCC loads each at attach, and the verifier's time is
counted with the attach (``--load`` adds it: every function loaded once).

    sudo .venv/bin/python scripts/bench_compile.py --reps 3
    sudo .venv/bin/python scripts/bench_compile.py --variants default --cache --reps 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pasta_trace.capture.bpf.probe_set import handler_names, program_spec  # noqa: E402
from pasta_trace.probes import catalog, compiled_cache, program  # noqa: E402

VARIANTS = {
    "floor": dict(filter_pids=True, apis=()),
    "default": dict(filter_pids=True),
    "system": dict(filter_pids=False),
    "stacks": dict(filter_pids=True, stack_depth=32),
    "native": dict(filter_pids=True, stack_depth=32, native_stacks="default"),
    "aggregate": dict(filter_pids=True, aggregate=True),
}


def text_of(variant: str) -> str:
    """The C text a capture of ``variant`` compiles (probe_set.program_spec; the floor: no handlers)."""
    kw = dict(VARIANTS[variant])
    apis = kw.pop("apis", catalog.APIS)
    return program.build(replace(program_spec(buffer_pages=1024, aggregate=kw.pop("aggregate", False), **kw),
                                 apis=apis))


def short_text_of(variant: str) -> str:
    """The text of ``variant`` without handlers, as a cache hit compiles it."""
    kw = dict(VARIANTS[variant])
    kw.pop("apis", None)
    return program.build(replace(program_spec(buffer_pages=1024, aggregate=kw.pop("aggregate", False), **kw), apis=()))


def build(bcc, text: str, load: bool, short: str | None = None) -> tuple[float, float, int]:
    """(CPU seconds, wall seconds, functions) for one compile (and load, with
    ``load``); through the cache in $PASTA_TRACE_BPF_CACHE when ``short``
    (the text without handlers) is given."""
    t0, w0 = time.process_time(), time.perf_counter()
    if short is None:
        b = bcc.BPF(text=text.encode())
    else:
        b = compiled_cache.compile_program(bcc, text, lambda: short, handler_names(), lambda _msg: None)
    n = 0
    if load:  # every function, as the attach would (the discover program's raw tracepoints as such)
        names = [bcc.lib.bpf_function_name(b.module, i) for i in range(bcc.lib.bpf_num_functions(b.module))]
        for name in names + [h.encode() for h in getattr(b, "cached_handlers", {})]:
            b.load_func(name, bcc.BPF.RAW_TRACEPOINT if name.startswith(b"raw_tracepoint__") else bcc.BPF.KPROBE)
            n += 1
    dt, wall = time.process_time() - t0, time.perf_counter() - w0
    b.cleanup()
    return dt, wall, n


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated, of: " + ", ".join(VARIANTS))
    ap.add_argument("--load", action="store_true", help="also load every function (the verifier's time)")
    ap.add_argument("--cache", action="store_true",
                    help="also build each variant through the compiled handlers cache: a miss, then a hit")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("bench_compile: run as root (BCC needs it)", file=sys.stderr)
        return 77
    import bcc

    variants = [v for v in args.variants.split(",") if v]
    if "floor" not in variants:
        variants.insert(0, "floor")
    texts = {v: text_of(v) for v in variants}
    rows = [*variants, *(f"{v}+{how}" for v in variants if v != "floor" and args.cache for how in ("miss", "hit"))]
    times: dict[str, list[float]] = {r: [] for r in rows}
    walls: dict[str, list[float]] = {r: [] for r in rows}
    loaded: dict[str, int] = {}
    load_before = os.getloadavg()
    for _ in range(args.reps):  # interleaved, so load changes hit every variant alike
        for v in variants:
            dt, wall, loaded[v] = build(bcc, texts[v], args.load)
            times[v].append(dt)
            walls[v].append(wall)
            if v == "floor" or not args.cache:
                continue
            with tempfile.TemporaryDirectory() as d:  # empty: the first build misses, the second hits
                os.environ[compiled_cache.ENV] = d
                for how in ("miss", "hit"):
                    dt, wall, loaded[f"{v}+{how}"] = build(bcc, texts[v], args.load, short_text_of(v))
                    times[f"{v}+{how}"].append(dt)
                    walls[f"{v}+{how}"].append(wall)
    load1, load5, _ = os.getloadavg()
    floor = statistics.median(times["floor"])
    print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load average {load_before[0]:.1f} before, "
          f"{load1:.1f} / {load5:.1f} after, on {os.cpu_count()} CPUs, {args.reps} reps"
          f"{', with load' if args.load else ''}")
    print(f"{'variant':<16} {'C KiB':>6} {'median s':>9} {'min s':>7} {'max s':>7} {'wall s':>7} {'x floor':>8}"
          + (f" {'x compile':>9}" if args.cache else "") + (f" {'loaded':>6}" if args.load else ""))
    for r in rows:
        t = times[r]
        med = statistics.median(t)
        v = r.split("+")[0]
        print(f"{r:<16} {len(texts[v]) / 1024:>6.0f} {med:>9.2f} {min(t):>7.2f} {max(t):>7.2f} "
              f"{statistics.median(walls[r]):>7.2f} {med / floor:>8.2f}"
              + (f" {med / statistics.median(times[v]):>9.2f}" if args.cache else "")
              + (f" {loaded[r]:>6}" if args.load else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
