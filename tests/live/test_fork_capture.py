"""Cross-stream CUDA graph capture on the stand-in runtime and driver
(tests/fixtures/fork_capture_workload.cu): a stream that waits on an event
recorded on a capturing stream captures into the same graph until the
origin's end, its launches, copies and memsets are recorded, not run, and
every graph launch runs the kernels of both streams; a copy or memset made
under capture counts no bytes anywhere (summary, processes, transfers,
top's counts, --aggregate)."""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest

import build
from pasta_run import run_pasta
from pasta_trace import merge, schema
from pasta_trace.capture.session.top_counts import TopCounts
from pasta_trace.probes import catalog
from pasta_trace.read import open_capture

pytestmark = [pytest.mark.live, pytest.mark.usefixtures("require_bpf")]

VECADD, SCALE, PLAIN = "_Z6vecAddPKfS0_Pfi", "_Z5scaleIfEvPT_S0_i", "plain_c_kernel"
KIND, API = pl.col("kind").cast(pl.String), pl.col("api").cast(pl.String)


@pytest.fixture(scope="module")
def workload(build_dir):
    try:
        return build.graph_workload(build_dir, "fork_capture_workload")
    except build.Unavailable as e:
        pytest.skip(f"cannot build fork_capture_workload: {e}")


@pytest.fixture
def stub_env(cudart_stub, cuda_stub) -> dict[str, str]:
    return {"LD_LIBRARY_PATH": f"{cudart_stub.parent}:{cuda_stub.parent}"}


def _record(workload, stub_env, out, *flags: str):
    """(the workload's report, the tracer's stderr) of one launched run."""
    report = out.with_suffix(".json")
    r = run_pasta([*flags, "-o", str(out), "--", str(workload), "--report", str(report)], timeout=300,
                  env=stub_env)
    assert r.returncode == 0, r.stderr
    return json.loads(report.read_text()), r.stderr


def _top_counts(ev: pl.DataFrame) -> dict:
    """TopCounts (what `top` shows) of the capture's events, fed as the drain feeds it."""
    recs = np.zeros(ev.height, dtype=schema.HOST_EVENT.dtype)
    recs["pid"] = ev["pid"].to_numpy()
    recs["api"] = [catalog.API_ID[a] for a in ev["api"].cast(pl.String)]
    recs["kind"] = [int(schema.Kind[k]) for k in ev["kind"].cast(pl.String)]
    recs["ret"] = ev["ret"].fill_null(0).to_numpy()
    recs["flags"] = np.where(ev["ret"].is_null().to_numpy(), 0, schema.FLAG_HAS_RET)
    recs["size"] = ev["size"].fill_null(0).to_numpy()
    recs["valid"] = np.where(ev["size"].is_null().to_numpy(), 0, 1 << schema.PAYLOAD_BITS["size"])
    top = TopCounts(list(catalog.API_NAMES))
    top.add(recs)
    interval, _, _ = top.take()
    return interval.row(0, named=True)


