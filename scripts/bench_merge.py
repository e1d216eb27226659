#!/usr/bin/env python3
"""Merge benchmark: pasta-trace's merge against DuckDB and a NumPy floor.

    .venv/bin/python scripts/bench_merge.py --sizes 1e6
    .venv/bin/python scripts/bench_merge.py --sizes 1e7,1e8 --engines pasta,duckdb

For each size, a seeded synthetic capture (pasta_trace.testing.synthetic: 10^5
launches, 10^4 allocation instances with address reuse, N device access
samples, all Parquet) is merged from Parquet to Parquet by each engine in a
fresh subprocess:

  launch matching      host launch <- device launch (pid, tid, time), as-of
  access attribution   each sample -> allocation instance live at its launch
  working set          per kernel: samples, thread accesses, bytes, distinct 4 KiB pages
  hotness              per allocation instance: samples, accesses, bytes, launches

  pasta   pasta_trace.merge: kernel_executions, working_set, hotness (lazy Polars, streaming
          sinks, one query per output as `pasta-trace merge` runs them; the capture opened
          as every verb opens it, every file checked, the samples' by the pass that reads them)
  duckdb  SQL with ASOF JOINs (SET asof_loop_join_threshold=0), the reference engine
  numpy   pyarrow row-group batches + np.searchsorted / np.unique, one core: the floor

The three results must agree (row-hash checksums of the three outputs) before
any time is printed.  Peak memory is the child's max RSS, against the inputs'
in-memory size (rows x column widths).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import polars as pl

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pasta_trace.testing import synthetic  # noqa: E402

ENGINES = ("pasta", "duckdb", "numpy")
WS_SHIFT = 12
TOLERANCE_NS = 1_000_000

#: canonical output columns every engine writes (checksummed in this order)
OUT = {
    "kernels": {"pid": pl.Int64, "launch_seq": pl.Int64, "launch_id": pl.Int64},
    "working_set": {"pid": pl.Int64, "launch_id": pl.Int64, "samples": pl.Int64, "accesses": pl.Int64,
                    "bytes": pl.Int64, "pages": pl.Int64},
    "hotness": {"pid": pl.Int64, "base": pl.Int64, "size": pl.Int64, "samples": pl.Int64, "accesses": pl.Int64,
                "bytes": pl.Int64, "launches": pl.Int64},
}


# --------------------------------------------------------------------------- engines (run in a child)


def run_pasta(cap_dir: Path, out: Path) -> None:
    from pasta_trace import merge
    from pasta_trace.read import open_capture

    cap = open_capture(cap_dir)
    # one streaming query per output, as `pasta-trace merge` runs them: peak
    # memory is the largest one's, not the sum
    merge.kernel_executions(cap).select("pid", "launch_seq", "launch_id").sink_parquet(out / "kernels.parquet")
    merge.working_set(cap, WS_SHIFT).sink_parquet(out / "working_set.parquet", engine="streaming")
    merge.hotness(cap).sink_parquet(out / "hotness.parquet", engine="streaming")


def run_duckdb(cap_dir: Path, out: Path) -> None:
    import duckdb

    con = duckdb.connect()
    samples = f"read_parquet('{cap_dir}/device/access_samples.parquet')"
    stmts = [
        f"SET threads={os.cpu_count()}",
        "SET asof_loop_join_threshold=0",  # else a small estimated probe side turns ASOF into an O(N*M) nested loop
        "SET preserve_insertion_order=false",
        f"CREATE TABLE ev AS SELECT * FROM read_parquet('{cap_dir}/events*.parquet')",
        """CREATE TABLE host AS SELECT pid, tid, ts_ns,
               row_number() OVER (PARTITION BY pid ORDER BY ts_ns, tid) - 1 AS launch_seq
           FROM ev WHERE kind = 'launch'""",
        f"""CREATE TABLE dl AS SELECT pid, launch_id, tid, host_mono_begin::BIGINT AS dev_ts
            FROM read_parquet('{cap_dir}/device/launches.parquet')""",
        f"""CREATE TABLE km AS SELECT dl.pid, dl.launch_id,
               CASE WHEN dl.dev_ts - h.ts_ns <= {TOLERANCE_NS} THEN h.launch_seq END AS launch_seq,
               CASE WHEN dl.dev_ts - h.ts_ns <= {TOLERANCE_NS} THEN h.ts_ns END AS t
            FROM dl ASOF LEFT JOIN host h ON dl.pid = h.pid AND dl.tid = h.tid AND dl.dev_ts >= h.ts_ns""",
        """CREATE TABLE allocs AS SELECT pid, ptr AS base, size, ts_ns AS alloc_ts,
               lead(ts_ns) OVER (PARTITION BY pid, ptr ORDER BY ts_ns) AS next_alloc
           FROM ev WHERE kind = 'alloc' AND (ret IS NULL OR ret = 0) AND ptr IS NOT NULL AND ptr <> 0""",
        "CREATE TABLE frees AS SELECT pid, ptr AS base, ts_ns AS free_ts FROM ev WHERE kind = 'free'",
        """CREATE TABLE inst AS SELECT a.pid, a.base, a.size, a.alloc_ts,
               CASE WHEN f.free_ts > a.next_alloc THEN NULL ELSE f.free_ts END AS free_ts
           FROM allocs a ASOF LEFT JOIN frees f
             ON a.pid = f.pid AND a.base = f.base AND a.alloc_ts <= f.free_ts""",
        """CREATE TABLE pids AS SELECT pid, (row_number() OVER (ORDER BY pid) - 1)::UBIGINT AS pidx
           FROM (SELECT DISTINCT pid FROM inst)""",
        """CREATE TABLE seg AS SELECT row_number() OVER (ORDER BY pid, b) - 1 AS seg_id, pid, b, e FROM (
               SELECT pid, b, lead(b) OVER (PARTITION BY pid ORDER BY b) AS e FROM (
                   SELECT DISTINCT pid, b FROM (SELECT pid, base AS b FROM inst WHERE size > 0
                                                UNION ALL SELECT pid, base + size FROM inst WHERE size > 0)))
           WHERE e IS NOT NULL""",
        """CREATE TABLE segk AS SELECT seg_id, (pidx << 48) | b AS kstart, (pidx << 48) | e AS kend
           FROM seg JOIN pids USING (pid)""",
        """CREATE TABLE cover AS SELECT s.seg_id, i.pid, i.base, i.size, i.alloc_ts, i.free_ts
           FROM seg s JOIN inst i ON s.pid = i.pid AND s.b >= i.base AND s.e <= i.base + i.size""",
        f"""CREATE TABLE agg AS SELECT a.pid, a.launch_id,
               CASE WHEN a.key < s.kend THEN s.seg_id END AS seg_id,
               count(*) AS samples, sum(bit_count(a.lanes)::BIGINT) AS accesses,
               sum(bit_count(a.lanes)::BIGINT * a.size::BIGINT) AS bytes
            FROM (SELECT x.pid, x.launch_id, x.lanes, x.size, (p.pidx << 48) | x.address AS key
                  FROM {samples} x LEFT JOIN pids p USING (pid)) a
            ASOF LEFT JOIN segk s ON a.key >= s.kstart
            GROUP BY ALL""",
        f"""COPY (SELECT h.pid, h.launch_seq, km.launch_id FROM host h LEFT JOIN km USING (pid, launch_seq))
            TO '{out}/kernels.parquet' (FORMAT parquet)""",
        f"""COPY (SELECT c.pid, c.base, c.size, sum(g.samples) AS samples, sum(g.accesses) AS accesses,
                  sum(g.bytes) AS bytes, count(DISTINCT g.launch_id) AS launches
            FROM agg g JOIN km USING (pid, launch_id) JOIN cover c ON g.seg_id = c.seg_id
            WHERE c.alloc_ts <= km.t AND (c.free_ts IS NULL OR km.t < c.free_ts)
            GROUP BY c.pid, c.base, c.size, c.alloc_ts) TO '{out}/hotness.parquet' (FORMAT parquet)""",
        f"""COPY (SELECT pid, launch_id, count(*) AS samples, sum(bit_count(lanes)::BIGINT) AS accesses,
                  sum(bit_count(lanes)::BIGINT * size::BIGINT) AS bytes,
                  count(DISTINCT address // {1 << WS_SHIFT}) AS pages
            FROM {samples} GROUP BY ALL) TO '{out}/working_set.parquet' (FORMAT parquet)""",
    ]
    for s in stmts:
        con.sql(s)  # one statement per call: execute() leaves a result open and the next fails


def _np_popcount(x: np.ndarray) -> np.ndarray:
    return np.bitwise_count(x).astype(np.int64)


def run_numpy(cap_dir: Path, out: Path) -> None:
    import pyarrow.parquet as pq

    ev = pl.read_parquet(cap_dir / "events-00000.parquet")
    col = lambda df, c: df[c].to_numpy()  # noqa: E731
    # launches: per-pid order, then device -> host by (pid, tid) and time
    host = ev.filter(pl.col("kind") == "launch")
    order = np.lexsort((col(host, "tid"), col(host, "ts_ns"), col(host, "pid")))
    h_pid, h_tid, h_ts = col(host, "pid")[order].astype(np.int64), col(host, "tid")[order].astype(np.int64), \
        col(host, "ts_ns")[order]
    first = np.r_[0, np.flatnonzero(np.diff(h_pid)) + 1]
    h_seq = np.arange(h_pid.size) - np.repeat(first, np.diff(np.r_[first, h_pid.size]))
    dl = pl.read_parquet(cap_dir / "device" / "launches.parquet")
    d_pid, d_tid = col(dl, "pid").astype(np.int64), col(dl, "tid").astype(np.int64)
    d_ts, d_lid = col(dl, "host_mono_begin").astype(np.int64), col(dl, "launch_id").astype(np.int64)
    # one sortable int per (thread group, time): group index << 38 | time since t0
    t0 = min(h_ts.min(), d_ts.min())
    groups = np.unique((h_pid << 32) | h_tid)
    dk = (d_pid << 32) | d_tid
    dgrp = np.minimum(np.searchsorted(groups, dk), groups.size - 1)
    hflat = (np.searchsorted(groups, (h_pid << 32) | h_tid).astype(np.int64) << 38) | (h_ts - t0)
    dflat = (dgrp.astype(np.int64) << 38) | (d_ts - t0)
    ho = np.argsort(hflat)
    pos = np.searchsorted(hflat[ho], dflat, side="right") - 1
    hidx = ho[np.maximum(pos, 0)]
    hit = (groups[dgrp] == dk) & (pos >= 0) & ((hflat[hidx] >> 38) == dgrp) & (d_ts - h_ts[hidx] <= TOLERANCE_NS)
    lseq = np.where(hit, h_seq[hidx], -1)
    lt = np.where(hit, h_ts[hidx], np.iinfo(np.int64).min)
    kern = pl.DataFrame({"pid": h_pid, "launch_seq": h_seq}).join(
        pl.DataFrame({"pid": d_pid[hit], "launch_seq": lseq[hit], "launch_id": d_lid[hit]}),
        on=["pid", "launch_seq"], how="left")
    kern.write_parquet(out / "kernels.parquet")
    # allocation instances: next free of the same (pid, base), before the next alloc there
    ok = (ev["ret"].is_null() | (ev["ret"] == 0)).to_numpy()
    al = ev.filter(pl.Series(ok) & (pl.col("kind") == "alloc") & (pl.col("ptr") > 0))
    fr = ev.filter(pl.col("kind") == "free")
    a_pid, a_base = col(al, "pid").astype(np.int64), col(al, "ptr").astype(np.int64)
    a_size, a_ts = col(al, "size").astype(np.int64), col(al, "ts_ns")
    ao = np.lexsort((a_ts, a_base, a_pid))
    a_pid, a_base, a_size, a_ts = a_pid[ao], a_base[ao], a_size[ao], a_ts[ao]
    pids = np.unique(a_pid)
    ak = (np.searchsorted(pids, a_pid).astype(np.int64) << 48) | a_base
    same_next = np.r_[ak[1:] == ak[:-1], False]
    next_alloc = np.where(same_next, np.r_[a_ts[1:], 0], np.iinfo(np.int64).max)
    f_pid, f_base, f_ts = col(fr, "pid").astype(np.int64), col(fr, "ptr").astype(np.int64), col(fr, "ts_ns")
    fpi = np.searchsorted(pids, f_pid)
    fknown = (fpi < pids.size) & (pids[np.minimum(fpi, pids.size - 1)] == f_pid)
    fk = (fpi[fknown].astype(np.int64) << 48) | f_base[fknown]
    fo = np.lexsort((f_ts[fknown], fk))
    fk, fts = fk[fo], f_ts[fknown][fo]
    # first free of the same key at or after the alloc: search (key, ts) pairs in a structured sort
    fpair = np.rec.fromarrays([fk, fts], names="k,t")
    apair = np.rec.fromarrays([ak, a_ts], names="k,t")
    fi = np.searchsorted(fpair, apair, side="left")
    fic = np.minimum(fi, fk.size - 1)
    has_free = (fi < fk.size) & (fk[fic] == ak) & (fts[fic] <= next_alloc)
    free = np.where(has_free, fts[fic], np.iinfo(np.int64).max)
    # segments cut at every boundary; the instances covering each
    bk = np.unique(np.r_[ak, ak + a_size][np.r_[a_size, a_size] > 0])
    seg_pid = bk >> 48
    kstart, kend = bk[:-1], bk[1:]
    keep = seg_pid[:-1] == seg_pid[1:]
    kstart, kend = kstart[keep], kend[keep]
    s_first = np.searchsorted(kstart, ak)
    s_stop = np.searchsorted(kstart, ak + a_size)
    n_cov = s_stop - s_first
    cov_inst = np.repeat(np.arange(ak.size), n_cov)
    cov_seg = np.concatenate([np.arange(a, b) for a, b in zip(s_first, s_stop)]) if ak.size else np.array([], int)
    # launch index: dense id of (pid, launch_id) among the device launches
    lkey = np.sort((d_pid << 40) | d_lid)
    l_t = np.full(lkey.size, np.iinfo(np.int64).min)
    l_t[np.searchsorted(lkey, (d_pid << 40) | d_lid)] = lt
    nseg = kstart.size + 1
    seg_acc: dict[str, list[np.ndarray]] = {"key": [], "n": [], "acc": [], "bytes": []}
    ws_keys, ws_rows = [], []
    pf = pq.ParquetFile(cap_dir / "device" / "access_samples.parquet")
    for batch in pf.iter_batches(batch_size=4_000_000, columns=["pid", "launch_id", "address", "size", "lanes"]):
        b = {n: batch.column(n).to_numpy() for n in batch.schema.names}
        pid, addr = b["pid"].astype(np.int64), b["address"].astype(np.int64)
        li = np.searchsorted(lkey, (pid << 40) | b["launch_id"].astype(np.int64))
        pc = _np_popcount(b["lanes"])
        by = pc * b["size"].astype(np.int64)
        pi = np.searchsorted(pids, pid)
        pic = np.minimum(pi, pids.size - 1)
        key = (pic.astype(np.int64) << 48) | addr
        sg = np.searchsorted(kstart, key, side="right") - 1
        inside = (pids[pic] == pid) & (sg >= 0) & (key < kend[np.maximum(sg, 0)])
        ck = li * nseg + np.where(inside, sg + 1, 0)
        u, inv = np.unique(ck, return_inverse=True)
        seg_acc["key"].append(u)
        seg_acc["n"].append(np.bincount(inv, minlength=u.size))
        seg_acc["acc"].append(np.bincount(inv, weights=pc, minlength=u.size).astype(np.int64))
        seg_acc["bytes"].append(np.bincount(inv, weights=by, minlength=u.size).astype(np.int64))
        ws_keys.append(np.unique((li << 36) | (addr >> WS_SHIFT)))
        ws_rows.append(np.stack([li, pc, by]))
    # per (launch, segment), then the instance live at the launch
    u, inv = np.unique(np.concatenate(seg_acc["key"]), return_inverse=True)
    sums = {k: np.bincount(inv, weights=np.concatenate(seg_acc[k]), minlength=u.size).astype(np.int64)
            for k in ("n", "acc", "bytes")}
    g_li, g_seg = u // nseg, u % nseg - 1
    co = np.argsort(cov_seg, kind="stable")
    cs, ci = cov_seg[co], cov_inst[co]
    lo, hi = np.searchsorted(cs, g_seg, "left"), np.searchsorted(cs, g_seg, "right")
    cnt = np.where(g_seg >= 0, hi - lo, 0)
    rows = np.repeat(np.arange(u.size), cnt)
    inst = ci[np.concatenate([np.arange(a, b) for a, b, c in zip(lo, hi, cnt) if c])] if cnt.sum() else \
        np.array([], np.int64)
    t = l_t[g_li[rows]]
    live = (a_ts[inst] <= t) & (t < free[inst])
    rows, inst = rows[live], inst[live]
    hot = pl.DataFrame({"inst": inst, "li": g_li[rows], "samples": sums["n"][rows], "accesses": sums["acc"][rows],
                        "bytes": sums["bytes"][rows]}).group_by("inst").agg(
        pl.col("samples").sum(), pl.col("accesses").sum(), pl.col("bytes").sum(),
        pl.col("li").n_unique().alias("launches"))
    inst_ix = hot["inst"].to_numpy()
    hot.with_columns(pl.Series("pid", a_pid[inst_ix]), pl.Series("base", a_base[inst_ix]),
                     pl.Series("size", a_size[inst_ix])).write_parquet(out / "hotness.parquet")
    # working set per launch
    wk = np.unique(np.concatenate(ws_keys))
    pages = np.bincount(wk >> 36, minlength=lkey.size)
    r = np.concatenate(ws_rows, axis=1)
    n = np.bincount(r[0], minlength=lkey.size)
    acc = np.bincount(r[0], weights=r[1], minlength=lkey.size).astype(np.int64)
    byt = np.bincount(r[0], weights=r[2], minlength=lkey.size).astype(np.int64)
    seen = n > 0
    pl.DataFrame({"pid": (lkey >> 40)[seen], "launch_id": (lkey & ((1 << 40) - 1))[seen], "samples": n[seen],
                  "accesses": acc[seen], "bytes": byt[seen], "pages": pages[seen]}).write_parquet(
        out / "working_set.parquet")


# --------------------------------------------------------------------------- parent


def checksum(out: Path) -> dict[str, tuple[int, int]]:
    """(rows, order-independent sum of row hashes) per output, on canonical columns."""
    res = {}
    for name, cols in OUT.items():
        df = pl.read_parquet(out / f"{name}.parquet").select([pl.col(c).cast(t) for c, t in cols.items()])
        res[name] = (df.height, int((df.hash_rows(seed=1) % (1 << 40)).sum()))
    return res


def peak_rss() -> int:
    """This process's peak resident bytes (VmHWM of its own address space)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) * 1024


def measure(engine: str, cap_dir: Path, out: Path) -> dict:
    """Run in a fresh process, which reports its own peak RSS (wait4's ru_maxrss
    would count this process's too: a forked child inherits its parent's peak)."""
    shutil.rmtree(out, ignore_errors=True)
    pid = os.fork()
    if pid == 0:
        os.execv(sys.executable, [sys.executable, __file__, "--child", engine, str(cap_dir), str(out)])
    _, status, usage = os.wait4(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{engine} failed (exit {os.waitstatus_to_exitcode(status)})")
    res = json.loads((out / "timing.json").read_text())
    return {"seconds": res["seconds"], "peak_bytes": res["peak_bytes"],
            "cpu": usage.ru_utime + usage.ru_stime}


def input_bytes(cap_dir: Path) -> int:
    """In-memory size of the inputs: rows x width of every column read."""
    total = 0
    for f in [*cap_dir.glob("events*.parquet"), *(cap_dir / "device").glob("*.parquet")]:
        meta = pl.read_parquet_schema(f)
        rows = pl.scan_parquet(f).select(pl.len()).collect().item()
        total += rows * sum(_width(t) for t in meta.values())
    return total


def _width(t: pl.DataType) -> int:
    # strings and categoricals (only in the small tables) counted as 8 bytes
    return {pl.UInt8: 1, pl.Int8: 1, pl.UInt16: 2, pl.Int16: 2, pl.UInt32: 4, pl.Int32: 4, pl.Float32: 4}.get(
        t.base_type(), 8)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1e6", help="access sample rows, comma-separated (default 1e6)")
    ap.add_argument("--launches", type=float, default=1e5)
    ap.add_argument("--allocations", type=float, default=1e4)
    ap.add_argument("--pids", type=int, default=4)
    ap.add_argument("--engines", default=",".join(ENGINES))
    ap.add_argument("--repeat", type=int, default=1, help="runs per engine; the median counts")
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/pasta-bench-merge"))
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--child", nargs=3, metavar=("ENGINE", "CAPTURE", "OUT"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        engine, cap_dir, out = a.child[0], Path(a.child[1]), Path(a.child[2])
        out.mkdir(parents=True, exist_ok=True)
        t = time.perf_counter()
        {"pasta": run_pasta, "duckdb": run_duckdb, "numpy": run_numpy}[engine](cap_dir, out)
        (out / "timing.json").write_text(json.dumps({"seconds": time.perf_counter() - t, "peak_bytes": peak_rss()}))
        return 0
    engines = [e for e in a.engines.split(",") if e]
    if "pasta" not in engines or any(e not in ENGINES for e in engines):
        ap.error(f"--engines: pasta plus any of {', '.join(ENGINES)}")
    print(f"machine: {os.cpu_count()} CPUs; polars {pl.__version__}; numpy {np.__version__}")
    for size in [int(float(s)) for s in a.sizes.split(",")]:
        spec = synthetic.Spec(pids=a.pids, launches=int(a.launches), allocations=int(a.allocations),
                              accesses=size, seed=a.seed, page_hist=False)
        cap_dir = a.workdir / f"cap-{size}-{spec.launches}-{spec.allocations}-{spec.pids}-{a.seed}"
        if not (cap_dir / "manifest.json").exists():
            shutil.rmtree(cap_dir, ignore_errors=True)
            t = time.perf_counter()
            synthetic.write_capture(cap_dir, spec)
            print(f"generated {cap_dir} in {time.perf_counter() - t:.1f} s")
        inp = input_bytes(cap_dir)
        # engines take turns, so a busy spell on the shared machine hits them alike
        runs: dict[str, list[dict]] = {e: [] for e in engines}
        load_before = os.getloadavg()[0]
        for _ in range(a.repeat):
            for e in engines:
                runs[e].append(measure(e, cap_dir, a.workdir / f"out-{e}"))
        load_after = os.getloadavg()[0]
        sums = {e: checksum(a.workdir / f"out-{e}") for e in engines}
        results = {}
        for e in engines:
            secs = sorted(r["seconds"] for r in runs[e])
            cpu = sorted(r["cpu"] for r in runs[e])
            results[e] = {"seconds": statistics.median(secs), "all": secs, "cpu": statistics.median(cpu),
                          "peak_bytes": max(r["peak_bytes"] for r in runs[e])}
        ref = sums["pasta"]
        bad = [e for e in engines if sums[e] != ref]
        print(f"\n{size:.0e} access rows ({spec.launches} launches, {spec.allocations} allocations, "
              f"{spec.pids} processes); inputs in memory {inp / 2**30:.2f} GiB")
        for name, (rows, h) in ref.items():
            print(f"  checksum {name}: {rows} rows, hash {h}")
        if bad:
            for e in bad:
                print(f"  MISMATCH {e}: {sums[e]}")
            return 1
        print(f"  all engines agree ({', '.join(engines)})")
        print(f"  {'engine':8} {'seconds':>8} {'M rows/s':>9} {'cpu s':>7} {'peak GiB':>9} {'peak/input':>10} "
              f"{'vs duckdb':>10} {'vs numpy':>9}")
        for e in engines:
            r = results[e]
            vs = [f"{results[o]['seconds'] / r['seconds']:.2f}x" if o in results else "-" for o in ("duckdb", "numpy")]
            print(f"  {e:8} {r['seconds']:8.2f} {size / r['seconds'] / 1e6:9.2f} {r['cpu']:7.2f} "
                  f"{r['peak_bytes'] / 2**30:9.2f} "
                  f"{r['peak_bytes'] / inp:10.2f} {vs[0]:>10} {vs[1]:>9}")
        print("  (medians over the runs; cpu s: user+sys of the whole child process, including imports;")
        print("   vs X: X's seconds / this engine's seconds, >1 means faster than X)")
        print(f"  load average (1 min): {load_before:.1f} before, {load_after:.1f} after")
        if a.repeat > 1:
            for e in engines:
                print(f"  {e} runs: {', '.join(f'{x:.2f}' for x in results[e]['all'])} s")
        for o in ("duckdb", "numpy"):
            if o in runs:
                # each round's engines ran one after the other: their ratio shares that round's load
                ratios = sorted(b["seconds"] / p["seconds"] for p, b in zip(runs["pasta"], runs[o]))
                cpu = sorted(b["cpu"] / p["cpu"] for p, b in zip(runs["pasta"], runs[o]))
                print(f"  {o} / pasta per round: seconds median {statistics.median(ratios):.2f}x "
                      f"({ratios[0]:.2f}-{ratios[-1]:.2f}), cpu s median {statistics.median(cpu):.2f}x "
                      f"({cpu[0]:.2f}-{cpu[-1]:.2f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
