"""The daemon's automatic triggers (pasta_trace/daemon/triggers.py) on stand-in
workloads, one daemon for the module: an out-of-memory return, an
illegal-address return and cuInit failing each make exactly one dump, named
by the trigger and the PID, written --after seconds after the trigger and
holding exactly the workload's calls of the window (its own log says which)
including those made after the trigger; the second failure of the same cause
makes none and is counted.  An NCCL collective that never returns on one of
two stub ranks fires nccl_hang with the communicator's comm_id and the
collective's sequence number; SIGKILL of that rank fires killed, and its
parent's non-zero exit fires exit.  A process whose calls stop fires quiet."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import polars as pl
import pytest

from pasta_run import Tracer, run_pasta, wait_for_file
from pasta_trace import schema
from pasta_trace.parquet_scan import scan_events

pytestmark = [pytest.mark.live, pytest.mark.machine_wide, pytest.mark.usefixtures("require_bpf")]

WORKLOAD = Path(__file__).resolve().parents[1] / "fixtures" / "failing_workload.py"
WINDOW_S, AFTER_S, HANG_S, QUIET_S = 5, 1.5, 1, 2


@pytest.fixture(scope="module")
def daemon(_bpf_status, tmp_path_factory):
    if _bpf_status:
        pytest.skip(_bpf_status)
    d = tmp_path_factory.mktemp("triggers")
    with tempfile.TemporaryDirectory(prefix="pasta-daemon-", dir="/tmp") as sock_dir:
        t = Tracer(["daemon", "-v", "-o", str(d / "dumps"), "--socket", f"{sock_dir}/daemon.sock",
                    "--window", str(WINDOW_S), "--after", str(AFTER_S), "--hang-after", str(HANG_S),
                    "--quiet-after", str(QUIET_S), "--no-stacks", "--metrics", "off"], d / "daemon.log")
        try:
            t.wait_ready(timeout=180)  # the first start of a configuration compiles the BPF program
            t.dumps = d / "dumps"
            yield t
            assert t.stop() == 0, t.stderr()
        finally:
            t.kill()


class Failing:
    """failing_workload.py, started and made ready (its library attached), not yet going."""

    def __init__(self, cuda_stub: Path, where: Path, fail: str, *extra: str, env: dict[str, str] | None = None):
        where.mkdir()
        self.dir = where
        self.proc = subprocess.Popen([sys.executable, str(WORKLOAD), "--cuda", str(cuda_stub), "--dir", str(where),
                                      "--fail", fail, *extra], env={**os.environ, **(env or {})})
        self.pid = int(wait_for_file(where / "ready", 60, self.proc))

    def run(self) -> dict:
        (self.dir / "go").touch()
        return json.loads(wait_for_file(self.dir / "done", 60, self.proc))

    def end(self) -> int:
        (self.dir / "end").touch()
        return self.proc.wait(timeout=60)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def wait_dump(daemon: Tracer, kind: str, pid: int, timeout: float = 60) -> Path:
    """The one complete dump of ``kind`` for ``pid``."""
    deadline = time.monotonic() + timeout
    while True:
        found = sorted(daemon.dumps.glob(f"dump-*-{kind}-pid{pid}"))
        if found and (found[0] / "manifest.json").exists() and \
                json.loads((found[0] / "manifest.json").read_text()).get("complete"):
            return found[0]
        assert time.monotonic() < deadline, daemon.stderr()
        time.sleep(0.05)


def dumps_of(daemon: Tracer, kind: str, pid: int) -> list[str]:
    return sorted(p.name for p in daemon.dumps.glob(f"dump-*-{kind}-pid{pid}*"))


def events_of(d: Path, pid: int) -> pl.DataFrame:
    return scan_events(sorted(d.glob("events-*.parquet"))).collect().filter(pl.col("pid") == pid).sort("ts_ns")


def check_error_dump(daemon: Tracer, w: Failing, log: dict, kind: str, error: str, ret: int) -> dict:
    """The one dump of ``kind`` for the workload: named, timed and filled as the workload's log says."""
    d = wait_dump(daemon, kind, w.pid)
    manifest = json.loads((d / "manifest.json").read_text())
    t = manifest["trigger"]
    api = log["fails"][0]["api"]
    assert [f["ret"] for f in log["fails"]] == [ret, ret]
    assert (t["kind"], t["pid"], t["api"], t["error"], t["ret"], t["tid"]) == (kind, w.pid, api, error, ret, w.pid)
    assert t["cause"] == f"{api} returned {error} ({ret}) in PID {w.pid} (thread {w.pid})"
    assert log["fails"][0]["before"] <= t["call_ns"] <= log["fails"][1]["before"]  # the first of the two
    assert t["call_ns"] <= t["fired_ns"] and t["window_s"] == WINDOW_S
    assert t["window_start_ns"] == manifest["clock"]["start_ns"] == t["fired_ns"] - WINDOW_S * 10**9
    # written --after seconds after it fired: the end of the window is that much later
    assert AFTER_S <= t["after_s"] < AFTER_S + 30  # taken when due, by a loop that runs every 10 ms
    assert manifest["clock"]["end_ns"] - t["fired_ns"] >= AFTER_S * 1e9
    assert manifest["format_version"] == "%d.%d" % schema.CAPTURE_FORMAT_VERSION
    assert manifest["complete"] is True
    # every call of the workload, the launches made after the trigger included, and nothing else
    ev = events_of(d, w.pid)
    launches = ev.filter(pl.col("api") == "cuLaunchKernel")
    assert launches["grid_x"].to_list() == list(range(1, len(log["before"]) + 1))
    failed = ev.filter(pl.col("api") == api)
    assert failed["ret"].to_list() == [ret, ret]
    assert ev.height == len(log["before"]) + 2
    assert ev["ts_ns"].min() >= t["window_start_ns"] and ev["ts_ns"].max() <= manifest["clock"]["end_ns"]
    assert launches.filter(pl.col("ts_ns") > t["call_ns"]).height > 0  # the --after part is there
    # the second failure made no dump: counted as suppressed
    assert dumps_of(daemon, kind, w.pid) == [d.name]
    assert re.search(rf"trigger {kind} suppressed 1 time .*in PID {w.pid} ", daemon.stderr()), daemon.stderr()
    return manifest


