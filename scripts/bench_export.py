#!/usr/bin/env python3
"""Export throughput on a seeded synthetic capture (host events only).

    .venv/bin/python scripts/bench_export.py --events 1000000

Prints, for Perfetto and Chrome JSON: seconds (wall and CPU), events/s and
output size of `pasta-trace export`'s writers, and the ratio of time per event
written against a baseline measured in the same run on a sample of the same
API calls: one message per event built with the `perfetto` package's generated
protobuf classes (Perfetto; fewer arguments, no interning), and json.dumps of
one dict per event (Chrome).  The trace model (Polars preparation, shared by
both writers) is timed separately.
"""

from __future__ import annotations

import argparse
import io
import json
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pasta_trace import schema  # noqa: E402
from pasta_trace.export import chrome, perfetto, trace_model  # noqa: E402
from pasta_trace.read import open_capture  # noqa: E402

KINDS = [("cuLaunchKernel", "launch", 0.6), ("cuMemcpyHtoDAsync_v2", "memcpy", 0.15),
         ("cuMemAlloc_v2", "alloc", 0.05), ("cuMemFree_v2", "free", 0.05), ("cuStreamSynchronize", "sync", 0.15)]


def synth_capture(path: Path, n: int, seed: int, pids: int = 4, threads: int = 4, streams: int = 4) -> Path:
    rng = np.random.default_rng(seed)
    path.mkdir(parents=True, exist_ok=True)
    k = rng.choice(len(KINDS), size=n, p=[w for *_, w in KINDS])
    pid = rng.integers(0, pids, n).astype(np.uint32) + 1000
    tid = pid * 10 + rng.integers(0, threads, n).astype(np.uint32)
    ts = np.int64(10**12) + np.arange(n, dtype=np.int64) * 1000  # one call per µs, no overlap on a thread
    dur = rng.integers(100, 900, n).astype(np.int64)
    api = np.array([a for a, _, _ in KINDS])[k]
    kind = np.array([c for _, c, _ in KINDS])[k]
    is_launch, is_copy, is_alloc, is_free = (kind == "launch"), (kind == "memcpy"), (kind == "alloc"), (kind == "free")
    # allocations and frees pair up per process: the i-th free of a pid frees its i-th allocation
    ptr = np.zeros(n, dtype=np.uint64)
    ptr[is_alloc] = 0x7F0000000000 + np.arange(is_alloc.sum(), dtype=np.uint64) * 0x100000
    frees = np.flatnonzero(is_free)
    allocs = np.flatnonzero(is_alloc)
    m = min(len(frees), len(allocs))
    keep = frees[:m][allocs[:m] < frees[:m]]
    ptr[keep] = ptr[allocs[:m][allocs[:m] < frees[:m]]]
    pid[keep] = pid[allocs[:m][allocs[:m] < frees[:m]]]
    none = lambda mask, v: pl.Series(np.where(mask, v, 0)).cast(pl.UInt64).set(pl.Series(~mask), None)  # noqa: E731
    func = 0xF00 + rng.integers(0, 50, n).astype(np.uint64)
    ev = pl.DataFrame({
        "ts_ns": ts, "dur_ns": dur, "pid": pid, "tid": tid, "comm": "bench", "api": api, "kind": kind,
        "ret": np.zeros(n, dtype=np.int32),
        "stream": none(is_launch | is_copy, 0x5000 + rng.integers(0, streams, n).astype(np.uint64)),
        "func": none(is_launch, func),
        "grid_x": pl.Series(np.where(is_launch, 128, 0)).cast(pl.UInt32).set(pl.Series(~is_launch), None),
        "block_x": pl.Series(np.where(is_launch, 256, 0)).cast(pl.UInt32).set(pl.Series(~is_launch), None),
        "ptr": none(is_alloc | np.isin(np.arange(n), keep), ptr),
        "size": none(is_alloc | is_copy, rng.integers(1, 1 << 20, n).astype(np.uint64)),
    }).with_columns(grid_y=pl.col("grid_x").clip(upper_bound=1), grid_z=pl.col("grid_x").clip(upper_bound=1),
                    block_y=pl.col("block_x").clip(upper_bound=1), block_z=pl.col("block_x").clip(upper_bound=1))
    ev = ev.select([pl.col(c).cast(t) if c in ev.columns else pl.lit(None, t).alias(c)
                    for c, t in schema.EVENTS_SCHEMA.items()])
    ev.write_parquet(path / "events-000.parquet")
    handles = np.arange(0xF00, 0xF00 + 50, dtype=np.uint64)
    pl.DataFrame({
        "pid": np.repeat(np.arange(pids, dtype=np.uint32) + 1000, len(handles)),
        "handle": np.tile(handles, pids), "name": [f"kernel_{i}" for i in range(len(handles))] * pids,
        "source": "module_get_function", "ts_ns": 0, "api": "cuModuleGetFunction", "reason": None,
    }).cast(schema.NAMES_SCHEMA).write_parquet(path / "names.parquet")
    (path / "manifest.json").write_text(json.dumps({"format_version": "1.0", "complete": True, "counts": {}}))
    return path


