"""CUPTI kernel records of CUDA graph launches (device format 1.2: graph_id,
graph_node_id), written by the device file writer and merged with a capture
of graph launches: each graph launch runs its device kernels, one launch row
each, marked via_graph, joined exactly; the host's estimate stays beside the
device's count.  A 1.1 file (the C++ writer's golden file before 1.2) still
reads, its graph ids 0."""

from __future__ import annotations

import ctypes
import json
from pathlib import Path

import polars as pl
import pytest

import merge_fixtures as fx
from pasta_trace import merge, schema
from pasta_trace.device import read_device_file
from pasta_trace.device.writer import DeviceFileWriter, RT, device_file_name
from pasta_trace.read import open_capture
from pasta_trace.schema import DeviceBackend
from pasta_trace.tools.kernels import kernel_summary

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests/fixtures/golden"
P, T, S = 50, 51, 0x5


def _host_events() -> list[dict]:
    """A capture of two kernels (0xA, 0xB) instantiated as exec 0x990 and
    launched twice, a kernel launched directly meanwhile, and a launch of
    exec 0x999, instantiated before the trace."""
    ev = fx.ev
    capture = [ev(10, P, T, "cuStreamBeginCapture_v2", "graph", stream=S, dst=10, ret=0),
               *(ev(ts, P, T, "cuLaunchKernel", "captured", func=f, stream=S, dst=10, grid_x=g)
                 for ts, f, g in ((20, 0xA, 2), (30, 0xB, 3))),
               ev(35, P, T, "cuLaunchKernel", "launch", func=0xC, stream=0x6, grid_x=1, dur_ns=20),
               ev(40, P, T, "cuStreamEndCapture", "graph", stream=S, ptr=0x900, dst=10, ret=0),
               ev(50, P, T, "cuGraphInstantiateWithFlags", "graph", func=0x990, ptr=0x900, ret=0)]
    return capture + [ev(ts, P, T, "cuGraphLaunch", "graph", func=x, stream=S)
                      for ts, x in ((100, 0x990), (200, 0x990), (300, 0x999))]


#: (correlation id, start, name, graph_id, graph_node_id, grid_x) of what CUPTI recorded
_DEVICE = [
    (6, 36, "c", 0, 0, 1),
    (7, 130, "b", 1, 0x102, 3), (7, 110, "a", 1, 0x101, 2),
    (8, 210, "a", 1, 0x101, 2), (8, 220, "b", 1, 0x102, 3),
    # the graph the host never saw: three kernels, one of them twice
    (9, 310, "x", 2, 0x201, 7), (9, 330, "y", 2, 0x202, 8), (9, 350, "x", 2, 0x203, 7),
]


def _write_device(cap_dir: Path, records: list[tuple]) -> Path:
    (cap_dir / "device").mkdir(exist_ok=True)
    path = cap_dir / "device" / device_file_name(P, DeviceBackend.cupti)
    ids: dict[str, int] = {}
    with DeviceFileWriter(path, pid=P, backend=DeviceBackend.cupti) as w:
        for corr, start, name, gid, node, gx in records:
            if name not in ids:
                ids[name] = len(ids) + 1
                w.string(ids[name], name)
            w.record(RT.CUPTI_KERNEL, start=start, end=start + 5, stream_id=7, correlation_id=corr,
                     name_id=ids[name], grid_x=gx, grid_y=1, grid_z=1, block_x=32, block_y=1, block_z=1,
                     graph_id=gid, graph_node_id=node)
    return path


def _capture(tmp_path: Path, events: list[dict], records: list[tuple]):
    cap_dir = fx.write(tmp_path / "cap", events=events, device=False)
    _write_device(cap_dir, records)
    return open_capture(cap_dir)


