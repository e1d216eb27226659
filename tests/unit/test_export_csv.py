"""`pasta-trace export --format csv`: events.csv plus one file per registered
tool, each the tool's frame exactly (nested values as JSON, binary as hex,
handles and addresses as 0x...); launches name their kernel."""

from __future__ import annotations

from pathlib import Path

import polars as pl
from polars.testing import assert_frame_equal

from pasta_trace import schema
from pasta_trace.cli import main
from pasta_trace.reporters.csv_dir import flat
from pasta_trace.read import open_capture
from pasta_trace.tools import REGISTRY
from test_export_model import T0, write_capture


def _export(tmp_path: Path) -> tuple[Path, Path]:
    cap = write_capture(tmp_path / "cap")
    out = tmp_path / "csv"
    assert main(["export", str(cap), "--format", "csv", "-o", str(out)]) == 0
    return cap, out


def test_one_file_per_tool_plus_events(tmp_path: Path) -> None:
    _, out = _export(tmp_path)
    assert sorted(p.name for p in out.iterdir()) == sorted(["events.csv", *(f"{t}.csv" for t in REGISTRY)])
    assert sorted(p.stem for p in out.iterdir()) == [
        "alloc_hotness", "api_errors", "call_sites", "collective_bandwidth", "collectives", "copy_storms", "events",
        "gpu_idle", "hangs", "kernel_call_sites", "kernels", "launch_gaps", "leak_call_sites", "leaks", "memory",
        "memory_peaks", "memory_totals", "page_hotness", "peak_call_sites", "prefetch", "processes",
        "repeated_copies", "repeated_copy_call_sites", "straggler_ranks", "stragglers", "sync", "sync_call_sites",
        "tensor_fragmentation", "tensor_leaks", "tensor_memory", "tensor_peak_call_sites", "tensor_peaks",
        "tensors_never_freed", "transfer_call_sites", "transfers", "working_set"]


def test_events_csv(tmp_path: Path) -> None:
    _, out = _export(tmp_path)
    lines = (out / "events.csv").read_text().splitlines()
    cols = list(schema.EVENTS_SCHEMA)
    cols.insert(cols.index("func") + 1, "kernel")
    assert lines[0] == ",".join(cols)
    assert len(lines) == 1 + 10
    # ts, dur, pid, tid, comm, api, kind, ret, stream, func, kernel, grid, block, shmem, ptr, size, ..., aux, stack_id,
    # layer, device, allocated_bytes, reserved_bytes (format 1.2), then the NCCL columns (1.3) and outer_ts_ns,
    # caller, caller_fp (1.4), at_exit (1.7): none in this file
    assert lines[1] == f"{T0 + 1000},100,100,101,train,cuMemAlloc_v2,alloc,0,,,,,,,,,,,0x1000,4096{',' * 23}"
    events = pl.read_csv(out / "events.csv", infer_schema=False)
    assert events.filter(pl.col("kind") != "alloc").select("api", "stream", "func", "kernel", "ptr", "dst", "src").rows() == [
        # in the capture's row order
        ("cuLaunchKernel", "0x5", "0xf1", "axpy", None, None, None),
        ("cuLaunchKernel", "0x6", "0xf2", "reduce", None, None, None),
        ("cuMemcpyDtoH_v2", None, None, None, None, "0x9000", "0x1000"),
        ("cuMemFree_v2", None, None, None, "0x1000", None, None),
        ("cuLaunchKernel", "0x5", "0xf1", "axpy", None, None, None),
        ("hipLaunchKernel", "0x0", "0xa1", "hip_fill", None, None, None),
        ("hipDeviceSynchronize", None, None, None, None, None, None),
    ]


def test_tool_files_hold_the_tool_frames(tmp_path: Path) -> None:
    cap_path, out = _export(tmp_path)
    cap = open_capture(cap_path)
    for name, tool in REGISTRY.items():
        want = flat(tool.compute(cap), [c for c, col in tool.columns.items() if col.unit == "handle"])
        want = want.with_columns(pl.col(c).cast(pl.String) for c, t in want.schema.items()
                                 if isinstance(t, (pl.Categorical, pl.Enum)))
        got = pl.read_csv(out / f"{name}.csv", schema=want.schema)
        assert_frame_equal(got, want, check_exact=True), name


def test_flat_turns_nested_and_binary_into_text() -> None:
    frame = pl.DataFrame({
        "shape": [[2, 1, 1], None], "pair": [{"a": 1, "b": "x"}, {"a": None, "b": "y"}],
        "bits": [b"\x01\xff", b""], "n": [1, 2],
    })
    assert flat(frame).rows() == [("[2,1,1]", '{"a":1,"b":"x"}', "01ff", 1), (None, '{"a":null,"b":"y"}', "", 2)]


def test_tool_files_spell_handles_in_hex(tmp_path: Path) -> None:
    _, out = _export(tmp_path)
    leaks = pl.read_csv(out / "leaks.csv", infer_schema=False)
    assert leaks.select("pid", "base", "size").rows() == [("200", "0x10", "2048"), ("100", "0x8000", "1000")]