def test_a_joined_stream_captures_into_its_origins_graph(workload, stub_env, tmp_path):
    rep, stderr = _record(workload, stub_env, tmp_path / "cap")
    pid, s, c, x = rep["pid"], rep["streams"], rep["counts"], rep["exec"]
    cap = open_capture(tmp_path / "cap")
    ev = cap.events.filter(pl.col("pid") == pid).sort("ts_ns").collect()
    begins = ev.filter(API.is_in(["cudaStreamBeginCapture", "cuStreamBeginCapture_v2"]) & (KIND == "graph"))
    rt_id, drv_id = begins["dst"].to_list()

    # recorded, not run: on the origin and on the streams joined to it, launches, copies and memsets alike,
    # each with its origin's capture id; a copy's destination is in ptr (a memset's place)
    captured = ev.filter(KIND == "captured").group_by(API, "stream", "dst").agg(pl.len(), pl.col("size").sum())
    assert captured.sort("api", "stream").rows() == sorted([
        ("__cudaLaunchKernel", s["s1"], rt_id, c["r1"], 0), ("__cudaLaunchKernel", s["s2"], rt_id, c["r2"], 0),
        ("cudaMemcpyAsync", s["s2"], rt_id, 1, c["copy"]), ("cudaMemsetAsync", s["s2"], rt_id, 1, c["set"]),
        ("cuLaunchKernel", s["s4"], drv_id, c["d"], 0), ("cuMemsetD8Async", s["s4"], drv_id, 1, c["dset"])])
    copy = ev.filter((KIND == "captured") & (API == "cudaMemcpyAsync"))
    memset = ev.filter((KIND == "captured") & (API == "cudaMemsetAsync"))
    assert copy["ptr"].to_list() == memset["ptr"].to_list() and copy["ptr"][0] != 0
    # run: before the capture, on a stream that waited on an event that left the capture, and after the end
    assert ev.filter(KIND == "launch").group_by(API, "stream").len().sort("stream").rows() == [
        ("__cudaLaunchKernel", s["s2"], c["warm"] + c["after"]), ("__cudaLaunchKernel", s["s5"], 1)]

    # the fork and join calls: under capture they carry its id, outside it (and on s5) none; never syncs
    order = ev.filter(API.is_in(["cudaEventRecord", "cudaEventRecordWithFlags", "cudaStreamWaitEvent",
                                 "cuEventRecord", "cuEventRecordWithFlags", "cuStreamWaitEvent"]))
    assert order.filter(KIND != "nested").select(API, "stream", "dst").rows() == [
        ("cudaEventRecord", s["s1"], None), ("cuEventRecord", s["s1"], None),  # the driver entry looked up
        ("cudaStreamWaitEvent", s["s2"], None), ("cuStreamWaitEvent", s["s2"], None),  # once, in the first
        ("cudaEventRecordWithFlags", s["s2"], None), ("cuEventRecordWithFlags", s["s2"], None),
        ("cudaStreamWaitEvent", s["s1"], None),
        ("cudaEventRecord", s["s1"], rt_id), ("cudaStreamWaitEvent", s["s2"], rt_id),
        ("cudaEventRecord", s["s1"], rt_id), ("cudaEventRecord", s["s5"], None), ("cudaStreamWaitEvent", s["s5"], None),
        ("cudaEventRecordWithFlags", s["s2"], rt_id), ("cudaStreamWaitEvent", s["s1"], rt_id),
        ("cuEventRecord", s["s3"], drv_id), ("cuStreamWaitEvent", s["s4"], drv_id),
        ("cuEventRecordWithFlags", s["s4"], drv_id), ("cuStreamWaitEvent", s["s3"], drv_id)]
    assert order.filter(KIND != "nested")["kind"].cast(pl.String).unique().to_list() == ["other"]
    assert ev.filter(KIND == "sync").height == 0

    # each graph launch runs the kernels captured on both streams; the copy and memset are no kernels
    counts = merge.graph_launch_counts(cap).filter(pl.col("pid") == pid)
    assert counts.select("exec", "host_kernels").rows() == [(x["rt"], c["r1"] + c["r2"])] * c["m"] + [
        (x["drv"], c["d"])] * c["md"]
    ex = merge.kernel_executions(cap).filter(pl.col("pid") == pid).collect()
    assert ex.group_by("name").agg(pl.len(), pl.col("via_graph").sum()).sort("name").rows() == sorted([
        (VECADD, c["warm"] + c["r1"] * c["m"], c["r1"] * c["m"]),
        (SCALE, c["r2"] * c["m"] + c["d"] * c["md"], c["r2"] * c["m"] + c["d"] * c["md"]),
        (PLAIN, c["after"] + 1, 0)])

    # bytes: only the copy made after the end, in the summary, the tools and top's counts
    assert f"copied: {c['after_copy']} B" in stderr
    r = run_pasta(["report", str(tmp_path / "cap"), "--json", "--tool", "processes", "--tool", "transfers"],
                  timeout=120)
    assert r.returncode == 0, r.stderr
    tools = json.loads(r.stdout)["tools"]
    proc = [p for p in tools["processes"]["rows"] if p["pid"] == pid]
    assert [(p["launches"], p["copy_bytes"]) for p in proc] == [(c["warm"] + c["after"] + 1, c["after_copy"])]
    assert [(t["direction"], t["copies"], t["bytes"]) for t in tools["transfers"]["rows"] if t["pid"] == pid] == [
        ("h2d", 1, c["after_copy"])]
    top = _top_counts(ev)
    assert (top["launches"], top["copies"], top["copy_bytes"]) == (c["warm"] + c["after"] + 1, 1, c["after_copy"])


def test_aggregate_counts_no_captured_bytes(workload, stub_env, tmp_path):
    """--aggregate: the captured calls are rows of kind captured, apart from
    the copies, memsets and launches that ran."""
    rep, stderr = _record(workload, stub_env, tmp_path / "cap", "--aggregate")
    pid, c = rep["pid"], rep["counts"]
    assert f"copied: {c['after_copy']} B" in stderr
    agg = open_capture(tmp_path / "cap").aggregate.filter(pl.col("pid") == pid).collect()
    per_kind = agg.filter(KIND.is_in(["launch", "memcpy", "memset", "captured"])).group_by(KIND).agg(
        pl.col("count").sum(), pl.col("bytes").sum()).sort("kind")
    assert per_kind.rows() == [
        ("captured", c["r1"] + c["r2"] + 1 + 1 + c["d"] + 1, c["copy"] + c["set"] + c["dset"]),
        ("launch", c["warm"] + c["after"] + 1, 0), ("memcpy", 1, c["after_copy"])]