def test_graph_launches_run_their_device_kernels(tmp_path: Path) -> None:
    cap = _capture(tmp_path, _host_events(), _DEVICE)
    assert cap.problems == []
    ex = merge.kernel_executions(cap).collect()
    assert ex.select("ts_ns", "name", "grid_x", "via_graph", "graph_exec", "match", "gpu_start_ns").rows() == [
        (35, "c", 1, False, None, "exact", 36),
        (100, "a", 2, True, 0x990, "exact", 110), (100, "b", 3, True, 0x990, "exact", 130),
        (200, "a", 2, True, 0x990, "exact", 210), (200, "b", 3, True, 0x990, "exact", 220),
        (300, "x", 7, True, 0x999, "exact", 310), (300, "y", 8, True, 0x999, "exact", 330),
        (300, "x", 7, True, 0x999, "exact", 350),
    ]
    assert ex["launch_seq"].to_list() == list(range(8))
    # where the host knew the graph (same count), its node lends the handle: named by the host too
    assert ex.filter(pl.col("ts_ns") == 100)["func"].to_list() == [0xA, 0xB]
    assert ex.filter(pl.col("ts_ns") == 300)["func"].null_count() == 3
    dev = merge.device_executions(cap).collect()
    assert dev.filter(pl.col("graph_id") != 0).height == 7 and dev["launch_seq"].null_count() == 0
    summary = kernel_summary(cap).select("name", "launches", "via_graph").sort("name")
    assert summary.rows() == [("a", 2, 2), ("b", 2, 2), ("c", 1, None), ("x", 2, 2), ("y", 1, 1)]
    assert not summary["name"].str.starts_with("graph@").any()


def test_host_estimate_beside_the_device_count(tmp_path: Path) -> None:
    cap = _capture(tmp_path, _host_events(), _DEVICE)
    counts = merge.graph_launch_counts(cap)
    assert counts.select("ts_ns", "exec", "host_kernels", "device_kernels", "correlation_id").rows() == [
        (100, 0x990, 2, 2, 7), (200, 0x990, 2, 2, 8), (300, 0x999, None, 3, 9)]


def test_a_graph_launch_cupti_missed_keeps_the_host_estimate(tmp_path: Path) -> None:
    """CUPTI's records of the first graph launch are missing (dropped, or
    CUPTI began later): the device groups go to their launches by time, and
    the launch without records keeps the kernels the host worked out."""
    records = [r for r in _DEVICE if r[0] != 7]
    cap = _capture(tmp_path, _host_events(), records)
    ex = merge.kernel_executions(cap).collect()
    assert ex.select("ts_ns", "name", "via_graph", "match", "gpu_start_ns").rows() == [
        (35, "c", False, "exact", 36),
        (100, "unknown@0xa", True, None, None), (100, "unknown@0xb", True, None, None),
        (200, "a", True, "exact", 210), (200, "b", True, "exact", 220),
        (300, "x", True, "exact", 310), (300, "y", True, "exact", 330), (300, "x", True, "exact", 350),
    ]
    counts = merge.graph_launch_counts(cap)
    assert counts.select("host_kernels", "device_kernels").rows() == [(2, None), (2, 2), (None, 3)]


def test_graph_ids_round_trip_through_the_writer(tmp_path: Path) -> None:
    path = _write_device(tmp_path, _DEVICE)
    d = read_device_file(path)
    assert d.problems == []
    assert d.files["ver_minor"].to_list() == [schema.DEVICE_FORMAT_VERSION[1]] == [2]
    k = d.frames["cupti_kernels"]
    assert k.select("correlation_id", "graph_id", "graph_node_id", "name").rows() == [
        (c, g, n, name) for c, _, name, g, n, _ in _DEVICE]


def test_a_1_1_file_still_reads() -> None:
    """The C++ writer's golden file as format 1.1 wrote it: its 64-byte
    CUPTI_KERNEL reads whole, graph ids 0."""
    d = read_device_file(GOLDEN / "device_1_1_records.bin")
    assert d.problems == []
    assert (d.files["ver_major"].item(), d.files["ver_minor"].item()) == (1, 1)
    want = next(r for r in json.loads((GOLDEN / "device_all_records.json").read_text())["records"]
                if r["type"] == "CUPTI_KERNEL")["payload"]
    got = d.frames["cupti_kernels"].drop("pid", "name").to_dicts()
    assert got == [{**want, "graph_id": 0, "graph_node_id": 0}]
    assert d.frames["cupti_kernels"]["name"].to_list() == ["_Z6vecaddPKfS0_Pfi"]
    now = read_device_file(GOLDEN / "device_all_records.bin")  # the same records, as 1.2 writes them
    assert {k: f.height for k, f in d.frames.items()} == {k: f.height for k, f in now.frames.items()}
    assert now.frames["cupti_kernels"].select("graph_id", "graph_node_id").rows() == [(3, 0x300000002)]


