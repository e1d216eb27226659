"""The daemon's triggers on made-up batches of events (pasta_trace/daemon/triggers.py):
which failed returns fire what, once per process and kind a batch; debouncing;
exit statuses; the sequence numbers and comm_ids the NCCL watch keeps; exits of
processes with and without GPU calls; the trigger flags as the CLI parses them.
The live half, on real uprobes: tests/live/test_daemon_triggers.py."""

from __future__ import annotations

import os

import numpy as np
import pytest

from pasta_run import run_pasta
from pasta_trace import cli, schema
from pasta_trace.daemon.triggers import Debounce, ErrorScan, NcclWatch, Triggers, exit_firing
from pasta_trace.probes.catalog import API_ID
from pasta_trace.schema import FLAG_HAS_RET, Kind, PAYLOAD_BITS

S = 1_000_000_000


def batch(*rows: tuple) -> np.ndarray:
    """rows of (pid, tid, ts_ns, symbol, ret, has_ret)"""
    recs = np.zeros(len(rows), schema.HOST_EVENT.dtype)
    for r, (pid, tid, ts, symbol, ret, has_ret) in zip(recs, rows):
        r["pid"], r["tid"], r["ts_ns"], r["api"], r["ret"] = pid, tid, ts, API_ID[symbol], ret
        r["flags"] = FLAG_HAS_RET if has_ret else 0
    return recs


def fired(recs: np.ndarray) -> list[tuple]:
    return [(f.kind, f.pid, f.details["api"], f.details["error"], f.details["call_ns"], f.repeats)
            for f in ErrorScan().scan(recs)]


def test_each_family_s_out_of_memory_illegal_address_and_launch_failure_fire():
    recs = batch((1, 1, 50, "cudaMalloc", 2, True), (1, 1, 40, "cuMemAlloc_v2", 2, True),
                 (2, 3, 10, "hipMalloc", 2, True), (4, 4, 20, "cuLaunchKernel", 719, True),
                 (5, 5, 30, "cudaStreamSynchronize", 700, True), (6, 6, 60, "hipDeviceSynchronize", 719, True))
    # the first call of each (process, kind) in time order; the runtime's nested driver call is a repeat
    assert fired(recs) == [("oom", 2, "hipMalloc", "hipErrorOutOfMemory", 10, 0),
                           ("cuda_error", 4, "cuLaunchKernel", "CUDA_ERROR_LAUNCH_FAILED", 20, 0),
                           ("cuda_error", 5, "cudaStreamSynchronize", "cudaErrorIllegalAddress", 30, 0),
                           ("oom", 1, "cuMemAlloc_v2", "CUDA_ERROR_OUT_OF_MEMORY", 40, 1),
                           ("cuda_error", 6, "hipDeviceSynchronize", "hipErrorLaunchFailure", 60, 0)]


def test_what_does_not_fire():
    recs = batch((1, 1, 10, "cuMemcpyHtoD_v2", 2, True),  # 2 from a copy is not out of memory
                 (1, 1, 20, "cuMemAlloc_v2", 1, True),  # invalid value
                 (1, 1, 30, "cuMemAlloc_v2", 2, False),  # no return probe ran: ret means nothing
                 (1, 1, 40, "ncclAllReduce", 2, True),  # ncclSystemError, not a CUDA error
                 (1, 1, 50, "cuInit", 0, True))
    assert fired(recs) == []


def test_cuinit_failing_with_any_code_fires_once_with_its_repeats():
    recs = batch((7, 8, 10, "cuInit", 100, True), (7, 9, 20, "cuInit", 3, True), (7, 8, 30, "cuInit", 100, True))
    assert fired(recs) == [("init_failed", 7, "cuInit", "CUDA_ERROR_NO_DEVICE", 10, 2)]
    f = ErrorScan().scan(recs)[0]
    assert f.cause == "cuInit returned CUDA_ERROR_NO_DEVICE (100) in PID 7 (thread 8)"
    assert f.details == {"api": "cuInit", "error": "CUDA_ERROR_NO_DEVICE", "ret": 100, "tid": 8, "call_ns": 10}


def test_debounce_admits_one_per_kind_and_process_per_interval_and_counts_the_rest():
    d = Debounce(300 * S)
    assert d.admit("oom", 1, 0)
    assert not d.admit("oom", 1, 299 * S)
    assert d.admit("oom", 2, 1 * S) and d.admit("exit", 1, 1 * S)
    assert d.admit("oom", 1, 300 * S, repeats=4)  # admitted; its 4 repeats are counted
    assert d.suppressed == {"oom": 5}


def test_exit_statuses():
    assert exit_firing(10, 0) is None
    killed = exit_firing(10, 0x80 | 11)
    assert (killed.kind, killed.cause, killed.details) == (
        "killed", "PID 10 killed by SIGSEGV (core dumped)", {"signal": 11, "signal_name": "SIGSEGV",
                                                             "core_dumped": True})
    ended = exit_firing(10, 3 << 8)
    assert (ended.kind, ended.cause, ended.details) == ("exit", "PID 10 exited with status 3", {"exit_status": 3})


