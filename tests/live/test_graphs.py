"""CUDA graphs on the stand-in runtime and driver (tests/fixtures/
graph_workload.cu): launches on a stream under capture are recorded, not run
(kind captured); each graph launch runs the kernels of its graph, counted per
launch in every tool; a graph made before an attach is said unknown, with
the reason, never guessed."""

from __future__ import annotations

import csv
import json
import os
import subprocess

import build
import polars as pl
import pytest

from pasta_run import run_pasta, wait_for_file
from pasta_trace import merge
from pasta_trace.export import trace_model
from pasta_trace.merge.graphs import PARTIAL_REASON, UNKNOWN_REASON
from pasta_trace.read import open_capture
from pasta_trace.tools.kernels import kernel_summary

VECADD, SCALE, PLAIN, INNER = "_Z6vecAddPKfS0_Pfi", "_Z5scaleIfEvPT_S0_i", "plain_c_kernel", "_ZN2ns5innerEPd"


@pytest.fixture(scope="session")
def graph_workload(build_dir):
    try:
        return build.graph_workload(build_dir)
    except build.Unavailable as e:
        pytest.skip(f"cannot build graph_workload: {e}")


@pytest.fixture
def stub_env(cudart_stub, cuda_stub) -> dict[str, str]:
    return {"LD_LIBRARY_PATH": f"{cudart_stub.parent}:{cuda_stub.parent}"}


def _expected(report: dict) -> dict[str, tuple[int, int]]:
    """kernel -> (launches, of them via a graph), from what the program did"""
    m = report["launches"]
    graph = {VECADD: report["captured"][VECADD] * m["rt"] + report["drv_nodes"][VECADD] * m["dn"],
             SCALE: report["captured"][SCALE] * m["rt"] + report["driver"][SCALE] * m["drv"],
             INNER: report["nodes"][INNER] * m["ex"], PLAIN: report["child"][PLAIN] * m["ex"]}
    return {k: (graph[k] + report["plain"].get(k, 0), graph[k]) for k in graph}


@pytest.mark.live
def test_captured_launches_run_in_their_graph_launches(require_bpf, graph_workload, stub_env, tmp_path):
    report_path, cap_dir = tmp_path / "report.json", tmp_path / "cap"
    r = run_pasta(["-o", str(cap_dir), "--", str(graph_workload), "--report", str(report_path)], timeout=300,
                  env=stub_env)
    assert r.returncode == 0, r.stderr
    report = json.loads(report_path.read_text())
    pid, m = report["pid"], report["launches"]
    cap = open_capture(cap_dir)
    ev = cap.events.filter(pl.col("pid") == pid).sort("ts_ns").collect()
    kind, api = pl.col("kind").cast(pl.String), pl.col("api").cast(pl.String)

    # captured: every launch made under capture, each with the id of its capture's begin and end
    captured = ev.filter(kind == "captured")
    assert captured.group_by(api).len().sort("api").rows() == [
        ("__cudaLaunchKernel", sum(report["captured"].values())),
        ("cuGraphAddKernelNode_v2", report["drv_nodes"][VECADD]), ("cuLaunchKernel", report["driver"][SCALE]),
        ("cudaGraphAddKernelNode", report["nodes"][INNER] + report["child"][PLAIN])]
    begins = ev.filter(api.is_in(["cudaStreamBeginCapture", "cuStreamBeginCapture_v2"]) & (kind == "graph"))
    ends = ev.filter(api.is_in(["cudaStreamEndCapture", "cuStreamEndCapture"]) & (kind == "graph"))
    assert begins["dst"].to_list() == ends["dst"].to_list() == begins["ts_ns"].cast(pl.UInt64).to_list()
    by_stream = captured.filter(~api.is_in(["cudaGraphAddKernelNode", "cuGraphAddKernelNode_v2"])).group_by(
        "stream", "dst").len().sort("len")
    assert by_stream.rows() == [(s, d, n) for s, d, n in zip(
        begins["stream"].to_list()[::-1], begins["dst"].to_list()[::-1],
        [report["driver"][SCALE], sum(report["captured"].values())])]
    # the launches made on another stream meanwhile ran: launches, the only ones
    assert ev.filter(kind == "launch").group_by(api).len().rows() == [
        ("__cudaLaunchKernel", report["plain"][PLAIN])]

    # each graph launch carries its exec; the instantiations map the execs to the graphs the ends made
    launches = merge.graph_launches(cap).filter(pl.col("pid") == pid)
    assert launches.group_by("exec").len().sort("exec").rows() == sorted(
        (report["exec"][k], m[k]) for k in ("rt", "ex", "drv", "dn"))
    assert launches["inst_ts"].null_count() == 0

    # the kernels the graph launches ran, one row per kernel per graph launch, named
    ex = merge.kernel_executions(cap).filter(pl.col("pid") == pid).collect()
    expected = _expected(report)
    got = ex.group_by("name").agg(pl.len(), pl.col("via_graph").sum()).sort("name").rows()
    assert got == sorted((k, n, g) for k, (n, g) in expected.items())
    via = ex.filter(pl.col("via_graph"))
    assert via.group_by("graph_exec").len().sort("graph_exec").rows() == sorted([
        (report["exec"]["rt"], m["rt"] * sum(report["captured"].values())),
        (report["exec"]["ex"], m["ex"] * (report["nodes"][INNER] + report["child"][PLAIN])),
        (report["exec"]["drv"], m["drv"] * report["driver"][SCALE]),
        (report["exec"]["dn"], m["dn"] * report["drv_nodes"][VECADD])])
    # the driver's node named its kernel by CUkernel (func null): that handle, with the node's shape
    dn = via.filter(pl.col("graph_exec") == report["exec"]["dn"])
    assert dn.select("name", "grid_x", "block_x").unique().rows() == [(VECADD, 7, 128)]
    assert via["dur_ns"].null_count() == via.height  # the graph launch's API time is not split over its kernels
    assert ex.filter(pl.col("name").str.starts_with("unknown@")).height == 0
    assert ex["launch_seq"].to_list() == list(range(ex.height))

    # the kernel tool and the csv export count the same
    summary = kernel_summary(cap).filter(pl.col("pid") == pid)
    assert summary.select("name", "launches", "via_graph").sort("name").rows() == sorted(
        (k, n, g) for k, (n, g) in expected.items())
    out = tmp_path / "csv"
    r = run_pasta(["export", str(cap_dir), "--format", "csv", "-o", str(out)], timeout=120)
    assert r.returncode == 0, r.stderr
    with open(out / "kernels.csv") as f:
        rows = sorted((row["name"], int(row["launches"]), int(row["via_graph"])) for row in csv.DictReader(f)
                      if int(row["pid"]) == pid)
    assert rows == sorted((k, n, g) for k, (n, g) in expected.items())
    # the exports' timeline draws each on its stream
    kernels = trace_model.build(cap).kernels.filter(pl.col("pid") == pid)
    assert kernels.group_by("name").len().sort("name").rows() == sorted((k, n) for k, (n, _) in expected.items())


