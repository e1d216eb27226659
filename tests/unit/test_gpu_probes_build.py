"""gpu_probes builds here without a GPU: the Sanitizer patches carry every
patch function as a global function in each embedded cubin, the injection
library exports InitializeInjection, needs no CUDA driver symbol, and loads and
initialises cleanly (with CUDA_INJECTION64_PATH's entry point and through
LD_PRELOAD) on a machine with no GPU."""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from elftools.elf.elffile import ELFFile

from pasta_trace import schema

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "scripts/build_gpu_probes.sh"
SAN_PATCHES = ["gp_san_global_access", "gp_san_shared_access", "gp_san_local_access", "gp_san_block_enter",
               "gp_san_block_exit"]
NV_FUNCS = ["gp_nv_instr", "gp_nv_mem", "gp_nv_block_enter", "gp_nv_block_exit"]
FATBIN_MAGIC = 0xBA55ED50


def _nvcc() -> str | None:
    return shutil.which("nvcc") or next(iter(sorted(Path("/usr/local").glob("cuda*/bin/nvcc"))), None)


@pytest.fixture(scope="module")
def manifest() -> dict:
    if _nvcc() is None:
        pytest.skip("nvcc not installed: gpu_probes cannot be built here")
    env = {k: v for k, v in os.environ.items() if k != "NVBIT_HOME"}
    r = subprocess.run([str(BUILD)], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    m = json.loads((ROOT / "gpu_probes/build/manifest.json").read_text())
    if m["artifacts"]["sanitizer"] is None:
        pytest.skip("the Sanitizer backend was skipped: " + r.stdout)
    return m


def fatbin_cubins(blob: bytes) -> dict[int, bytes]:
    """sm arch -> cubin ELF, for every cubin entry of the fatbin containers in `blob`."""
    out: dict[int, bytes] = {}
    off = 0
    while off + 16 <= len(blob):
        magic, _ver, hsize, size = struct.unpack_from("<IHHQ", blob, off)
        if magic != FATBIN_MAGIC:
            off += 8
            continue
        e, end = off + hsize, off + hsize + size
        while e < end:
            kind, _v, ehsize, psize = struct.unpack_from("<HHII", blob, e)
            arch = struct.unpack_from("<I", blob, e + 28)[0]
            flags = struct.unpack_from("<Q", blob, e + 40)[0]
            payload = blob[e + ehsize:e + ehsize + psize]
            if kind == 2:
                assert not flags & 0x8000, "compressed cubin: the build must not compress the patches"
                assert payload[:4] == b"\x7fELF"
                out[arch] = payload
            e += ehsize + psize
        off = end
    return out


def global_funcs(cubin: bytes) -> set[str]:
    import io
    elf = ELFFile(io.BytesIO(cubin))
    return {s.name for s in elf.get_section_by_name(".symtab").iter_symbols()
            if s["st_info"]["bind"] == "STB_GLOBAL" and s["st_info"]["type"] == "STT_FUNC"}


def symbol_bytes(lib: Path, name: str) -> bytes:
    with lib.open("rb") as f:
        elf = ELFFile(f)
        sym = elf.get_section_by_name(".dynsym").get_symbol_by_name(name)[0]
        sec = elf.get_section(sym["st_shndx"])
        start = sym["st_value"] - sec["sh_addr"] + sec["sh_offset"]
        f.seek(start)
        head = f.read(16)
        _, _, hsize, size = struct.unpack("<IHHQ", head)
        return head + f.read(hsize - 16 + size)


def test_manifest_lists_absolute_built_artefacts(manifest: dict) -> None:
    a = manifest["artifacts"]
    for key in ["sanitizer", "sanitizer_patches", "nvbit_device"]:
        assert Path(a[key]).is_absolute() and Path(a[key]).is_file(), key
    assert {"sm_80", "sm_90"} <= set(manifest["archs"])
    assert manifest["sanitizer_api_version"].startswith(manifest["nvcc_version"] + ".")
    assert a["nvbit"] is None and manifest["skipped"] == {"nvbit": "NVBIT_HOME not set"}


def test_every_patch_is_a_global_function_in_each_embedded_cubin(manifest: dict) -> None:
    embedded = symbol_bytes(Path(manifest["artifacts"]["sanitizer"]), "gp_san_patches_fatbin")
    assert embedded == Path(manifest["artifacts"]["sanitizer_patches"]).read_bytes()
    cubins = fatbin_cubins(embedded)
    assert sorted(f"sm_{a}" for a in cubins) == sorted(manifest["archs"])
    for arch, cubin in cubins.items():
        assert set(SAN_PATCHES) <= global_funcs(cubin), arch


def test_nvbit_device_functions_compile_for_each_arch(manifest: dict) -> None:
    with open(manifest["artifacts"]["nvbit_device"], "rb") as f:
        sec = ELFFile(f).get_section_by_name(".nv_fatbin")
        cubins = fatbin_cubins(sec.data())
    assert sorted(f"sm_{a}" for a in cubins) == sorted(manifest["archs"])
    for arch, cubin in cubins.items():
        assert set(NV_FUNCS) <= global_funcs(cubin), arch


def test_injection_library_exports_initialize_and_needs_no_driver_symbol(manifest: dict) -> None:
    out = subprocess.run(["nm", "-D", manifest["artifacts"]["sanitizer"]], capture_output=True, text=True,
                         check=True).stdout.splitlines()
    defined = {line.split()[-1]: line.split()[-2] for line in out if len(line.split()) == 3}
    undefined = {line.split()[-1] for line in out if len(line.split()) == 2}
    assert defined["InitializeInjection"] == "T"
    assert not [s for s in undefined if s.startswith("cu")]
    assert "sanitizerSubscribe" in undefined


def _alive_header_then_gone(tmp_path: Path, r: subprocess.CompletedProcess) -> dict:
    """The header a process printed of its own file while it ran; the file must be gone once it exited."""
    assert r.returncode == 0, r.stderr
    *_, pid, header = r.stdout.split()
    raw = bytes.fromhex(header)
    rec = np.frombuffer(raw[:schema.DEV_FILE_HEADER.size], dtype=schema.DEV_FILE_HEADER.dtype)[0]
    # it reached no CUDA, so it recorded nothing: its header-only file was removed at exit
    assert list(tmp_path.iterdir()) == []
    return {name: int(rec[name]) for name in rec.dtype.names} | {"size": len(raw), "self": int(pid)}


# Prints the caller's pid and the hex of its own device file, as it stands while the process runs.
_SHOW_OWN_FILE = ("import os, pathlib\n"
                  "f = pathlib.Path(os.environ['GPU_PROBES_DIR']) / f'gpu_probes.{os.getpid()}.sanitizer.bin'\n"
                  "print(os.getpid(), f.read_bytes().hex())\n")


def test_no_gpu_dlopen_and_initialize_returns_cleanly(manifest: dict, tmp_path: Path) -> None:
    code = ("import ctypes, os, sys\n"
            f"lib = ctypes.CDLL({manifest['artifacts']['sanitizer']!r})\n"
            "print(lib.InitializeInjection(), lib.InitializeInjection())\n" + _SHOW_OWN_FILE)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env=os.environ | {"GPU_PROBES_DIR": str(tmp_path)})
    h = _alive_header_then_gone(tmp_path, r)
    # subscribed (libsanitizer needs no GPU for that): 1, as the driver expects of a working injection
    assert r.stdout.split()[:2] == ["1", "1"]
    assert (h["magic"], h["ver_major"], h["ver_minor"], h["header_size"], h["pid"], h["backend"], h["page_shift"],
            h["size"]) == (schema.DEVICE_MAGIC, *schema.DEVICE_FORMAT_VERSION, 64, h["self"],
                           schema.DeviceBackend.sanitizer, 16, 64)
    assert h["mono_open"] <= h["mono_after"]