def test_out_of_memory_makes_one_dump_and_report_reads_it(daemon, cuda_stub, tmp_path):
    w = Failing(cuda_stub, tmp_path / "w", "oom")
    try:
        log = w.run()
        check_error_dump(daemon, w, log, "oom", "CUDA_ERROR_OUT_OF_MEMORY", 2)
        d = wait_dump(daemon, "oom", w.pid)
        n = json.loads((d / "manifest.json").read_text())["counts"]["events"]  # every process's
        r = run_pasta(["report", str(d)])
        assert r.returncode == 0, r.stderr
        assert re.search(rf"^ *events  ({n}|{n:,})$", r.stdout, re.M), r.stdout
        assert w.end() == 0
    finally:
        w.kill()
    time.sleep(0.3)  # a clean exit fires nothing (its exit was drained by now: the loop polls every 10 ms)
    assert dumps_of(daemon, "exit", w.pid) == dumps_of(daemon, "killed", w.pid) == []


def test_an_illegal_address_makes_one_dump(daemon, cuda_stub, tmp_path):
    w = Failing(cuda_stub, tmp_path / "w", "fault", env={"PASTA_STUB_SYNC_ERROR": "700"})
    try:
        log = w.run()
        check_error_dump(daemon, w, log, "cuda_error", "CUDA_ERROR_ILLEGAL_ADDRESS", 700)
        assert w.end() == 0
    finally:
        w.kill()


def test_cuinit_failing_and_a_non_zero_exit_each_make_one_dump(daemon, cuda_stub, tmp_path):
    w = Failing(cuda_stub, tmp_path / "w", "init", "--exit", "3", env={"PASTA_STUB_NO_DEVICE": "1"})
    try:
        log = w.run()
        assert w.end() == 3  # at once: its calls are in the window of its exit's dump however slow the checks
        check_error_dump(daemon, w, log, "init_failed", "CUDA_ERROR_NO_DEVICE", 100)
        d = wait_dump(daemon, "exit", w.pid)
        t = json.loads((d / "manifest.json").read_text())["trigger"]
        assert (t["kind"], t["pid"], t["exit_status"], t["cause"]) == ("exit", w.pid, 3,
                                                                       f"PID {w.pid} exited with status 3")
        assert events_of(d, w.pid).height == len(log["before"]) + 2
        assert run_pasta(["report", str(d)]).returncode == 0
    finally:
        w.kill()


def test_a_process_whose_calls_stop_fires_quiet(daemon, cuda_stub, tmp_path):
    w = Failing(cuda_stub, tmp_path / "w", "none", "--before", "0.2", "--after", "0")
    try:
        log = w.run()
        d = wait_dump(daemon, "quiet", w.pid, timeout=QUIET_S + 60)
        t = json.loads((d / "manifest.json").read_text())["trigger"]
        last = events_of(d, w.pid)["ts_ns"].max()
        assert t["last_call_ns"] == last and log["before"][-1] <= last <= log["end"]
        assert t["fired_ns"] - last >= QUIET_S * 1e9 and t["quiet_s"] >= QUIET_S
        assert events_of(d, w.pid)["grid_x"].to_list() == list(range(1, len(log["before"]) + 1))
        assert w.end() == 0
    finally:
        w.kill()
    assert dumps_of(daemon, "quiet", w.pid) == [d.name]


@pytest.fixture(scope="module")
def nccl_programs(build_dir: Path) -> dict[str, Path]:
    import build

    try:
        return {"stub": build.nccl_stub(build_dir), "ranks": build.nccl_ranks(build_dir)}
    except build.Unavailable as e:
        pytest.skip(f"cannot build the NCCL fixtures: {e}")


