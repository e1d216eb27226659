#!/usr/bin/env python3
"""Cross-rank analysis benchmark: the stragglers tool on Polars, and on Dask beside it.

    .venv/bin/python scripts/bench_cluster.py                  # 64 ranks x 10^5 collectives
    .venv/bin/python scripts/bench_cluster.py --ranks 8 --collectives 10000 --workers 2

A seeded synthetic job (pasta_trace.testing.synthetic_nccl: every rank an AllReduce
after another on one communicator, one rank late every fifth, the last rank
never entering the last) is written as a cluster timeline of --nodes
captures, each node's clock moved by a known offset (`pasta-trace merge`'s
write, timed on its own).  Then, on that timeline:

  polars   tools.nccl.stragglers on the opened timeline, read lazily from Parquet
           (the collective calls matched to their communicators, grouped by
           collective): collective rows per second, best of --repeat
  dask     pasta_trace.dask_cluster.analyse's stragglers step on a LocalCluster
           of --workers single-threaded worker processes (read, match,
           shuffle by collective, per-collective step), best of --repeat

Both results must be equal, row for row, before any time is printed.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import polars as pl

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pasta_trace import merge, schema  # noqa: E402
from pasta_trace.testing import synthetic, synthetic_nccl  # noqa: E402
from pasta_trace.read import Capture  # noqa: E402
from pasta_trace.tools import nccl  # noqa: E402

NODE_SHIFT_NS = 3_000_000_007  # node k's CLOCK_MONOTONIC reads k times this more
RT0 = 1_764_000_000_000_000_000  # CLOCK_REALTIME at synthetic.MONO0


def _sample(mono: int, shift: int) -> dict:
    return {"mono_before_ns": mono + shift - 400, "realtime_ns": mono - synthetic.MONO0 + RT0,
            "mono_after_ns": mono + shift + 400}


def node_captures(ranks: int, collectives: int, nodes: int, span_ns: int) -> list[Capture]:
    """The job as `nodes` in-memory captures, each on its own clock."""
    pids = (10_000 + np.arange(ranks)).astype(np.uint32)
    events, _, comms = synthetic_nccl.calls(collectives, pids, synthetic.MONO0, span_ns, np.random.default_rng(7))
    per_node = -(-ranks // nodes)
    caps = []
    for k in range(nodes):
        mine = pids[k * per_node:(k + 1) * per_node].tolist()
        shift = k * NODE_SHIFT_NS
        clock = {"start_ns": synthetic.MONO0 + shift, "end_ns": synthetic.MONO0 + span_ns + shift,
                 "start_sample": _sample(synthetic.MONO0, shift), "end_sample": _sample(synthetic.MONO0 + span_ns, shift)}
        ev = events.lazy().filter(pl.col("pid").is_in(mine)).with_columns(pl.col("ts_ns") + shift)
        cm = comms.lazy().filter(pl.col("pid").is_in(mine)).with_columns(pl.col("ts_ns") + shift,
                                                                         pl.lit(f"node{k}").alias("host"))
        empty = lambda s: schema.empty_frame(s).lazy()  # noqa: E731
        caps.append(Capture(Path(f"node{k}"), {"host": f"node{k}", "clock": clock, "complete": True}, ev,
                            empty(schema.NAMES_SCHEMA), empty(schema.PROCESSES_SCHEMA), empty(schema.LIBRARIES_SCHEMA),
                            None, communicators=cm))
    return caps


def best(fn, repeat: int) -> tuple[float, float, object]:
    """(wall s, this process's CPU s, result) of the run with the least wall time."""
    runs, out = [], None
    for _ in range(repeat):
        t, c = time.perf_counter(), time.process_time()
        out = fn()
        runs.append((time.perf_counter() - t, time.process_time() - c))
    wall, cpu = min(runs)
    return wall, cpu, out


def dask_stragglers(timeline: Path, client) -> pl.DataFrame:
    from pasta_trace import dask_cluster

    return dask_cluster.analyse(timeline, client, tools=("stragglers",))["stragglers"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--collectives", type=float, default=1e5, help="per rank")
    ap.add_argument("--nodes", type=int, default=8, help="captures the ranks are spread over")
    ap.add_argument("--workers", type=int, default=2, help="Dask LocalCluster worker processes")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-dask", action="store_true")
    args = ap.parse_args()
    n = int(args.collectives)
    span = max(n * 200_000, 10**9)  # 200 us between collectives
    with tempfile.TemporaryDirectory(prefix="bench-cluster-") as tmp:
        out = Path(tmp) / "cluster.parquet"
        t = time.perf_counter()
        caps = node_captures(args.ranks, n, args.nodes, span)
        t_gen = time.perf_counter() - t
        t = time.perf_counter()
        offsets = merge.write_cluster(caps, merge.timeline_output(out), sync_ns=10_000_000)
        t_merge = time.perf_counter() - t
        truth = np.arange(args.nodes) * -NODE_SHIFT_NS
        err = int(np.abs(offsets["offset_ns"].to_numpy() - truth).max())
        t = time.perf_counter()
        cap = merge.load(out)  # opening checks every file (parquet_scan): once, not per analysis
        t_open = time.perf_counter() - t
        rows = merge.collective_entries(cap).select(pl.len()).collect().item()
        print(f"{args.ranks} ranks x {n} collectives on {args.nodes} nodes: {rows:,} collective rows "
              f"(generated in {t_gen:.1f} s, merged into a cluster timeline in {t_merge:.1f} s; "
              f"worst clock offset error {err / 1000:.1f} us; opened in {t_open:.1f} s)")
        t_pl, cpu_pl, want = best(lambda: nccl.stragglers(cap), args.repeat)
        cores = os.cpu_count() or 1
        # on a shared machine wall time counts other processes' turns too; CPU time spread over
        # the cores is what the same work takes with the cores to itself
        print(f"polars  stragglers  {t_pl:7.3f} s  {rows / t_pl / 1e6:6.1f} M rows/s  "
              f"({want.height:,} collectives; CPU {cpu_pl:.3f} s = {rows / (cpu_pl / cores) / 1e6:.1f} M rows/s "
              f"on {cores} idle cores)")
        if args.no_dask:
            return 0
        import distributed

        with distributed.LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True,
                                      dashboard_address=None) as lc, distributed.Client(lc) as client:
            t_dk, _, got = best(lambda: dask_stragglers(out, client), args.repeat)
        if not got.equals(want):
            print("FAIL: Dask's stragglers differ from Polars'", file=sys.stderr)
            return 1
        print(f"dask    stragglers  {t_dk:7.3f} s  {rows / t_dk / 1e6:6.1f} M rows/s  "
              f"({args.workers} workers x 1 thread; same {got.height:,} rows as Polars)")
        print(f"dask / polars time: {t_dk / t_pl:.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