def _attached(graph_workload, stub_env, tracer, tmp_path, *flags: str) -> dict:
    """Run the workload, attach with -p when it says ready, let it go on; its report."""
    report, go = tmp_path / "report.json", tmp_path / "go"
    proc = subprocess.Popen([str(graph_workload), "--report", str(report), "--go-file", str(go), *flags],
                            env={**os.environ, **stub_env})
    try:
        wait_for_file(report.with_name(report.name + ".ready"), timeout=60, proc=proc)
        t = tracer(["-o", str(tmp_path / "cap"), "-p", str(proc.pid)])
        t.wait_ready(timeout=180)
        go.touch()
        assert proc.wait(timeout=60) == 0
        assert t.finish(timeout=180) == 0, t.stderr()
    finally:
        go.touch()
        if proc.poll() is None:
            proc.kill()
    return json.loads(report.read_text())


@pytest.mark.live
def test_graph_made_before_the_attach_is_said_unknown(require_bpf, graph_workload, stub_env, tracer, tmp_path):
    """Captured, built and instantiated before the attach: the graph launches
    are seen with their execs, their kernels unknown with the reason."""
    rep = _attached(graph_workload, stub_env, tracer, tmp_path)
    m, pid = rep["launches"], rep["pid"]
    cap = open_capture(tmp_path / "cap")
    ev = cap.events.filter(pl.col("pid") == pid).collect()
    assert ev.filter(pl.col("kind").cast(pl.String) == "captured").height == 0
    launches = merge.graph_launches(cap).filter(pl.col("pid") == pid)
    assert launches.group_by("exec").len().sort("exec").rows() == sorted(
        (rep["exec"][k], m[k]) for k in ("rt", "ex", "drv", "dn"))
    assert launches["inst_ts"].null_count() == launches.height
    summary = kernel_summary(cap).filter(pl.col("pid") == pid)
    assert summary.select("name", "launches", "via_graph", "name_reason").sort("name").rows() == sorted(
        (f"graph@0x{rep['exec'][k]:x}", m[k], m[k], UNKNOWN_REASON) for k in ("rt", "ex", "drv", "dn"))


@pytest.mark.live
def test_attach_during_a_capture(require_bpf, graph_workload, stub_env, tracer, tmp_path):
    """Attached after the runtime capture began: its launches are seen as
    launches, yet none counts as run, and its graph's kernels are unknown
    with the reason; the graphs made after the attach are counted exactly."""
    rep = _attached(graph_workload, stub_env, tracer, tmp_path, "--go-in-capture")
    m, pid = rep["launches"], rep["pid"]
    cap = open_capture(tmp_path / "cap")
    kind = pl.col("kind").cast(pl.String)
    ev = cap.events.filter(pl.col("pid") == pid).collect()
    # the probes saw no begin: the launches on the capturing stream are kind launch, the end has no capture id
    assert ev.filter(kind == "launch").height == sum(rep["captured"].values()) + rep["plain"][PLAIN]
    ends = ev.filter((pl.col("api").cast(pl.String) == "cudaStreamEndCapture") & (kind == "graph"))
    assert (ends.height, ends["dst"].null_count()) == (1, 1)
    ex = merge.kernel_executions(cap).filter(pl.col("pid") == pid).collect()
    got = ex.group_by("name").agg(pl.len(), pl.col("via_graph").sum()).sort("name").rows()
    assert got == sorted([
        (f"graph@0x{rep['exec']['rt']:x}", m["rt"], m["rt"]),
        (PLAIN, rep["plain"][PLAIN] + rep["child"][PLAIN] * m["ex"], rep["child"][PLAIN] * m["ex"]),
        (INNER, rep["nodes"][INNER] * m["ex"], rep["nodes"][INNER] * m["ex"]),
        (SCALE, rep["driver"][SCALE] * m["drv"], rep["driver"][SCALE] * m["drv"]),
        (VECADD, rep["drv_nodes"][VECADD] * m["dn"], rep["drv_nodes"][VECADD] * m["dn"])])
    summary = kernel_summary(cap).filter(pl.col("name").str.starts_with("graph@"))
    assert summary.select("name", "name_reason").rows() == [(f"graph@0x{rep['exec']['rt']:x}", PARTIAL_REASON)]
