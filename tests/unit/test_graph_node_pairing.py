"""CUDA graphs with parallel branches, CUPTI device data written by the
device file writer: the GPU starts the kernels of two branches in another
order than they were captured, and each device kernel still takes the
handle and call site of the host node it ran (by name and shape, then name,
then place).  The timeline carries CUPTI's graph_id and graph_node_id, and
a timeline of the previous version still reads."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq

import merge_fixtures as fx
from pasta_trace import merge, schema
from pasta_trace.cli import main
from pasta_trace.device.writer import DeviceFileWriter, RT, device_file_name
from pasta_trace.read import open_capture
from pasta_trace.schema import DeviceBackend
from test_export_model import T0
from test_export_perfetto import Parsed

P, T, S1, S2 = 60, 61, 0x5, 0x6
GEMM, NORM, RELU, COPY = "_Z4gemmPfi", "_Z4normPf", "_Z4reluPf", "_Z4copyPf"
HANDLES = {0xA: GEMM, 0xB: NORM, 0xC: RELU, 0xE: COPY}


def _node(ts: int, func: int, stream: int, grid_x: int, block_x: int, caller: int, **kw) -> dict:
    return fx.ev(ts, P, T, "cuLaunchKernel", "captured", func=func, stream=stream, dst=10, grid_x=grid_x,
                 grid_y=1, grid_z=1, block_x=block_x, block_y=1, block_z=1, shmem=0, caller=caller, **kw)


def _fork_join_events() -> list[dict]:
    """A capture on S1 forked to S2 (S2 waits an event S1 recorded, S1 waits
    one of S2 before the end): gemm 8x128 then relu on S1, gemm 2x64 then
    norm on S2, captured in the order gemm8, gemm2, norm, relu; exec 0x990
    launched at 100 and 200; a direct launch of copy at 35."""
    return [fx.ev(10, P, T, "cuStreamBeginCapture_v2", "graph", stream=S1, dst=10, ret=0),
            _node(20, 0xA, S1, 8, 128, 0x1001), _node(22, 0xA, S2, 2, 64, 0x1002),
            _node(24, 0xB, S2, 1, 32, 0x1003), _node(26, 0xC, S1, 4, 128, 0x1004),
            fx.ev(35, P, T, "cuLaunchKernel", "launch", func=0xE, stream=0x7, grid_x=1, grid_y=1, grid_z=1,
                  block_x=32, block_y=1, block_z=1, dur_ns=20, caller=0x1005),
            fx.ev(40, P, T, "cuStreamEndCapture", "graph", stream=S1, ptr=0x900, dst=10, ret=0),
            fx.ev(50, P, T, "cuGraphInstantiateWithFlags", "graph", func=0x990, ptr=0x900, ret=0),
            fx.ev(100, P, T, "cuGraphLaunch", "graph", func=0x990, stream=S1),
            fx.ev(200, P, T, "cuGraphLaunch", "graph", func=0x990, stream=S1)]


#: (correlation id, start, name, graph_id, graph_node_id, grid_x, block_x) as CUPTI
#: recorded them: in each graph launch the branches start in another order than
#: captured (launch 100: gemm2 first; launch 200: relu before norm), and the node ids
#: (the exec's nodes) follow neither order
_FORK_JOIN_DEVICE = [
    (6, 36, COPY, 0, 0, 1, 32),
    (7, 105, GEMM, 3, 0x13, 2, 64), (7, 107, GEMM, 3, 0x12, 8, 128),
    (7, 112, NORM, 3, 0x11, 1, 32), (7, 130, RELU, 3, 0x14, 4, 128),
    (8, 205, GEMM, 3, 0x12, 8, 128), (8, 206, GEMM, 3, 0x13, 2, 64),
    (8, 220, RELU, 3, 0x14, 4, 128), (8, 222, NORM, 3, 0x11, 1, 32),
]


def _capture(tmp_path: Path, events: list[dict], records: list[tuple], handles: dict[int, str],
             earlier: dict[int, str] | None = None):
    """The capture, its handles named at 5 (those of `earlier` at 1, then
    renamed at 5: a module reloaded), and CUPTI's `records`."""
    cap_dir = fx.write(tmp_path / "cap", events=events, device=False)
    names = [{"pid": P, "handle": h, "name": n, "source": "module_get_function", "ts_ns": ts,
              "api": "cuModuleGetFunction"}
             for ts, named in ((1, earlier or {}), (5, handles)) for h, n in named.items()]
    fx.frame(names, schema.NAMES_SCHEMA).write_parquet(cap_dir / "names.parquet")
    (cap_dir / "device").mkdir()
    ids: dict[str, int] = {}
    with DeviceFileWriter(cap_dir / "device" / device_file_name(P, DeviceBackend.cupti), pid=P,
                          backend=DeviceBackend.cupti) as w:
        for corr, start, name, gid, node, gx, bx in records:
            if name not in ids:
                ids[name] = len(ids) + 1
                w.string(ids[name], name)
            w.record(RT.CUPTI_KERNEL, start=start, end=start + 1, stream_id=7, correlation_id=corr,
                     name_id=ids[name], grid_x=gx, grid_y=1, grid_z=1, block_x=bx, block_y=1, block_z=1,
                     graph_id=gid, graph_node_id=node)
    return open_capture(cap_dir)


