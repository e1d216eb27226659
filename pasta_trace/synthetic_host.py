"""Host events a synthetic capture can add beside its launches and
allocations (pasta_trace.synthetic): syncs, copies (some of the same host
range again, some in storms of small copies) and the Python stacks of the
calls, from a fixed table of call sites.  Drawn from their own random
stream, so captures without them are unchanged."""

from __future__ import annotations

import numpy as np
import polars as pl

from . import schema

#: kind -> the Python lines that make such calls: (file, line, function);
#: every stack has main() at train.py:100 as its caller
SITES: dict[str, list[tuple[str, int, str]]] = {
    "launch": [("model.py", 40, "Model.forward"), ("model.py", 55, "Model.backward")],
    "alloc": [("data.py", 12, "make_buffer")],
    "memcpy": [("data.py", 30, "load_batch"), ("data.py", 44, "save_output")],
    "sync": [("train.py", 70, "step")],
}
MAIN = ("train.py", 100, "main")
#: share of calls with no stack (a thread that runs no Python)
NO_STACK_SHARE = 0.2
#: host buffers the copies read and write: few, so ranges repeat
HOST_BUFFERS = 8
#: share of syncs that return LAUNCH_FAILED (CUDA_ERROR_LAUNCH_FAILED)
FAILED_SYNC_SHARE = 0.1
LAUNCH_FAILED = 719
#: small copies in the one storm a capture with copies holds
STORM_COPIES = 40


def _site_ids() -> dict[str, list[int]]:
    """kind -> the stack_id of each of its sites (1-based, in SITES order)."""
    out, n = {}, 0
    for kind, sites in SITES.items():
        out[kind] = list(range(n + 1, n + 1 + len(sites)))
        n += len(sites)
    return out


def stacks(pids: np.ndarray) -> pl.DataFrame:
    """stacks.parquet: every site's two-frame stack (the site, then main) in every process."""
    rows = []
    for kind, sites in SITES.items():
        for sid, (file, line, function) in zip(_site_ids()[kind], sites):
            rows += [(sid, 0, function, file, line), (sid, 1, MAIN[2], MAIN[0], MAIN[1])]
    frames = pl.DataFrame(rows, schema=["stack_id", "depth", "function", "file", "line"], orient="row")
    return (
        pl.DataFrame({"pid": pids}).join(frames, how="cross")
        .with_columns(kind=pl.lit("python"), module=pl.lit(None, pl.String), addr=pl.col("stack_id") * 16 + pl.col("depth"),
                      truncated=pl.lit(False))
        .select([pl.col(c).cast(t) for c, t in schema.STACKS_SCHEMA.items()])
    )


def with_stacks(events: pl.DataFrame, rng: np.random.Generator) -> pl.DataFrame:
    """Each call given one of its kind's sites, or (NO_STACK_SHARE of them) no stack."""
    ids = _site_ids()
    kind = events["kind"].cast(pl.String).to_numpy()
    sid = np.zeros(events.height, np.int64)
    for k, choices in ids.items():
        mine = kind == k
        sid[mine] = rng.choice(choices, mine.sum())
    sid[rng.random(events.height) < NO_STACK_SHARE] = 0
    return events.with_columns(stack_id=pl.Series(sid, dtype=pl.UInt64).replace(0, None))


def syncs_and_copies(n_syncs: int, n_copies: int, pids: np.ndarray, span_ns: int, t0: int,
                     rng: np.random.Generator) -> pl.DataFrame:
    """Syncs (stream-wide on one of two streams, or context-wide) and copies
    (h2d and d2h of HOST_BUFFERS host buffers, of a few fixed sizes, so the
    same range is copied again), as schema.EVENTS_SCHEMA rows."""
    def base(n: int) -> dict:
        pid = pids[rng.integers(0, pids.size, n)]
        return {"ts_ns": t0 + rng.integers(span_ns // 100, span_ns, n), "pid": pid, "tid": pid + 1,
                "dur_ns": rng.integers(1_000, 500_000, n), "ret": np.zeros(n, np.int32)}

    syncs = pl.DataFrame(base(n_syncs)).with_columns(
        api=pl.lit("cuStreamSynchronize"), kind=pl.lit("sync"),
        stream=pl.Series(rng.choice([0, 0x7000_0000, 0x7000_0100], n_syncs), dtype=pl.UInt64),
    ).with_columns(api=pl.when(pl.col("stream") == 0).then(pl.lit("cuCtxSynchronize")).otherwise("api"),
                   stream=pl.col("stream").replace(0, None),
                   # a few report an earlier kernel's fault, as a sync does
                   ret=pl.Series(np.where(rng.random(n_syncs) < FAILED_SYNC_SHARE, LAUNCH_FAILED, 0), dtype=pl.Int32))
    h2d = rng.random(n_copies) < 0.6
    host = (0x5600_0000_0000 + rng.integers(0, HOST_BUFFERS, n_copies) * 0x10_0000).astype(np.uint64)
    dev = (0x7F00_0000_0000 + rng.integers(0, HOST_BUFFERS, n_copies) * 0x40_0000).astype(np.uint64)
    copies = pl.DataFrame(base(n_copies)).with_columns(
        api=pl.Series(np.where(h2d, "cuMemcpyHtoD_v2", "cuMemcpyDtoH_v2")), kind=pl.lit("memcpy"),
        copy_kind=pl.Series(np.where(h2d, "h2d", "d2h")),
        src=pl.Series(np.where(h2d, host, dev)), dst=pl.Series(np.where(h2d, dev, host)),
        size=pl.Series(rng.choice([4096, 65536, 1 << 20], n_copies).astype(np.uint64)),
    )
    # one storm: STORM_COPIES small h2d copies 10 µs apart on one thread, mid-capture
    storm = pl.DataFrame({
        "ts_ns": t0 + span_ns // 2 + 10_000 * np.arange(STORM_COPIES), "pid": np.full(STORM_COPIES, pids[0]),
        "tid": np.full(STORM_COPIES, pids[0] + 1), "dur_ns": np.full(STORM_COPIES, 2_000),
        "ret": np.zeros(STORM_COPIES, np.int32)}).with_columns(
        api=pl.lit("cuMemcpyHtoD_v2"), kind=pl.lit("memcpy"), copy_kind=pl.lit("h2d"),
        src=pl.lit(0x5700_0000_0000, pl.UInt64), dst=pl.lit(0x7F10_0000_0000, pl.UInt64), size=pl.lit(512, pl.UInt64))
    parts = [syncs, copies, storm] if n_copies else [syncs, copies]
    ev = pl.concat(parts, how="diagonal_relaxed").with_columns(comm=pl.lit("worker"))
    return ev.select([pl.col(c).cast(t) if c in ev.columns else pl.lit(None, t).alias(c)
                      for c, t in schema.EVENTS_SCHEMA.items()])
