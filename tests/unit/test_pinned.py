"""probes.pinned: a library file is kept only when the descriptor opened is
the very file (device, inode) a process has; everything after goes through
/proc/self/fd of that descriptor."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from pasta_trace.probes import elf, pinned


def test_the_first_candidate_that_is_the_file_is_kept_and_reached_through_our_descriptor(tmp_path):
    real, decoy = tmp_path / "real", tmp_path / "decoy"
    real.write_bytes(b"real")
    decoy.write_bytes(b"decoy")
    os.mkfifo(tmp_path / "fifo")  # opened with O_PATH: no wait for a writer
    st = real.stat()
    pin = pinned.pin(st.st_dev, st.st_ino, [str(tmp_path / "gone"), str(tmp_path / "fifo"), str(decoy), str(real)])
    try:
        assert (pin.dev, pin.inode, pin.source) == (st.st_dev, st.st_ino, str(real))
        real.rename(tmp_path / "moved")
        decoy.rename(real)  # another file at the path now: the pin still reaches the first
        assert Path(pin.path).read_bytes() == b"real"
    finally:
        pin.close()
    assert pin.fd == -1


def test_no_candidate_is_the_file(tmp_path):
    real, decoy = tmp_path / "real", tmp_path / "decoy"
    real.write_bytes(b"real")
    decoy.write_bytes(b"decoy")
    st = real.stat()
    with pytest.raises(pinned.IdentityError) as e:
        pinned.pin(st.st_dev, st.st_ino, [str(decoy)])
    assert e.value.errno == errno.ESTALE
    d = decoy.stat()
    assert e.value.strerror == (f"not the file the process has (device {st.st_dev} inode {st.st_ino}): "
                                f"{decoy} is another file now (device {d.st_dev} inode {d.st_ino})")
    with pytest.raises(pinned.IdentityError) as e:
        pinned.pin(st.st_dev, st.st_ino, [str(tmp_path / "gone")])
    assert e.value.errno == errno.ENOENT  # gone: the process exited, or the file went


def test_a_process_s_own_mapping_reaches_the_mapped_file():
    """This process maps libc: its map_files link is found by (device, inode) and read as ELF."""
    libc = next(line.split(None, 5)[5] for line in Path("/proc/self/maps").read_text().splitlines()
                if line.rstrip().endswith(".so.6") and "/libc" in line)
    st = os.stat(libc)
    found = list(pinned.mapped_files(os.getpid(), st.st_dev, st.st_ino))
    assert found and all(p.startswith(f"/proc/{os.getpid()}/map_files/") for p in found)
    pin = pinned.pin(st.st_dev, st.st_ino, found[:1])
    try:
        assert elf.build_id(pin.path) == elf.build_id(libc)
    finally:
        pin.close()
