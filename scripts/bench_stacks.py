#!/usr/bin/env python3
"""Cost of the caller's Python stack per traced event (run as root).

One run measures the same stub function (``cuMemFree_v2`` of a -O0 stub
``libcuda.so.1``, an entry-only probe) called through ctypes from Python at
stack depth 10 and 30:

* untraced;
* traced with ``--no-stacks`` (the probe alone);
* traced with Python stacks (the default);
* traced with ``--no-stacks --native-stacks`` (an 8 KiB copy of the user
  stack per event, unwound by the tracer), with fewer calls (--native-calls)
  and a native ring big enough that no copy is lost (a lost one costs less
  and would flatter the figure), each Python level also nesting C frames
  (through ``map``) so that a full 8 KiB is copied (``short`` counts the
  copies cut at the top of the stack): its baseline is the probe alone
  measured with the same calls and callers.

Each figure is the calling thread's CPU time per call (the kernel runs the
probe in that thread), the median of --batches batches of --calls calls; the
probe's cost is traced minus untraced, the stacks' cost is stacks minus
no-stacks (and their ratio: traced with stacks / the probe alone, both from
this run), and the cost per extra frame is (depth 30 - depth 10) / 20.
Targets (docs/performance.md): stacks <= 1.0 us per event at depth 10 and
<= 60 ns per extra frame; native stacks <= 5 us per event.  Every call site makes the same stack, so after the
first event each one costs the walk and one hash lookup (identical stacks are
sent once).

    sudo .venv/bin/python scripts/bench_stacks.py --calls 20000 --batches 7
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "fixtures"))

CALLER = r"""
import ctypes, json, sys, time
lib = ctypes.CDLL(sys.argv[1]); calls, batches, depth, via_c = map(int, sys.argv[2:6])
free = lib.cuMemFree_v2
def batch():
    t = time.thread_time_ns()
    for _ in range(calls):
        free(0)
    return (time.thread_time_ns() - t) / calls
def down(n):
    if n <= 1:
        return [batch() for _ in range(batches)]
    # via_c: each level through map() also nests C frames, so that the native stack is deeper than 8 KiB
    return next(map(down, [n - 1])) if via_c else down(n - 1)
print(json.dumps(down(depth - 1)))  # the module frame counts: `depth` frames at the call
"""


#: --native-stack-buffer-pages for the native row: 128 MiB, ~16k stacks of 8 KiB
NATIVE_PAGES = 32768


def measure(cmd_prefix: list[str], stub: Path, calls: int, batches: int, depth: int, tmp: Path,
            counts: dict | None = None, via_c: bool = False) -> float:
    """Median CPU ns per call; ``counts``: filled with the capture's stack counts."""
    script = tmp / "caller.py"
    script.write_text(CALLER)
    out = tmp / f"out-{depth}.json"
    inner = [sys.executable, str(script), str(stub), str(calls), str(batches), str(depth), str(int(via_c))]
    cap = tmp / f"cap-{len(os.listdir(tmp))}"
    if cmd_prefix:
        cmd = [*cmd_prefix, "-o", str(cap), "--", "sh", "-c", " ".join(inner) + f" > {out}"]
    else:
        cmd = ["sh", "-c", " ".join(inner) + f" > {out}"]
    subprocess.run(cmd, check=True, stderr=subprocess.DEVNULL, timeout=600)
    if counts is not None:
        counts.update(json.loads((cap / "manifest.json").read_text())["counts"].get("stacks", {}))
    return statistics.median(json.loads(out.read_text()))


