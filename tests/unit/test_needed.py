"""capture.procs.needed: the libraries a program loads at start, found as ld.so
finds them, on real files built by cc."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from pasta_trace.capture.procs.needed import needed_files

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")


def _cc(args: list[str], cwd: Path) -> None:
    subprocess.run(["cc", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """bin/prog -> lib/libx.so (DT_RPATH $ORIGIN/../lib) -> deep/liby.so (libx's DT_RUNPATH
    $ORIGIN/../deep); elsewhere/libz.so through LD_LIBRARY_PATH only."""
    for d in ("bin", "lib", "deep", "elsewhere"):
        (tmp_path / d).mkdir()
    (tmp_path / "y.c").write_text("int y(void) { return 1; }\n")
    (tmp_path / "z.c").write_text("int z(void) { return 2; }\n")
    (tmp_path / "x.c").write_text("int y(void); int x(void) { return y(); }\n")
    (tmp_path / "p.c").write_text("int x(void); int z(void); int main(void) { return x() + z(); }\n")
    _cc(["-shared", "-fPIC", "y.c", "-o", "deep/liby.so"], tmp_path)
    _cc(["-shared", "-fPIC", "z.c", "-o", "elsewhere/libz.so"], tmp_path)
    _cc(["-shared", "-fPIC", "x.c", "-o", "lib/libx.so", "-Ldeep", "-ly", "-Wl,--enable-new-dtags",
         "-Wl,-rpath,$ORIGIN/../deep"], tmp_path)
    _cc(["p.c", "-o", "bin/prog", "-Llib", "-Lelsewhere", "-lx", "-lz", "-Wl,--disable-new-dtags",
         "-Wl,-rpath,$ORIGIN/../lib", "-Wl,-rpath-link,deep"], tmp_path)
    return tmp_path


def test_needed_files(tree: Path):
    found = needed_files(str(tree / "bin" / "prog"), {"LD_LIBRARY_PATH": str(tree / "elsewhere")}, {})
    mine = [f for f in found if f.startswith(str(tree))]
    assert mine == [str(tree / "lib" / "libx.so"), str(tree / "elsewhere" / "libz.so"), str(tree / "deep" / "liby.so")]
    assert any(Path(f).name.startswith("libc.so") for f in found)  # from the default directories


def test_unfound_library_is_left_out(tree: Path):
    """Without LD_LIBRARY_PATH, libz.so is not found (ld.so would refuse to start it)."""
    found = needed_files(str(tree / "bin" / "prog"), {}, {})
    assert [f for f in found if f.startswith(str(tree))] == [str(tree / "lib" / "libx.so"),
                                                               str(tree / "deep" / "liby.so")]


def test_ld_cache_is_used(tree: Path):
    found = needed_files(str(tree / "bin" / "prog"), {}, {"libz.so": str(tree / "elsewhere" / "libz.so")})
    assert str(tree / "elsewhere" / "libz.so") in found


def test_script_and_damaged_files(tree: Path):
    """A script to launch has no libraries of its own; a damaged library is left out, with what it needs."""
    script = tree / "run.sh"
    script.write_text("#!/bin/sh\nexec true\n")
    assert needed_files(str(script), {}, {}) == []
    (tree / "lib" / "libx.so").write_bytes(b"\x7fELF" + b"\xff" * 60)
    found = needed_files(str(tree / "bin" / "prog"), {"LD_LIBRARY_PATH": str(tree / "elsewhere")}, {})
    assert [f for f in found if f.startswith(str(tree))] == [str(tree / "lib" / "libx.so"),
                                                               str(tree / "elsewhere" / "libz.so")]
