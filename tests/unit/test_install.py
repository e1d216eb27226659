"""A non-editable install finds its BPF sources (shipped as pasta_trace/bpf)."""

import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_wheel_install_prints_the_bpf_program(tmp_path: Path) -> None:
    # a clean copy: an in-tree build/ left by an earlier build would carry stale files into the wheel
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".git", ".venv", "build", "*.egg-info", "__pycache__"))
    wheels = tmp_path / "wheels"
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", str(src), "-w", str(wheels)],
        capture_output=True, text=True, timeout=300,
    )
    if built.returncode != 0 and "build dependencies" in built.stderr:
        pytest.skip(f"cannot fetch the build backend: {built.stderr.strip().splitlines()[-1]}")
    assert built.returncode == 0, built.stderr
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    # the dependencies come from this environment; the package itself only from the wheel
    (site / "_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q",
         "--no-deps", "--ignore-installed", *map(str, wheels.glob("*.whl"))],
        check=True, timeout=300,
    )
    where = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import pasta_trace.probes.program as p; print(p.BPF_DIR)"],
        cwd=tmp_path, capture_output=True, text=True, check=True,
    )
    assert Path(where.stdout.strip()) == site / "pasta_trace" / "bpf"
    out = subprocess.run([str(venv / "bin" / "pasta-trace"), "--print-bpf", "-a"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    for src in ("cuda.bpf.c", "hip.bpf.c", "nccl.bpf.c", "discover.bpf.c"):
        body = (ROOT / "bpf" / src).read_text().strip()
        assert body.splitlines()[-1] in out.stdout, src
