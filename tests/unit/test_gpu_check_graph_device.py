"""scripts/gpu_check's row of a graph-launched kernel against CUPTI's graph
node records: vecadd_graph (gpu_tests/vecadd_graph.cu) builds, and its rows
pass exact counts and fail one off.  The row itself needs a GPU."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from test_gpu_check import gpu_check_module

ROOT = Path(__file__).resolve().parents[2]


def test_rows_pass_exact_counts_and_fail_one_off() -> None:
    g = gpu_check_module()
    n, m = g.GRAPH_DEVICE_NODES, g.GRAPH_DEVICE_LAUNCHES
    got = {"device_graph_kernels": n * m, "correlation_ids": m, "joined": n * m, "direct": 0,
           "device_counts": [n] * m, "host_counts": [n] * m}
    rows = g.graph_device_rows(got, n, m)
    assert [(what, e, v) for what, e, v in rows if str(e) != str(v)] == []
    assert [what for what, _, _ in rows] == [
        "[graph cupti] CUPTI vecadd records with a graph id",
        "[graph cupti] their correlation ids (one per graph launch)",
        "[graph cupti] of them joined exactly to a host graph launch",
        "[graph cupti] device kernels per host graph launch", "[graph cupti] host's estimate per graph launch",
        "[graph cupti] vecadd run outside a graph"]
    # a record not joined, a launch whose graph the host did not see: each fails its row
    bad = g.graph_device_rows({**got, "joined": n * m - 1, "host_counts": [None] + [n] * (m - 1)}, n, m)
    assert [what for what, e, v in bad if str(e) != str(v)] == [
        "[graph cupti] of them joined exactly to a host graph launch", "[graph cupti] host's estimate per graph launch"]
    assert all(v == "?" for _, _, v in g.graph_device_rows({}, n, m))


def test_the_row_is_a_gpu_step_run_under_record_device_cupti(tmp_path: Path) -> None:
    g = gpu_check_module()
    assert g.GRAPH_DEVICE in g.GPU_STEPS
    build, record = g.graph_device_cmds("nvcc", "python3", tmp_path)
    assert build[2] == str(ROOT / "gpu_probes/gpu_tests/vecadd_graph.cu") and Path(build[2]).is_file()
    assert record[3:6] == ["record", "--device", "cupti"]
    assert record[-3:] == [str(tmp_path / "vecadd_graph"), str(g.GRAPH_DEVICE_NODES), str(g.GRAPH_DEVICE_LAUNCHES)]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_vecadd_graph_builds_and_names_vecadd_as_the_rows_expect(tmp_path: Path) -> None:
    g = gpu_check_module()
    build, _ = g.graph_device_cmds(shutil.which("nvcc"), "python3", tmp_path)
    r = subprocess.run(build, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    syms = subprocess.run(["nm", str(tmp_path / "vecadd_graph")], capture_output=True, text=True).stdout
    assert g.VECADD in syms  # the host stub, named as the fatbin names the kernel
