"""scripts/gpu_check as issue 22's decisive experiment, checked here without a GPU: --dry builds
everything, writes every command line, reads the TOOL_STATUS of the real library in a process with no
CUDA and ends with every GPU row SKIP "no GPU"; the rows of the control, of memcheck and of the tool's
status pass exact values and fail loudly on wrong ones."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pasta_trace import schema
from pasta_trace.device.writer import DeviceFileWriter
from test_gpu_check import SCRIPT, gpu_check_module


@pytest.fixture(scope="module")
def gc():
    return gpu_check_module()


def _nvcc() -> bool:
    return bool(shutil.which("nvcc") or list(Path("/usr/local").glob("cuda*/bin/nvcc")))


@pytest.mark.skipif(not _nvcc(), reason="nvcc not installed: gpu_probes cannot be built here")
def test_dry_run_builds_logs_every_command_reads_the_status_and_skips_every_gpu_row(gc, tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "OUT")} | {"OUT": str(out)}
    r = subprocess.run([sys.executable, str(SCRIPT), "--dry", "--n", "1024"], capture_output=True, text=True,
                       timeout=300, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    table = (out / "table.txt").read_text()
    assert table == r.stdout  # the table is kept where $OUT says
    results = {ln.rsplit(None, 1)[0].split("  ")[0]: ln.rsplit(None, 1)[1] for ln in table.splitlines()[2:]}
    assert "FAIL" not in results.values()
    for step in gc.GPU_STEPS:
        assert results[step] == "SKIP" and f"{step}" in table, step
    gpu_rows = [ln for ln in table.splitlines() if ln.endswith("SKIP")]
    assert len(gpu_rows) == len(gc.GPU_STEPS) and all("  no GPU" in ln for ln in gpu_rows)
    for what in ("build gpu_probes (sanitizer + vecadd)", "[dry] InitializeInjection, twice, as the driver calls it",
                 "[dry] a device file with the tool's status", "[dry] TOOL_STATUS records",
                 "[dry] injection mode recorded", "[dry] CUDA_MODULE_LOADING recorded", "[dry] tool verdict"):
        assert results[what] == "PASS", what
    commands = (out / "commands.txt").read_text()
    for what in ("[control] vecadd under the sample-pattern tool", "[control] memcheck on one out-of-bounds load",
                 "[LD_PRELOAD, lazy loading] vecadd under gpu_probes", "[LD_PRELOAD, eager loading] vecadd under gpu_probes",
                 "[CUDA_INJECTION64_PATH] vecadd under gpu_probes", "[aggregation] vecadd plain",
                 "[aggregation] vecadd gpu", "[aggregation] vecadd cpu", gc.GRAPH_DEVICE, f"{gc.GRAPH_DEVICE}: build"):
        assert f"# {what}\n" in commands, what
    assert "CUDA_MODULE_LOADING=LAZY GPU_PROBES_DIR=" in commands and "CUDA_MODULE_LOADING=EAGER" in commands
    assert "GP_CONTROL_TRACE=3072 LD_PRELOAD=" in commands
    built = out / "dry-status"
    assert len(list(built.glob("gpu_probes.*.sanitizer.bin"))) == 1


CONTROL_OUT = """gp_control: subscribed, patches from /x/control_patches.fatbin
vecadd n=1024 ok a=0x7f0000000000 b=0x7f0000001000 c=0x7f0000002000
gp_control: _Z6vecaddPKfS0_Pfi loads=2048 stores=1024 traced=0 pages=0 copy_ms=0.000 agg_ms=0.000
"""


def test_control_rows_pass_exact_counts_and_fail_one_off(gc) -> None:
    lines = gc.CONTROL_LINE.findall(CONTROL_OUT)
    assert gc.control_rows(lines, 1024) == [("[control] vecadd launches seen", 1, 1),
                                            ("[control] global loads counted", 2048, 2048),
                                            ("[control] global stores counted", 1024, 1024)]
    off = gc.CONTROL_LINE.findall(CONTROL_OUT.replace("loads=2048", "loads=2047"))
    assert [want == got for _, want, got in gc.control_rows(off, 1024)] == [True, False, True]
    assert gc.control_rows([], 1024) == [("[control] vecadd launches seen", 1, 0)]


MEMCHECK_OUT = """========= COMPUTE-SANITIZER
========= Invalid __global__ read of size 4 bytes
=========     at oob_read(const int *, int *, int)+0x70
=========     by thread (0,0,0) in block (0,0,0)
=========     Address 0x7f3a2e000400 is out of bounds
oob_read done: no error
========= ERROR SUMMARY: 1 error
"""


def test_memcheck_rows_want_exactly_one_invalid_read(gc) -> None:
    assert [(w, g) for _, w, g in gc.memcheck_rows(MEMCHECK_OUT)] == [(1, 1), ("ERROR SUMMARY: 1 error",
                                                                              "ERROR SUMMARY: 1 error")]
    clean = "========= ERROR SUMMARY: 0 errors\n"
    assert [(w, g) for _, w, g in gc.memcheck_rows(clean)] == [(1, 0), ("ERROR SUMMARY: 1 error",
                                                                       "ERROR SUMMARY: 0 errors")]


def _status_file(path: Path, **fields) -> Path:
    with DeviceFileWriter(path, pid=4242, backend=schema.DeviceBackend.sanitizer) as w:
        w.tool_status(host_mono=1, stage=1, injection_mode=1, loading_mode=1, rc_subscribe=0)
        w.tool_status(host_mono=2, stage=3, injection_mode=1, loading_mode=1, rc_subscribe=0, rc_add_patches=0,
                      rc_patch_instructions=0, rc_patch_module=0, rc_set_callback_data=0, rc_set_launch_data=0,
                      rc_loaded_status=0, modules_patched=1, launches=1, launches_with_data=1, **fields)
    return path


def test_status_rows_of_a_run_whose_patches_got_no_buffer_fail_and_say_so(gc, tmp_path: Path) -> None:
    p = _status_file(tmp_path / "null.bin", rc_fallback_read=0, patch_null_calls=3 * 1024)
    d, reader = gc.read_device([p], sys.executable)
    assert reader == "pasta_trace.device"
    tab = gc.Table()
    gc.status_rows(tab, d, "t", "LD_PRELOAD", {"CUDA_MODULE_LOADING": "LAZY"})
    rows = {r[0]: r[1:] for r in tab.rows}
    assert rows["[t] TOOL_STATUS records"] == ("1 process", "1 process(es)", "PASS")
    assert rows["[t] injection mode recorded"] == ("1", "1", "PASS")
    assert rows["[t] CUDA_MODULE_LOADING recorded"] == ("1", "1", "PASS")
    assert rows["[t] tool verdict"] == (gc.WORKED, "the patches ran but never got their buffer (NULL userdata)", "FAIL")
    assert rows["[t] tool status"][1].startswith("pid 4242: sanitizer via LD_PRELOAD, CUDA_MODULE_LOADING lazy: ")
    # the same run loaded through the driver's variable would be said wrong, and eager loading too
    tab = gc.Table()
    gc.status_rows(tab, d, "t", "CUDA_INJECTION64_PATH", {"CUDA_MODULE_LOADING": "EAGER"}, want=None)
    assert [r[3] for r in tab.rows if "recorded" in r[0]] == ["FAIL", "FAIL"]


def test_status_rows_pass_a_run_that_worked_and_fail_files_nothing_could_read(gc, tmp_path: Path) -> None:
    p = _status_file(tmp_path / "ok.bin", rc_fallback_read=0, patch_data_calls=4)
    d, _ = gc.read_device([p], sys.executable)
    assert [r["host_mono"] for r in d["tool_status"]] == [1, 2]
    tab = gc.Table()
    gc.status_rows(tab, d, "t")
    assert tab.rows[-1] == ("[t] tool verdict", gc.WORKED, gc.WORKED, "PASS")
    # no interpreter with pasta_trace.device: no status is made up, the row fails and the run with it
    d, reader = gc.read_device([p], None)
    assert reader == "nothing"
    tab = gc.Table()
    gc.status_rows(tab, d, "t", "LD_PRELOAD", {"CUDA_MODULE_LOADING": "LAZY"})
    assert tab.rows == [("[t] TOOL_STATUS records", "1 process", "0 process(es)", "FAIL")] and tab.failed


def _fake_run(gc, monkeypatch, answer) -> list:
    """gpu_check's run() replaced: answer(cmd, env) gives (rc, output) as the GPU machine would."""
    calls = []

    def run(cmd, env=None, timeout=120, cwd=None):
        calls.append((cmd, env))
        rc, out = answer(cmd, env or {})
        return rc, out, 0.5

    monkeypatch.setattr(gc, "run", run)
    return calls


