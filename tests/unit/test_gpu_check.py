"""scripts/gpu_check: without a GPU it stops at once with one clear line and
exit 3; its vecadd verdict passes exact counts and fails loudly on a wrong one
(checked on a synthetic device file, read through pasta_trace.device as the
script reads it: tests/gpu/programs/read_device.py).  The device files
that gpu_probes wrote on a real GPU (tests/fixtures/h200/README.md) are read
exactly, and the verdict on them is the one the H200 run printed, except where
that run's check itself was wrong."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from pasta_trace import schema
from pasta_trace.device import read_device_files
from pasta_trace.device.writer import DeviceFileWriter, entries
from pasta_trace.schema import DeviceBackend
from pasta_trace.schema import DeviceRecordType as RT

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts/gpu_check"
NO_GPU = "gpu_check: no usable NVIDIA GPU here ({}): nothing was checked. " \
         "Run it on a machine with an NVIDIA GPU and driver.\n"


def gpu_check_module():
    loader = importlib.machinery.SourceFileLoader("gpu_check", str(SCRIPT))
    spec = importlib.util.spec_from_loader("gpu_check", loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


def run(path_dirs: list[Path], tmp_path: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "LD_PRELOAD")}
    env["PATH"] = os.pathsep.join(map(str, path_dirs))
    return subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=60, env=env,
                          cwd=tmp_path)


def fake_smi(tmp_path: Path, body: str) -> Path:
    d = tmp_path / "bin"
    d.mkdir()
    p = d / "nvidia-smi"
    p.write_text("#!/bin/sh\n" + body + "\n")
    p.chmod(0o755)
    return d


def test_without_nvidia_smi_it_exits_3_at_once(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    r = run([empty], tmp_path)
    assert (r.returncode, r.stdout, r.stderr) == (3, "", NO_GPU.format("nvidia-smi not found"))


def test_driver_not_loaded_is_reported_with_nvidia_smis_reason(tmp_path: Path) -> None:
    msg = "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."
    r = run([fake_smi(tmp_path, f"echo \"{msg}\"; exit 9")], tmp_path)
    assert (r.returncode, r.stdout, r.stderr) == (3, "", NO_GPU.format(f"nvidia-smi failed: {msg}"))


def test_gpu_listed_but_no_libcuda_is_still_no_gpu(tmp_path: Path) -> None:
    r = run([fake_smi(tmp_path, "echo 'NVIDIA H200, 580.159, 9.0'")], tmp_path)
    assert r.returncode == 3 and r.stdout == ""
    assert r.stderr.startswith("gpu_check: no usable NVIDIA GPU here (libcuda.so.1 cannot be loaded (")
    assert r.stderr.count("\n") == 1


def synthetic_vecadd(path: Path, n: int, bases: list[int], gld: int) -> None:
    """What the Sanitizer backend writes for one vecadd launch of n floats (a, b, c 2 MiB aligned)."""
    shift = 16
    w = DeviceFileWriter(path, pid=77, backend=DeviceBackend.sanitizer, page_shift=shift)
    w.string(1, "_Z6vecaddPKfS0_Pfi")
    for b in bases:
        w.record(RT.ALLOC, address=b, size=4 * n)
    w.record(RT.LAUNCH, launch_id=1, name_id=1, grid_x=n // 256, block_x=256, host_mono_begin=10,
             host_mono_end=20)
    w.record(RT.CLOCK_SYNC, launch_id=1, host_mono_before=10, gpu_globaltimer=5_000, host_mono_after=90)
    w.record(RT.KERNEL_SUMMARY, launch_id=1, gpu_t_first=5_000, gpu_t_last=9_000, gld=gld, gst=n,
             gld_warp=2 * n // 32, gst_warp=n // 32, bytes=12 * n, blocks_in=n // 256, blocks_out=n // 256)
    pages = np.concatenate([np.arange(b >> shift, (b + 4 * n) >> shift, dtype=np.uint64) for b in bases])
    counts = np.full(len(pages), (1 << shift) // 4, dtype=np.uint64)
    w.page_hist(1, pages, counts, page_shift=shift)
    ent = entries(schema.DEV_ALLOC_TOUCH_ENTRY, alloc_base=np.array(bases, dtype=np.uint64),
                  touches=np.full(3, n, dtype=np.uint64), bytes=np.full(3, 4 * n, dtype=np.uint64),
                  unique_pages=np.full(3, (4 * n) >> shift, dtype=np.uint32))
    w._with_entries(RT.ALLOC_TOUCH, 1, entries(schema.DEV_ALLOC_TOUCH_HEADER, n=np.array([3])), ent)
    w.close()


def test_vecadd_verdict_exact_and_loud(tmp_path: Path) -> None:
    gc = gpu_check_module()
    n = 1 << 22
    bases = [0x7F0000000000, 0x7F0001000000, 0x7F0002000000]

    def verdict(gld: int) -> "gc.Table":
        p = tmp_path / f"gpu_probes.{gld}.sanitizer.bin"
        synthetic_vecadd(p, n, bases, gld)
        d = gc.read_device([p], sys.executable)[0]
        tab = gc.Table()
        gc.check_vecadd(tab, d, n, bases, "test")
        return tab

    good = verdict(2 * n)
    assert not good.failed, good.rows
    rows = {r[0]: r for r in good.rows}
    assert rows["[test] thread-level global loads"] == ("[test] thread-level global loads", str(2 * n), str(2 * n),
                                                        "PASS")
    assert rows["[test] distinct 64 KiB pages of a"][1:] == ("256", "256", "PASS")
    bad = verdict(2 * n - 1)
    assert bad.failed
    assert [r for r in bad.rows if r[3] == "FAIL"] == [
        ("[test] thread-level global loads", str(2 * n), str(2 * n - 1), "FAIL")]


def test_the_scripts_reader_gives_pasta_trace_devices_rows_on_the_golden_file() -> None:
    """Every frame the steps check, as the script's program prints it, is read_device_files' frame row for row
    (a value JSON cannot hold, as its string)."""
    import json

    gc = gpu_check_module()
    golden = ROOT / "tests/fixtures/golden/device_all_records.bin"
    got, reader = gc.read_device([golden], sys.executable)
    assert reader == "pasta_trace.device"
    want = read_device_files([golden])
    for frame in gc.DEVICE_FRAMES:
        assert got[frame] == json.loads(json.dumps(want.frames[frame].to_dicts(), default=str)), frame
    assert sum(map(len, (got[f] for f in gc.DEVICE_FRAMES))) > 8
    assert got["problems"] == want.problems == []
    assert [r["name"] for r in got["launches"]] == ["_Z6vecaddPKfS0_Pfi"]


def test_without_pasta_trace_device_every_read_says_why_and_its_rows_fail(tmp_path: Path) -> None:
    """No interpreter imports pasta_trace.device: nothing is read, and the vecadd rows fail on the reason."""
    gc = gpu_check_module()
    p = tmp_path / "gpu_probes.1.sanitizer.bin"
    synthetic_vecadd(p, 1024, [0x7F0000000000, 0x7F0001000000, 0x7F0002000000], 2048)
    why = "pasta_trace.device not importable here (needs polars and numpy: scripts/setup.sh)"
    d, reader = gc.read_device([p], None)
    assert (reader, d["problems"], d["launches"], d["final_status"]) == ("nothing", [why], [], [])
    tab = gc.Table()
    assert not gc.check_vecadd(tab, d, 1024, [0x7F0000000000, 0x7F0001000000, 0x7F0002000000], "t")
    assert tab.rows == [("[t] reader problems", "none", why, "FAIL"), ("[t] vecadd launches recorded", "1", "0", "FAIL")]


def test_torch_tensor_rows_compare_every_counter_and_fail_on_one_off(tmp_path: Path) -> None:
    """The PyTorch row: the CUDA tensor events of the workload's window, counted by the script's own snippet on a
    capture, against torch.cuda.memory_stats() deltas; one block missing fails its row."""
    import json

    from test_tools_tensors import K, M, MB, T0, _capture

    gc = gpu_check_module()
    cap = _capture(tmp_path / "cap")
    window = {"pid": 7, "t0": T0, "t1": T0 + 10_000}
    (tmp_path / "w.json").write_text(json.dumps(window))
    r = subprocess.run([sys.executable, gc.program("count_tensors.py"), str(cap), str(tmp_path / "w.json")],
                       capture_output=True, text=True, cwd=ROOT, env=gc._pyenv(), timeout=60)
    counted = json.loads(r.stdout)
    # the hand-written capture's cuda:0 rows: 7 blocks handed out, 3 taken back (one from before the capture)
    assert counted == {"allocs": 7, "frees": 3, "alloc_bytes": MB(6.75), "free_bytes": MB(4.5),
                       "allocated": MB(6.25), "reserved": MB(22)}
    stats = {**window, "delta": {"allocation.all.allocated": 7, "allocation.all.freed": 3,
                                 "allocated_bytes.all.allocated": MB(6.75), "allocated_bytes.all.freed": 4 * M + 512 * K},
             "allocated": MB(6.25), "reserved": MB(22)}
    tab = gc.Table()
    for what, expected, measured in gc.tensor_rows(counted, stats):
        tab.check(what, expected, measured)
    assert not tab.failed and len(tab.rows) == 6
    stats["delta"]["allocation.all.allocated"] = 8
    tab = gc.Table()
    for what, expected, measured in gc.tensor_rows(counted, stats):
        tab.check(what, expected, measured)
    assert [r for r in tab.rows if r[3] == "FAIL"] == [
        ("torch: tensor_alloc events = allocation.all.allocated", "8", "7", "FAIL")]


def test_torch_tensor_step_skips_without_cuda_torch(tmp_path: Path) -> None:
    gc = gpu_check_module()
    if subprocess.run([sys.executable, "-c", "import torch; assert torch.cuda.is_available()"],
                      capture_output=True).returncode == 0:
        pytest.skip("this interpreter has PyTorch with CUDA: the step would run")
    tab = gc.Table()
    gc.torch_tensor_events(tab, sys.executable, tmp_path)
    assert tab.rows == [("PyTorch tensor events", "-", "PyTorch with CUDA not importable", "SKIP")]
    assert not tab.failed


def test_nccl_verdict_passes_exact_calls_and_fails_a_wrong_size() -> None:
    mod = gpu_check_module()
    uid = bytes(range(128))
    assert mod.nccl_comm_id(uid) == schema.nccl_comm_id(uid)  # the script's stdlib copy of the hash
    counts = mod.NCCL_COUNTS
    calls = [{"count": c, "size": 4 * c, "ret": 0, "seq": i, "datatype": "float32"} for i, c in enumerate(counts)]
    comms = [{"rank": 0, "nranks": 1, "comm_id": mod.nccl_comm_id(uid)}]
    tab = mod.Table()
    mod.check_nccl(tab, calls, comms, counts, mod.nccl_comm_id(uid))
    assert [r[3] for r in tab.rows] == ["PASS"] * 4 and not tab.failed
    calls[1]["size"] = 4
    tab = mod.Table()
    mod.check_nccl(tab, calls, comms, counts, mod.nccl_comm_id(uid))
    assert [r[3] for r in tab.rows] == ["PASS", "FAIL", "PASS", "PASS"]


def test_attach_name_rows_pass_only_the_driver_object_name_the_driver_gives() -> None:
    """Each handle's row: ok only where the name read from the driver object
    (source driver_object) equals cuFuncGetName's; a refusal shows its reason."""
    gc = gpu_check_module()
    captured = [{"handle": 0x10, "name": "_Z6vecAddPKfS0_Pfi", "source": "driver_object", "reason": None},
                {"handle": 0x20, "name": "plain_c_kernel", "source": "driver_object", "reason": None},
                {"handle": 0x30, "name": "unknown@0x30", "source": "unknown", "reason": "no lookup seen; why"}]
    ref = {"0x10": "_Z6vecAddPKfS0_Pfi", "0x20": "_ZN2ns5innerEPd", "0x30": "plain_c_kernel", "0x40": None}
    assert gc.attach_name_rows("mixed", ref, captured, {"path": [0x30, 0x10], "reason": None}) == [
        ("[attach mixed] 0x10", "_Z6vecAddPKfS0_Pfi", "_Z6vecAddPKfS0_Pfi (driver_object)", True),
        ("[attach mixed] 0x20", "_ZN2ns5innerEPd", "plain_c_kernel (driver_object)", False),
        ("[attach mixed] 0x30", "plain_c_kernel", "unknown@0x30 (unknown): no lookup seen; why", False),
        ("[attach mixed] 0x40", "(driver gave no name)", "no row", None),
        ("[attach mixed] name offset", "-", "0x30+0x10", None),
    ]
    assert gc.attach_name_rows("module", {}, [], {"path": None, "reason": "offsets disagree"})[-1][2] == \
        "offsets disagree"


