"""NCCL: NVIDIA's real libnccl.so.2 (PyPI nvidia-nccl-cu13, cached by
scripts/fetch_nccl.sh, never installed) called without a GPU, launched and
attached mid-run, every call with its exact arguments and return code; and a
stub libnccl.so.2 (tests/fixtures/nccl_stub.c, nccl.h's signatures) for what
the real one cannot do here: four ranks (processes) on one communicator, one a
straggler by a known delay, one that never enters the last collective.

One tracer run (launch mode) records both programs; two more attach to a
waiting one (-p, and -a: the three modes)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import polars as pl
import pytest

from pasta_run import run_pasta
from pasta_trace import schema
from pasta_trace.read import Capture, open_capture
from pasta_trace.tools import REGISTRY

pytestmark = pytest.mark.live

RANKS, ITERS, STRAGGLER, LATE_AT, DELAY_MS, HANG = 4, 5, 2, 2, 300, 1
#: the calls nccl_calls prints that the probes see under another name
SEEN_AS = {"ncclBcast": "ncclBroadcast"}  # a wrapper that calls ncclBroadcast(buff, buff, ...)


@pytest.fixture(scope="module")
def nccl_programs(build_dir: Path) -> dict[str, Path]:
    import build

    try:
        return {"stub": build.nccl_stub(build_dir), "calls": build.nccl_calls(build_dir),
                "ranks": build.nccl_ranks(build_dir)}
    except build.Unavailable as e:
        pytest.skip(f"cannot build the NCCL fixtures: {e}")


@pytest.fixture(scope="module")
def launched(_bpf_status, real_libnccl, nccl_programs, tmp_path_factory) -> tuple[Capture, dict, dict]:
    if _bpf_status:
        pytest.skip(_bpf_status)
    d = tmp_path_factory.mktemp("nccl")
    p = nccl_programs
    script = (f"{p['calls']} {real_libnccl.lib} > {d}/calls.json && "
              f"{p['ranks']} {p['stub']} --ranks {RANKS} --iters {ITERS} --straggler {STRAGGLER} "
              f"--late-at {LATE_AT} --delay-ms {DELAY_MS} --hang {HANG} > {d}/ranks.json")
    r = run_pasta(["-o", str(d / "cap"), "--", "sh", "-c", script], timeout=300)
    assert r.returncode == 0, r.stderr
    return (open_capture(d / "cap"), json.loads((d / "calls.json").read_text()),
            json.loads((d / "ranks.json").read_text()))


def expected(printed: dict) -> list[tuple]:
    """(api, ret, layer, count, datatype, op, root, peer, stream, nranks, rank, aux, comm_id) of each printed call."""
    uid = schema.nccl_comm_id(bytes.fromhex(printed["unique_id"]))
    out = []
    for c in printed["calls"]:
        coll = "count" in c
        out.append((
            SEEN_AS.get(c["api"], c["api"]), c["ret"], "nccl", c.get("count"),
            schema.NCCL_DATATYPE_NAMES[c["datatype"]] if coll else None,
            schema.NCCL_OP_NAMES[c["op"]] if "op" in c else None, c.get("root"), c.get("peer"), c.get("stream"),
            c.get("nranks"), c.get("rank"), c.get("version"),
            uid if c["api"] in ("ncclGetUniqueId", "ncclCommInitRank") else None,
        ))
    return out


def captured(cap: Capture, pid: int) -> list[tuple]:
    cols = ["api", "ret", "layer", "count", "datatype", "op", "root", "peer", "stream", "nranks", "rank", "aux",
            "comm_id"]
    return cap.events.filter(pl.col("pid") == pid).sort("ts_ns").select(
        pl.col(c).cast(pl.String) if c in ("api", "layer", "datatype", "op") else pl.col(c) for c in cols
    ).collect().rows()


def check_real_calls(cap: Capture, printed: dict, real_libnccl) -> None:
    want = expected(printed)
    calls = {c["api"]: c for c in printed["calls"]}
    # what the library does without a GPU (reference/context-attribution.md, section 4)
    assert calls["ncclGetVersion"]["version"] == real_libnccl.version_code
    assert (calls["ncclGetUniqueId"]["ret"], calls["ncclCommInitRank"]["ret"], calls["ncclGroupStart"]["ret"]) == (
        0, 1, 0)
    assert {c["ret"] for c in printed["calls"] if "count" in c} == {4}  # NULL communicator: ncclInvalidArgument
    pids = cap.events.filter(pl.col("api").cast(pl.String) == "ncclGetVersion").select("pid").collect()
    assert pids.height == 1
    assert captured(cap, pids.item()) == want
    # CommInitRank failed: no communicator was made
    assert cap.communicators.filter(pl.col("pid") == pids.item()).collect().height == 0
    lib = [e for e in cap.manifest["libraries"] if e["inode"] == real_libnccl.lib.stat().st_ino]
    assert len(lib) == 1 and (lib[0]["family"], len(lib[0]["symbols_attached"]), lib[0]["symbols_missing"]) == (
        "nccl", 21, [])


def test_real_libnccl_launched(launched, real_libnccl) -> None:
    cap, printed, _ = launched
    check_real_calls(cap, printed, real_libnccl)


@pytest.mark.parametrize("mode", ["-p", pytest.param("-a", marks=pytest.mark.machine_wide)])
def test_real_libnccl_attached_mid_run(require_bpf, real_libnccl, nccl_programs, tracer, tmp_path, mode) -> None:
    """-p PID, and -a (system-wide: the library is found by the scan of every process)."""
    prog = subprocess.Popen([str(nccl_programs["calls"]), str(real_libnccl.lib), "--wait"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert prog.stdout.readline() == "ready\n"  # libnccl.so.2 is loaded and initialised
        t = tracer(["-o", str(tmp_path / "cap"), *(["-p", str(prog.pid)] if mode == "-p" else ["-a"])])
        t.wait_ready(timeout=180)
        out, _ = prog.communicate("go\n", timeout=60)
        assert prog.returncode == 0
        assert t.stop() == 0, t.stderr()
    finally:
        prog.kill()
    check_real_calls(open_capture(tmp_path / "cap"), json.loads(out), real_libnccl)


def test_stub_ranks_communicator_and_sequence(launched) -> None:
    cap, _, ranks = launched
    comm_id = schema.nccl_comm_id(bytes.fromhex(ranks["unique_id"]))
    comms = cap.communicators.sort("rank").collect()
    assert comms.select("pid", "comm_id", "rank", "nranks", "api").rows() == [
        (pid, comm_id, r, RANKS, "ncclCommInitRank") for r, pid in enumerate(ranks["pids"])]
    assert comms["end_ts_ns"].is_null().to_list() == [r == HANG for r in range(RANKS)]
    seqs = cap.events.filter((pl.col("kind") == "collective") & pl.col("pid").is_in(ranks["pids"])).group_by("pid").agg(
        pl.col("seq").sort_by("ts_ns"), pl.col("count").unique(), pl.col("size").unique()).collect()
    got = dict((pid, (s, c, z)) for pid, s, c, z in seqs.iter_rows())
    assert got == {pid: (list(range(ITERS - (r == HANG))), [1024], [4096]) for r, pid in enumerate(ranks["pids"])}


def test_stub_ranks_stragglers_and_hangs(launched) -> None:
    cap, _, ranks = launched
    comm_id = schema.nccl_comm_id(bytes.fromhex(ranks["unique_id"]))
    late = REGISTRY["stragglers"].compute(cap)
    assert late.select("comm_id", "seq", "ranks").rows() == [
        (comm_id, s, RANKS - (s == ITERS - 1)) for s in range(ITERS)]
    worst = late.sort("late_ns", descending=True).row(0, named=True)
    assert (worst["seq"], worst["last_rank"], worst["last_pid"]) == (LATE_AT, STRAGGLER, ranks["pids"][STRAGGLER])
    # the delay, give or take the scheduling noise of a busy 2-CPU machine: the straggler sleeps from its
    # barrier exit, but the rank before it may be woken from the same barrier some ms late (CI saw 296 ms)
    assert (DELAY_MS - 100) * 10**6 <= worst["late_ns"] < (DELAY_MS + 100) * 10**6
    assert late.filter(pl.col("seq") != LATE_AT)["late_ns"].max() < DELAY_MS * 10**6 // 3
    top = REGISTRY["straggler_ranks"].compute(cap).row(0, named=True)
    assert (top["rank"], top["worst_seq"], top["max_late_ns"]) == (STRAGGLER, LATE_AT, worst["late_ns"])
    hung = REGISTRY["hangs"].compute(cap)
    assert hung.select("comm_id", "seq", "api", "nranks", "entered", "missing", "missing_ranks",
                       "missing_pids").rows() == [
        (comm_id, ITERS - 1, "ncclAllReduce", RANKS, RANKS - 1, 1, str(HANG), str(ranks["pids"][HANG]))]
