"""DeviceSession: the environment each backend gets, its errors, and collecting the files."""

from __future__ import annotations

import json
import os

import pytest

from pasta_trace import schema
from pasta_trace.device import read_device_files
from pasta_trace.device.inject import BOOTSTRAP_DIR, DEFAULT_MANIFEST, DeviceSession
from pasta_trace.device.writer import DeviceFileWriter, device_file_name
from pasta_trace.errors import EXIT_RUNTIME, EXIT_USAGE, PastaError, UsageError
from pasta_trace.safe_output import OutputDir


def _out(path):
    return OutputDir.claim(path, force=False)


@pytest.fixture
def built(tmp_path):
    """A build manifest naming two real files, as scripts/build_gpu_probes.sh writes it."""
    libs = tmp_path / "build"
    libs.mkdir()
    (libs / "libgpu_probes_sanitizer.so").write_bytes(b"\x7fELF")
    (libs / "libgpu_probes_nvbit.so").write_bytes(b"\x7fELF")
    m = libs / "manifest.json"
    m.write_text(json.dumps({
        "format_version": 1,
        "artifacts": {"sanitizer": str(libs / "libgpu_probes_sanitizer.so"), "nvbit": str(libs / "libgpu_probes_nvbit.so")},
    }))
    return m


def test_sanitizer_env(tmp_path, built, monkeypatch):
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    s = DeviceSession("sanitizer", _out(tmp_path / "cap"), page_shift=12, sample="warp:32", hash_slots=8192, manifest=built)
    assert s.env() == {
        "LD_PRELOAD": str(built.parent / "libgpu_probes_sanitizer.so"),
        "GPU_PROBES_DIR": str(s.staging),
        "GPU_PROBES_PAGE_SHIFT": "12",
        "GPU_PROBES_SAMPLE": "warp:32",
        "GPU_PROBES_HASH_SLOTS": "8192",
    }
    # beside the capture directory, which nobody but root may write in while it is recorded
    assert s.staging.is_dir() and s.staging.parent == tmp_path and s.staging.name.startswith(".cap.device-")


def test_options_left_out_are_not_set(tmp_path, built, monkeypatch):
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    s = DeviceSession("sanitizer", _out(tmp_path / "cap"), manifest=built)
    assert set(s.env()) == {"LD_PRELOAD", "GPU_PROBES_DIR"}


def test_the_real_build_manifest(tmp_path):
    """What scripts/build_gpu_probes.sh wrote here, if it ran."""
    if not DEFAULT_MANIFEST.is_file():
        pytest.skip("gpu_probes not built (scripts/build_gpu_probes.sh)")
    arts = json.loads(DEFAULT_MANIFEST.read_text())["artifacts"]
    if arts.get("sanitizer"):
        env = DeviceSession("sanitizer", _out(tmp_path / "s")).env()
        assert env["LD_PRELOAD"].split(":")[0] == arts["sanitizer"] and os.path.isabs(arts["sanitizer"])
    if arts.get("nvbit"):
        assert DeviceSession("nvbit", _out(tmp_path / "n")).env()["LD_PRELOAD"].split(":")[0] == arts["nvbit"]
    else:
        with pytest.raises(PastaError, match="^NVBit tool not built: set NVBIT_HOME"):
            DeviceSession("nvbit", _out(tmp_path / "n"))


def test_nvbit_env_keeps_an_existing_preload(tmp_path, built, monkeypatch):
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    lib = str(built.parent / "libgpu_probes_nvbit.so")
    s = DeviceSession("nvbit", _out(tmp_path / "cap"), page_shift=16, manifest=built)
    assert s.env() == {"LD_PRELOAD": lib, "GPU_PROBES_DIR": str(s.staging), "GPU_PROBES_PAGE_SHIFT": "16"}
    monkeypatch.setenv("LD_PRELOAD", "/usr/lib/libjemalloc.so.2")
    assert DeviceSession("nvbit", _out(tmp_path / "cap2"), manifest=built).env()["LD_PRELOAD"] == f"{lib}:/usr/lib/libjemalloc.so.2"


