#!/usr/bin/env python3
"""Report and export on a big seeded synthetic capture, against a plain Parquet scan.

    .venv/bin/python scripts/bench_export.py --events 1e6
    .venv/bin/python scripts/bench_export.py --events 1e7 --keep /tmp/pasta-bench-export
    .venv/bin/python scripts/bench_export.py --events 1e7 --keep /tmp/pasta-bench-export --device --verbs report

The capture is pasta_trace.testing.synthetic's: 4 processes, 90 % of the N events
launches, allocations (N/25) paired with most of their frees, syncs (N/50),
every call with a Python stack, and 10^5 device access samples.  By default
the verbs read its host-only copy (no device/); --device gives them the
device data too (a kernel execution for every launch).

Each verb (`pasta-trace report PATH`, `pasta-trace export PATH --format
perfetto`, ...) runs in a fresh process, as the command line runs it, and
reports its own wall and CPU seconds and peak RSS (VmHWM of its own address
space: wait4's ru_maxrss would count this process's peak, which a forked child
inherits).  The baseline, measured in the same run in a fresh process too, is
a plain Parquet scan of the same events file into memory (every column).
Both times start before the child imports Polars (and pasta_trace).
Events/s of each verb is the capture's events over its wall seconds; the
ratio is its time over the scan's.  The machine load (uptime) is printed with
the figures: on a shared machine compare CPU seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

#: the project's targets for a 10^7-event capture (docs/performance.md)
TARGET_S, TARGET_BYTES = 10.0, 4 << 30

#: verb name -> pasta-trace arguments after PATH ({out}: a file in the work directory)
VERBS = {
    "report": ["report", "{path}"],
    "json": ["report", "{path}", "--json"],
    "perfetto": ["export", "{path}", "--format", "perfetto", "-o", "{out}", "--force"],
    "chrome": ["export", "{path}", "--format", "chrome", "-o", "{out}", "--force"],
}

#: run in the child: the verb as `pasta-trace` runs it, stdout to /dev/null,
#: then one JSON line on the fd BENCH_RESULT_FD names, with its own times and peak
CHILD = """
import json, os, resource, sys, time
t0, ru0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
from pasta_trace.cli import main
rc = main(sys.argv[1:])
wall = time.perf_counter() - t0
ru = resource.getrusage(resource.RUSAGE_SELF)
with open("/proc/self/status") as f:
    hwm = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) * 1024
cpu = ru.ru_utime + ru.ru_stime - ru0.ru_utime - ru0.ru_stime
os.write(int(os.environ["BENCH_RESULT_FD"]), json.dumps({"rc": rc, "wall": wall, "cpu": cpu, "peak": hwm}).encode())
"""

#: the baseline: every column of the events file(s) read into memory
SCAN = """
import json, os, resource, sys, time
t0, ru0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
import polars as pl
n = pl.scan_parquet(sys.argv[1:]).collect().height
wall = time.perf_counter() - t0
ru = resource.getrusage(resource.RUSAGE_SELF)
with open("/proc/self/status") as f:
    hwm = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) * 1024
cpu = ru.ru_utime + ru.ru_stime - ru0.ru_utime - ru0.ru_stime
os.write(int(os.environ["BENCH_RESULT_FD"]), json.dumps({"rc": 0, "rows": n, "wall": wall, "cpu": cpu,
                                                         "peak": hwm}).encode())
