"""`report`, `export` and `merge` on an --aggregate capture (no events, the
kernel's counts and byte sums in aggregate.parquet): processes, kernels,
memory totals and API errors come from the counts, exactly; the tables that
need per-call events say so, and not that they need device data."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from pasta_trace import cli
from pasta_trace.testing import synthetic
from pasta_trace.tools import REGISTRY

MIB = 1 << 20
PER_CALL = "needs per-call events; an --aggregate capture keeps only counts and byte sums"
DEVICE = "needs device data (gpu_probes or CUPTI); this capture has none"

PROCESSES = [  # pid, api_calls, failed_calls, launches, kernels, device_alloc_bytes, copy_bytes, threads, sync_ns
    (4242, 1907, 5, 1750, 2, 10 * MIB, 4 * MIB, None, None),  # 2 failed launches: no kernel ran
    (4259, 8, 0, 7, 1, 4096, 0, None, None),
]
KERNELS = [  # pid, name, launches, failed_launches, shapes, top_grid, top_block
    (4242, "kernel_0", 1500, None, 2, "128x1x1", "256x1x1"),
    (4242, "kernel_1", 250, 2, 1, "32x1x1", "128x1x1"),
    (4259, "unknown@0x666600000000", 7, None, 1, "8x1x1", "64x1x1"),
]
MEMORY = [  # pid, memory, allocations, allocated_bytes, freed, freed_bytes, held_bytes
    (4242, "device", 10, 10 * MIB, None, None, None),
    (4242, "pinned host", 2, MIB, None, None, None),
    (4259, "device", 1, 4096, None, None, None),
]
ERRORS = [  # pid, api, error, failed, calls
    (4242, "cuMemAlloc_v2", "CUDA_ERROR_OUT_OF_MEMORY", 3, 13),
    (4242, "cuLaunchKernel", "CUDA_ERROR_INVALID_VALUE", 2, 1752),
]
COLUMNS = {
    "processes": ["pid", "api_calls", "failed_calls", "launches", "kernels", "device_alloc_bytes", "copy_bytes",
                  "threads", "sync_ns"],
    "kernels": ["pid", "name", "launches", "failed_launches", "shapes", "top_grid", "top_block"],
    "memory_totals": ["pid", "memory", "allocations", "allocated_bytes", "freed", "freed_bytes", "held_bytes"],
    "api_errors": ["pid", "api", "error", "failed", "calls"],
}
EXPECTED = {"processes": PROCESSES, "kernels": KERNELS, "memory_totals": MEMORY, "api_errors": ERRORS}


@pytest.fixture
def cap(tmp_path: Path) -> Path:
    return synthetic.write_aggregate_capture(tmp_path / "cap")


def _report(capsys, path: Path) -> dict:
    assert cli.main(["report", str(path), "--json"]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    return json.loads(out)


def _check_tables(doc: dict) -> None:
    for tool, cols in COLUMNS.items():
        rows = [tuple(r[c] for c in cols) for r in doc["tools"][tool]["rows"]]
        assert rows == EXPECTED[tool], tool
        assert doc["tools"][tool]["note"] is None
    assert (doc["capture"]["events"], doc["capture"]["aggregate_calls"]) == (0, 1915)
    for name, tool in REGISTRY.items():
        note = doc["tools"][name]["note"]
        assert note == (None if tool.reads_aggregate else DEVICE if tool.needs_device else PER_CALL), name


def test_report_reads_the_counts(cap: Path, capsys) -> None:
    _check_tables(_report(capsys, cap))


def test_csv_export_writes_the_counts_and_says_why_other_tables_are_empty(cap: Path, tmp_path: Path,
                                                                         capsys) -> None:
    """Fails before: every header-only table was said to need device data."""
    out = tmp_path / "csv"
    assert cli.main(["export", str(cap), "--format", "csv", "-o", str(out)]) == 0
    err = capsys.readouterr().err.splitlines()
    per_call = [n for n, t in REGISTRY.items() if not t.reads_aggregate and not t.needs_device]
    device = [n for n, t in REGISTRY.items() if not t.reads_aggregate and t.needs_device]
    assert err[1:] == [f"note: {', '.join(per_call)}: header only ({PER_CALL})",
                       f"note: {', '.join(device)}: header only ({DEVICE})"]
    assert (out / "events.csv").read_text().count("\n") == 1  # the header: no events
    for tool, cols in COLUMNS.items():
        frame = pl.read_csv(out / f"{tool}.csv").select(cols)
        assert frame.rows() == EXPECTED[tool], tool


def test_trace_export_says_an_aggregate_capture_has_no_calls(cap: Path, tmp_path: Path, capsys) -> None:
    assert cli.main(["export", str(cap), "--format", "chrome", "-o", str(tmp_path / "t.json")]) == 0
    assert capsys.readouterr().err.splitlines()[0] == (
        f"pasta-trace: warning: {cap} holds no API calls (an --aggregate capture keeps counts only: "
        "see pasta-trace report)")


def test_merge_carries_the_counts_into_the_timeline(cap: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "timeline"
    assert cli.main(["merge", str(cap), "-o", str(out)]) == 0
    assert capsys.readouterr().err.splitlines() == [
        "kernel launches: 0 on the host, 0 on the device",
        "note: an --aggregate capture: 1,759 launches counted per kernel and shape, no single launch to match "
        "with device data; the counts are carried into the timeline",
        f"Wrote {out}",
        f"You can now run: pasta-trace report {out}",
    ]
    _check_tables(_report(capsys, out))


def test_report_banner_counts_the_aggregate_overflow(tmp_path: Path, capsys) -> None:
    path = synthetic.write_aggregate_capture(tmp_path / "lossy", lost_agg=18)
    assert cli.main(["report", str(path), "--json"]) == 0
    out, err = capsys.readouterr()
    assert err == "pasta-trace: warning: INCOMPLETE: 18 aggregated calls lost\n"
    doc = json.loads(out)
    assert doc["incomplete"] == "INCOMPLETE: 18 aggregated calls lost"
    assert doc["capture"]["losses"] == {"lost_agg": 18}
