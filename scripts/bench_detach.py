#!/usr/bin/env python3
"""Time to remove uprobes: BCC's perf-event uprobes against uprobe_multi links
(run as root).

The same N probes of the test fixtures' stub ``libcuda.so.1`` (a private copy,
so that no other tracer's probes share its inode), each attached as
pasta-trace attaches them (probes.attach.attach_library: every probed
symbol of the catalog at its chosen placement; an entry probe, and a return
probe where the API has one), are removed by closing
their descriptors from --threads threads, as pasta-trace's background closer
does: first as perf-event uprobes (the baseline, BCC's attach_uprobe), then
as uprobe_multi links, alternating for --reps rounds.  Prints the wall time
of attach and of removal per round, the medians, and the ratio.

    sudo .venv/bin/python scripts/bench_detach.py --reps 3
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "fixtures"))

from pasta_trace.probes import program, uprobe_link  # noqa: E402
from pasta_trace.probes.attach import attach_library  # noqa: E402


def _round(lib: str, links: bool, threads: int) -> tuple[int, float, float]:
    from bcc import BPF

    os.environ["PASTA_TRACE_PERF_UPROBES"] = "0" if links else "1"
    uprobe_link.available.cache_clear()
    bpf = BPF(text=program.build(program.Spec(discover=False)).encode())
    t0 = time.monotonic()
    result = attach_library(bpf, lib, "cuda")  # as the tracer attaches: the catalog, placements, aliases
    if result.errors:
        raise SystemExit(f"attach failed: {result.errors[0]}")
    t1 = time.monotonic()
    fds = [*bpf.uprobe_fds.values(), *uprobe_link.take(bpf)]
    bpf.uprobe_fds.clear()
    with ThreadPoolExecutor(max_workers=threads) as pool:
        list(pool.map(os.close, fds))
    t2 = time.monotonic()
    bpf.cleanup()
    return len(fds), t1 - t0, t2 - t1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=3, help="rounds of each way (default 3)")
    ap.add_argument("--threads", type=int, default=16, help="closing threads (default 16, as the tracer)")
    a = ap.parse_args()
    import build

    with tempfile.TemporaryDirectory(prefix="pasta-bench-detach-") as d:
        lib = str(Path(d) / "libcuda.so.1")
        shutil.copyfile(build.cuda_stub(), lib)
        uprobe_link.available.cache_clear()
        if not uprobe_link.available():
            print("this kernel has no uprobe_multi links: nothing to compare")
            return 1
        rows: dict[bool, list[tuple[int, float, float]]] = {False: [], True: []}
        for r in range(a.reps):
            for links in (False, True):
                n, att, rem = _round(lib, links, a.threads)
                rows[links].append((n, att, rem))
                way = "uprobe_multi links " if links else "perf-event uprobes"
                print(f"round {r + 1}: {way}  {n} probes  attach {att:6.2f} s  remove {rem:6.2f} s")
    med = {k: (statistics.median(x[1] for x in v), statistics.median(x[2] for x in v)) for k, v in rows.items()}
    n = rows[True][0][0]
    print(f"\nmedian over {a.reps} rounds, {n} probes, closed from {a.threads} threads:")
    print(f"  perf-event uprobes (baseline): attach {med[False][0]:.2f} s, remove {med[False][1]:.2f} s")
    print(f"  uprobe_multi links:            attach {med[True][0]:.2f} s, remove {med[True][1]:.2f} s")
    print(f"  removal {med[False][1] / max(med[True][1], 1e-9):.1f}x faster with links")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
