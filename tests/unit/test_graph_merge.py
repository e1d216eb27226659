"""CUDA graphs in the merge, on a written capture: a graph launch runs the
kernels its capture recorded, children and reused handles included; CUPTI's
kernel records of a graph launch (one correlation id) join its kernels in
start order."""

from __future__ import annotations

from pathlib import Path

import polars as pl

import merge_fixtures as fx
from pasta_trace import merge
from pasta_trace.merge.graphs import UNKNOWN_REASON
from pasta_trace.read import open_capture
from pasta_trace.tools.kernels import kernel_summary

P, T, S = 50, 51, 0x5


def _graph_events() -> list[dict]:
    ev = fx.ev
    return [
        ev(10, P, T, "cuStreamBeginCapture_v2", "graph", stream=S, dst=10, ret=0),
        ev(20, P, T, "cuLaunchKernel", "captured", func=0xA, stream=S, dst=10, grid_x=2),
        ev(30, P, T, "cuLaunchKernel", "captured", func=0xB, stream=S, dst=10, grid_x=3),
        ev(35, P, T, "cuLaunchKernel", "launch", func=0xC, stream=0x6, grid_x=1, dur_ns=20),  # another stream: runs
        ev(40, P, T, "cuStreamEndCapture", "graph", stream=S, ptr=0x900, dst=10, ret=0),
        # an explicit graph with one kernel node and the captured graph as its child
        ev(41, P, T, "cuGraphCreate", "graph", ptr=0x910, ret=0),
        ev(42, P, T, "cuGraphAddKernelNode_v2", "captured", func=0xD, ptr=0x910, grid_x=4, ret=0),
        ev(43, P, T, "cuGraphAddChildGraphNode", "graph", ptr=0x910, src=0x900, ret=0),
        ev(50, P, T, "cuGraphInstantiateWithFlags", "graph", func=0x990, ptr=0x900, ret=0),
        ev(51, P, T, "cuGraphInstantiateWithFlags", "graph", func=0x991, ptr=0x910, ret=0),
        ev(52, P, T, "cuGraphInstantiateWithFlags", "graph", func=0x992, ptr=0x910, ret=1),  # failed: no exec
        ev(100, P, T, "cuGraphLaunch", "graph", func=0x990, stream=S),
        ev(200, P, T, "cuGraphLaunch", "graph", func=0x990, stream=S),
        ev(300, P, T, "cuGraphLaunch", "graph", func=0x991, stream=S),
        ev(400, P, T, "cuGraphLaunch", "graph", func=0x999, stream=S),  # instantiated before the trace
        # the exec handle reused for another graph after a destroy
        ev(500, P, T, "cuGraphExecDestroy", "graph", func=0x990),
        ev(510, P, T, "cuGraphCreate", "graph", ptr=0x920, ret=0),
        ev(520, P, T, "cuGraphAddKernelNode_v2", "captured", func=0xE, ptr=0x920, grid_x=5, ret=0),
        ev(530, P, T, "cuGraphInstantiateWithFlags", "graph", func=0x990, ptr=0x920, ret=0),
        ev(540, P, T, "cuGraphAddKernelNode_v2", "captured", func=0xF, ptr=0x920, ret=0),  # after: not in the exec
        ev(600, P, T, "cuGraphLaunch", "graph", func=0x990, stream=S),
    ]


def test_each_graph_launch_runs_its_graphs_kernels(tmp_path: Path) -> None:
    cap = open_capture(fx.write(tmp_path / "cap", events=_graph_events(), device=False))
    ex = merge.kernel_executions(cap).collect()
    assert ex.select("ts_ns", "func", "grid_x", "via_graph", "graph_exec", "launch_seq").rows() == [
        (35, 0xC, 1, False, None, 0),
        (100, 0xA, 2, True, 0x990, 1), (100, 0xB, 3, True, 0x990, 2),
        (200, 0xA, 2, True, 0x990, 3), (200, 0xB, 3, True, 0x990, 4),
        # the explicit graph: its own node, then the child's kernels, copied in when it was added
        (300, 0xD, 4, True, 0x991, 5), (300, 0xA, 2, True, 0x991, 6), (300, 0xB, 3, True, 0x991, 7),
        (400, 0x999, None, True, 0x999, 8),
        (600, 0xE, 5, True, 0x990, 9),
    ]
    assert ex["dur_ns"].null_count() == ex.height - 1
    summary = kernel_summary(cap)
    assert summary.filter(pl.col("name") == "graph@0x999").select("launches", "via_graph", "name_reason").rows() \
        == [(1, 1, UNKNOWN_REASON)]


def test_cupti_records_of_a_graph_launch_join_its_kernels_in_start_order(tmp_path: Path) -> None:
    events = _graph_events()[:13]  # two launches of the captured graph
    cupti = [fx_cupti(corr=7, start=130, name="b"), fx_cupti(corr=7, start=110, name="a"),
             fx_cupti(corr=8, start=220, name="b"), fx_cupti(corr=8, start=210, name="a"),
             fx_cupti(corr=6, start=36, name="c")]
    cap = open_capture(fx.write(tmp_path / "cap", events=events, dev={"cupti_kernels": cupti}))
    ex = merge.kernel_executions(cap).collect()
    assert ex.select("ts_ns", "func", "match", "gpu_start_ns", "name").rows() == [
        (35, 0xC, "exact", 36, "c"),
        (100, 0xA, "exact", 110, "a"), (100, 0xB, "exact", 130, "b"),
        (200, 0xA, "exact", 210, "a"), (200, 0xB, "exact", 220, "b"),
    ]


def fx_cupti(*, corr: int, start: int, name: str) -> dict:
    return {"pid": P, "start": start, "end": start + 5, "grid_id": 0, "stream_id": 7, "correlation_id": corr,
            "device": 0, "name_id": 0, "grid_x": 1, "grid_y": 1, "grid_z": 1, "block_x": 32, "block_y": 1,
            "block_z": 1, "name": name}