def test_control_step_on_the_output_a_gpu_would_give(gc, tmp_path: Path, monkeypatch) -> None:
    m = {"artifacts": {"vecadd": str(tmp_path / "build/vecadd")}}
    calls = _fake_run(gc, monkeypatch, lambda cmd, env: (0, CONTROL_OUT))
    tab = gc.Table()
    gc.control(tab, m, 1024, tmp_path)
    assert [r[3] for r in tab.rows] == ["PASS"] * 4
    (cmd, env), = calls
    assert cmd == [str(tmp_path / "build/vecadd"), "1024", "0", "1"]
    assert env["LD_PRELOAD"] == str(tmp_path / "build/libgp_control.so") and "GP_CONTROL_TRACE" not in env
    assert (tmp_path / "control.txt").read_text() == CONTROL_OUT


def test_aggregation_step_times_both_sides_and_compares_their_pages(gc, tmp_path: Path, monkeypatch) -> None:
    n = 1024
    m = {"artifacts": {"vecadd": str(tmp_path / "vecadd"), "sanitizer": "/x/libgpu_probes_sanitizer.so"}}
    pages = np.array([10, 11, 20, 30], dtype=np.uint64)

    def answer(cmd, env):
        if env.get("GP_CONTROL_TRACE"):
            assert env["GP_CONTROL_TRACE"] == str(3 * n) and cmd[1:] == [str(n), "0", "6"]
            line = f"gp_control: {gc.VECADD} loads={2 * n} stores={n} traced={3 * n} pages=4 copy_ms=1 agg_ms=2\n"
            return 0, line * 6 + "vecadd_launch_ms=5.0000 over 5 launches\n"
        if "GPU_PROBES_DIR" in env:
            with DeviceFileWriter(Path(env["GPU_PROBES_DIR"]) / "gpu_probes.7.sanitizer.bin", pid=7,
                                  backend=schema.DeviceBackend.sanitizer) as w:
                for lid in range(1, 7):  # the last launch's pages are the ones compared
                    w.page_hist(lid, pages if lid == 6 else pages[:1], np.ones(len(pages) if lid == 6 else 1))
            return 0, "vecadd_launch_ms=0.5000 over 5 launches\n"
        return 0, "vecadd_launch_ms=0.0100 over 5 launches\n"

    _fake_run(gc, monkeypatch, answer)
    tab = gc.Table()
    gc.aggregation_ratio(tab, m, n, sys.executable, tmp_path)
    rows = {r[0]: r[1:] for r in tab.rows}
    assert rows["[aggregation] CPU-side trace / GPU-side aggregation, per launch"][1] == \
        "10.0x (5.000 / 0.500 ms; plain 0.010 ms)"
    assert rows["[aggregation] CPU side traced every access"] == (str(3 * n), str(3 * n), "PASS")
    assert rows["[aggregation] distinct pages, GPU side = CPU side"] == ("4", "4", "PASS")
    assert [r[3] for r in tab.rows if r[0].startswith("[aggregation] vecadd")] == ["PASS"] * 3