def test_ld_preload_initialises_from_the_constructor(manifest: dict, tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-c", _SHOW_OWN_FILE], capture_output=True, text=True,
                       timeout=60, env=os.environ | {"GPU_PROBES_DIR": str(tmp_path), "GPU_PROBES_PAGE_SHIFT": "21",
                                                     "LD_PRELOAD": manifest["artifacts"]["sanitizer"]})
    h = _alive_header_then_gone(tmp_path, r)
    assert (h["pid"], h["page_shift"], h["size"]) == (h["self"], 21, 64)


def test_unwritable_output_dir_is_one_line_and_the_program_runs_on(manifest: dict, tmp_path: Path) -> None:
    r = subprocess.run(["/bin/echo", "still here"], capture_output=True, text=True, timeout=60,
                       env=os.environ | {"GPU_PROBES_DIR": str(tmp_path / "missing"),
                                         "LD_PRELOAD": manifest["artifacts"]["sanitizer"]})
    assert (r.returncode, r.stdout) == (0, "still here\n")
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpu_probes: cannot write the device record file: ")
    assert "No such file or directory" in lines[0]


def test_build_without_nvcc_prints_one_skipped_line(tmp_path: Path) -> None:
    r = subprocess.run([str(BUILD)], capture_output=True, text=True, env=os.environ | {"NVCC": "/nonexistent/nvcc"})
    assert (r.returncode, r.stderr) == (0, "")
    assert r.stdout.splitlines() == ["SKIPPED: gpu_probes: nvcc not found (install the CUDA toolkit 13.0 or set NVCC)"]