def test_a_cupti_kernel_shorter_than_1_1_is_damage(tmp_path: Path) -> None:
    path = tmp_path / "short.bin"
    with DeviceFileWriter(path, pid=P, backend=DeviceBackend.cupti) as w:
        w.record(RT.CUPTI_KERNEL, start=1, end=2, correlation_id=3)
        w.write_raw(b"\x0d\x00\x00\x00\x48\x00\x00\x00" + bytes(8) + bytes(56))  # a 56-byte payload
    d = read_device_file(path)
    assert d.frames["cupti_kernels"]["correlation_id"].to_list() == [3]
    assert d.problems == [f"{path}: stopped at byte {64 + 16 + schema.DEV_CUPTI_KERNEL.size} of "
                          f"{64 + 16 + schema.DEV_CUPTI_KERNEL.size + 72}: CUPTI_KERNEL record is too short "
                          "for its 64-byte payload (72 bytes)"]


def test_a_graph_launch_the_host_lost_joins_no_other(tmp_path: Path) -> None:
    """Three graph launches on the device, two on the host (the first of 7 and 8
    lost, say): both groups come before the launch at 100, which keeps the
    first; the other's kernels join no launch, direct or graph."""
    records = [r for r in _DEVICE if r[0] in (6, 7, 8)]
    records = [(c, s - 80 if c == 8 else s, n, g, i, x) for c, s, n, g, i, x in records]  # 8 ran at 130, 140
    events = [e for e in _host_events() if e["ts_ns"] != 300]
    cap = _capture(tmp_path, events, records)
    ex = merge.kernel_executions(cap).collect()
    assert ex.select("ts_ns", "name", "match", "gpu_start_ns").rows() == [
        # c: by time, as the device's order no longer lines up with the host's launches
        (35, "c", "time", 36), (100, "a", "exact", 110), (100, "b", "exact", 130),
        (200, "unknown@0xa", None, None), (200, "unknown@0xb", None, None)]
    dev = merge.device_executions(cap).collect()
    assert dev.filter(pl.col("launch_seq").is_null()).select("correlation_id", "gpu_start_ns").sort(
        "gpu_start_ns").rows() == [(8, 130), (8, 140)]
    assert merge.graph_launch_counts(cap).select("device_kernels", "correlation_id").rows() == [(2, 7), (None, None)]


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_the_cupti_python_collector_writes_the_graph_ids(tmp_path: Path) -> None:
    """Real cupti-python ActivityKernel10 objects, one of a graph launch and
    one launched directly, through the collector's encoder."""
    cupti = pytest.importorskip("cupti.cupti", reason="cupti-python is not installed")
    from test_cupti_collector import _activity
    from pasta_trace.device.cupti_collector import ActivityEncoder

    name = ctypes.create_string_buffer(b"graphk")
    acts = [_activity(cupti.ActivityKernel10, cupti.activity_kernel10_dtype, kind=int(cupti.ActivityKind.CONCURRENT_KERNEL),
                      start=10 * i, end=10 * i + 5, correlation_id=40 + i, name=ctypes.addressof(name),
                      graph_id=gid, graph_node_id=node) for i, (gid, node) in enumerate([(3, 0x300000001), (0, 0)])]
    path = tmp_path / device_file_name(P, DeviceBackend.cupti)
    with DeviceFileWriter(path, pid=P, backend=DeviceBackend.cupti) as w:
        ActivityEncoder(cupti, w).write(acts)
    k = read_device_file(path).frames["cupti_kernels"]
    assert k.select("correlation_id", "graph_id", "graph_node_id", "name").rows() == [
        (40, 3, 0x300000001, "graphk"), (41, 0, 0, "graphk")]


def test_a_launch_whose_device_count_differs_from_the_hosts_estimate(tmp_path: Path) -> None:
    """The first launch ran a third kernel the host's capture did not show (a
    launch joined to the capture from another stream, say): its rows are the
    three device kernels, named by the device, no host handle lent to them."""
    records = sorted(_DEVICE + [(7, 150, "z", 1, 0x103, 9)], key=lambda r: (r[0], r[1]))
    cap = _capture(tmp_path, _host_events(), records)
    ex = merge.kernel_executions(cap).filter(pl.col("ts_ns").is_in([100, 200])).collect()
    assert ex.select("ts_ns", "func", "name", "grid_x", "match").rows() == [
        (100, None, "a", 2, "exact"), (100, None, "b", 3, "exact"), (100, None, "z", 9, "exact"),
        (200, 0xA, "a", 2, "exact"), (200, 0xB, "b", 3, "exact")]
    assert merge.graph_launch_counts(cap).select("host_kernels", "device_kernels").rows() == [
        (2, 3), (2, 2), (None, 3)]