def test_attach_names_step_says_why_it_cannot_run_before_545(tmp_path: Path) -> None:
    gc = gpu_check_module()
    tab = gc.Table()
    gc.attach_names_probes(tab, "535.261.03", None, tmp_path)
    assert tab.rows == [("kernel names on attach", "-", "driver 535.261.03 < 545: no cuFuncGetName to compare with",
                         "SKIP")]


# --------------------------------------------------------------------------- files written on an H200

H200 = ROOT / "tests/fixtures/h200"
N = 1 << 22
VECADD = "_Z6vecaddPKfS0_Pfi"
#: a, b and c of that run (its own stdout); the driver put each inside a reservation of its own
A, B, C = 139701839200256, 139701293940736, 139701310717952


def test_cupti_file_of_vecadd() -> None:
    d = read_device_files([H200 / "vecadd.cupti.bin"])
    assert d.problems == []
    k = d.frames["cupti_kernels"]
    assert k.select("name", "grid_x", "grid_y", "block_x", "block_y").rows() == [(VECADD, N // 256, 1, 256, 1)]
    assert (k["end"] > k["start"]).all()
    m = d.frames["cupti_memcpy"].sort("start")
    # two host-to-device copies, then the result back, each of 4n bytes, one after another on one stream
    assert m.select("bytes", "copy_kind").rows() == [(4 * N, 1), (4 * N, 1), (4 * N, 2)]
    assert m["stream_id"].n_unique() == 1 and (m["start"].shift(-1) >= m["end"]).drop_nulls().all()
    # the kernel runs between the copies in, and the copy out
    assert m["end"][1] <= k["start"][0] and k["end"][0] <= m["start"][2]


def test_sanitizer_file_of_vecadd_under_ld_preload() -> None:
    d = read_device_files([H200 / "vecadd.sanitizer-preload.bin"])
    assert d.problems == []
    launch = d.frames["launches"]
    assert launch.select("name", "grid_x", "block_x").rows() == [(VECADD, N // 256, 256)]
    allocs = d.frames["allocs"]
    device = allocs.filter(pl.col("kind") == 0).filter(pl.col("size") == 4 * N)
    assert sorted(device["address"].to_list()) == sorted([A, B, C])
    virtual = allocs.filter(pl.col("kind") == 4)
    assert virtual.height == 6
    # every array lies inside a reservation the driver reported before it
    for base in (A, B, C):
        inside = virtual.filter((pl.col("address") <= base) & (pl.col("address") + pl.col("size") >= base + 4 * N))
        assert inside.height == 1
        assert inside["host_mono"][0] < device.filter(pl.col("address") == base)["host_mono"][0]
    assert sorted(d.frames["frees"]["address"].to_list()) == sorted([A, B, C])


def test_gpu_check_verdict_on_the_h200_sanitizer_file() -> None:
    """The allocation row passes (the reservations are not counted as arrays, as the H200 run's
    check wrongly did); the counter rows fail as they did there: no patch function ran."""
    gc = gpu_check_module()
    d = gc.read_device([H200 / "vecadd.sanitizer-preload.bin"], sys.executable)[0]
    tab = gc.Table()
    assert not gc.check_vecadd(tab, d, N, [A, B, C], "h200")
    rows = {r[0]: r[1:] for r in tab.rows}
    assert rows["[h200] ALLOC records of a, b, c"] == (f"3 x {4 * N} B", f"3 x {4 * N} B", "PASS")
    assert rows["[h200] vecadd launches recorded"] == ("1", "1", "PASS")
    assert rows["[h200] thread-level global loads"] == (str(2 * N), "0", "FAIL")
    assert rows["[h200] blocks entered / exited"] == (f"{N // 256} / {N // 256}", "0 / 0", "FAIL")