"""


def build(path: Path, events: int, seed: int) -> Path:
    """The synthetic capture at `path` (with device/), and its host-only copy
    at `path`-host; an existing one of the same size and seed is reused."""
    from pasta_trace.testing import synthetic

    spec = synthetic.Spec(pids=4, launches=events * 9 // 10, allocations=events // 25, syncs=events // 50,
                          accesses=100_000, stacks=True, seed=seed)
    stamp = path / "bench.json"
    host = path.with_name(path.name + "-host")
    if stamp.exists() and json.loads(stamp.read_text()) == spec.__dict__ and host.is_dir():
        return path
    shutil.rmtree(path, ignore_errors=True)
    shutil.rmtree(host, ignore_errors=True)
    synthetic.write_capture(path, spec)
    shutil.copytree(path, host, ignore=shutil.ignore_patterns("device", "bench.json"))
    stamp.write_text(json.dumps(spec.__dict__))
    return path


def child(code: str, args: list[str]) -> dict:
    """Run `code` in a fresh interpreter with `args`; its JSON result comes on a pipe."""
    r, w = os.pipe()
    proc = subprocess.Popen([sys.executable, "-c", code, *args], cwd=ROOT, pass_fds=(w,),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env={**os.environ, "BENCH_RESULT_FD": str(w)})
    os.close(w)
    with os.fdopen(r, "rb") as f:
        out = f.read()
    _, err = proc.communicate()
    if proc.returncode != 0 or not out:
        tail = err.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
        raise SystemExit(f"bench_export: child {args[:2]} failed (exit {proc.returncode}): {tail[0]}")
    return json.loads(out)


def uptime() -> str:
    with open("/proc/loadavg") as f:
        return "load average " + ", ".join(f.read().split()[:3])


def verdict(res: dict) -> str:
    """Against the 10^7-event targets: met, or missed by how much."""
    out = []
    for what, value, bound, unit in (("time", res["wall"], TARGET_S, "s"), ("memory", res["peak"] / 2**30,
                                                                          TARGET_BYTES / 2**30, "GiB")):
        out.append(f"{what} met" if value <= bound else f"{what} missed by {value - bound:.1f} {unit} "
                   f"({value / bound:.1f}x)")
    return ", ".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=float, default=1e6, help="events in the capture (default 1e6; target 1e7)")
    ap.add_argument("--verbs", default="report,perfetto", help=f"comma-separated: {', '.join(VERBS)}")
    ap.add_argument("--device", action="store_true", help="read the capture with its device data")
    ap.add_argument("--keep", type=Path, metavar="DIR",
                    help="build the capture in DIR and keep it (reused by a later run of the same size)")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    verbs = a.verbs.split(",")
    unknown = [v for v in verbs if v not in VERBS]
    if unknown:
        ap.error(f"unknown verb {unknown[0]!r}; one of {', '.join(VERBS)}")
    with tempfile.TemporaryDirectory() as tmp:
        work = a.keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        cap = build(work / "cap", int(a.events), a.seed)
        path = cap if a.device else cap.with_name(cap.name + "-host")
        events_files = sorted(str(p) for p in path.glob("events*.parquet"))
        print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; capture: {path} "
              f"({'with' if a.device else 'without'} device data), ready in "
              f"{time.perf_counter() - t0:.1f} s")
        print(f"{'step':10s} {'seconds':>8s} {'cpu s':>7s} {'peak GiB':>8s} {'M events/s':>10s} {'vs scan':>8s}"
              "  load")
        scan = child(SCAN, events_files)
        n = scan["rows"]
        line = "{:10s} {:8.2f} {:7.2f} {:8.2f} {:10.2f} {:>8s}  {}"
        print(line.format("scan", scan["wall"], scan["cpu"], scan["peak"] / 2**30, n / scan["wall"] / 1e6, "1.0x",
                          uptime()))
        for verb in verbs:
            args = [arg.format(path=path, out=work / f"out.{verb}") for arg in VERBS[verb]]
            res = child(CHILD, args)
            print(line.format(verb, res["wall"], res["cpu"], res["peak"] / 2**30, n / res["wall"] / 1e6,
                              f"{res['wall'] / scan['wall']:.1f}x", uptime()))
            if a.events >= 1e7:  # --events 1e7 gives 9,969,994 events (not every allocation is freed)
                print(f"{'':10s} against the 10^7-event targets ({TARGET_S:.0f} s, "
                      f"{TARGET_BYTES / 2**30:.0f} GiB): {verdict(res)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