def test_cupti_env_puts_the_bootstrap_first(tmp_path, monkeypatch):
    pytest.importorskip("cupti", reason="cupti-python is not installed")
    monkeypatch.setenv("PYTHONPATH", "/opt/mine")
    s = DeviceSession("cupti", _out(tmp_path / "cap"))
    env = s.env()
    assert env["PYTHONPATH"] == f"{BOOTSTRAP_DIR}{os.pathsep}/opt/mine"
    assert (BOOTSTRAP_DIR / "sitecustomize.py").is_file()
    assert (os.path.isdir(os.path.join(env["PASTA_TRACE_PYTHONPATH"], "pasta_trace")), env["GPU_PROBES_DIR"]) == (
        True, str(s.staging),
    )


@pytest.mark.parametrize(
    "backend, message",
    [
        ("sanitizer", "Sanitizer backend not built: run scripts/build_gpu_probes.sh"),
        ("nvbit", "NVBit tool not built: set NVBIT_HOME and run scripts/build_gpu_probes.sh"),
    ],
)
def test_backend_not_built(tmp_path, backend, message):
    with pytest.raises(PastaError) as e:
        DeviceSession(backend, _out(tmp_path / "cap"), manifest=tmp_path / "no-manifest.json")
    assert (e.value.one_line(), e.value.exit_code) == (message, EXIT_RUNTIME)
    assert [p.name for p in tmp_path.iterdir()] == ["cap"]  # no staging for a backend that cannot run


@pytest.mark.parametrize("path", ["gone.so", None])
def test_manifest_naming_a_missing_or_skipped_artefact_means_not_built(tmp_path, built, path):
    built.write_text(json.dumps({"artifacts": {"sanitizer": path and str(tmp_path / path), "nvbit": None}}))
    with pytest.raises(PastaError, match="^Sanitizer backend not built: run scripts/build_gpu_probes.sh$"):
        DeviceSession("sanitizer", _out(tmp_path / "cap"), manifest=built)


def test_damaged_manifest(tmp_path):
    m = tmp_path / "manifest.json"
    m.write_text("{")
    with pytest.raises(PastaError) as e:
        DeviceSession("nvbit", _out(tmp_path / "cap"), manifest=m)
    assert e.value.one_line() == (
        f"{m}: unreadable build manifest (Expecting property name enclosed in double quotes: line 1 column 2 (char 1))"
        " (run scripts/build_gpu_probes.sh)"
    )


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"backend": "ptx"}, "unknown device backend 'ptx' (choose from sanitizer, nvbit, cupti)"),
        ({"page_shift": 40}, "page shift 40 is out of range (8..30, 16 = 64 KiB pages)"),
        ({"sample": "warp:0"}, "bad sampling 'warp:0' (off, warp:N or cta:K)"),
        ({"hash_slots": 4}, "page-hash slots 4 is too small (at least 8)"),
    ],
)
def test_usage_errors(tmp_path, built, kwargs, message):
    args = {"backend": "sanitizer", **kwargs}
    with pytest.raises(UsageError) as e:
        DeviceSession(args.pop("backend"), _out(tmp_path / "cap"), manifest=built, **args)
    assert (str(e.value), e.value.exit_code) == (message, EXIT_USAGE)


def test_finish_moves_every_process_file_into_device(tmp_path, built):
    cap = tmp_path / "cap"
    s = DeviceSession("sanitizer", _out(cap), manifest=built)
    staging = s.staging
    for pid in (300, 1200):
        with DeviceFileWriter(staging / device_file_name(pid, "sanitizer"), pid=pid, backend=schema.DeviceBackend.sanitizer) as w:
            w.string(1, f"kernel_of_{pid}")
    (cap / "device").mkdir()
    (cap / "device" / "gpu_probes.300.sanitizer.bin").write_bytes(b"from an earlier session")
    files = s.finish()
    assert files == [cap / "device" / "gpu_probes.1200.sanitizer.bin", cap / "device" / "gpu_probes.300.sanitizer.1.bin"]
    assert not staging.exists()
    assert (cap / "device" / "gpu_probes.300.sanitizer.bin").read_bytes() == b"from an earlier session"
    d = read_device_files(files)
    assert (d.problems, d.files["pid"].to_list()) == ([], [1200, 300])
    assert s.finish() == []


