"""`pasta-trace export --format perfetto`: the .pftrace is parsed with the
protobuf classes shipped in the `perfetto` package (perfetto_trace_pb2; its
trace processor needs a shell binary it would download, and there is no
network), interned strings resolved, slices rebuilt from begin/end pairs per
track, and compared exactly with the hand-built capture of test_export_model."""

from __future__ import annotations

import io
from collections import defaultdict
from pathlib import Path

import numpy as np
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

from pasta_trace.cli import main
from pasta_trace.export import perfetto, protowire
from test_export_model import T0, device_model, write_capture

BEGIN, END, COUNTER = pb.TrackEvent.TYPE_SLICE_BEGIN, pb.TrackEvent.TYPE_SLICE_END, pb.TrackEvent.TYPE_COUNTER


class Parsed:
    """Tracks named the way the Perfetto UI groups them, and what is on each.
    Times are ns after T0; an instant has end None."""

    def __init__(self, data: bytes) -> None:
        trace = pb.Trace()
        trace.ParseFromString(data)
        self.packets = list(trace.packet)
        interned: dict[str, dict[int, str]] = defaultdict(dict)
        self.descriptors: dict[int, pb.TrackDescriptor] = {}
        for p in self.packets:
            for kind in ("event_names", "event_categories", "debug_annotation_names"):
                for e in getattr(p.interned_data, kind):
                    interned[kind][e.iid] = e.name
            for e in p.interned_data.debug_annotation_string_values:
                interned["values"][e.iid] = e.str.decode()
            if p.HasField("track_descriptor"):
                self.descriptors[p.track_descriptor.uuid] = p.track_descriptor
        self.tracks = {u: self._name(d) for u, d in self.descriptors.items()}
        slices: dict[str, list[list]] = defaultdict(list)
        self.counters: dict[str, list[tuple[int, int]]] = defaultdict(list)
        self.flows_out: dict[int, tuple[str, int]] = {}
        self.flows_in: dict[int, tuple[str, int]] = {}
        stacks: dict[str, list[list]] = defaultdict(list)
        last_ts = 0
        for p in self.packets:
            if not p.HasField("track_event"):
                continue
            assert p.timestamp >= last_ts, "events are written in time order"
            last_ts = p.timestamp
            assert (p.trusted_packet_sequence_id, p.sequence_flags) == (1, 2)
            e, t = p.track_event, p.timestamp - T0
            track = self.tracks[e.track_uuid]
            if e.type == COUNTER:
                self.counters[track].append((t, e.counter_value))
            elif e.type == END:
                stacks[track].pop()[1] = t
            else:
                args = {interned["debug_annotation_names"][a.name_iid]: self._value(a, interned)
                        for a in e.debug_annotations}
                s = [t, None, interned["event_names"][e.name_iid], interned["event_categories"][e.category_iids[0]], args]
                slices[track].append(s)
                if e.type == BEGIN:
                    stacks[track].append(s)
                    s[1] = "open"
                for f in e.flow_ids:
                    self.flows_out[f] = (track, t)
                for f in e.terminating_flow_ids:
                    self.flows_in[f] = (track, t)
        assert not any(stacks.values()), "every begin has its end"
        self.slices = {k: [tuple(s[:4]) for s in v] for k, v in slices.items()}
        self.args = {(k, s[0]): s[4] for k, v in slices.items() for s in v}

    @staticmethod
    def _value(a: pb.DebugAnnotation, interned: dict) -> object:
        kind = a.WhichOneof("value")
        return interned["values"][a.string_value_iid] if kind == "string_value_iid" else getattr(a, kind)

    def _name(self, d: pb.TrackDescriptor) -> str:
        if d.HasField("process"):
            return f"process {d.process.pid} {d.process.process_name}"
        if d.HasField("thread"):
            return f"thread {d.thread.pid}/{d.thread.tid} {d.thread.thread_name}"
        return f"{self.descriptors[d.parent_uuid].process.pid}: {d.name}"

    def flows(self) -> set[tuple]:
        assert self.flows_out.keys() == self.flows_in.keys()
        return {(f, *self.flows_out[f], *self.flows_in[f]) for f in self.flows_out}


def _export(tmp_path: Path) -> Parsed:
    cap = write_capture(tmp_path / "cap")
    out = tmp_path / "cap.pftrace"
    assert main(["export", str(cap), "--format", "perfetto", "-o", str(out)]) == 0
    return Parsed(out.read_bytes())


def test_clock_is_declared_monotonic(tmp_path: Path) -> None:
    t = _export(tmp_path)
    assert not t.packets[0].HasField("timestamp")
    snap = t.packets[0].clock_snapshot
    assert snap.primary_trace_clock == pb.BUILTIN_CLOCK_MONOTONIC
    assert [(c.clock_id, c.timestamp) for c in snap.clocks] == [(pb.BUILTIN_CLOCK_MONOTONIC, T0 + 1000)]
    first = t.packets[1]
    assert first.sequence_flags == pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
    assert first.trace_packet_defaults.timestamp_clock_id == pb.BUILTIN_CLOCK_MONOTONIC


