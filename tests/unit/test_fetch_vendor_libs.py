"""scripts/fetch_vendor_libs.sh without the network: an `apt-get` stand-in on
PATH records the private sources list it is given and hands out a .deb built
here, so the choice of suite, the cache directory of each driver, the version
check and the messages the real-driver tests skip with are checked exactly."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from test_probe_catalog import ROOT, vendor_libcuda  # noqa: E402

SCRIPT = ROOT / "scripts" / "fetch_vendor_libs.sh"
LIB = "usr/lib/x86_64-linux-gnu/nvidia/current/libcuda.so.1"

FAKE_APT = """#!/bin/sh
# apt-get stand-in: keeps the sources list; `update` fails with $FAKE_UPDATE_ERR
# when set; `download` drops $FAKE_DEB into the current directory.
for a; do case $a in Dir::Etc::SourceList=*) cp "${a#*=}" "$FAKE_LOG/sources.list" ;; esac; done
case " $* " in
  *" update "*) if [ -n "$FAKE_UPDATE_ERR" ]; then echo "$FAKE_UPDATE_ERR"; exit 100; fi ;;
  *" download "*) cp "$FAKE_DEB" . ;;
esac
"""


def _deb(tmp: Path, version: str) -> Path:
    root = tmp / f"pkg-{version}"
    (root / "DEBIAN").mkdir(parents=True)
    (root / "DEBIAN" / "control").write_text(
        f"Package: libcuda1\nVersion: {version}\nArchitecture: amd64\nMaintainer: t <t@t>\nDescription: t\n"
    )
    (root / LIB).parent.mkdir(parents=True)
    (root / LIB).write_text(version)
    deb = tmp / f"libcuda1_{version}_amd64.deb"
    subprocess.run(["dpkg-deb", "-Zgzip", "--build", str(root), str(deb)], check=True, capture_output=True)
    return deb


@pytest.fixture
def fake_apt(tmp_path, monkeypatch):
    if shutil.which("dpkg-deb") is None:
        pytest.skip("dpkg-deb is not installed (not a Debian machine)")
    bin_dir, log = tmp_path / "bin", tmp_path / "log"
    bin_dir.mkdir()
    log.mkdir()
    (bin_dir / "apt-get").write_text(FAKE_APT)
    (bin_dir / "apt-get").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_LOG", str(log))
    monkeypatch.setenv("FAKE_UPDATE_ERR", "")
    monkeypatch.setenv("PASTA_VENDOR_CACHE", str(tmp_path / "cache"))
    return tmp_path


def _fetch(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, timeout=60)


def test_550_comes_from_trixie_into_its_own_directory(fake_apt, monkeypatch):
    cache = fake_apt / "cache"
    monkeypatch.setenv("FAKE_DEB", str(_deb(fake_apt, "550.163.01-2")))
    r = _fetch("--driver", "550")
    assert (r.returncode, r.stdout, r.stderr) == (0, f"{cache}/libcuda1-550/{LIB}\n", "")
    assert (cache / "libcuda1-550" / "VERSION").read_text() == "550.163.01-2\n"
    assert sorted(os.listdir(cache)) == ["libcuda1-550"]  # 535's directory untouched, no unpacking left over
    lines = (fake_apt / "log" / "sources.list").read_text().splitlines()
    assert lines and len(set(lines)) == len(lines)
    assert {ln.split()[-3] for ln in lines} == {"trixie"}  # this machine's suites replaced
    assert all(ln.endswith(" main non-free") and "security" not in ln for ln in lines)
    # fetched once: the next call answers from the cache, even with apt failing
    monkeypatch.setenv("FAKE_UPDATE_ERR", "E: no network")
    assert _fetch("--driver", "550").stdout == r.stdout
    assert vendor_libcuda("550") == (f"{cache}/libcuda1-550/{LIB}", "550.163.01-2")


def test_535_keeps_this_machines_suites(fake_apt, monkeypatch):
    monkeypatch.setenv("FAKE_DEB", str(_deb(fake_apt, "535.261.03-1")))
    r = _fetch()
    assert (r.returncode, r.stdout) == (0, f"{fake_apt}/cache/libcuda1/{LIB}\n")
    assert "trixie" not in (fake_apt / "log" / "sources.list").read_text()


def test_a_mirror_with_another_driver_is_refused(fake_apt, monkeypatch):
    monkeypatch.setenv("FAKE_DEB", str(_deb(fake_apt, "535.261.03-1")))
    r = _fetch("--driver", "550")
    assert (r.returncode, r.stdout) == (3, "")
    assert r.stderr == "cannot fetch libcuda1 (550, Debian trixie): the mirror has libcuda1 535.261.03-1\n"
    assert os.listdir(fake_apt / "cache") == []


def test_an_unfetchable_driver_skips_with_the_reason(fake_apt, monkeypatch):
    monkeypatch.setenv("FAKE_UPDATE_ERR", "E: The repository 'http://deb.debian.org/debian trixie Release' is gone")
    with pytest.raises(pytest.skip.Exception) as skipped:
        vendor_libcuda("550")
    assert str(skipped.value) == (
        "NVIDIA libcuda1 550 not available: cannot fetch libcuda1 (550, Debian trixie): apt-get update with "
        "non-free failed: E: The repository 'http://deb.debian.org/debian trixie Release' is gone"
    )


@pytest.mark.parametrize("args", [("--driver", "560"), ("--driver",), ("--driver", "550", "a", "b")])
def test_usage_errors_exit_2(args):
    r = _fetch(*args)
    assert (r.returncode, r.stdout, r.stderr) == (2, "", f"usage: {SCRIPT} [--driver 535|550] [CACHE_DIR]\n")