def drain_rate(tracer: list[str], stub: Path, calls: int, procs: int, tmp: Path) -> dict:
    """``procs`` Python processes each make ``calls`` stacked calls at depth 10
    at full speed under one tracer: the rate the capture took them at (events
    over the span of their timestamps) and what it lost."""
    import polars as pl

    script = tmp / "caller.py"
    script.write_text(CALLER)
    inner = " ".join([sys.executable, str(script), str(stub), str(calls), "1", "10", "0"])
    cap = tmp / "cap-rate"
    cmd = [*tracer, "-o", str(cap), "--", "sh", "-c", " & ".join([f"{inner} >/dev/null"] * procs) + " & wait"]
    subprocess.run(cmd, check=True, stderr=subprocess.DEVNULL, timeout=600)
    ev = pl.scan_parquet(cap / "events-*.parquet").select(
        n=pl.len(), stacked=pl.col("stack_id").is_not_null().sum(), span=pl.col("ts_ns").max() - pl.col("ts_ns").min(),
    ).collect().row(0, named=True)
    counts = json.loads((cap / "manifest.json").read_text())["counts"]
    return {**ev, "lost_events": counts.get("lost_events", 0),
            "lost_stacks": counts.get("stacks", {}).get("lost_stacks", 0), "calls": calls * procs}


def main() -> int:
    import build

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--batches", type=int, default=7)
    ap.add_argument("--native-calls", type=int, default=2000, help="calls per batch of the native-stack row")
    ap.add_argument("--rate-calls", type=int, default=500000,
                    help="calls per process of the drain-rate row (2 processes; 0: skip it)")
    a = ap.parse_args()
    stub = build.cuda_stub()
    tracer = [sys.executable, "-m", "pasta_trace.cli"]
    print(f"load: {os.getloadavg()[0]:.2f} (1 min), {os.cpu_count()} CPUs")
    with tempfile.TemporaryDirectory(prefix="bench-stacks-") as d:
        tmp = Path(d)
        rate = drain_rate(tracer, stub, a.rate_calls, 2, tmp) if a.rate_calls else None
        res = {}
        for depth in (10, 30):
            res[depth] = {
                "untraced": measure([], stub, a.calls, a.batches, depth, tmp),
                "probe": measure([*tracer, "--no-stacks"], stub, a.calls, a.batches, depth, tmp),
                "stacks": measure(tracer, stub, a.calls, a.batches, depth, tmp),
                "native_probe": measure([*tracer, "--no-stacks"], stub, a.native_calls, a.batches, depth, tmp,
                                        via_c=True),
                "native": measure([*tracer, "--no-stacks", "--native-stacks", "--native-stack-buffer-pages",
                                   str(NATIVE_PAGES)], stub, a.native_calls, a.batches, depth, tmp,
                                  counts=(native_counts := {}), via_c=True),
                "native_counts": native_counts,
            }
    for depth, r in res.items():
        print(f"depth {depth}: untraced {r['untraced']:.0f} ns/call; probe +{r['probe'] - r['untraced']:.0f} ns; "
              f"with Python stacks +{r['stacks'] - r['untraced']:.0f} ns "
              f"(stacks alone +{r['stacks'] - r['probe']:.0f} ns per event; "
              f"{r['stacks'] / r['probe']:.2f}x the probe alone)")
    slope = ((res[30]["stacks"] - res[30]["probe"]) - (res[10]["stacks"] - res[10]["probe"])) / 20
    print(f"per extra frame: {slope:.0f} ns")
    for depth, r in res.items():
        c = r["native_counts"]
        print(f"depth {depth}, {a.native_calls} calls per batch: probe alone {r['native_probe']:.0f} ns/call; "
              f"with native stacks {r['native']:.0f} ns/call (native stacks alone "
              f"+{r['native'] - r['native_probe']:.0f} ns per event, {r['native'] / r['native_probe']:.2f}x "
              f"the probe alone; {c.get('native_samples', 0):,} copied, "
              f"{c.get('lost_native_stacks', 0):,} lost, {c.get('short_native_stacks', 0):,} short, "
              f"{c.get('native_stacks', 0)} distinct)")
    if rate:
        print(f"drain: {rate['calls']:,} calls from 2 processes at depth 10 -> {rate['n']:,} events "
              f"({rate['stacked']:,} with a stack) over {rate['span'] / 1e9:.2f} s = "
              f"{rate['n'] / max(rate['span'], 1) * 1e9:,.0f} stacked events/s; lost: {rate['lost_events']:,} "
              f"events, {rate['lost_stacks']:,} stacks (target: 200,000/s, 0 lost)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