def nccl_batch(*rows: tuple) -> np.ndarray:
    """rows of (pid, ts_ns, symbol, ret, communicator, comm_id or None)"""
    recs = np.zeros(len(rows), schema.HOST_EVENT.dtype)
    slots = schema.NCCL_SLOTS
    for r, (pid, ts, symbol, ret, comm, comm_id) in zip(recs, rows):
        r["pid"], r["tid"], r["ts_ns"], r["api"], r["ret"], r["flags"] = pid, pid, ts, API_ID[symbol], ret, FLAG_HAS_RET
        r["kind"] = Kind.comm if symbol.startswith("ncclComm") else Kind.collective
        r[slots["communicator"]] = comm
        r["valid"] = 1 << PAYLOAD_BITS["communicator"]
        if comm_id is not None:
            r[slots["comm_id"]] = comm_id
            r["valid"] |= 1 << PAYLOAD_BITS["comm_id"]
    return recs


def test_the_nccl_watch_numbers_collectives_per_communicator_as_a_capture_does():
    w = NcclWatch(-1, 60 * S)  # no map read here: note() only
    w.note(nccl_batch((1, 10, "ncclAllReduce", 0, 0xA, None),  # before the creation the watch saw: not counted
                      (1, 20, "ncclCommInitRank", 0, 0xA, 77), (1, 30, "ncclAllReduce", 0, 0xA, None),
                      (1, 40, "ncclAllReduce", 3, 0xA, None),  # failed: took no part
                      (2, 25, "ncclCommInitRank", 0, 0xB, 77)))
    w.note(nccl_batch((1, 50, "ncclBroadcast", 0, 0xA, None), (2, 60, "ncclAllReduce", 0, 0xB, None)))
    assert w.pids == {1, 2}
    assert w._done == {(1, 0xA): 2, (2, 0xB): 1}
    assert w._comm_ids == {(1, 0xA): 77, (2, 0xB): 77}
    w.note(nccl_batch((1, 70, "ncclCommInitRank", 0, 0xA, 88)))  # the handle made again: numbered from 0
    assert (w._done[(1, 0xA)], w._comm_ids[(1, 0xA)]) == (0, 88)
    w.gone(1)
    assert w.pids == {2} and list(w._done) == [(2, 0xB)]


def test_an_exit_fires_only_for_a_process_with_gpu_calls_and_after_the_next_drain():
    t = Triggers(-1, hang_after_s=None, quiet_after_s=None)
    t.note(batch((5, 5, 10, "cuLaunchKernel", 0, True)))
    t.exited(5, 9)
    t.exited(6, 9)  # no GPU call seen
    found = t.poll(1 * S)
    assert [(f.kind, f.pid) for f in found] == [("killed", 5)]
    assert t.poll(2 * S) == []


@pytest.mark.parametrize("argv, want", [
    ([], (60.0, None, 300.0, 5.0)),
    (["--hang-after", "0", "--quiet-after", "30", "--debounce", "10", "--after", "0"], (None, 30.0, 10.0, 0.0)),
    (["--hang-after", "off", "--quiet-after", "off"], (None, None, 300.0, 5.0)),
])
def test_the_trigger_flags(argv, want):
    a = cli.build_parser().parse_args(["daemon", "-o", "d", *argv])
    assert (a.hang_after, a.quiet_after, a.debounce, a.after) == want


def test_quiet_after_must_be_less_than_the_window(tmp_path):
    r = run_pasta(["daemon", "-o", str(tmp_path / "d"), "--window", "30", "--quiet-after", "30"])
    assert r.returncode == 2
    assert r.stderr.strip() == ("pasta-trace: error: --quiet-after 30 is not less than --window 30 (a quiet "
                                "process's last calls must still be in the window: raise --window)")
    assert not (tmp_path / "d").exists()


def test_the_quiet_watch_keeps_each_process_s_newest_call_of_interleaved_runs():
    t = Triggers(-1, hang_after_s=None, quiet_after_s=5)
    rows = [(1, 1, 30, "cuLaunchKernel", 0, True), (1, 1, 10, "cuLaunchKernel", 0, True),
            (2, 2, 50, "cuLaunchKernel", 0, True), (1, 1, 20, "cuLaunchKernel", 0, True),
            (2, 2, 40, "cuLaunchKernel", 0, True)]
    t.note(batch(*rows))
    assert t._quiet._last == {1: 30, 2: 50}
    t.note(batch((1, 1, 25, "cuLaunchKernel", 0, True)))  # an older call drained later changes nothing
    assert t._quiet._last == {1: 30, 2: 50}