_COLUMNS = ("ts_ns", "name", "grid_x", "block_x", "func", "caller", "gpu_start_ns", "graph_id", "graph_node_id")


def _rows(cap) -> list[tuple]:
    """The kernel executions' _COLUMNS, each with its launch row's call site."""
    callers = merge.host_launches(cap).select("pid", "launch_seq", "caller")
    return merge.kernel_executions(cap).join(callers, on=["pid", "launch_seq"], how="left").sort(
        "launch_seq").select(_COLUMNS).collect().rows()

#: the fork/join capture's rows, each device kernel with its own node's handle and call site
_FORK_JOIN_ROWS = [
    (35, COPY, 1, 32, 0xE, 0x1005, 36, None, None),
    (100, GEMM, 2, 64, 0xA, 0x1002, 105, 3, 0x13), (100, GEMM, 8, 128, 0xA, 0x1001, 107, 3, 0x12),
    (100, NORM, 1, 32, 0xB, 0x1003, 112, 3, 0x11), (100, RELU, 4, 128, 0xC, 0x1004, 130, 3, 0x14),
    (200, GEMM, 8, 128, 0xA, 0x1001, 205, 3, 0x12), (200, GEMM, 2, 64, 0xA, 0x1002, 206, 3, 0x13),
    (200, RELU, 4, 128, 0xC, 0x1004, 220, 3, 0x14), (200, NORM, 1, 32, 0xB, 0x1003, 222, 3, 0x11),
]


def test_parallel_branches_pair_each_kernel_with_its_node(tmp_path: Path) -> None:
    """By place, launch 100 would give the first gemm the other gemm's call
    site, and launch 200 relu the norm node's handle (and so its name); by
    name alone, the two gemms' call sites would be swapped at 100."""
    cap = _capture(tmp_path, _fork_join_events(), _FORK_JOIN_DEVICE, HANDLES)
    assert cap.problems == []
    assert _rows(cap) == _FORK_JOIN_ROWS
    ex = merge.kernel_executions(cap).collect()
    assert ex["via_graph"].to_list() == [False] + [True] * 8
    assert ex["match"].to_list() == ["exact"] * 9
    assert merge.graph_launch_counts(cap).select("host_kernels", "device_kernels").rows() == [(4, 4), (4, 4)]


def _explicit_events(unnamed_shape: bool) -> list[dict]:
    """cuGraphCreate, then three kernel nodes with no dependency between them
    (gemm, norm, relu), instantiated as exec 0x880, launched at 100; the norm
    node's shape was not read where `unnamed_shape`."""
    def node(ts: int, func: int, gx: int, bx: int, caller: int) -> dict:
        row = _node(ts, func, None, gx, bx, caller, ptr=0x800, ret=0)
        row.update(api="cuGraphAddKernelNode_v2", dst=None)
        if unnamed_shape and func == 0xB:
            row.update(grid_x=None, grid_y=None, grid_z=None, block_x=None, block_y=None, block_z=None)
        return row
    return [fx.ev(10, P, T, "cuGraphCreate", "graph", ptr=0x800, ret=0),
            node(20, 0xA, 8, 128, 0x2001), node(22, 0xB, 1, 32, 0x2002), node(24, 0xC, 4, 128, 0x2003),
            fx.ev(30, P, T, "cuGraphInstantiateWithFlags", "graph", func=0x880, ptr=0x800, ret=0),
            fx.ev(100, P, T, "cuGraphLaunch", "graph", func=0x880, stream=S1)]


#: the three independent nodes, run in the reverse of their making
_EXPLICIT_DEVICE = [(7, 105, RELU, 4, 0x21, 4, 128), (7, 106, NORM, 4, 0x22, 1, 32), (7, 108, GEMM, 4, 0x23, 8, 128)]


def test_nodes_without_dependencies_pair_by_name(tmp_path: Path) -> None:
    """Explicit kernel nodes with no dependency chain, run in reverse: paired
    by name and shape, and by name alone where the host did not read one
    node's shape (the row keeps the device's shape)."""
    want = [(100, RELU, 4, 128, 0xC, 0x2003, 105, 4, 0x21), (100, NORM, 1, 32, 0xB, 0x2002, 106, 4, 0x22),
            (100, GEMM, 8, 128, 0xA, 0x2001, 108, 4, 0x23)]
    for unnamed_shape in (False, True):
        cap = _capture(tmp_path / str(unnamed_shape), _explicit_events(unnamed_shape), _EXPLICIT_DEVICE, HANDLES)
        assert _rows(cap) == want, unnamed_shape


