"""scripts/gpu_check's CUDA graph row: the host's counts of the graph program
against what it did and against CUPTI's kernel records of the graph's nodes
(one correlation id per graph launch); exact, and a count one off fails."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from test_gpu_check import gpu_check_module


def _cupti(corr: int, name: str) -> dict:
    return {"name": name, "correlation_id": corr, "start": corr * 100, "end": corr * 100 + 5, "grid_x": 256,
            "block_x": 256}


def test_graph_rows_pass_exact_counts_and_fail_one_off() -> None:
    g = gpu_check_module()
    nodes, launches = g.GRAPH_NODES, g.GRAPH_LAUNCHES
    host = {"captured": nodes, "graph_launches": launches, "via_graph": nodes * launches, "direct": 0}
    # each graph launch's node records share the cudaGraphLaunch's correlation id; another kernel's records
    # (the program's own memset, say) are not counted
    cupti = [_cupti(10 + i, g.GRAPHK) for i in range(launches) for _ in range(nodes)] + [_cupti(3, "other")]
    rows = g.graph_rows(host, cupti, nodes, launches)
    assert [(what, e, m) for what, e, m in rows if e != m] == []
    assert [what for what, _, _ in rows] == [
        "[graph] host: captured launches (not run)", "[graph] host: graph launches with their exec",
        "[graph] host: graphk run by graph launches", "[graph] host: graphk run outside a graph",
        "[graph] CUPTI: graphk kernel records (graph nodes)",
        "[graph] CUPTI: their correlation ids (one per graph launch)"]
    # a captured launch counted as run, a record lost, a host without counts: each fails its row
    bad = g.graph_rows({**host, "direct": nodes}, cupti[1:], nodes, launches)
    assert [what for what, e, m in bad if e != m] == [
        "[graph] host: graphk run outside a graph", "[graph] CUPTI: graphk kernel records (graph nodes)"]
    assert all(m == "?" for what, _, m in g.graph_rows({}, cupti, nodes, launches) if "host" in what)


def test_graph_program_source_has_the_counts_the_rows_expect(tmp_path: Path) -> None:
    g = gpu_check_module()
    source = (g.PROGRAMS / "graph.cu").read_text()
    assert "__global__ void graphk(float *x, int n)" in source  # mangled as GRAPHK
    assert g.GRAPHK == "_Z6graphkPfi"
    assert "i < NODES;" in source and "i < LAUNCHES;" in source
    cmd = g.graph_build_cmd("nvcc", tmp_path / "graph")
    assert cmd == ["nvcc", f"-DNODES={g.GRAPH_NODES}", f"-DLAUNCHES={g.GRAPH_LAUNCHES}", str(g.PROGRAMS / "graph.cu"),
                   "-o", str(tmp_path / "graph")]
    nvcc = g._nvcc()
    if nvcc is None:
        pytest.skip("nvcc not installed: the graph program cannot be built here")
    # built as the step builds it, it holds graphk by the name the rows look for
    r = subprocess.run(g.graph_build_cmd(nvcc, tmp_path / "graph"), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    symbols = subprocess.run(["nm", str(tmp_path / "graph")], capture_output=True, text=True, check=True).stdout
    assert [ln.split()[1:] for ln in symbols.splitlines() if ln.endswith(" " + g.GRAPHK)] == [["t", g.GRAPHK]]
