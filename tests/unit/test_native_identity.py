"""Native frames of a process that has exited are read from its file only
while the path holds the file it mapped (stacks.native.AddressSpace._open):
the device and inode its saved maps line recorded."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from pasta_trace.stacks import native, unwind_table as ut


@pytest.fixture
def lib(tmp_path) -> Path:
    if shutil.which("gcc") is None:
        pytest.skip("gcc is missing")
    (tmp_path / "x.c").write_text("int mapped_fn(int x) { return x * 3; }\n")
    out = tmp_path / "mapped" / "libx.so"
    out.parent.mkdir()
    subprocess.run(["gcc", "-shared", "-fPIC", "-O0", "-o", str(out), str(tmp_path / "x.c")], check=True)
    return out


def space(tmp_path: Path, lib: Path, inode: int) -> native.AddressSpace:
    """The address space of PID 4242, exited: its live maps are empty, the saved ones map ``lib``."""
    proc = tmp_path / "proc"
    (proc / "4242").mkdir(parents=True, exist_ok=True)
    (proc / "4242" / "maps").write_text("")
    st = lib.stat()
    line = (f"7f0000000000-7f0000010000 r-xp 00000000 {os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x} "
            f"{inode} {lib}\n")
    return native.AddressSpace(4242, native.ModuleCache(tmp_path / "cache"), proc=proc, saved_maps=lambda pid: line)


def test_the_file_mapped_is_read(lib, tmp_path):
    m, tables = space(tmp_path, lib, lib.stat().st_ino).locate(0x7F0000000100)
    assert isinstance(tables, ut.Tables) and "mapped_fn" in tables.sym_name.tolist()


def test_another_file_at_the_path_is_not_read(lib, tmp_path):
    ino = lib.stat().st_ino
    secret = tmp_path / "secret.so"
    shutil.copy(lib, secret)
    lib.unlink()
    lib.symlink_to(secret)  # the path now leads elsewhere (here to a file like it, so only the identity tells)
    s = space(tmp_path, lib, ino)
    m, tables = s.locate(0x7F0000000100)
    assert tables is None
    dev = f"{os.major(secret.stat().st_dev):02x}:{os.minor(secret.stat().st_dev):02x}"
    assert s._modules.problems == {str(lib): f"cannot open: not the file the process mapped (device {dev} inode {ino})"}