def test_build_is_fast_and_says_nvbit_skipped_when_up_to_date(manifest: dict) -> None:
    env = {k: v for k, v in os.environ.items() if k != "NVBIT_HOME"}
    r = subprocess.run([str(BUILD)], capture_output=True, text=True, env=env)
    assert r.returncode == 0
    assert [ln for ln in r.stdout.splitlines() if "NVBIT" in ln] == ["SKIPPED: NVBIT_HOME not set"]


def test_as_cuda_injection_the_static_initializer_subscribes_and_initialize_injection_reports(
        manifest: dict, tmp_path: Path) -> None:
    """Loaded through CUDA_INJECTION64_PATH, the static initializer subscribes at load, as NVIDIA's samples do
    (no module load can come before it); the driver's InitializeInjection then returns 1, and again if called again."""
    lib = manifest["artifacts"]["sanitizer"]
    code = ("import ctypes, os, sys\n"
            f"lib = ctypes.CDLL({lib!r})\n"
            "before = sorted(os.listdir(sys.argv[1]))\n"
            "rc = lib.InitializeInjection(), lib.InitializeInjection()\n"
            "print(len(before), *rc, len(os.listdir(sys.argv[1])))\n")
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=60,
                       env=os.environ | {"GPU_PROBES_DIR": str(tmp_path), "CUDA_INJECTION64_PATH": lib})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["1", "1", "1", "1"]


def test_gpu_check_program_compiles_here(manifest: dict) -> None:
    r = subprocess.run([str(BUILD), "--gpu-tests"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    m = json.loads((ROOT / "gpu_probes/build/manifest.json").read_text())
    exe = Path(m["artifacts"]["vecadd"])
    with exe.open("rb") as f:
        cubins = fatbin_cubins(ELFFile(f).get_section_by_name(".nv_fatbin").data())
    assert sorted(f"sm_{a}" for a in cubins) == sorted(m["archs"])
    assert all({"_Z6vecaddPKfS0_Pfi", "_Z9timer_resPyi"} <= global_funcs(c) for c in cubins.values())


def test_cupti_injection_without_a_driver_says_so_and_leaves_no_file(manifest: dict, tmp_path: Path) -> None:
    lib = manifest["artifacts"]["cupti"]
    if lib is None:
        pytest.skip("the CUPTI injection was not built (no toolkit CUPTI headers)")
    out = subprocess.run(["nm", "-D", lib], capture_output=True, text=True, check=True).stdout
    assert re.search(r"^[0-9a-f]+ T InitializeInjection$", out, re.M)
    code = f"import ctypes; print(ctypes.CDLL({lib!r}).InitializeInjection())"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env=os.environ | {"GPU_PROBES_DIR": str(tmp_path), "CUDA_INJECTION64_PATH": lib})
    assert (r.returncode, r.stdout) == (0, "0\n")
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpu_probes: CUPTI unavailable: ")
    assert list(tmp_path.iterdir()) == []


def test_a_forked_child_leaves_the_parents_file_alone(manifest: dict, tmp_path: Path) -> None:
    code = ("import os, sys\n"
            "pid = os.fork()\n"
            "if pid == 0:\n"
            "    sys.exit(0)\n"
            "print(pid, os.waitpid(pid, 0)[1], sorted(os.listdir(os.environ['GPU_PROBES_DIR'])))\n"
            + _SHOW_OWN_FILE)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env=os.environ | {"GPU_PROBES_DIR": str(tmp_path),
                                         "LD_PRELOAD": manifest["artifacts"]["sanitizer"]})
    h = _alive_header_then_gone(tmp_path, r)
    child, status, listing = r.stdout.split("\n")[0].split(" ", 2)
    assert int(status) == 0 and int(child) != h["self"]
    # after the child's exit, the parent's file was still there, whole, and the child had made none
    assert listing == repr([f"gpu_probes.{h['self']}.sanitizer.bin"])
    assert h["size"] == 64