def test_fire_counts_every_trigger_in_the_metrics_and_plans_one_dump_per_interval(tmp_path):
    from pasta_trace.daemon.metrics import Metrics
    from pasta_trace.daemon.service import Daemon, DaemonOptions
    from pasta_trace.daemon.triggers import Firing
    from pasta_trace.probes.catalog import API_NAMES

    said: list[str] = []
    d = Daemon(DaemonOptions(out_dir=tmp_path, window_s=60, window_bytes=1 << 30, socket=tmp_path / "s",
                             socket_group=None, keep=None, keep_bytes=None, buffer_pages=64, command_line=[],
                             verbose=True, after_s=5.0), say=said.append)
    d.metrics = Metrics(list(API_NAMES))
    me = os.getpid()  # a real process: the metrics read its /proc
    for _ in range(2):
        d._fire(Firing("oom", me, "cuMemAlloc_v2 returned CUDA_ERROR_OUT_OF_MEMORY (2)", repeats=1))
    d.metrics.update({})
    t = d.metrics.published.totals
    rows = t.filter((t["metric"] == "triggers") & (t["pid"] == me))
    assert dict(zip(rows["a"].to_list(), rows["value"].to_list())) == {"oom": 2}
    assert [f.kind for _, f, _ in d._pending] == ["oom"]  # one dump planned, 5 s on
    assert d._debounce.suppressed == {"oom": 3}  # both repeats and the second firing
    assert said == [
        "trigger oom suppressed 1 time (one dump per 300 s per process; 1 so far): cuMemAlloc_v2 returned "
        "CUDA_ERROR_OUT_OF_MEMORY (2)",
        "trigger oom: cuMemAlloc_v2 returned CUDA_ERROR_OUT_OF_MEMORY (2); dumping in 5 s",
        "trigger oom suppressed 2 times (one dump per 300 s per process; 3 so far): cuMemAlloc_v2 returned "
        "CUDA_ERROR_OUT_OF_MEMORY (2)"]


def test_the_nccl_watch_reads_a_process_s_threads_over_several_checks_within_its_budget(monkeypatch):
    """Every thread of this process (real pidfds; a map fd of -1: no call in flight found), one a check
    with no budget: the round ends once each was read, and a new one starts."""
    import threading

    stop = threading.Event()
    threads = [threading.Thread(target=stop.wait) for _ in range(3)]
    for t in threads:
        t.start()
    try:
        w = NcclWatch(-1, 60 * S)
        monkeypatch.setattr(NcclWatch, "BUDGET_S", 0.0)
        w.pids = {os.getpid()}
        n = len(os.listdir("/proc/self/task"))
        checks = 0
        while True:
            assert w.check(0) == []
            checks += 1
            if not w.busy:
                break
        assert checks == n >= 4
        w.check(0)
        assert w.busy  # the next round
    finally:
        stop.set()
        for t in threads:
            t.join()


def test_a_trigger_left_out_of_triggers_is_counted_and_never_dumped(tmp_path):
    from pasta_trace.daemon.metrics import Metrics
    from pasta_trace.daemon.service import Daemon, DaemonOptions
    from pasta_trace.daemon.triggers import Firing
    from pasta_trace.probes.catalog import API_NAMES

    said: list[str] = []
    d = Daemon(DaemonOptions(out_dir=tmp_path, window_s=60, window_bytes=1 << 30, socket=tmp_path / "s",
                             socket_group=None, keep=None, keep_bytes=None, buffer_pages=64, command_line=[],
                             verbose=True, after_s=5.0, triggers=frozenset({"oom"})), say=said.append)
    d.metrics = Metrics(list(API_NAMES))
    me = os.getpid()
    d._fire(Firing("exit", me, "exited with status 1"))
    d._fire(Firing("oom", me, "cuMemAlloc_v2 returned CUDA_ERROR_OUT_OF_MEMORY (2)"))
    d.metrics.update({})
    t = d.metrics.published.totals
    rows = t.filter((t["metric"] == "triggers") & (t["pid"] == me))
    assert dict(zip(rows["a"].to_list(), rows["value"].to_list())) == {"exit": 1, "oom": 1}
    assert [f.kind for _, f, _ in d._pending] == ["oom"]
    assert d._debounce.suppressed == {}
    assert said[0] == "trigger exit (not in --triggers: no dump): exited with status 1"


def test_the_triggers_option_takes_all_none_or_kinds():
    from pasta_trace.cli import build_parser
    from pasta_trace.daemon.triggers import KINDS

    parse = build_parser().parse_args
    assert parse(["daemon", "-o", "d"]).triggers == frozenset(KINDS)
    assert parse(["daemon", "-o", "d", "--triggers", "none"]).triggers == frozenset()
    assert parse(["daemon", "-o", "d", "--triggers", "oom, nccl_hang"]).triggers == {"oom", "nccl_hang"}
    from pasta_trace.errors import UsageError

    with pytest.raises(UsageError) as e:  # exit 2, one line (cli.main prints it)
        parse(["daemon", "-o", "d", "--triggers", "oom,segfault"])
    assert "segfault: not a trigger (all, none, or some of oom,cuda_error," in str(e.value)
