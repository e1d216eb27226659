"""The mmap drain, the late-load program and the capture files against the
real kernel: real BPF ring buffers, real raw tracepoints, a real tracer
process killed with SIGKILL."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from pasta_run import descendants, wait_user_space_gone
from pasta_trace import schema
from pasta_trace.parquet_scan import scan_events

ROOT = Path(__file__).resolve().parents[2]
SYS_GETPPID = 110


def _skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "needs root for BPF"
    try:
        import bcc  # noqa: F401
    except ImportError:
        return "BCC (python3-bpfcc) is not importable"
    return None


pytestmark = [pytest.mark.live, pytest.mark.skipif(_skip_reason() is not None, reason=_skip_reason() or "")]

# Each getppid() of the test process writes PER_CALL records numbered from 0;
# the ones with i % 7 == 3 are reserved then discarded.
PER_CALL = 200
FILL = schema.bpf_c_header() + r"""
#include <uapi/linux/ptrace.h>
BPF_RINGBUF_OUTPUT(events, RING_PAGES);
BPF_PERCPU_ARRAY(lost, u64, 1);
BPF_ARRAY(cfg, u32, 1);
BPF_ARRAY(seq, u64, 1);
RAW_TRACEPOINT_PROBE(sys_enter)
{
    if (ctx->args[1] != SYS_NR)
        return 0;
    int k = 0;
    u32 *pid = cfg.lookup(&k);
    if (!pid || *pid != (bpf_get_current_pid_tgid() >> 32))
        return 0;
    u64 *s = seq.lookup(&k);
    if (!s)
        return 0;
#pragma clang loop unroll(disable)
    for (u32 i = 0; i < PER_CALL; i++) {
        u64 n = __sync_fetch_and_add(s, 1);
        struct pt_event *e = events.ringbuf_reserve(sizeof(struct pt_event));
        if (!e) {
            u64 *l = lost.lookup(&k);
            if (l)
                (*l)++;
            continue;
        }
        __builtin_memset(e, 0, sizeof(*e));
        e->size = n;
        e->pid = bpf_get_current_pid_tgid() >> 32;
        e->kind = PT_KIND_ALLOC;
        e->valid = PT_V_SIZE;
        if (n % 7 == 3)
            events.ringbuf_discard(e, BPF_RB_NO_WAKEUP);
        else
            events.ringbuf_submit(e, BPF_RB_NO_WAKEUP);
    }
    return 0;
}
"""


def _fill_program(in_process, ring_pages: int):
    text = FILL.replace("RING_PAGES", str(ring_pages)).replace("SYS_NR", str(SYS_GETPPID)).replace(
        "PER_CALL", str(PER_CALL))
    b = in_process.bpf(text)
    b["cfg"][b["cfg"].Key(0)] = b["cfg"].Leaf(os.getpid())
    return b


def _lost(b) -> int:
    return int(sum(b["lost"][b["lost"].Key(0)]))


def test_drain_returns_every_committed_record_in_order_across_wraps(in_process):
    from pasta_trace.capture.bpf.ringbuf import open_table

    b = _fill_program(in_process, ring_pages=16)  # 64 KiB: 455 records, so 3 calls wrap it
    ring = in_process.closing(open_table(b, "events", schema.HOST_EVENT.dtype))
    got = []
    for _ in range(20):
        os.getppid()
        got.append(ring.drain())
    seqs = np.concatenate(got)["size"]
    expected = [n for n in range(20 * PER_CALL) if n % 7 != 3]
    assert seqs.tolist() == expected
    assert ring.pending_bytes == 0
    assert _lost(b) == 0


def test_full_ring_counts_every_lost_record_exactly(in_process):
    from pasta_trace.capture.bpf.ringbuf import open_table

    from pasta_trace.capture.bpf.ringbuf import record_stride

    b = _fill_program(in_process, ring_pages=1)  # 4 KiB: as many records as fit, each an 8-byte header + the record
    ring = in_process.closing(open_table(b, "events", schema.HOST_EVENT.dtype))
    for _ in range(5):
        os.getppid()  # no drain in between: the ring overflows
    captured = ring.drain()
    produced = 5 * PER_CALL
    slots = ring.size // record_stride(schema.HOST_EVENT.size)
    # every reservation either failed (counted lost) or took a slot; discarded
    # records hold their slot until consumed, like committed ones
    assert slots == 4096 // (8 + (schema.HOST_EVENT.size + 7) // 8 * 8)
    assert slots < PER_CALL  # so a single call already overflows the ring
    assert _lost(b) == produced - slots
    assert captured["size"].tolist() == [n for n in range(slots) if n % 7 != 3]


def test_late_open_stops_the_process_until_resumed_and_tracks_children(tmp_path, in_process):
    """discover.bpf.c: an open of a libcuda.so* name stops the opener before
    the open returns; the watcher's callback sees it stopped; a second open
    of a now-known path does not stop; a forked child joins pid_filter; exits
    are reported."""
    from pasta_trace.capture.procs.late_load import LateLoadWatcher
    from pasta_trace.probes import program

    lib = tmp_path / "venv" / "lib" / "libcuda.so.1"
    lib.parent.mkdir(parents=True)
    shutil.copy("/bin/true", lib)
    b = in_process.bpf(program.build(program.Spec(probes=False, filter_pids=True)))
    seen: list = []

    def on_library(opened):
        state = Path(f"/proc/{opened.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        seen.append(("lib", opened.pid, opened.path, opened.ns_path, state, opened.inode))
        return True  # as if probed: the file is made known, its next open does not stop

    w = in_process.closing(LateLoadWatcher(
        b, on_library=on_library, on_fork=lambda pid, ppid, ts: seen.append(("fork", pid, ppid)),
        on_exec=lambda pid, cgroup_id: seen.append(("exec", pid)), on_exit=lambda pid, ts: seen.append(("exit", pid)),
    ))
    go = tmp_path / "go"
    script = (
        "import os, sys, time\n"
        f"while not os.path.exists({str(go)!r}): time.sleep(0.01)\n"
        f"a = open({str(lib)!r}, 'rb')\n"
        f"b = open({str(lib)!r}, 'rb')\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    os._exit(0)\n"
        "os.waitpid(pid, 0)\n"
        "print(pid, flush=True)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    pf = b["pid_filter"]
    pf[pf.Key(child.pid)] = pf.Leaf(1)
    go.touch()
    deadline = time.monotonic() + 20
    while child.poll() is None and time.monotonic() < deadline:
        w.poll()
        time.sleep(0.005)
    time.sleep(0.05)
    w.poll()
    grandchild = int(child.stdout.read().strip())
    assert child.returncode == 0
    # the interpreter's own exec may or may not land after pid_filter was set
    assert [e for e in seen if e[0] != "exec"] == [
        ("lib", child.pid, str(lib), str(lib), "T", lib.stat().st_ino),
        ("fork", grandchild, child.pid),
        ("exit", grandchild),
        ("exit", child.pid),
    ]
    assert w.stops == 1


def _stub_workload(tmp_path):
    sys.path.insert(0, str(ROOT / "tests" / "fixtures"))
    try:
        import build
    except ImportError as e:
        pytest.skip(f"test fixtures are missing: {e}")
    try:
        return build.cuda_stub(tmp_path / "build"), build.cuda_workload(tmp_path / "build")
    except build.Unavailable as e:
        pytest.skip(str(e))


def test_sigkilled_tracer_leaves_readable_events_of_all_but_the_last_interval(tmp_path):
    """A real `pasta-trace -- workload` is killed with SIGKILL mid-capture:
    the events files are readable, they hold every call of the workload's
    first rounds (written >= 1 s before the kill), and the manifest is
    completed by the events writer."""
    lib, workload = _stub_workload(tmp_path)
    out = tmp_path / "cap"
    report = tmp_path / "report.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    tracer = subprocess.Popen(
        [sys.executable, "-m", "pasta_trace.cli", "-o", str(out), "--", str(workload), "--lib", str(lib),
         "--report", str(report), "--threads", "1", "--flood", "100000000"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and len(list(out.glob("events-*.parquet"))) < 3:
            time.sleep(0.1)
        assert len(list(out.glob("events-*.parquet"))) >= 3, tracer.stderr.read() if tracer.poll() else "timeout"
        traced = json.loads((out / "manifest.json").read_text())["pids"]
        # its own helpers (the events writer, which saves what reached it when
        # the tracer dies, and the stop guardian), not the workload
        helpers = descendants(tracer.pid) - descendants(traced[0]) - set(traced)
        kill_ns = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        tracer.send_signal(signal.SIGKILL)
        for pid in (tracer.pid, *helpers):
            wait_user_space_gone(pid)
    finally:
        if tracer.poll() is None:
            tracer.kill()
    for pid in traced:  # the workload we launched through the tracer
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    from pasta_trace.read import open_capture

    cap = open_capture(out)
    # the events writer outlived it: it wrote the events left in the kernel's ring
    # and completed the manifest with the counts (capture.output.takeover)
    assert cap.complete, cap.problems
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["mode"] == "launch"
    assert any("died during the capture" in n for n in manifest["notes"])
    files = sorted(out.glob("events-*.parquet"))
    per_file = [pl.read_parquet(f) for f in files]
    assert all(f.height > 0 for f in per_file)
    ev = cap.events.collect()
    assert ev.height == sum(f.height for f in per_file) == manifest["counts"]["events"]
    assert ev.filter(pl.col("api") == "cuLaunchKernel").height > 0
    # each interval is written once: consecutive files do not overlap in time
    bounds = [(f["ts_ns"].min(), f["ts_ns"].max()) for f in per_file]
    assert all(bounds[i][1] < bounds[i + 1][0] for i in range(len(bounds) - 1))
    # and at most the last ~interval before the kill is missing (flushes every 1 s)
    assert bounds[-1][1] >= kill_ns - 2_000_000_000


def test_aggregate_mode_counts_exactly_what_event_mode_records(tmp_path):
    """The same workload launched twice: once recording events, once with
    --aggregate.  Per (api, kind) the kernel-side counts equal the events, and
    both equal the workload's own report of the probed calls it made."""
    from pasta_trace.probes.catalog import API_ID

    lib, workload = _stub_workload(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    counts = {}
    for mode in ("events", "aggregate"):
        out = tmp_path / mode
        report = tmp_path / f"{mode}.json"
        extra = ["--aggregate"] if mode == "aggregate" else []
        r = subprocess.run([sys.executable, "-m", "pasta_trace.cli", *extra, "-o", str(out), "--", str(workload),
                            "--lib", str(lib), "--report", str(report)], env=env, capture_output=True, text=True,
                           timeout=300)
        assert r.returncode == 0, r.stderr
        calls = [c["api"] for c in json.loads(report.read_text())["calls"] if c["api"] in API_ID]
        expected = pl.DataFrame({"api": calls}).group_by("api").agg(pl.len().cast(pl.UInt64).alias("n"))
        if mode == "events":
            got = scan_events(sorted(out.glob("events-*.parquet"))).group_by(pl.col("api").cast(pl.String)).agg(
                pl.len().cast(pl.UInt64).alias("n")).collect()
        else:
            got = pl.read_parquet(out / "aggregate.parquet").group_by(pl.col("api").cast(pl.String)).agg(
                pl.col("count").sum().alias("n"))
        assert got.sort("api").rows() == expected.sort("api").rows()
        counts[mode] = got.sort("api").rows()
    assert counts["events"] == counts["aggregate"]
