"""Decode ring records into the capture's Parquet files, and the manifest."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from pasta_trace import schema
from pasta_trace.capture.output import manifest as mf
from pasta_trace.capture.output.decode import events_frame, names_frame
from pasta_trace.capture.procs.discovery import family_of
from pasta_trace.capture.session.options import CAPTURE_FILES
from pasta_trace.capture.procs.processes import container_id
from pasta_trace.capture.output.writer import CaptureWriter
from pasta_trace.read import open_capture
from pasta_trace.safe_output import OutputDir

APIS = ["cuLaunchKernel", "cuMemAlloc_v2", "cuMemcpyHtoD_v2", "cuModuleGetFunction", "cuKernelGetFunction"]


def _event(api: int, kind: schema.Kind, **fields) -> np.ndarray:
    rec = np.zeros(1, schema.HOST_EVENT.dtype)
    rec["api"] = api
    rec["kind"] = int(kind)
    rec["pid"] = 100
    rec["tid"] = 101
    rec["comm"] = b"train.py"
    for k, v in fields.items():
        rec[k] = v
    return rec


def _launch(ts: int, func: int) -> np.ndarray:
    v = (1 << schema.PAYLOAD_BITS["func"]) | (1 << schema.PAYLOAD_BITS["grid"]) | (1 << schema.PAYLOAD_BITS["block"])
    return _event(0, schema.Kind.launch, ts_ns=ts, func=func, grid_x=4, grid_y=2, grid_z=1, block_x=128,
                  block_y=1, block_z=1, stream=77, shmem=99, valid=v)


def _alloc(ts: int, ptr: int, size: int) -> np.ndarray:
    v = (1 << schema.PAYLOAD_BITS["ptr"]) | (1 << schema.PAYLOAD_BITS["size"])
    return _event(1, schema.Kind.alloc, ts_ns=ts, ptr=ptr, size=size, valid=v, ret=0, dur_ns=1500,
                  flags=schema.FLAG_HAS_RET | schema.FLAG_HAS_DUR)


def test_events_frame_has_the_schema_and_nulls_where_unset():
    recs = np.concatenate([_launch(10, 0xABC), _alloc(20, 0x7000, 4096)])
    df = events_frame(recs, APIS)
    assert df.schema == schema.empty_frame(schema.EVENTS_SCHEMA).schema
    launch, alloc = df.row(0, named=True), df.row(1, named=True)
    assert launch["api"] == "cuLaunchKernel" and launch["kind"] == "launch"
    assert (launch["func"], launch["grid_x"], launch["grid_y"], launch["block_x"], launch["shmem"]) == (
        0xABC, 4, 2, 128, None)
    assert launch["stream"] is None  # valid bit for stream unset although the field holds 77
    assert launch["ret"] is None and launch["dur_ns"] is None and launch["ptr"] is None
    assert launch["comm"] == "train.py" and launch["pid"] == 100 and launch["tid"] == 101
    assert (alloc["api"], alloc["kind"], alloc["ptr"], alloc["size"], alloc["ret"], alloc["dur_ns"]) == (
        "cuMemAlloc_v2", "alloc", 0x7000, 4096, 0, 1500)
    assert alloc["func"] is None and alloc["grid_x"] is None
    assert (launch["layer"], alloc["layer"]) == ("driver", "driver")


def test_events_frame_of_several_arrays_is_that_of_their_concatenation_and_no_records_give_an_empty_frame():
    a, b = _launch(10, 0xABC), _alloc(20, 0x7000, 4096)
    empty = np.zeros(0, a.dtype)
    assert events_frame([a, empty, b], APIS).equals(events_frame(np.concatenate([a, b]), APIS))
    for none in (empty, [empty, empty], []):
        assert events_frame(none, APIS).equals(schema.empty_frame(schema.EVENTS_SCHEMA))


def test_comms_that_differ_past_their_first_eight_bytes_stay_apart():
    a, b, c = _launch(10, 0xA), _launch(20, 0xB), _launch(30, 0xC)
    a["comm"], b["comm"], c["comm"] = b"python3.11-work", b"python3.11-othe", b"python3.11-work"
    assert events_frame(np.concatenate([a, b, c]), APIS)["comm"].to_list() == [
        "python3.11-work", "python3.11-othe", "python3.11-work"]
    same = np.concatenate([a, c])
    assert events_frame(same, APIS)["comm"].to_list() == ["python3.11-work"] * 2


def test_events_files_store_times_delta_encoded_the_rest_as_dictionaries_and_read_back_equal(tmp_path):
    import pyarrow.parquet as pq

    from pasta_trace.capture.output.event_writer import write_atomic

    recs = np.concatenate([_launch(10 + i, 0xA + i % 3) for i in range(1000)] + [_alloc(5000, 0x7000, 4096)])
    recs["outer_ts"][:10] = np.arange(1, 11)
    df = events_frame(recs, APIS)
    write_atomic(OutputDir.claim(tmp_path / "cap", force=False), "events-00000.parquet", df)
    path = tmp_path / "cap/events-00000.parquet"
    back = pl.read_parquet(path)
    assert back.schema == df.schema and back.equals(df)
    meta = pq.ParquetFile(path).metadata.row_group(0)
    encodings = {meta.column(i).path_in_schema: set(meta.column(i).encodings) for i in range(meta.num_columns)}
    for time_col in schema.DELTA_ENCODED_COLUMNS[:2]:
        assert "DELTA_BINARY_PACKED" in encodings[time_col]
    assert {"RLE_DICTIONARY"} <= encodings["func"] and {"RLE_DICTIONARY"} <= encodings["api"]
    assert not any("DELTA_BINARY_PACKED" in e for c, e in encodings.items() if c not in schema.DELTA_ENCODED_COLUMNS)


def test_each_event_says_its_layer():
    recs = np.concatenate([_launch(10, 0xABC), _alloc(20, 0x7000, 4096), _event(2, schema.Kind.other)])
    df = events_frame(recs, ["cuLaunchKernel", "hipMalloc", "notInTheCatalog"])
    assert df["layer"].to_list() == ["driver", "runtime", None]


def test_unknown_api_id_and_kind_decode_without_failing():
    df = events_frame(_event(9, schema.Kind.other, ts_ns=1), APIS)
    assert df["api"].to_list() == ["api#9"]
    assert df["kind"].to_list() == ["other"]


def test_a_kind_this_reader_does_not_know_reads_other():
    """Fails before: with kinds after `other`, clamping to the last name read 200 as the last kind."""
    df = events_frame(np.concatenate([_event(0, schema.Kind.other), _event(0, schema.Kind.tensor_free),
                                      _event(0, schema.Kind.comm)]), APIS)
    newer = _event(0, schema.Kind.launch)
    newer["kind"] = 200
    df2 = events_frame(newer, APIS)
    assert df["kind"].to_list() == ["other", "tensor_free", "comm"] and df2["kind"].to_list() == ["other"]


TENSOR_APIS = ["c10::reportMemoryUsageToProfiler", "c10::ProfiledCPUMemoryReporter::Delete", "cuMemsetD8_v2"]


def _tensor(kind: schema.Kind, aux: int, reserved: bool = True, **fields) -> np.ndarray:
    bits = ["ptr", "size", "dst", "aux"] + ["src"] * reserved
    return _event(0, kind, aux=aux, valid=sum(1 << schema.PAYLOAD_BITS[b] for b in bits), **fields)


def test_tensor_events_decode_their_slots_into_named_columns():
    recs = np.concatenate([
        _tensor(schema.Kind.tensor_alloc, 1 | 3 << 8, ptr=0x7F00, size=2 << 20, dst=6 << 20, src=20 << 20),
        _tensor(schema.Kind.tensor_free, 1 | 3 << 8, ptr=0x7F00, size=2 << 20, dst=4 << 20, src=20 << 20),
        _tensor(schema.Kind.tensor_alloc, 0 | 0xFF << 8, reserved=False, ptr=0x10, size=64, dst=64),
        _tensor(schema.Kind.tensor_alloc, 6 | 0 << 8, ptr=0x20, size=8, dst=8, src=9),
        _tensor(schema.Kind.tensor_alloc, 99 | 1 << 8, ptr=0x30, size=8, dst=8, src=9),
        _event(2, schema.Kind.memset, ptr=0x40, size=4, aux=7, dst=5,
               valid=sum(1 << schema.PAYLOAD_BITS[b] for b in ("ptr", "size", "aux", "dst"))),
    ])
    df = events_frame(recs, TENSOR_APIS).select("kind", "ptr", "size", "device", "allocated_bytes", "reserved_bytes",
                                                "dst", "src", "aux", "layer")
    assert df.rows() == [
        ("tensor_alloc", 0x7F00, 2 << 20, "cuda:3", 6 << 20, 20 << 20, None, None, None, "framework"),
        ("tensor_free", 0x7F00, 2 << 20, "cuda:3", 4 << 20, 20 << 20, None, None, None, "framework"),
        ("tensor_alloc", 0x10, 64, "cpu", 64, None, None, None, None, "framework"),
        ("tensor_alloc", 0x20, 8, "hip:0", 8, 9, None, None, None, "framework"),
        ("tensor_alloc", 0x30, 8, "device#99:1", 8, 9, None, None, None, "framework"),
        # other kinds keep their slots, and have no tensor columns
        ("memset", 0x40, 4, None, None, None, 5, None, 7, "driver"),
    ]


def test_copy_kind_is_an_enum_when_valid():
    rec = _event(2, schema.Kind.memcpy, copy_kind=int(schema.CopyKind.h2d), size=64,
                 valid=(1 << schema.PAYLOAD_BITS["copy_kind"]) | (1 << schema.PAYLOAD_BITS["size"]))
    df = events_frame(rec, APIS)
    assert df["copy_kind"].to_list() == ["h2d"]
    assert df["size"].to_list() == [64]


def _name(handle: int, name: bytes, source: schema.NameSource, alias: int = 0, api: int = 3, ts: int = 5):
    rec = np.zeros(1, schema.HOST_NAME.dtype)
    rec["pid"], rec["handle"], rec["alias"], rec["name"] = 100, handle, alias, name
    rec["source"], rec["api"], rec["ts_ns"] = int(source), api, ts
    return rec


def test_names_resolve_kernel_get_function_aliases():
    recs = np.concatenate([
        _name(0x10, b"_Z3addPf", schema.NameSource.library_get_kernel, api=3, ts=1),
        _name(0x20, b"", schema.NameSource.kernel_get_function, alias=0x10, api=4, ts=2),
        _name(0x30, b"", schema.NameSource.kernel_get_function, alias=0x99, api=4, ts=3),  # alias never named
    ])
    df = names_frame(recs, APIS)
    assert df.schema == schema.empty_frame(schema.NAMES_SCHEMA).schema
    assert df.select("handle", "name", pl.col("source").cast(pl.String)).rows() == [
        (0x10, "_Z3addPf", "library_get_kernel"),
        (0x20, "_Z3addPf", "kernel_get_function"),
    ]


def test_name_bytes_after_the_nul_are_ignored():
    df = names_frame(_name(0x10, b"kern\0garbage", schema.NameSource.module_get_function), APIS)
    assert df["name"].to_list() == ["kern"]


def test_writer_rotates_one_file_per_flush_and_reader_sees_all(tmp_path):
    w = CaptureWriter(OutputDir.claim(tmp_path, force=False), APIS)
    w.add_events(np.concatenate([_launch(1, 0xA), _launch(2, 0xB)]))
    w.flush()
    w.add_events(_alloc(3, 0x7000, 512))
    w.add_names(_name(0xA, b"kernA", schema.NameSource.module_get_function))
    w.flush_async()
    w.close()
    assert sorted(p.name for p in tmp_path.glob("events*.parquet")) == ["events-00000.parquet", "events-00001.parquet"]
    assert not list(tmp_path.glob(".*"))  # no temporary files left behind
    cap = open_capture(tmp_path)  # no manifest: what a killed tracer leaves
    assert cap.complete is False
    ev = cap.events.sort("ts_ns").collect()
    assert ev["ts_ns"].to_list() == [1, 2, 3]
    assert ev["kind"].cast(pl.String).to_list() == ["launch", "launch", "alloc"]
    assert cap.names.collect()["name"].to_list() == ["kernA"]
    assert w.events == 3 and w.names == 1
    assert w.by_kind.tolist() == [2, 1] + [0] * (len(schema.Kind) - 2)
    assert w.pids_and_comms() == [(100, "train.py")]


def test_each_events_file_leaves_out_its_all_null_columns_and_readers_put_them_back(tmp_path):
    """Format 1.12: a file of launches has no ptr/size/NCCL/tensor columns, one
    with an allocation has ptr and size too; open_capture and scan_events read
    both as the frames the writer decoded, every column in schema order."""
    from pasta_trace.parquet_scan import scan_events

    launches = np.concatenate([_launch(1, 0xA), _launch(2, 0xB)])
    mixed = np.concatenate([_launch(3, 0xA), _alloc(4, 0x7000, 512)])
    w = CaptureWriter(OutputDir.claim(tmp_path, force=False), APIS)
    w.add_events(launches)
    w.flush()
    w.add_events(mixed)
    w.close()
    files = sorted(tmp_path.glob("events*.parquet"))
    stored = [list(pl.read_parquet_schema(f)) for f in files]
    decoded = pl.concat([events_frame(launches, APIS), events_frame(mixed, APIS)])
    always = ["ts_ns", "pid", "tid", "comm", "api", "kind", "layer"]
    assert set(always) <= set(stored[0]) and set(always) <= set(stored[1])
    assert {"ptr", "size", "dur_ns", "ret"}.isdisjoint(stored[0])  # no launch here has a return code
    assert {"ptr", "size", "dur_ns", "ret"} <= set(stored[1])
    assert "dst" not in stored[1] and "communicator" not in stored[1] and "at_exit" not in stored[1]
    # what a file keeps is exactly the columns with a value in some row of it
    for f, part in zip(files, (launches, mixed)):
        frame = events_frame(part, APIS)
        assert pl.read_parquet_schema(f).keys() == {c for c in frame.columns if frame[c].null_count() < frame.height}
    for lf in (open_capture(tmp_path).events, scan_events(files)):
        back = lf.sort("ts_ns").collect()
        assert back.columns == list(schema.EVENTS_SCHEMA)
        assert back.equals(decoded.sort("ts_ns"))


def test_flush_with_nothing_pending_writes_no_file(tmp_path):
    w = CaptureWriter(OutputDir.claim(tmp_path, force=False), APIS)
    w.flush()
    w.close()
    assert list(tmp_path.iterdir()) == []


def test_manifest_complete_is_written_atomically_last(tmp_path):
    start = mf.ClockSample.now()
    m = mf.Manifest(command_line=["pasta-trace", "-p", "1"], mode="pid", start=start, pids=[1])
    out = OutputDir.claim(tmp_path, force=False)
    m.write(out, complete=False)
    first = json.loads((tmp_path / "manifest.json").read_text())
    assert first["complete"] is False and first["counts"] == {}
    m.end = mf.ClockSample.now()
    m.counts = mf.counts(events=5, names=2, lost={"lost_events": 3, "lost_names": 1, "lost_inflight": 0},
                         by_kind={"launch": 5})
    m.libraries = [mf.LibraryEntry("/usr/lib/libcuda.so.1", "/proc/1/root/usr/lib/libcuda.so.1", 1, 2, "ab",
                                   "cuda", ["cuLaunchKernel"], ["cuLaunchKernelEx"], {"cuLaunchKernel": 10})]
    m.write(out, complete=True)
    data = json.loads((tmp_path / "manifest.json").read_text())
    assert data["complete"] is True
    assert data["format_version"] == ".".join(map(str, schema.CAPTURE_FORMAT_VERSION))
    assert data["mode"] == "pid"
    assert data["counts"]["lost_events"] == 3 and data["counts"]["lost_names"] == 1
    assert data["clock"]["start_ns"] == start.mono_before_ns
    assert data["clock"]["end_ns"] == m.end.mono_after_ns
    s = data["clock"]["start_sample"]
    assert s["mono_before_ns"] <= s["mono_after_ns"]
    assert data["libraries"][0]["symbols_missing"] == ["cuLaunchKernelEx"]
    assert data["libraries"][0]["placements"] == {"cuLaunchKernel": 10}
    assert [p.name for p in tmp_path.iterdir()] == ["manifest.json"]
    (tmp_path / "events-00000.parquet").write_bytes(b"")  # reader reads the counts back
    assert open_capture(tmp_path).lost_events == 4


@pytest.mark.parametrize(
    "name,family",
    [("libcuda.so.1", "cuda"), ("libcuda.so", "cuda"), ("libcuda.so.535.261.03", "cuda"),
     ("libamdhip64.so.5", "hip"), ("libamdhip64.so", "hip"), ("libcudart.so.12", "cudart"),
     ("libcudart.so", "cudart"), ("libcudart_static.a", None), ("libcublas.so.12", None),
     ("libcuda.so.1.bak", None), ("libcuda_stub.so", None), ("/opt/x/libcuda.so.1 (deleted)", "cuda"),
     ("/venv/lib/python3.11/site-packages/torch/lib/libc10.so", "c10"), ("libc10.so.2.13", "c10"),
     ("libc10_cuda.so", None), ("libc10.so.bak", None)],
)
def test_library_file_names(name, family):
    assert family_of(name) == family


@pytest.mark.parametrize(
    "cgroup,cid",
    [
        ("/system.slice/docker-" + "a" * 64 + ".scope", "a" * 64),
        ("/kubepods/besteffort/pod1/" + "0123456789abcdef" * 4, "0123456789abcdef" * 4),
        ("/system.slice/cri-containerd-" + "b" * 64 + ".scope", "b" * 64),
        ("/user.slice/user-1000.slice/session-2.scope", None),
        ("/", None),
    ],
)
def test_container_id_from_cgroup(cgroup, cid):
    assert container_id(cgroup) == cid


def test_a_process_gone_before_its_exec_is_handled_keeps_the_cgroup_the_kernel_reported(tmp_path):
    """fork, join a container's cgroup, exec, exit: all before the tracer reads /proc.
    The exec notification carries the cgroup id (a cgroupfs directory's inode)."""
    from pasta_trace.capture.procs.processes import ProcessTable, cgroup2_root, cgroup_path

    root = tmp_path / "cgroup"
    scope = root / "system.slice" / ("docker-" + "ab" * 32 + ".scope")
    scope.mkdir(parents=True)
    proc = tmp_path / "proc"  # empty: every process is already gone
    proc.mkdir()
    table = ProcessTable()
    gone = 4194305  # above the kernel's largest pid_max: never a live process
    table.add_minimal(gone, "sh")  # seen at fork, before it joined the cgroup
    assert cgroup_path(scope.stat().st_ino, root) == f"/system.slice/docker-{'ab' * 32}.scope"
    assert cgroup_path(root.stat().st_ino, root) == "/"
    assert cgroup_path(1, root) is None
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text("31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
                         "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n")
    assert cgroup2_root(mountinfo) == Path("/sys/fs/cgroup/unified")  # hybrid v1/v2 layout
    table.refresh(gone, proc=proc, cgroup_id=scope.stat().st_ino, cgroup_root=root)
    row = table.frame().row(0, named=True)
    assert (row["pid"], row["comm"], row["cgroup"], row["container_id"]) == (
        gone, "sh", f"/system.slice/docker-{'ab' * 32}.scope", "ab" * 32)


def test_a_process_first_seen_after_its_exec_and_exit_keeps_the_cgroup_the_kernel_reported(tmp_path):
    """-a: the exec notification comes before the process is in the table (its
    events arrive later, after it has exited): the cgroup id is kept for it."""
    from pasta_trace.capture.procs.processes import ProcessTable

    root = tmp_path / "cgroup"
    scope = root / ("docker-" + "cd" * 32 + ".scope")
    scope.mkdir(parents=True)
    proc = tmp_path / "proc"
    proc.mkdir()
    table = ProcessTable()
    gone = 4194305  # above the kernel's largest pid_max: never a live process
    table.refresh(gone, proc=proc, cgroup_id=scope.stat().st_ino, cgroup_root=root)
    assert table.frame().height == 0
    table.add_minimal(gone, "cuda_workload")
    row = table.frame().row(0, named=True)
    assert (row["pid"], row["comm"], row["cgroup"], row["container_id"]) == (
        gone, "cuda_workload", f"/docker-{'cd' * 32}.scope", "cd" * 32)


def test_nested_calls_keep_their_outer_call_and_each_event_its_layer():
    """A driver launch made inside a runtime launch: kind nested, pointing at the
    runtime launch's entry time; the layer comes from each API."""
    apis = ["cudaLaunchKernel", "cuLaunchKernel", "hipMalloc", "someNewerApi"]
    v = (1 << schema.PAYLOAD_BITS["func"]) | (1 << schema.PAYLOAD_BITS["caller"])
    recs = np.concatenate([
        _event(0, schema.Kind.launch, ts_ns=10, func=0x5000, caller=0x5123, caller_fp=0x6000, valid=v),
        _event(1, schema.Kind.nested, ts_ns=12, func=0xABC, outer_ts=10, valid=v & ~(1 << schema.PAYLOAD_BITS["caller"])),
        _event(2, schema.Kind.alloc, ts_ns=20),
        _event(3, schema.Kind.other, ts_ns=30),
    ])
    df = events_frame(recs, apis).select("api", "kind", "layer", "outer_ts_ns", "func", "caller", "caller_fp")
    assert [tuple(str(x) if i < 3 and x is not None else x for i, x in enumerate(r)) for r in df.rows()] == [
        ("cudaLaunchKernel", "launch", "runtime", None, 0x5000, 0x5123, None),  # caller_fp's valid bit unset
        ("cuLaunchKernel", "nested", "driver", 10, 0xABC, None, None),
        ("hipMalloc", "alloc", "runtime", None, None, None, None),
        ("someNewerApi", "other", None, None, None, None, None),  # not in this reader's catalog: no layer
    ]
def test_force_removes_an_earlier_captures_device_files(tmp_path):
    """`record --force` on an earlier capture: its device/ files (which the
    merge and report would read as this capture's) go with the rest of it;
    files that are not a capture's stay."""
    old = tmp_path / "cap"
    (old / "device").mkdir(parents=True)
    for name in ("manifest.json", "events-00000.parquet", "names.parquet", "stacks.parquet", "aggregate.parquet",
                 "device/gpu_probes.4242.cupti.bin", "device/launches.parquet", "my-notes.txt"):
        (old / name).write_bytes(b"old")
    out = OutputDir.claim(old, force=True, clean=CAPTURE_FILES)
    out.close()
    assert sorted(p.name for p in old.iterdir()) == ["my-notes.txt"]
