"""The Sanitizer injection's own account of itself (TOOL_STATUS, device format 1.1), without a GPU.

The library is loaded the way the driver loads it (dlopen, dlsym InitializeInjection, call it) and through
LD_PRELOAD; the status record it leaves is read back exactly by pasta_trace.device, and `report` shows it.
The C++ writer's bytes for a TOOL_STATUS are also in the golden file (test_gpu_probes_golden.py); here the
status of a whole run of the library itself.  The patch fatbin carries PTX of its highest architecture.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from pasta_trace import schema
from pasta_trace.device import read_device_file, read_device_files
from pasta_trace.device import writer as W
from pasta_trace.device.status import final_status, status_lines, verdict
from pasta_trace.schema import DeviceRecordType as RT

from test_gpu_probes_build import FATBIN_MAGIC, manifest  # noqa: F401  (the module's build fixture)
from test_tools_capture import write_capture

NOT_CALLED = schema.TOOL_STATUS_NOT_CALLED

# Loads the library as the driver does and prints what InitializeInjection returned, twice, then whether the
# library is still mapped after its handle was closed (pinned: RTLD_NODELETE).
_DRIVER_LOAD = """
import ctypes, os, sys, _ctypes
lib = ctypes.CDLL(sys.argv[1], mode=os.RTLD_NOW | os.RTLD_LOCAL)
init = lib.InitializeInjection
init.restype = ctypes.c_int
a, b = init(), init()
_ctypes.dlclose(lib._handle)
mapped = any(sys.argv[1] in line for line in open('/proc/self/maps'))
print(a, b, mapped, os.getpid())
"""


def _run(lib: str, tmp_path: Path, **env: str) -> tuple[list[str], subprocess.CompletedProcess]:
    r = subprocess.run([sys.executable, "-c", _DRIVER_LOAD, lib], capture_output=True, text=True, timeout=60,
                       env=os.environ | {"GPU_PROBES_DIR": str(tmp_path)} | env)
    assert r.returncode == 0, r.stderr
    return r.stdout.split(), r


def _status_row(path: Path) -> dict:
    d = read_device_file(path)
    assert d.problems == []
    rows = d.frames["tool_status"].to_dicts()
    assert len(rows) == 1
    return rows[0]


def _untouched(**over) -> dict:
    """The status of a library that subscribed and never got a CUDA callback."""
    return {"stage": int(schema.ToolStage.final), "rc_subscribe": 0,
            **{f: NOT_CALLED for f in ("rc_add_patches", "rc_patch_instructions", "rc_patch_module",
                                       "rc_set_callback_data", "rc_set_launch_data", "rc_loaded_status",
                                       "rc_fallback_read")},
            **{f: 0 for f in ("modules_patched", "modules_failed", "functions_not_loaded", "launches",
                              "launches_with_data", "patch_null_calls", "patch_data_calls")}} | over


def test_loaded_as_the_driver_does_initialize_injection_returns_1_pins_the_library_and_records_its_mode(
        manifest: dict, tmp_path: Path) -> None:  # noqa: F811
    lib = manifest["artifacts"]["sanitizer"]
    out, r = _run(lib, tmp_path, CUDA_INJECTION64_PATH=lib, CUDA_MODULE_LOADING="EAGER", GPU_PROBES_KEEP_STATUS="1")
    a, b, mapped, pid = out
    # subscribed in the static initializer (no GPU is needed for that): 1, as the driver expects, each time
    assert (a, b) == ("1", "1")
    assert mapped == "True", "dlclose unmapped the injection library: callbacks could point into nothing"
    path = tmp_path / f"gpu_probes.{pid}.sanitizer.bin"
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]
    row = _status_row(path)
    assert row["host_mono"] > 0
    del row["host_mono"]
    assert row == _untouched(pid=int(pid), injection_mode=int(schema.InjectionMode.injection),
                             loading_mode=int(schema.LoadingMode.eager))
    assert r.stderr == ""


@pytest.mark.parametrize("loading, mode", [("LAZY", schema.LoadingMode.lazy), ("", schema.LoadingMode.unset),
                                           ("weird", schema.LoadingMode.other)])
def test_preloaded_the_status_says_ld_preload_and_the_loading_mode(
        manifest: dict, tmp_path: Path, loading: str, mode: schema.LoadingMode) -> None:  # noqa: F811
    lib = manifest["artifacts"]["sanitizer"]
    code = "import os; print(os.getpid())"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env=os.environ | {"GPU_PROBES_DIR": str(tmp_path), "LD_PRELOAD": lib,
                                         "CUDA_MODULE_LOADING": loading, "GPU_PROBES_KEEP_STATUS": "1"})
    assert r.returncode == 0, r.stderr
    row = _status_row(tmp_path / f"gpu_probes.{r.stdout.strip()}.sanitizer.bin")
    del row["host_mono"]
    assert row == _untouched(pid=int(r.stdout), injection_mode=int(schema.InjectionMode.preload),
                             loading_mode=int(mode))


def test_without_keep_status_a_process_that_never_reached_cuda_leaves_no_file(
        manifest: dict, tmp_path: Path) -> None:  # noqa: F811
    out, _ = _run(manifest["artifacts"]["sanitizer"], tmp_path)
    assert out[:3] == ["1", "1", "True"]
    assert list(tmp_path.iterdir()) == []


def test_the_report_shows_the_device_status_of_the_library_run(manifest: dict, tmp_path: Path, capsys) -> None:  # noqa: F811
    """The file the library itself wrote, in a capture's device/ directory, in `report`'s header (JSON and terminal)."""
    from pasta_trace import cli

    cap = write_capture(tmp_path / "cap")
    dev = cap / "device"
    dev.mkdir()
    pid = _run(manifest["artifacts"]["sanitizer"], dev, GPU_PROBES_KEEP_STATUS="1", CUDA_MODULE_LOADING="LAZY")[0][3]
    line = (f"pid {pid}: sanitizer via LD_PRELOAD, CUDA_MODULE_LOADING lazy: subscribe ok, add-patches not called, "
            "patch-instructions not called, patch-module not called, loaded-status not called, set-callback-data "
            "not called, set-launch-data not called, fallback-read not called; modules patched 0, failed 0; "
            "launches 0, given their buffer 0, function not loaded 0; patch calls with buffer 0, without 0: "
            "no module patched (none was loaded or launched)")
    capsys.readouterr()
    assert cli.main(["report", str(cap), "--json", "--tool", "kernels"]) == 0
    assert json.loads(capsys.readouterr().out)["capture"]["device_status"] == [line]
    assert cli.main(["report", str(cap), "--tool", "kernels"]) == 0
    text = " ".join(capsys.readouterr().out.split())  # the table wraps the line: compare its words
    assert f"tool status {line}" in text


def test_python_writer_round_trips_tool_status_and_the_last_record_is_the_final_word(tmp_path: Path) -> None:
    p = tmp_path / "s.bin"
    with W.DeviceFileWriter(p, pid=77, backend=schema.DeviceBackend.sanitizer) as w:
        w.tool_status(host_mono=10, stage=int(schema.ToolStage.init), injection_mode=1, loading_mode=1, rc_subscribe=0)
        w.tool_status(host_mono=20, stage=int(schema.ToolStage.module), injection_mode=1, loading_mode=1,
                      rc_subscribe=0, rc_add_patches=0, rc_patch_instructions=0, rc_patch_module=0, modules_patched=1)
        w.tool_status(host_mono=30, stage=int(schema.ToolStage.final), injection_mode=1, loading_mode=1,
                      rc_subscribe=0, rc_add_patches=0, rc_patch_instructions=0, rc_patch_module=0,
                      rc_set_callback_data=0, rc_set_launch_data=0, rc_loaded_status=0, rc_fallback_read=0,
                      modules_patched=1, launches=2, launches_with_data=2, patch_null_calls=0, patch_data_calls=8)
    d = read_device_files([p])
    assert d.problems == []
    f = d.frames["tool_status"]
    assert dict(f.schema) == schema.DEVICE_FRAMES["tool_status"]
    assert f["host_mono"].to_list() == [10, 20, 30]
    assert f.row(0, named=True)["rc_add_patches"] == NOT_CALLED
    last = final_status(f).to_dicts()
    assert len(last) == 1 and last[0]["host_mono"] == 30 and last[0]["patch_data_calls"] == 8
    assert verdict(last[0]) == "the patches ran with their buffer"


def _row(**over) -> dict:
    return _untouched(pid=1, injection_mode=1, loading_mode=1, rc_add_patches=0, rc_patch_instructions=0,
                      rc_patch_module=0, modules_patched=1, launches=3, launches_with_data=3) | over


@pytest.mark.parametrize("over, said", [
    ({"rc_subscribe": 13, "modules_patched": 0}, "not subscribed (ERROR_NOT_INITIALIZED (13)): no callback, no patch"),
    ({"modules_patched": 0, "rc_add_patches": 12}, "no module patched (add-patches failed)"),
    ({"modules_patched": 0, "rc_patch_module": 1}, "no module patched (patch-module failed)"),
    ({"patch_null_calls": 40, "rc_fallback_read": 0}, "the patches ran but never got their buffer (NULL userdata)"),
    ({"patch_null_calls": 4, "patch_data_calls": 9}, "the patches ran; some calls got no buffer (NULL userdata)"),
    ({"patch_data_calls": 9}, "the patches ran with their buffer"),
    ({"launches": 0, "launches_with_data": 0}, "modules patched, no launch seen"),
    ({"launches_with_data": 0}, "no launch was given its buffer"),
    ({}, "no patch call reported back: the patches never ran, or ran with no buffer in every launch"),
])
def test_the_verdict_tells_the_zero_counter_cases_apart(over: dict, said: str) -> None:
    assert verdict(_row(**over)) == said


def test_status_lines_name_every_call_and_a_process_that_ended_early() -> None:
    f = pl.DataFrame([_row(stage=int(schema.ToolStage.module), host_mono=5, rc_set_launch_data=6,
                           rc_fallback_read=0, patch_data_calls=2)], schema=schema.DEVICE_FRAMES["tool_status"])
    assert status_lines(f) == [
        "pid 1: sanitizer via LD_PRELOAD, CUDA_MODULE_LOADING lazy: subscribe ok, add-patches ok, "
        "patch-instructions ok, patch-module ok, loaded-status not called, set-callback-data not called, "
        "set-launch-data ERROR_INVALID_OPERATION (6), fallback-read ok; modules patched 1, failed 0; launches 3, "
        "given their buffer 3, function not loaded 0; patch calls with buffer 2, without 0: the patches ran with "
        "their buffer; ended before its final status (module)"]


def fatbin_entries(blob: bytes) -> list[tuple[str, int]]:
    """(kind, arch) of every entry of every fatbin container in `blob`: kind "ptx" or "elf"."""
    out = []
    off = blob.find(struct.pack("<I", FATBIN_MAGIC))
    while off != -1 and off + 16 <= len(blob):
        _magic, _ver, hsize, size = struct.unpack_from("<IHHQ", blob, off)
        e, end = off + hsize, off + hsize + size
        while e < end:
            kind, _v, ehsize, psize = struct.unpack_from("<HHII", blob, e)
            out.append(({1: "ptx", 2: "elf"}[kind], struct.unpack_from("<I", blob, e + 28)[0]))
            e += ehsize + psize
        off = blob.find(struct.pack("<I", FATBIN_MAGIC), end)
    return out


def test_the_patch_fatbin_carries_ptx_of_its_highest_architecture_next_to_every_sass(manifest: dict) -> None:  # noqa: F811
    archs = sorted(int(a.removeprefix("sm_")) for a in manifest["archs"])
    entries = fatbin_entries(Path(manifest["artifacts"]["sanitizer_patches"]).read_bytes())
    assert sorted(entries) == sorted([("elf", a) for a in archs] + [("ptx", archs[-1])])


def test_record_h_declares_tool_status_as_the_schema_does() -> None:
    text = (Path(__file__).resolve().parents[2] / schema.DEVICE_HEADER_PATH).read_text()
    assert text == schema.device_c_header()
    assert f"#define GP_REC_TOOL_STATUS {int(RT.TOOL_STATUS)}" in text
    assert f"#define GP_VER_MINOR {schema.DEVICE_FORMAT_VERSION[1]}" in text
    assert schema.DEV_TOOL_STATUS.size == 96 and np.dtype(schema.DEV_TOOL_STATUS.dtype).itemsize == 96


def test_a_failed_subscribe_returns_0_to_the_driver_and_the_file_says_why(manifest: dict, tmp_path: Path) -> None:  # noqa: F811
    """The Sanitizer API has one subscriber per process: with gpu_check's control tool loaded first, ours
    cannot subscribe.  InitializeInjection then returns 0 (what the driver expects of an injection that
    failed), every time, and the file holds the subscribe's result."""
    from test_gpu_probes_build import BUILD

    r = subprocess.run([str(BUILD), "--gpu-tests"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    control = Path(manifest["artifacts"]["sanitizer"]).parent / "libgp_control.so"
    code = ("import ctypes, os, sys\n"
            "c = ctypes.CDLL(sys.argv[1])\n"
            "lib = ctypes.CDLL(sys.argv[2])\n"
            "print(c.InitializeInjection(), lib.InitializeInjection(), lib.InitializeInjection(), os.getpid())\n")
    r = subprocess.run([sys.executable, "-c", code, str(control), manifest["artifacts"]["sanitizer"]],
                       capture_output=True, text=True, timeout=60, env=os.environ | {"GPU_PROBES_DIR": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    control_rc, a, b, pid = r.stdout.split()
    assert (control_rc, a, b) == ("1", "0", "0")
    assert r.stderr.splitlines()[-1] == ("gpu_probes: sanitizerSubscribe(&t->sub, callback, t) failed: "
                                         "The maximum limit is reached")
    row = _status_row(tmp_path / f"gpu_probes.{pid}.sanitizer.bin")
    del row["host_mono"]
    assert row == _untouched(pid=int(pid), injection_mode=int(schema.InjectionMode.preload),
                             loading_mode=int(schema.LoadingMode.unset), rc_subscribe=10)
    assert verdict(row) == "not subscribed (ERROR_MAX_LIMIT_REACHED (10)): no callback, no patch"
