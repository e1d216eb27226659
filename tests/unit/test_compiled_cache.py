"""probes/compiled_cache without BCC: the map fd relocation of handcrafted
programs, what makes a program uncacheable, entries that do not read back
whole, and the directory it refuses."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest

from pasta_trace.commands import record
from pasta_trace.probes import compiled_cache as cc

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="the cache is root's: its checks need root")


def insn(code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
    return struct.pack("<BBhi", code, src << 4 | dst, off, imm)


def ld_map(dst: int, fd: int) -> bytes:
    return insn(cc.LD_IMM64, dst, cc.PSEUDO_MAP_FD, imm=fd) + insn(0)


def program(fd_a: int, fd_b: int) -> bytes:
    """r1 = map a; r2 = 0x1_0000_0007 (a constant whose halves look like an fd); call 1; r1 = map b; exit."""
    return b"".join([
        ld_map(1, fd_a),
        insn(cc.LD_IMM64, 2, 0, imm=7) + insn(0, imm=1),
        insn(cc.CALL, imm=1),
        ld_map(1, fd_b),
        insn(0xB7, 0, imm=0),  # r0 = 0
        insn(0x95),  # exit
    ])


def test_map_fds_are_moved_to_the_new_modules_maps():
    h = cc.normalise(program(7, 9), {9: 0, 7: 1})
    assert h.relocs == [(0, 1), (5, 0)]
    assert h.code == program(0, 0)
    assert cc.patch(h, [31, 30]) == program(30, 31)


@pytest.mark.parametrize("code, why", [
    (insn(cc.LD_IMM64, 1, 2, imm=7) + insn(0), "ld_imm64 with src_reg 2 at instruction 0"),  # a map value
    (insn(0xB7) + insn(cc.CALL, src=1, imm=3), "a call with src_reg 1 at instruction 1"),  # BPF-to-BPF
    (insn(cc.CALL, src=2, imm=3), "a call with src_reg 2 at instruction 0"),  # kfunc
    (ld_map(1, 8), "fd 8 at instruction 0 is none of the module's maps"),
    (insn(0x95)[:5], "5 bytes is not a whole number of instructions"),
])
def test_other_relocations_are_refused(code, why):
    with pytest.raises(cc.Uncacheable) as e:
        cc.normalise(code, {7: 0})
    assert str(e.value) == why


def entry() -> cc.Entry:
    maps = [cc.MapSpec("events", 27, 0, 0, 4194304, 0), cc.MapSpec("pid_filter", 1, 4, 1, 4096, 0)]
    return cc.Entry(maps, {"pt_e_a": cc.normalise(program(3, 4), {3: 0, 4: 1}),
                           "pt_r_a": cc.normalise(ld_map(1, 4) + insn(0x95), {3: 0, 4: 1})})


def test_an_entry_reads_back_whole():
    e = entry()
    assert cc.decode(cc.encode(e)) == e


@pytest.mark.parametrize("damage", ["truncated", "flipped", "magic", "empty"])
def test_a_damaged_entry_does_not_decode(damage):
    data = bytearray(cc.encode(entry()))
    if damage == "truncated":
        data = data[: len(data) // 2]
    elif damage == "flipped":
        data[-3] ^= 0x40
    elif damage == "magic":
        data[7] += 1  # another format version
    else:
        data = bytearray()
    with pytest.raises(Exception):
        cc.decode(bytes(data))


def test_relocations_that_miss_a_map_reference_do_not_decode():
    e = entry()
    e.handlers["pt_r_a"].relocs = []  # its map reference would be loaded with fd 0
    with pytest.raises(ValueError, match="relocations do not match"):
        cc.decode(cc.encode(e))


@needs_root
def test_a_corrupt_entry_is_a_miss_and_is_replaced(tmp_path):
    with cc.Cache(tmp_path / "bpf") as cache:
        cache.put("k", entry())
        assert cache.get("k") == entry()
        f = tmp_path / "bpf" / ("k" + cc.SUFFIX)
        f.write_bytes(f.read_bytes()[:-10])
        assert cache.get("k") is None
        cache.put("k", entry())
        assert cache.get("k") == entry()
        assert sorted(p.name for p in (tmp_path / "bpf").iterdir()) == ["k" + cc.SUFFIX]


@needs_root
def test_the_most_recently_used_entries_are_kept(tmp_path):
    with cc.Cache(tmp_path / "bpf", keep=3) as cache:
        for i, k in enumerate("abcd"):
            cache.put(k, entry())
            os.utime(tmp_path / "bpf" / (k + cc.SUFFIX), ns=(i * 10**9, i * 10**9))
        assert cache.get("b") is not None  # used: now the most recent
        cache.put("e", entry())
        assert [n for n, _ in cache.entries()] == [k + cc.SUFFIX for k in ("e", "b", "d")]


@needs_root
def test_an_entry_others_can_write_is_a_miss(tmp_path):
    with cc.Cache(tmp_path / "bpf") as cache:
        cache.put("k", entry())
        (tmp_path / "bpf" / ("k" + cc.SUFFIX)).chmod(0o620)
        assert cache.get("k") is None


@needs_root
def test_the_directory_is_made_root_only(tmp_path):
    with cc.Cache(tmp_path / "a" / "bpf"):
        pass
    st = (tmp_path / "a" / "bpf").stat()
    assert (st.st_uid, st.st_mode & 0o777) == (0, 0o700)


@needs_root
@pytest.mark.parametrize("kind, why", [("group-writable", "writable by others than root"),
                                       ("not-root", "not owned by root")])
def test_a_directory_others_can_change_is_refused(tmp_path, kind, why):
    d = tmp_path / "bpf"
    d.mkdir(mode=0o700)
    if kind == "group-writable":
        d.chmod(0o770)
    else:
        os.chown(d, 65534, 65534)
    with pytest.raises(cc.Refused) as e:
        cc.Cache(d)
    assert str(e.value) == f"not using {d}: {why}"


@needs_root
def test_a_link_to_a_directory_is_refused(tmp_path):
    (tmp_path / "real").mkdir(mode=0o700)
    (tmp_path / "bpf").symlink_to(tmp_path / "real")
    with pytest.raises(cc.Refused) as e:
        cc.Cache(tmp_path / "bpf")
    assert str(e.value) == f"cannot use {tmp_path / 'bpf'}: Not a directory"  # O_NOFOLLOW | O_DIRECTORY


def test_no_bpf_cache_turns_it_off():
    import argparse

    p = argparse.ArgumentParser()
    record.add_arguments(p)
    p.add_argument("-v", "--verbose", action="store_true")
    assert record._options(p.parse_args(["-p", "1"])).bpf_cache is True
    assert record._options(p.parse_args(["--no-bpf-cache", "-p", "1"])).bpf_cache is False


def test_the_key_is_the_text_and_what_compiled_it():
    pytest.importorskip("bcc")
    assert cc.key("a") == cc.key("a") != cc.key("b")
    assert len(cc.key("a")) == 64
    assert cc._libbcc_path() is None or Path(cc._libbcc_path()).name.startswith("libbcc.so")


@needs_root
def test_doctor_says_what_the_cache_holds(tmp_path):
    d = tmp_path / "bpf"
    assert cc.state(d) == (True, f"{d}: not made yet (the first capture makes it)")
    assert not d.exists()  # doctor makes nothing
    with cc.Cache(d) as cache:
        cache.put("k", entry())
    size = (d / ("k" + cc.SUFFIX)).stat().st_size
    assert cc.state(d) == (True, f"{d}: 1 programs, {size // 1024} KiB")
    d.chmod(0o770)
    assert cc.state(d) == (False, f"not using {d}: writable by others than root: every capture compiles all its handlers")
