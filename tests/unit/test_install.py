"""A non-editable install finds its BPF sources (shipped as pasta_trace/bpf)
and the HTML report's page, style sheet and script (package data)."""

import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from test_tools_capture import write_capture

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A venv with the package installed from a wheel built from this tree: (venv, its site-packages)."""
    tmp_path = tmp_path_factory.mktemp("install")
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
    return venv, site


@pytest.mark.slow
def test_wheel_install_prints_the_bpf_program(installed: tuple[Path, Path], tmp_path: Path) -> None:
    venv, site = installed
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


@pytest.mark.slow
def test_wheel_install_renders_the_html_report(installed: tuple[Path, Path], tmp_path: Path) -> None:
    """The page's skeleton, style sheet and script come from the wheel, inlined: one file, nothing to load."""
    venv, site = installed
    assets = site / "pasta_trace" / "reporters" / "html"
    for name in ("page.html", "style.css", "script.js"):
        assert (assets / name).read_bytes() == (ROOT / "pasta_trace" / "reporters" / "html" / name).read_bytes()
    cap = write_capture(tmp_path / "cap")
    out = subprocess.run([str(venv / "bin" / "pasta-trace"), "report", str(cap), "--html", str(tmp_path / "r.html")],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    page = (tmp_path / "r.html").read_text()
    assert page.startswith('<!DOCTYPE html><html lang="en">') and page.endswith("</script></body></html>\n")
    style, script = (assets / "style.css").read_text(), (assets / "script.js").read_text()
    assert page.count("<style>\n" + style) == 1 and page.count("<script>\n" + script + "</script>") == 1
    assert f"<title>pasta-trace report: {cap}</title>" in page
    # every placeholder of page.html filled (the script's own ${...} are JavaScript's), nothing linked
    rest = page.replace(script, "")
    assert "${" not in rest and "<link" not in rest and "src=" not in rest