def perfetto_baseline(model: trace_model.TraceModel, rows: int) -> float:
    """Seconds per TrackEvent: a generated-protobuf begin and end packet per API call."""
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

    api = model.api.head(rows)
    t0 = time.perf_counter()
    trace = pb.Trace()
    for r in api.iter_rows(named=True):
        for ph, ts in ((1, r["ts_ns"]), (2, r["ts_ns"] + (r["dur_ns"] or 0))):
            p = trace.packet.add()
            p.timestamp = ts
            p.trusted_packet_sequence_id = 1
            p.track_event.type = ph
            p.track_event.track_uuid = r["tid"]
            if ph == 1:
                p.track_event.name = r["api"]
                for k in ("kind", "stream", "func", "ptr", "size", "grid_x", "block_x"):
                    if r[k] is not None:
                        a = p.track_event.debug_annotations.add()
                        a.name = k
                        a.string_value = str(r[k])
    trace.SerializeToString()
    return (time.perf_counter() - t0) / len(trace.packet)


def chrome_baseline(model: trace_model.TraceModel, rows: int) -> float:
    """Seconds per event: json.dumps of one dict per API call."""
    api = model.api.head(rows)
    t0 = time.perf_counter()
    out = io.StringIO()
    for r in api.iter_rows(named=True):
        out.write(json.dumps({"ph": "X", "cat": r["cat"], "name": r["api"], "pid": r["pid"], "tid": r["tid"],
                              "ts": r["ts_ns"] / 1000, "dur": (r["dur_ns"] or 0) / 1000,
                              "args": {k: r[k] for k in ("kind", "stream", "func", "ptr", "size", "grid_x")
                                       if r[k] is not None}}) + ",\n")
    return (time.perf_counter() - t0) / api.height


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=1_000_000, help="host API calls in the capture")
    ap.add_argument("--baseline-events", type=int, default=50_000, help="events the per-event baselines encode")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        cap = open_capture(synth_capture(Path(d) / "cap", a.events, a.seed))
        t0, c0 = time.perf_counter(), time.process_time()
        model = trace_model.build(cap)
        t_model, c_model = time.perf_counter() - t0, time.process_time() - c0
        print(f"capture: {a.events} API calls -> {model.kernels.height} kernel rows, "
              f"{model.memory.height} counter samples, {model.n_events} trace events")
        print(f"trace model (Polars): {t_model:.2f} s wall ({c_model:.2f} s CPU), "
              f"{a.events / t_model / 1e6:.2f} M calls/s")
        for name, writer, base, mode in (("perfetto", perfetto.write, perfetto_baseline, "wb"),
                                         ("chrome", chrome.write, chrome_baseline, "wb")):
            out = Path(d) / f"out.{name}"
            t0, c0 = time.perf_counter(), time.process_time()
            with open(out, mode) as f:
                n = writer(model, f)
            t, c = time.perf_counter() - t0, time.process_time() - c0
            per_base = base(model, min(a.baseline_events, model.api.height))
            print(f"{name}: {n} events in {t:.2f} s wall ({c:.2f} s CPU) = {n / t / 1e6:.2f} M events/s, "
                  f"{out.stat().st_size / 1e6:.1f} MB; with the model {a.events / (t + t_model) / 1e6:.2f} M calls/s "
                  f"end to end; {t / n * 1e6:.2f} us per event vs {per_base * 1e6:.2f} us for the per-event "
                  f"baseline = {per_base / (t / n):.1f}x")
    print(f"peak RSS of this run: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6:.2f} GB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
