"""Traced libraries in a Python environment (PyTorch's libc10.so in a venv):
found from the interpreter's path without running it, listed by --dry-run
for a launched Python program and by doctor for the active environment."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from pasta_trace import cli
from pasta_trace.capture.procs import python_env
from pasta_trace.commands import doctor

C10 = ["_ZN3c1027reportMemoryUsageToProfilerEPvlmmNS_6DeviceE", "_ZN3c1025ProfiledCPUMemoryReporter3NewEPvm",
       "_ZN3c1025ProfiledCPUMemoryReporter6DeleteEPv"]


@pytest.fixture
def venv(tmp_path: Path, c10_stub: Path) -> tuple[Path, Path]:
    """(its python, its torch/lib/libc10.so): a venv's layout, with a library beside that is not traced."""
    env = tmp_path / "env"
    (env / "bin").mkdir(parents=True)
    (env / "bin" / "python3.11").symlink_to(sys.executable)
    (env / "pyvenv.cfg").write_text("home = /nowhere/bin\ninclude-system-site-packages = false\n")
    lib = env / "lib" / "python3.11" / "site-packages" / "torch" / "lib"
    lib.mkdir(parents=True)
    shutil.copy(c10_stub, lib / "libc10.so")
    shutil.copy(c10_stub, lib / "libtorch_cpu.so")
    return env / "bin" / "python3.11", lib / "libc10.so"


def test_found_from_the_interpreter_path_and_pythonpath(venv, tmp_path: Path, c10_stub: Path) -> None:
    python, libc10 = venv
    assert python_env.traced_libraries(str(python), {}) == [str(libc10)]
    extra = tmp_path / "pp" / "torch" / "lib"
    extra.mkdir(parents=True)
    shutil.copy(c10_stub, extra / "libc10.so")
    assert python_env.traced_libraries(str(python), {"PYTHONPATH": str(tmp_path / "pp")}) == sorted(
        [str(libc10), str(extra / "libc10.so")])
    assert python_env.traced_libraries("sh", {"PYTHONPATH": str(tmp_path / "pp")}) == []


def test_dry_run_of_a_python_program_lists_libc10_with_what_would_attach(venv, capsys) -> None:
    python, libc10 = venv
    assert cli.main(["--dry-run", "-v", "--", str(python), "train.py"]) == 0
    out = capsys.readouterr().out.splitlines()
    st = libc10.stat()
    assert f"{libc10} (c10, dev {st.st_dev} inode {st.st_ino}, via {libc10}): would attach 3 functions, 0 missing" \
        in out
    assert out[-1] == ("later loads of libcuda.so*/libcudart.so*/libamdhip64.so*/libc10.so*/libnccl.so* "
                       "would be caught when opened")


def test_doctor_lists_the_active_environments_libc10(venv, monkeypatch) -> None:
    python, libc10 = venv
    monkeypatch.setenv("VIRTUAL_ENV", str(python.parent.parent))
    monkeypatch.setattr(doctor, "_python_envs", lambda: [str(python)])
    checks = [c for c in doctor._library_checks(verbose=False) if str(libc10) in c.what]
    assert [c.line() for c in checks] == [
        f"ok   {libc10} (c10; python env {python.parent.parent}): 3 probes would attach, 0 probed functions missing"]
