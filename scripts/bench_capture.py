#!/usr/bin/env python3
"""Benchmark the host capture's drain (run as root).

(a) Drain capacity: a BPF program fills a real BPF ring buffer with
    schema.HOST_EVENT records (a raw tracepoint on this process's getppid()
    writes PER_CALL records per call); then the ring is emptied by
      - pasta-trace's mmap drain alone, and mmap drain + decode to the
        events frame (what the capture does), and
      - the baseline: BCC's open_ring_buffer() + ring_buffer_consume() with a
        per-event Python callback that only counts,
    each on the same pre-filled ring, best of --repeat runs.  Target: >= 10 M
    events/s for the mmap drain + decode.
(b) Sustained capture: `pasta-trace -- cuda_workload --flood N` (the stub
    libcuda from tests/fixtures, one cuLaunchKernel per call) with the default
    buffer; prints the achieved call rate, events captured + lost against the
    calls the workload made, and the tracer's CPU use during the flood (from
    /proc/PID/stat).  Targets: zero lost at 1 M calls/s, <= 25% of one core.
    Also the tracer's memory during the flood (VmRSS) and when it exited.
(c) SIGKILL under a flood (--kill-after S): the same capture, SIGKILLed S
    seconds into the flood; once its events writer has written what reached
    it, how far before the kill the newest event on disk is, and what the
    files hold against the calls made by then.  The README promises all but
    the last second.

(d) The events writer alone (--writer N): N launch records, as the drain
    hands them on (batches of 11,000, the ring's padded layout), through the
    capture writer (the shared ring and the events-writer process) until they
    are written; its events/s, CPU per event and bytes per event on disk,
    against the floor of writing the same records' raw bytes to a file.

    sudo .venv/bin/python scripts/bench_capture.py                    # (a) and (b), default sizes
    sudo .venv/bin/python scripts/bench_capture.py --fill 200000 --calls 2000000   # quick
    sudo .venv/bin/python scripts/bench_capture.py --skip-drain --calls 10000000 --threads 2 --runs 5
    sudo .venv/bin/python scripts/bench_capture.py --skip-drain --skip-sustained --kill-after 6
    sudo .venv/bin/python scripts/bench_capture.py --skip-drain --skip-sustained --writer 4000000
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pasta_trace import schema  # noqa: E402
from pasta_trace.capture.output.decode import events_frame  # noqa: E402
from pasta_trace.capture.bpf.ringbuf import open_table, record_stride  # noqa: E402
from pasta_trace.testing.bench_load import load_average, process_ticks, with_load  # noqa: E402

SYS_GETPPID = 110
PER_CALL = 1000

FILL = schema.bpf_c_header() + r"""
#include <uapi/linux/ptrace.h>
BPF_RINGBUF_OUTPUT(events, RING_PAGES);
BPF_ARRAY(cfg, u32, 1);
RAW_TRACEPOINT_PROBE(sys_enter)
{
    if (ctx->args[1] != SYS_NR)
        return 0;
    int k = 0;
    u32 *pid = cfg.lookup(&k);
    if (!pid || *pid != (bpf_get_current_pid_tgid() >> 32))
        return 0;
    u64 now = bpf_ktime_get_ns();
#pragma clang loop unroll(disable)
    for (u32 i = 0; i < PER_CALL; i++) {
        struct pt_event *e = events.ringbuf_reserve(sizeof(struct pt_event));
        if (!e)
            return 0;
        __builtin_memset(e, 0, sizeof(*e));
        e->ts_ns = now + i;
        e->pid = bpf_get_current_pid_tgid() >> 32;
        e->tid = (u32)bpf_get_current_pid_tgid();
        e->api = i & 7;
        e->kind = PT_KIND_LAUNCH;
        e->func = 0x1000 + (i & 15);
        e->grid_x = i; e->grid_y = 1; e->grid_z = 1;
        e->block_x = 128; e->block_y = 1; e->block_z = 1;
        e->valid = PT_V_FUNC | PT_V_GRID | PT_V_BLOCK;
        bpf_get_current_comm(e->comm, sizeof(e->comm));
        events.ringbuf_submit(e, BPF_RB_NO_WAKEUP);
    }
    return 0;
}
"""


def _ring_pages_for(n: int) -> int:
    need = n * record_stride(schema.HOST_EVENT.size)
    pages = 1
    while pages * os.sysconf("SC_PAGE_SIZE") < need:
        pages *= 2
    return pages


def drain_capacity(fill: int, repeat: int) -> dict:
    from bcc import BPF

    pages = _ring_pages_for(fill)
    text = FILL.replace("RING_PAGES", str(pages)).replace("SYS_NR", str(SYS_GETPPID)).replace(
        "PER_CALL", str(PER_CALL))
    b = BPF(text=text)
    b["cfg"][b["cfg"].Key(0)] = b["cfg"].Leaf(os.getpid())
    ring = open_table(b, "events", schema.HOST_EVENT.dtype)
    apis = [f"api{i}" for i in range(8)]

    def prefill() -> None:
        for _ in range(fill // PER_CALL):
            os.getppid()

    best = {"mmap": 0.0, "mmap_decode": 0.0}
    counts = {}
    for _ in range(repeat):
        prefill()
        t = time.perf_counter()
        recs = ring.drain()
        dt = time.perf_counter() - t
        counts["mmap"] = recs.size
        best["mmap"] = max(best["mmap"], recs.size / dt)

        prefill()
        t = time.perf_counter()
        frame = events_frame(ring.drain(), apis)
        dt = time.perf_counter() - t
        counts["mmap_decode"] = frame.height
        best["mmap_decode"] = max(best["mmap_decode"], frame.height / dt)
    ring.close()

    import ctypes

    seen = [0]
    raw: list[bytes] = []

    mode = ["count"]

    def callback(ctx, data, size):
        if mode[0] == "count":  # floor: one Python call per event, nothing kept
            seen[0] += 1
        else:  # the cheapest useful callback: keep the bytes, decode in bulk afterwards
            raw.append(ctypes.string_at(data, size))
        return 0

    b["events"].open_ring_buffer(callback)
    for name, m in (("bcc_count_only", "count"), ("bcc_callback", "keep")):
        mode[0] = m
        for _ in range(repeat):
            seen[0] = 0
            raw.clear()
            prefill()
            t = time.perf_counter()
            b.ring_buffer_consume()
            if raw:
                recs = np.frombuffer(b"".join(raw), schema.HOST_EVENT.dtype)
                seen[0] = events_frame(recs, apis).height
            dt = time.perf_counter() - t
            counts[name] = seen[0]
            best[name] = max(best.get(name, 0.0), seen[0] / dt)
    b.cleanup()
    return {"fill": fill, "ring_pages": pages, "events_per_s": best, "drained": counts}


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def _writer_pid(tracer: int, workload: int) -> int:
    """The tracer's events-writer child (capture.output.event_writer)."""
    for task in Path(f"/proc/{tracer}/task").iterdir():
        for child in (task / "children").read_text().split():
            if int(child) != workload and b"event_writer" in Path(f"/proc/{child}/cmdline").read_bytes():
                return int(child)
    raise SystemExit("no events-writer process found under the tracer")