def test_an_nccl_collective_that_never_returns_fires_nccl_hang(daemon, nccl_programs, tmp_path):
    """Two ranks, three AllReduce each: rank 1 never enters the last (nccl_ranks --hang), rank 0 enters it
    and the stub keeps it there (PASTA_STUB_NCCL_STALL).  Then rank 0 is killed: killed; the parent, which
    called ncclGetUniqueId and sees a rank fail, exits 1: exit."""
    out = tmp_path / "ranks.json"
    with open(out, "w") as f:
        parent = subprocess.Popen([str(nccl_programs["ranks"]), str(nccl_programs["stub"]), "--ranks", "2",
                                   "--iters", "3", "--hang", "1"], stdout=f,
                                  env={**os.environ, "PASTA_STUB_NCCL_STALL": "0,3"})
    try:
        deadline = time.monotonic() + 60
        while not (hung := sorted(daemon.dumps.glob("dump-*-nccl_hang-pid*"))) or not any(
                _child_of(int(p.name.rsplit("pid", 1)[1]), parent.pid) for p in hung):
            assert time.monotonic() < deadline and parent.poll() is None, daemon.stderr()
            time.sleep(0.05)
        rank0 = next(int(p.name.rsplit("pid", 1)[1]) for p in hung if _child_of(int(p.name.rsplit("pid", 1)[1]),
                                                                                  parent.pid))
        d = wait_dump(daemon, "nccl_hang", rank0)
        os.kill(rank0, signal.SIGKILL)
        assert parent.wait(timeout=60) == 1
        printed = json.loads(out.read_text())
        assert printed["pids"][0] == rank0
        comm_id = schema.nccl_comm_id(bytes.fromhex(printed["unique_id"]))
        manifest = json.loads((d / "manifest.json").read_text())
        t = manifest["trigger"]
        assert (t["kind"], t["pid"], t["api"], t["tid"], t["comm_id"], t["sequence"]) == (
            "nccl_hang", rank0, "ncclAllReduce", rank0, comm_id, 2)
        assert t["waited_s"] >= HANG_S and t["fired_ns"] - t["call_ns"] >= HANG_S * 1e9
        assert t["cause"] == (f"ncclAllReduce of communicator {comm_id:#018x}, collective 2 in PID {rank0} "
                              f"(thread {rank0}) not returned after {t['waited_s']:.1f} s")
        # the dump holds every process: both ranks' calls, numbered as a capture numbers them
        for pid in printed["pids"]:
            ev = events_of(d, pid)
            assert ev["api"].cast(pl.String).to_list() == ["ncclCommInitRank", "ncclAllReduce", "ncclAllReduce"]
            assert ev.filter(pl.col("kind") == "collective")["seq"].to_list() == [0, 1]
            assert ev.filter(pl.col("api") == "ncclCommInitRank")["comm_id"].to_list() == [comm_id]
        assert {parent.pid, *printed["pids"]} <= set(manifest["pids"])
        assert events_of(d, parent.pid)["api"].cast(pl.String).to_list() == ["ncclGetUniqueId"]
        k = json.loads((wait_dump(daemon, "killed", rank0) / "manifest.json").read_text())["trigger"]
        assert (k["signal"], k["signal_name"], k["core_dumped"], k["cause"]) == (
            9, "SIGKILL", False, f"PID {rank0} killed by SIGKILL")
        e = json.loads((wait_dump(daemon, "exit", parent.pid) / "manifest.json").read_text())["trigger"]
        assert e["exit_status"] == 1
        assert dumps_of(daemon, "nccl_hang", rank0) == [d.name]
        assert dumps_of(daemon, "exit", printed["pids"][1]) == []  # rank 1 exited 0
        assert run_pasta(["report", str(d)]).returncode == 0
    finally:
        if parent.poll() is None:
            for pid in _children(parent.pid):
                os.kill(pid, signal.SIGKILL)
            parent.kill()
            parent.wait()


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _child_of(pid: int, parent: int) -> bool:
    return pid in _children(parent)


def test_ctrl_c_writes_the_dumps_of_the_triggers_fired(daemon, cuda_stub, tmp_path):
    """Last in the module: it ends the shared daemon.  A trigger whose --after has not passed is written at
    Ctrl-C, with what came until then, and the daemon's last line counts the triggers suppressed."""
    w = Failing(cuda_stub, tmp_path / "w", "oom", "--before", "0.1", "--after", "0")
    try:
        log = w.run()
        assert daemon.stop() == 0, daemon.stderr()
        d = wait_dump(daemon, "oom", w.pid, timeout=1)
        t = json.loads((d / "manifest.json").read_text())["trigger"]
        assert t["call_ns"] == events_of(d, w.pid).filter(pl.col("api") == "cuMemAlloc_v2")["ts_ns"].min()
        assert events_of(d, w.pid)["grid_x"].drop_nulls().to_list() == list(range(1, len(log["before"]) + 1))
        # the second failing call of each workload of the module made no dump
        assert re.search(r"^stopped; \d+ dumps written, \d+ triggers suppressed \(--debounce\)$", daemon.stderr(),
                         re.M), daemon.stderr()
        assert w.end() == 0
    finally:
        w.kill()