def test_tracks(tmp_path: Path) -> None:
    t = _export(tmp_path)
    assert sorted(t.tracks.values()) == [
        "100: GPU memory", "100: GPU stream 0x5", "100: GPU stream 0x6", "200: GPU memory", "200: GPU stream 0x0",
        "process 100 train", "process 200 hipapp",
        "thread 100/101 train", "thread 100/102 loader", "thread 200/201 hipapp",
    ]
    procs = {d.process.pid: list(d.process.cmdline) for d in t.descriptors.values() if d.HasField("process")}
    assert procs == {100: ["python train.py"], 200: ["./hipapp"]}
    counters = [d.counter.unit for d in t.descriptors.values() if d.HasField("counter")]
    assert counters == [pb.CounterDescriptor.UNIT_SIZE_BYTES] * 2


def test_api_slices_on_threads(tmp_path: Path) -> None:
    t = _export(tmp_path)
    assert t.slices["thread 100/101 train"] == [
        (1000, 1100, "cuMemAlloc_v2", "cuda_driver"), (2000, 2050, "cuLaunchKernel", "cuda_driver"),
        (3000, 3050, "cuLaunchKernel", "cuda_driver"), (4000, 4300, "cuMemcpyDtoH_v2", "cuda_driver"),
        (5000, 5100, "cuMemFree_v2", "cuda_driver")]
    # the entry-only launch (no duration) is an instant
    assert t.slices["thread 100/102 loader"] == [
        (2500, None, "cuLaunchKernel", "cuda_driver"), (3500, 3700, "cuMemAlloc_v2", "cuda_driver")]
    assert t.slices["thread 200/201 hipapp"] == [
        (1500, 1600, "hipMalloc", "cuda_runtime"), (2200, 2240, "hipLaunchKernel", "cuda_runtime"),
        (6000, 6500, "hipDeviceSynchronize", "cuda_runtime")]
    assert t.args[("thread 100/101 train", 2000)] == {
        "kind": "launch", "ret": 0, "stream": 0x5, "func": 0xF1, "grid_x": 2, "grid_y": 1, "grid_z": 1,
        "block_x": 128, "block_y": 1, "block_z": 1, "correlation": 1}
    assert t.args[("thread 100/101 train", 4000)] == {
        "kind": "memcpy", "ret": 0, "size": 1024, "dst": 0x9000, "src": 0x1000, "copy_kind": "d2h"}


def test_host_only_kernels_and_flows(tmp_path: Path) -> None:
    t = _export(tmp_path)
    assert t.slices["100: GPU stream 0x5"] == [(2000, None, "axpy", "kernel"), (2500, None, "axpy", "kernel")]
    assert t.slices["100: GPU stream 0x6"] == [(3000, None, "reduce", "kernel")]
    assert t.slices["200: GPU stream 0x0"] == [(2200, None, "hip_fill", "kernel")]
    assert t.args[("100: GPU stream 0x6", 3000)] == {
        "stream": 0x6, "grid_x": 4, "grid_y": 1, "grid_z": 1, "block_x": 64, "block_y": 1, "block_z": 1,
        "correlation": 4, "device_timing": False}
    assert t.flows() == {
        (1, "thread 100/101 train", 2000, "100: GPU stream 0x5", 2000),
        (2, "thread 200/201 hipapp", 2200, "200: GPU stream 0x0", 2200),
        (3, "thread 100/102 loader", 2500, "100: GPU stream 0x5", 2500),
        (4, "thread 100/101 train", 3000, "100: GPU stream 0x6", 3000),
    }


def test_memory_counters(tmp_path: Path) -> None:
    t = _export(tmp_path)
    assert dict(t.counters) == {"100: GPU memory": [(1000, 4096), (3500, 5096), (5000, 1000)],
                                "200: GPU memory": [(1500, 2048)]}


def test_device_timing_memops_and_flows(tmp_path: Path) -> None:
    buf = io.BytesIO()
    n = perfetto.write(device_model(tmp_path), buf)
    t = Parsed(buf.getvalue())
    assert t.slices["100: GPU stream 0x5"] == [
        (2100, 2600, "axpy", "kernel"), (2700, 2900, "axpy", "kernel"), (4100, 4250, "Memcpy DtoH", "gpu_memcpy")]
    assert t.slices["100: GPU stream 0x6"] == [(3100, 3900, "reduce", "kernel")]
    assert t.slices["100: GPU stream #9"] == [(4400, 4420, "Memset", "gpu_memset")]
    assert t.args[("100: GPU stream 0x6", 3100)] == {
        "stream": 0x6, "grid_x": 4, "grid_y": 1, "grid_z": 1, "block_x": 64, "block_y": 1, "block_z": 1,
        "correlation": 4, "cupti_correlation": 3, "device_timing": True, "device": 0}
    assert t.args[("100: GPU stream 0x5", 4100)] == {
        "bytes": 1024, "cupti_copy_kind": 2, "stream": 0x5, "stream_id": 7, "cupti_correlation": 4, "device": 0}
    assert t.flows() == {
        (1, "thread 100/101 train", 2000, "100: GPU stream 0x5", 2100),
        (2, "thread 200/201 hipapp", 2200, "200: GPU stream 0x0", 2200),
        (3, "thread 100/102 loader", 2500, "100: GPU stream 0x5", 2700),
        (4, "thread 100/101 train", 3000, "100: GPU stream 0x6", 3100),
    }
    # 10 API calls (9 with an end), 4 kernels (3 with an end), 2 memops with ends, 4 counter samples
    assert n == 10 + 9 + 4 + 3 + 2 + 2 + 4