def _rss(pid: int) -> int:
    """The process's own resident memory now, bytes: VmRSS less RssShmem, the pages of the ring it shares
    with the events writer (counted apart: _ring_bytes).  VmHWM would be the BPF compile's peak."""
    return _status(pid, "VmRSS") - _status(pid, "RssShmem")


def _ring_bytes(pid: int) -> int:
    """Resident pages of the ring shared with the events writer (capture.output.shared_ring), bytes."""
    return _status(pid, "RssShmem")


def _status(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    return 0


def _start_flood(calls: int, threads: int, workdir: Path) -> tuple[subprocess.Popen, Path, Path]:
    """`pasta-trace -- cuda_workload --flood` on the stub; returns once its first manifest is written."""
    sys.path.insert(0, str(ROOT / "tests" / "fixtures"))
    import build

    lib, workload = build.cuda_stub(workdir / "build"), build.cuda_workload(workdir / "build")
    out, report = workdir / "cap", workdir / "report.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    tracer = subprocess.Popen(
        [sys.executable, "-m", "pasta_trace.cli", "-o", str(out), "--", str(workload), "--lib", str(lib),
         "--report", str(report), "--threads", str(threads), "--flood", str(calls // threads)],
        env=env, stderr=subprocess.PIPE, text=True)
    while not (out / "manifest.json").exists():
        if tracer.poll() is not None:
            raise SystemExit("tracer failed:\n" + tracer.stderr.read())
        time.sleep(0.01)
    return tracer, out, report


def sustained(calls: int, threads: int, workdir: Path) -> dict:
    tracer, out, report = _start_flood(calls, threads, workdir)
    hz = os.sysconf("SC_CLK_TCK")
    wl_pid = json.loads((out / "manifest.json").read_text())["pids"][0]
    writer = _writer_pid(tracer.pid, wl_pid)
    c0, w0, t0 = process_ticks(tracer.pid), process_ticks(writer), time.monotonic()
    rss0 = peak = _rss(tracer.pid)
    ring = 0
    while _running(wl_pid):
        peak = max(peak, _rss(tracer.pid))
        ring = max(ring, _ring_bytes(tracer.pid))
        time.sleep(0.05)
    c1, w1, t1 = process_ticks(tracer.pid), process_ticks(writer), time.monotonic()
    # the writer's CPU to the end: it writes what the flood left it, then exits (read until then)
    w_end = w1
    while _running(writer):
        try:
            w_end = max(w_end, process_ticks(writer))
        except (OSError, IndexError):  # gone meanwhile
            break
        time.sleep(0.02)
    stderr = tracer.communicate()[1]
    t2 = time.monotonic()
    if tracer.returncode != 0:
        raise SystemExit("tracer failed:\n" + stderr)
    m = json.loads((out / "manifest.json").read_text())
    made = json.loads(report.read_text())["flood"]["calls"]
    launches = m["counts"]["by_kind"]["launch"]
    return {
        "calls_made": made,
        "flood_seconds": t1 - t0,
        "calls_per_s": made / (t1 - t0),
        "launch_events": launches,
        "lost_events": m["counts"]["lost_events"],
        "lost_writer_behind": m["counts"].get("lost_writer_behind", 0),
        "tracer_cpu_fraction": (c1 - c0) / hz / (t1 - t0),
        "writer_cpu_fraction": (w1 - w0) / hz / (t1 - t0),
        "writer_ns_per_event": (w_end - w0) / hz * 1e9 / max(launches, 1),
        "buffer_pages": m["buffer_pages"],
        "tracer_rss": (rss0, peak),
        "ring_resident": ring,
        "finish_seconds": t2 - t1,
    }


def killed(calls: int, kill_after: float, workdir: Path) -> dict:
    """(c): SIGKILL the tracer kill_after seconds into the flood."""
    import polars as pl

    from pasta_trace.parquet_scan import scan_events

    tracer, out, report = _start_flood(calls, 1, workdir)
    wl_pid = json.loads((out / "manifest.json").read_text())["pids"][0]
    writer = _writer_pid(tracer.pid, wl_pid)
    rss0 = peak = _rss(tracer.pid)
    end = time.monotonic() + kill_after
    while time.monotonic() < end:
        peak = max(peak, _rss(tracer.pid))
        time.sleep(0.05)
    if not _running(wl_pid):
        raise SystemExit(f"the flood ended before {kill_after} s: give more --calls")
    kill_ns = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    tracer.kill()
    tracer.communicate()
    try:
        os.kill(wl_pid, 9)  # the workload (ours, started by the tracer): its calls after the kill do not matter
    except ProcessLookupError:
        pass
    while _running(writer):  # it writes what reached it, then exits
        time.sleep(0.01)
    files = sorted(out.glob("events-*.parquet"))
    ev = scan_events(files).select(pl.len(), pl.col("ts_ns").max()).collect() if files else None
    rows, newest = (ev.row(0) if ev is not None else (0, None))
    return {
        "kill_after": kill_after,
        "tracer_rss": (rss0, peak),
        "rows": rows,
        "files": len(files),
        "gap_s": None if newest is None else (kill_ns - newest) / 1e9,
    }


def _flood_records(n: int, seed: int = 1) -> np.ndarray:
    """Launch records as a 2-thread flood drains them: irregular times, two threads, seven kernels."""
    from pasta_trace.capture.bpf.ringbuf import padded_dtype
    from pasta_trace.probes.catalog import APIS

    rng = np.random.default_rng(seed)
    r = np.zeros(n, padded_dtype(schema.HOST_EVENT.dtype))
    r["ts_ns"] = 10**12 + np.cumsum(rng.integers(400, 1400, n))
    r["dur_ns"] = rng.integers(300, 900, n)
    r["pid"], r["tid"] = 4242, 4242 + (rng.integers(0, 2, n))
    r["api"] = [a.api_name for a in APIS].index("cuLaunchKernel")
    r["kind"] = int(schema.Kind.launch)
    r["flags"] = schema.FLAG_HAS_RET | schema.FLAG_HAS_DUR
    r["valid"] = sum(1 << schema.PAYLOAD_BITS[b] for b in ("stream", "func", "grid", "block", "shmem"))
    r["stream"], r["func"] = 0x7F00_0000, 0x5555_0000 + rng.integers(0, 7, n) * 64
    r["grid_x"], r["block_x"], r["comm"] = 128, 256, b"cuda_workload"
    return r


def writer_alone(n: int, workdir: Path) -> dict:
    """(d): n records through CaptureWriter until written; the raw-bytes write of the same records as baseline."""
    from pasta_trace.capture.output.writer import CaptureWriter
    from pasta_trace.probes.catalog import APIS
    from pasta_trace.safe_output import OutputDir

    recs = _flood_records(n)
    t = time.perf_counter()
    recs.tofile(workdir / "raw.bin")
    os.fsync(os.open(workdir / "raw.bin", os.O_RDONLY))
    raw_s = time.perf_counter() - t
    hz = os.sysconf("SC_CLK_TCK")
    w = CaptureWriter(OutputDir.claim(workdir / "cap", force=False), [a.api_name for a in APIS])
    w.flush()  # the writer process is up and idle
    c0, t0 = process_ticks(w._proc.pid), time.perf_counter()
    for at in range(0, n, 11_000):
        w.add_events(recs[at : at + 11_000])
    w.flush()  # synchronous: everything written
    c1, t1 = process_ticks(w._proc.pid), time.perf_counter()
    w.close()
    disk = sum(f.stat().st_size for f in w.event_files)
    return {"n": n, "written": w.written, "dropped": w.lost_behind, "seconds": t1 - t0,
            "cpu_s": (c1 - c0) / hz, "raw_seconds": raw_s, "disk_bytes": disk, "ring_bytes": recs.dtype.itemsize}


def _main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fill", type=int, default=1_000_000, help="records pre-filled per drain (default 1e6)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--calls", type=int, default=10_000_000, help="flood calls in (b) (default 1e7)")
    ap.add_argument("--threads", type=int, default=1, help="workload threads in (b)")
    ap.add_argument("--runs", type=int, default=1, help="floods in (b), one after another: medians and spread")
    ap.add_argument("--skip-drain", action="store_true")
    ap.add_argument("--skip-sustained", action="store_true")
    ap.add_argument("--kill-after", type=float, metavar="S",
                    help="(c): SIGKILL the tracer S seconds into a flood of --calls (default: no (c))")
    ap.add_argument("--writer", type=float, metavar="N", help="(d): N records through the events writer alone")
    a = ap.parse_args()
    if a.writer:
        with tempfile.TemporaryDirectory(prefix="pasta-bench-") as tmp:
            d = writer_alone(int(a.writer), Path(tmp))
        print(f"(d) events writer alone: {d['written']:,} of {d['n']:,} records written ({d['dropped']:,} dropped) "
              f"in {d['seconds']:.2f} s = {d['n'] / d['seconds'] / 1e6:.2f} M events/s; writer process "
              f"{d['cpu_s']:.2f} CPU s = {d['cpu_s'] / d['n'] * 1e9:.0f} ns an event")
        print(f"    {d['ring_bytes']} bytes an event in the ring, {d['disk_bytes'] / d['n']:.1f} on disk; baseline: the "
              f"raw records written to a file in {d['raw_seconds']:.2f} s "
              f"({d['n'] / d['raw_seconds'] / 1e6:.2f} M events/s): the writer takes "
              f"{d['seconds'] / d['raw_seconds']:.1f}x as long")
        if a.skip_drain and a.skip_sustained and a.kill_after is None:
            return 0
    if os.geteuid() != 0:
        print("bench_capture.py needs root (BPF)", file=sys.stderr)
        return 77
    if not a.skip_drain:
        r = drain_capacity(a.fill, a.repeat)
        e = r["events_per_s"]
        print(f"(a) drain capacity, {r['fill']:,} pre-filled records ({r['ring_pages']} pages), best of {a.repeat}:")
        print(f"    mmap drain             {e['mmap'] / 1e6:8.2f} M events/s  ({r['drained']['mmap']:,} drained)")
        print(f"    mmap drain + decode    {e['mmap_decode'] / 1e6:8.2f} M events/s  "
              f"({r['drained']['mmap_decode']:,} rows)  target >= 10 M/s")
        print(f"    BCC callback baseline  {e['bcc_callback'] / 1e6:8.2f} M events/s  "
              f"({r['drained']['bcc_callback']:,} rows: callback keeps each record's bytes, then the same decode)")
        print(f"    BCC callback floor     {e['bcc_count_only'] / 1e6:8.2f} M events/s  "
              f"(callback only counts, keeps nothing)")
        print(f"    ratio drain+decode / BCC callback: {e['mmap_decode'] / e['bcc_callback']:.1f}x; "
              f"drain alone: {e['mmap'] / e['bcc_callback']:.1f}x")
    if not a.skip_sustained:
        runs = []
        for i in range(a.runs):
            with tempfile.TemporaryDirectory(prefix="pasta-bench-") as tmp:
                s = sustained(a.calls, a.threads, Path(tmp))
            runs.append(s)
            print(f"(b) sustained{f' {i + 1}/{a.runs}' if a.runs > 1 else ''}: {s['calls_made']:,} cuLaunchKernel "
                  f"calls in {s['flood_seconds']:.2f} s = {s['calls_per_s'] / 1e6:.2f} M calls/s ({a.threads} "
                  f"thread(s)), buffer {s['buffer_pages']} pages, load average {load_average()}")
            print(f"    captured {s['launch_events']:,} + lost {s['lost_events']:,} + dropped (events writer behind) "
                  f"{s['lost_writer_behind']:,} = {s['launch_events'] + s['lost_events'] + s['lost_writer_behind']:,} "
                  f"(calls made {s['calls_made']:,})")
            print(f"    drain (tracer process) CPU during the flood: {100 * s['tracer_cpu_fraction']:.1f}% of one core "
                  f"(target <= 25%); events-writer process (decode + Parquet, nice {5}): "
                  f"{100 * s['writer_cpu_fraction']:.1f}% (target <= 40%); its CPU to its exit "
                  f"{s['writer_ns_per_event']:.0f} ns an event")
            print(f"    tracer memory {s['tracer_rss'][0] / 2**20:.0f} MiB at the start of the flood, at most "
                  f"{s['tracer_rss'][1] / 2**20:.0f} MiB during it, and the ring it shares with the events writer "
                  f"{s['ring_resident'] / 2**20:.0f} MiB; the tracer exited {s['finish_seconds']:.1f} s after it")
        if len(runs) > 1:
            def spread(key: str, scale: float = 1.0, fmt: str = "{:.1f}") -> str:
                v = sorted(r[key] * scale for r in runs)
                return f"{fmt.format(statistics.median(v))} ({fmt.format(v[0])}-{fmt.format(v[-1])})"

            whole = sum(r["lost_events"] + r["lost_writer_behind"] == 0 and
                        r["launch_events"] == r["calls_made"] for r in runs)
            print(f"(b) {len(runs)} floods, median (lowest-highest): {spread('calls_per_s', 1e-6, '{:.2f}')} M calls/s; "
                  f"drain {spread('tracer_cpu_fraction', 100)}% (target <= 25%); writer "
                  f"{spread('writer_cpu_fraction', 100)}% (target <= 40%), {spread('writer_ns_per_event', 1, '{:.0f}')}"
                  f" ns an event to its exit; 0 lost and every call captured in {whole} of {len(runs)}")
    if a.kill_after is not None:
        with tempfile.TemporaryDirectory(prefix="pasta-bench-") as tmp:
            k = killed(a.calls, a.kill_after, Path(tmp))
        print(f"(c) SIGKILL {k['kill_after']:.1f} s into a 1-thread flood (tracer memory "
              f"{k['tracer_rss'][0] / 2**20:.0f} -> at most {k['tracer_rss'][1] / 2**20:.0f} MiB): {k['rows']:,} "
              f"events in {k['files']} files; the newest is from {k['gap_s']:.2f} s before the kill")
    return 0


def main() -> int:
    return with_load(_main)


if __name__ == "__main__":
    raise SystemExit(main())
