"""The trace model ties each launch call to its kernel; the kernels a CUDA
graph launch ran have no launch call of their own, and the calls after them
still find their kernels."""

from __future__ import annotations

import polars as pl

from pasta_trace.export.trace_model import KERNEL_COLUMNS, KERNEL_SCHEMA, _kernels


def test_launch_calls_find_their_kernels_past_graph_kernels() -> None:
    api = pl.DataFrame({"pid": [7, 7, 7, 7], "tid": [1, 1, 1, 1], "ts_ns": [10, 20, 30, 40],
                        "kind": ["launch", "graph", "launch", "launch"]})
    names = ["a", "g1", "g2", "b", "c"]
    ex = pl.DataFrame({
        "pid": [7] * 5, "launch_seq": [0, 1, 2, 3, 4], "ts_ns": [10, 20, 20, 30, 40], "stream": [1] * 5,
        "name": names, "gpu_start_ns": [11, 21, 22, 31, 41], "gpu_end_ns": [12, 22, 23, 32, 42],
        "correlation_id": [1, 2, 2, 3, 4], "device": [0] * 5, **{c: [1] * 5 for c in KERNEL_COLUMNS if
                                                                c.startswith(("grid_", "block_"))},
        "via_graph": [False, True, True, False, False], "ret": [0] * 5,
        "graph_id": [None, 3, 3, None, None], "graph_node_id": [None, 0x31, 0x32, None, None],
    }).select([pl.col(c).cast(KERNEL_SCHEMA[c]) for c in KERNEL_COLUMNS])
    api, kernels = _kernels(api, ex)
    corr_of = dict(zip(kernels["name"], kernels["corr"]))
    assert api["corr"].to_list() == [corr_of["a"], None, corr_of["b"], corr_of["c"]]
    assert sorted(kernels["name"]) == sorted(names)
    # the graph's kernels carry CUPTI's graph and node ids, the others none
    assert dict(zip(kernels["name"], kernels.select("graph_id", "graph_node_id").rows())) == {
        "a": (None, None), "g1": (3, 0x31), "g2": (3, 0x32), "b": (None, None), "c": (None, None)}