def test_chunks_give_the_same_bytes(tmp_path: Path) -> None:
    model = device_model(tmp_path)
    whole, chunked = io.BytesIO(), io.BytesIO()
    perfetto.write(model, whole)
    perfetto.write(model, chunked, chunk_rows=3)
    assert chunked.getvalue() == whole.getvalue()


def test_varints_match_the_scalar_encoder() -> None:
    values = np.array([0, 1, 127, 128, 300, 2**32, 2**56 - 1, 2**63, 2**64 - 1], dtype=np.uint64)
    present = np.array([True] * 8 + [False])
    seg = protowire.varint_field(30, values, present)
    got, lens = protowire.assemble([seg])
    assert lens.tolist() == [3, 3, 3, 4, 4, 7, 10, 12, 0]  # a 2-byte tag, then 1..10 bytes
    want = b"".join(protowire.field_varint(30, int(v)) for v in values[:8])
    assert got.tobytes() == want
    # int64 -1 is written as its two's complement: ten bytes
    assert protowire.varint(-1) == b"\xff" * 9 + b"\x01"


def test_negative_counter_round_trips() -> None:
    body, _ = protowire.assemble([protowire.varint_field(30, np.array([-5], dtype=np.int64).view(np.uint64),
                                                      np.array([True]))])
    trace = pb.Trace()
    trace.ParseFromString(protowire.field_bytes(1, protowire.field_bytes(11, body.tobytes())))
    assert trace.packet[0].track_event.counter_value == -5


def test_capture_without_calls(tmp_path: Path) -> None:
    cap = write_capture(tmp_path / "cap", [])
    out = tmp_path / "t.pftrace"
    assert main(["export", str(cap), "-o", str(out)]) == 0
    t = Parsed(out.read_bytes())
    assert sorted(t.tracks.values()) == ["process 100 train", "process 200 hipapp"]
    assert not t.slices and not t.counters


def test_from_a_merged_timeline(tmp_path: Path) -> None:
    cap = write_capture(tmp_path / "cap")
    assert main(["merge", str(cap), "-o", str(tmp_path / "timeline")]) == 0
    out = tmp_path / "t.pftrace"
    assert main(["export", str(tmp_path / "timeline"), "-o", str(out)]) == 0
    assert Parsed(out.read_bytes()).slices == _export(tmp_path / "again").slices


def test_names_keep_every_character(tmp_path: Path) -> None:
    odd = 'void k<"q">(char \\\\, float) ∂\n'
    cap = write_capture(tmp_path / "cap", names=[(100, 0xF1, odd), (100, 0xF2, "reduce"), (200, 0xA1, "hip_fill")])
    out = tmp_path / "t.pftrace"
    assert main(["export", str(cap), "-o", str(out)]) == 0
    assert Parsed(out.read_bytes()).slices["100: GPU stream 0x5"] == [(2000, None, odd, "kernel"), (2500, None, odd, "kernel")]


def test_interleave_puts_each_row_at_its_position() -> None:
    # two layouts of different widths; rows of the first go to 2 and 0, of the second to 1
    a = protowire.layout([
        protowire.varint_field(1, np.array([5, 300], dtype=np.uint64), np.array([True, True])),
        protowire.const(b"\x10\x01", np.array([True, False])),
    ])
    b = protowire.layout([protowire.varint_field(2, np.array([2**40], dtype=np.uint64), np.array([True]))])
    got = protowire.interleave([a, b], [np.array([2, 0]), np.array([1])])
    want = (protowire.field_varint(1, 300) + protowire.field_varint(2, 2**40)
            + protowire.field_varint(1, 5) + b"\x10\x01")
    assert got.tobytes() == want


def test_ties_are_broken_as_a_lexsort_would() -> None:
    """Events of one instant are ordered by (kind of event, second key),
    stably: pairs swapped as columns, longer runs sorted; the same order as a
    lexsort of every event."""
    rng = np.random.default_rng(1)
    for _ in range(300):
        n = int(rng.integers(1, 60))
        t = np.sort(rng.integers(0, 8, n))
        o, s = rng.integers(0, 4, n).astype(np.int8), rng.integers(-3, 3, n)
        perm = np.arange(n)
        perfetto._break_ties(perm, t, lambda at: (o[at], s[at]))
        assert perm.tolist() == np.lexsort((s, o, t)).tolist()
