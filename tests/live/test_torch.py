"""The real PyTorch CPU wheel under real uprobes on its libc10.so: every
tensor the program made (data_ptr, nbytes) is one tensor_alloc with its size
and call site and one tensor_free with its size, launched (libc10.so caught
when `import torch` opens it) and attached to a running program; and the real
reportMemoryUsageToProfiler, called through ctypes with a fake
Device{CUDA, 3} as the CUDA caching allocator calls it, decodes field by
field.  One workload run per mode (tests/fixtures/torch_workload.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import polars as pl
import pytest

from pasta_run import read_report, run_pasta, wait_for_file
from pasta_trace.read import open_capture
from pasta_trace.tools.sites import with_site

pytestmark = [pytest.mark.live, pytest.mark.usefixtures("require_bpf")]

WORKLOAD = Path(__file__).resolve().parents[1] / "fixtures" / "torch_workload.py"
REPORT, NEW, DELETE = ("c10::reportMemoryUsageToProfiler", "c10::ProfiledCPUMemoryReporter::New",
                       "c10::ProfiledCPUMemoryReporter::Delete")


def workload(torch_cpu, report: Path, *extra: str) -> list[str]:
    return [torch_cpu.python, str(WORKLOAD), "--site", str(torch_cpu.site), "--report", str(report), *extra]


def tensor_events(out: Path, pid: int) -> pl.DataFrame:
    cap = open_capture(out)
    assert cap.complete and cap.lost_events == 0, cap.problems
    ev = with_site(cap.events.filter((pl.col("pid") == pid) & pl.col("kind").cast(pl.String).str.starts_with("tensor")),
                   cap, None)
    return ev.sort("ts_ns").collect()


def check_tensors(ev: pl.DataFrame, report: dict) -> None:
    """Each tensor: one tensor_alloc (its ptr, size and line), then one tensor_free (its size), in the program's order."""
    ptrs = [t["ptr"] for t in report["tensors"]]
    mine = ev.filter(pl.col("ptr").is_in(ptrs))
    allocs = mine.filter(pl.col("kind") == "tensor_alloc")
    frees = mine.filter(pl.col("kind") == "tensor_free")
    site = f"{report['file']}:{{}} main"
    assert allocs.select("api", "ptr", "size", "device", "allocated_bytes", "reserved_bytes", "layer",
                         "call_site").rows() == [
        (NEW, t["ptr"], t["size"], "cpu", None, None, "framework", site.format(t["line"])) for t in report["tensors"]]
    size = {t["ptr"]: t["size"] for t in report["tensors"]}
    assert frees.select("api", "ptr", "size", "device").rows() == [(DELETE, p, size[p], "cpu") for p in report["freed"]]
    assert allocs["ts_ns"].max() < frees["ts_ns"].min()


def check_fake_cuda(ev: pl.DataFrame, report: dict) -> None:
    """The CUDA argument path: ptr, size, running totals and Device{CUDA, 3} exactly as passed."""
    got = ev.filter(pl.col("api") == REPORT).select("kind", "ptr", "size", "device", "allocated_bytes",
                                                    "reserved_bytes", "layer", "dst", "src", "aux")
    assert got.rows() == [
        ("tensor_free" if c["free"] else "tensor_alloc", c["ptr"], c["size"], "cuda:3", c["allocated"], c["reserved"],
         "framework", None, None, None) for c in report["fake_cuda"]]


@pytest.fixture(scope="module")
def launched(tmp_path_factory, torch_cpu, _bpf_status) -> tuple[pl.DataFrame, dict]:
    """-- CMD: the tracer starts the program; libc10.so is caught when `import torch` opens it."""
    if _bpf_status:
        pytest.skip(_bpf_status)
    d = tmp_path_factory.mktemp("launched")
    report = d / "w.json"
    r = run_pasta(["-o", str(d / "cap"), "--", *workload(torch_cpu, report)], timeout=300)
    assert r.returncode == 0, r.stderr
    rep = read_report(report)
    assert f"PID {rep['pid']} loaded {torch_cpu.libc10}: attached 3 probes before its first call" in r.stderr
    return tensor_events(d / "cap", rep["pid"]), rep


def test_real_wheel_launched(launched):
    check_tensors(*launched)


def test_cuda_argument_path(launched):
    check_fake_cuda(*launched)


def test_real_wheel_attached(tmp_path, torch_cpu, tracer):
    """-p: attached to a program that has imported torch and holds a tensor; its free has no size (allocated
    before the probes: the size map never saw it)."""
    report = tmp_path / "w.json"
    proc = subprocess.Popen(workload(torch_cpu, report, "--wait"))
    try:
        pid = int(wait_for_file(report.with_name(report.name + ".ready"), timeout=120, proc=proc))
        t = tracer(["-p", str(pid), "-o", str(tmp_path / "cap")])
        t.wait_ready(timeout=120)
        report.with_name(report.name + ".go").touch()
        assert proc.wait(timeout=120) == 0
    finally:
        proc.kill()
    assert t.stop() == 0, t.stderr()
    rep = read_report(report)
    ev = tensor_events(tmp_path / "cap", pid)
    check_tensors(ev, rep)
    check_fake_cuda(ev, rep)
    early = ev.filter(pl.col("ptr") == rep["early"]["ptr"])
    assert early.select("kind", "api", "size", "device").rows()[:1] == [("tensor_free", DELETE, None, "cpu")]