def test_a_renamed_handle_pairs_by_its_name_at_the_launch(tmp_path: Path) -> None:
    """Handle 0xB named another kernel before its module was reloaded: the
    node goes by the name it had at the graph launch, as the launch rows do."""
    cap = _capture(tmp_path, _explicit_events(False), _EXPLICIT_DEVICE, HANDLES, earlier={0xB: "_Z3oldv"})
    assert [(r[1], r[4], r[5]) for r in _rows(cap)] == [(RELU, 0xC, 0x2003), (NORM, 0xB, 0x2002),
                                                        (GEMM, 0xA, 0x2001)]


def test_a_node_never_named_pairs_by_place(tmp_path: Path) -> None:
    """The norm node's handle was never named: names cannot pair the launch's
    kernels, which go by place (right where the start order is the capture
    order, as here); the unnamed row takes the device's name."""
    records = [(7, 105, GEMM, 4, 0x21, 8, 128), (7, 106, NORM, 4, 0x22, 1, 32), (7, 108, RELU, 4, 0x23, 4, 128)]
    handles = {h: n for h, n in HANDLES.items() if h != 0xB}
    cap = _capture(tmp_path, _explicit_events(False), records, handles)
    assert _rows(cap) == [
        (100, GEMM, 8, 128, 0xA, 0x2001, 105, 4, 0x21), (100, NORM, 1, 32, 0xB, 0x2002, 106, 4, 0x22),
        (100, RELU, 4, 128, 0xC, 0x2003, 108, 4, 0x23)]


def test_the_timeline_keeps_the_graph_ids(tmp_path: Path) -> None:
    cap = _capture(tmp_path, _fork_join_events(), _FORK_JOIN_DEVICE, HANDLES)
    out = tmp_path / "tl"
    merge.write_timeline(cap, out)
    loaded = merge.load(out)
    assert loaded.merged
    kernels = merge.kernel_executions(loaded).collect()
    assert kernels.schema["graph_id"] == pl.UInt32 and kernels.schema["graph_node_id"] == pl.UInt64
    assert _rows(loaded) == _FORK_JOIN_ROWS
    assert pq.read_schema(out / "kernels.parquet").names == list(schema.TIMELINE_FRAMES["kernels"])


def test_a_1_3_timeline_still_reads(tmp_path: Path) -> None:
    """The same timeline as format 1.3 wrote it (no graph ids): it loads, its
    graph ids null, every other column as before."""
    cap = _capture(tmp_path, _fork_join_events(), _FORK_JOIN_DEVICE, HANDLES)
    out = tmp_path / "tl"
    merge.write_timeline(cap, out)
    new = merge.kernel_executions(merge.load(out)).collect()
    pl.read_parquet(out / "kernels.parquet").drop("graph_id", "graph_node_id").write_parquet(out / "kernels.parquet")
    meta = json.loads((out / "timeline.json").read_text())
    (out / "timeline.json").write_text(json.dumps({**meta, "format_version": "1.3"}))
    old = merge.load(out)
    assert old.problems == []
    kernels = merge.kernel_executions(old).collect()
    assert dict(kernels.schema) == dict(new.schema)  # the columns an older file lacks come last
    assert kernels["graph_id"].null_count() == kernels["graph_node_id"].null_count() == 9
    assert kernels.drop("graph_id", "graph_node_id").equals(new.drop("graph_id", "graph_node_id"))


def test_the_exports_show_the_graph_ids(tmp_path: Path) -> None:
    """Chrome JSON and Perfetto: a kernel slice of a graph launch carries
    CUPTI's graph_id and graph_node_id; the kernel launched directly none."""
    cap = _capture(tmp_path, _fork_join_events(), _FORK_JOIN_DEVICE, HANDLES)
    chrome, pftrace = tmp_path / "t.json", tmp_path / "t.pftrace"
    assert main(["export", str(cap.path), "--format", "chrome", "-o", str(chrome)]) == 0
    assert main(["export", str(cap.path), "--format", "perfetto", "-o", str(pftrace)]) == 0
    # start (µs, three decimals) -> the slice's graph ids
    want = {round(t / 1000, 3): (g, n) for _, _, _, _, _, _, t, g, n in _FORK_JOIN_ROWS}
    slices = [e for e in json.loads(chrome.read_text())["traceEvents"] if e.get("cat") == "kernel"]
    assert {e["ts"]: (e["args"].get("graph_id"), e["args"].get("graph_node_id")) for e in slices} == want
    trace = Parsed(pftrace.read_bytes())
    got = {(t, args.get("graph_id"), args.get("graph_node_id")) for (track, t), args in trace.args.items()
           if track.endswith(("GPU stream 0x5", "GPU stream 0x7"))}
    assert got == {(t - T0, g, n) for _, _, _, _, _, _, t, g, n in _FORK_JOIN_ROWS}