def test_finish_leaves_unexpected_files_in_staging(tmp_path, built):
    s = DeviceSession("sanitizer", _out(tmp_path / "cap"), manifest=built)
    (s.staging / "core.1234").write_bytes(b"x")
    assert s.finish() == []
    assert sorted(p.name for p in s.staging.iterdir()) == ["core.1234"]


def test_finish_takes_plain_files_only_never_a_link(tmp_path, built):
    """The staging folder is the launched user's: a link or a second name of
    another file planted there must not be copied into the capture."""
    victim = tmp_path / "victim"
    victim.write_bytes(b"not yours")
    s = DeviceSession("sanitizer", _out(tmp_path / "cap"), manifest=built)
    (s.staging / "gpu_probes.1.sanitizer.bin").symlink_to(victim)
    os.link(victim, s.staging / "gpu_probes.2.sanitizer.bin")
    os.mkfifo(s.staging / "gpu_probes.3.sanitizer.bin")
    assert s.finish() == []
    assert not (tmp_path / "cap" / "device").exists()
    assert victim.read_bytes() == b"not yours"


@pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")
def test_staging_belongs_to_the_sudo_user(tmp_path, built, monkeypatch):
    """Under sudo the capture goes where the user may write (here a directory
    of theirs that they can reach), and the staging beside it is made by them."""
    import shutil
    import tempfile

    theirs = tempfile.mkdtemp(prefix="pasta-staging-")
    try:
        os.chmod(theirs, 0o755)
        os.chown(theirs, 65534, 65534)
        monkeypatch.setenv("SUDO_UID", "65534")
        monkeypatch.setenv("SUDO_GID", "65534")
        s = DeviceSession("sanitizer", _out(os.path.join(theirs, "cap")), manifest=built)
        st = s.staging.stat()
        assert (st.st_uid, st.st_gid) == (65534, 65534)
    finally:
        shutil.rmtree(theirs)


def test_cupti_without_cupti_python(tmp_path, monkeypatch):
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)  # as on a machine without the wheel
    with pytest.raises(PastaError) as e:
        DeviceSession("cupti", _out(tmp_path / "cap"))
    assert e.value.one_line() == "CUPTI backend needs cupti-python (pip install 'pasta-trace[cupti]' (cupti-python 13.0))"
    assert [p.name for p in tmp_path.iterdir()] == ["cap"]  # no staging


def test_cupti_for_a_non_python_command_uses_the_c_injection_library(tmp_path):
    lib = tmp_path / "libgpu_probes_cupti.so"
    lib.write_bytes(b"\x7fELF")
    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps({"artifacts": {"cupti": str(lib)}}))
    s = DeviceSession("cupti", _out(tmp_path / "cap"), manifest=manifest, command=["./vecadd", "16"])
    env = s.env()
    assert env["CUDA_INJECTION64_PATH"] == str(lib)
    assert "PYTHONPATH" not in env
    py = DeviceSession("cupti", _out(tmp_path / "cap2"), manifest=manifest, command=["/usr/bin/python3.11", "train.py"])
    assert "CUDA_INJECTION64_PATH" not in py.env()
    assert py.env()["PYTHONPATH"].split(os.pathsep)[0].endswith("cupti_bootstrap")


def test_cupti_for_a_non_python_command_without_the_library_is_one_line(tmp_path):
    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps({"artifacts": {"cupti": None}}))
    with pytest.raises(PastaError, match="CUPTI injection library not built"):
        DeviceSession("cupti", _out(tmp_path / "cap"), manifest=manifest, command=["./app"])