def test_a_failed_instrumented_run_still_shows_how_far_the_tool_got(gc, tmp_path: Path, monkeypatch) -> None:
    """A run that failed leaves its status: here the tool was injected and subscribed, and nothing after."""
    m = {"artifacts": {"vecadd": "/x/vecadd", "sanitizer": "/x/libgpu_probes_sanitizer.so"}}

    def answer(cmd, env):
        assert env["CUDA_INJECTION64_PATH"] == "/x/libgpu_probes_sanitizer.so" and env["GPU_PROBES_KEEP_STATUS"] == "1"
        with DeviceFileWriter(Path(env["GPU_PROBES_DIR"]) / "gpu_probes.9.sanitizer.bin", pid=9,
                              backend=schema.DeviceBackend.sanitizer) as w:
            w.tool_status(host_mono=1, stage=1, injection_mode=2, loading_mode=0, rc_subscribe=0)
        return 1, "vecadd: cudaMalloc(&a, n * sizeof(float)): initialization error\n"

    _fake_run(gc, monkeypatch, answer)
    tab = gc.Table()
    gc.vecadd_under_sanitizer(tab, m, 1024, "inj", "CUDA_INJECTION64_PATH", {}, sys.executable, tmp_path)
    rows = {r[0]: r[1:] for r in tab.rows}
    assert rows["[inj] vecadd runs instrumented"] == ("exit 0, result ok", "exit 1 (0.5 s)", "FAIL")
    assert rows["[inj] injection mode recorded"] == ("2", "2", "PASS")
    assert rows["[inj] CUDA_MODULE_LOADING recorded"] == ("0", "0", "PASS")
    assert rows["[inj] tool verdict"] == (gc.WORKED, "no module patched (none was loaded or launched)", "FAIL")
    assert rows["[inj] tool status"][1].endswith("ended before its final status (init)")
    assert "[inj] device files written" not in rows  # the run failed: no counts are compared
