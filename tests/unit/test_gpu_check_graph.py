"""scripts/gpu_check's CUDA graph row: the host's counts of the graph program
against what it did and against CUPTI's kernel records of the graph's nodes
(one correlation id per graph launch); exact, and a count one off fails."""

from __future__ import annotations

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


def test_graph_program_source_has_the_counts_the_rows_expect() -> None:
    g = gpu_check_module()
    assert "__global__ void graphk(float *x, int n)" in g.GRAPH_CU  # mangled as GRAPHK
    assert g.GRAPHK == "_Z6graphkPfi"
    assert "NODES" in g.GRAPH_CU and "LAUNCHES" in g.GRAPH_CU
