"""CUPTI's kernel records of CUDA graph launches (device format 1.2) merged
with a real capture of the stand-in graph workload (tests/fixtures/
graph_workload.cu) attached after its graphs were made: the host saw the
graph launches but not their kernels (graph@0x<exec>, unknown); the device
file, written by the device file writer with what CUPTI gives a graph launch
(one correlation id per launch, a graph id per graph, a node id per kernel),
makes every graph launch run its kernels, each joined exactly, while the
host's estimate stays unknown beside the device's count."""

from __future__ import annotations

import polars as pl
import pytest

from pasta_trace import merge
from pasta_trace.device.writer import RT, DeviceFileWriter, device_file_name
from pasta_trace.read import open_capture
from pasta_trace.schema import DeviceBackend
from pasta_trace.tools.kernels import kernel_summary
from test_graphs import INNER, PLAIN, SCALE, VECADD, _attached, graph_workload, stub_env  # noqa: F401 (fixtures)


def _kernels_of(rep: dict) -> dict[int, list[str]]:
    """exec -> the kernels one launch of it runs, in order, from what the workload did"""
    return {rep["exec"]["rt"]: [VECADD, SCALE] * rep["captured"][VECADD],
            rep["exec"]["ex"]: [INNER] * rep["nodes"][INNER] + [PLAIN] * rep["child"][PLAIN],
            rep["exec"]["drv"]: [SCALE] * rep["driver"][SCALE],
            rep["exec"]["dn"]: [VECADD] * rep["drv_nodes"][VECADD]}


@pytest.mark.live
def test_graph_made_before_the_attach_runs_the_kernels_cupti_recorded(require_bpf, graph_workload, stub_env, tracer,
                                                                      tmp_path):
    rep = _attached(graph_workload, stub_env, tracer, tmp_path)
    pid, runs = rep["pid"], _kernels_of(rep)
    cap_dir = tmp_path / "cap"
    launches = merge.graph_launches(open_capture(cap_dir)).filter(pl.col("pid") == pid).sort("ts_ns")
    assert launches.height == sum(rep["launches"].values())
    graph_ids = {x: i + 1 for i, x in enumerate(runs)}
    names: dict[str, int] = {}
    (cap_dir / "device").mkdir(exist_ok=True)
    with DeviceFileWriter(cap_dir / "device" / device_file_name(pid, DeviceBackend.cupti), pid=pid,
                          backend=DeviceBackend.cupti) as w:
        for corr, (ts, x) in enumerate(zip(launches["ts_ns"], launches["exec"]), start=100):
            for j, name in enumerate(runs[x]):
                if name not in names:
                    names[name] = len(names) + 1
                    w.string(names[name], name)
                w.record(RT.CUPTI_KERNEL, start=ts + 5000 + 100 * j, end=ts + 5050 + 100 * j, correlation_id=corr,
                         name_id=names[name], grid_x=1, grid_y=1, grid_z=1, block_x=32, block_y=1, block_z=1,
                         graph_id=graph_ids[x], graph_node_id=(graph_ids[x] << 32) + j + 1)
    cap = open_capture(cap_dir)
    assert cap.problems == []

    m = rep["launches"]
    expected = {VECADD: rep["captured"][VECADD] * m["rt"] + rep["drv_nodes"][VECADD] * m["dn"],
                SCALE: rep["captured"][SCALE] * m["rt"] + rep["driver"][SCALE] * m["drv"],
                INNER: rep["nodes"][INNER] * m["ex"], PLAIN: rep["child"][PLAIN] * m["ex"]}
    ex = merge.kernel_executions(cap).filter(pl.col("pid") == pid).collect()
    assert ex.group_by("name").agg(pl.len(), pl.col("via_graph").sum()).sort("name").rows() == sorted(
        (k, n, n) for k, n in expected.items())
    assert ex.filter(pl.col("match") != "exact").height == 0 and ex["gpu_start_ns"].null_count() == 0
    assert ex.group_by("graph_exec").len().sort("graph_exec").rows() == sorted(
        (x, len(runs[x]) * m[k]) for k, x in rep["exec"].items())
    summary = kernel_summary(cap).filter(pl.col("pid") == pid)
    assert summary.select("name", "launches", "via_graph").sort("name").rows() == sorted(
        (k, n, n) for k, n in expected.items())
    # the host's estimate: unknown (the graphs were made before the attach); the device's: what ran
    counts = merge.graph_launch_counts(cap).filter(pl.col("pid") == pid).sort("ts_ns")
    assert counts["host_kernels"].null_count() == counts.height
    assert counts["device_kernels"].to_list() == [len(runs[x]) for x in launches["exec"]]
