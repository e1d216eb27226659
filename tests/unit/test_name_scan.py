"""capture.naming.name_scan on synthetic memory: the name pointer of driver objects
is found only where every handle agrees and the strings are fatbin kernels."""

from __future__ import annotations

import struct

import pytest

from pasta_trace.capture.naming import name_scan
from pasta_trace.capture.naming.name_scan import scan

KERNELS = {"_Z6vecAddPKfS0_Pfi", "_Z5scaleIfEvPT_S0_i", "plain_c_kernel", "_ZN2ns5innerEPd"}


class Memory:
    """Regions of a fake address space; ``read`` behaves as /proc/PID/mem
    clipped to one mapping (fewer bytes at its end, None outside)."""

    def __init__(self) -> None:
        self.regions: dict[int, bytearray] = {}
        self._next = 0x100000

    def alloc(self, data: bytes) -> int:
        addr = self._next
        self.regions[addr] = bytearray(data)
        self._next += (len(data) + 0xFFF) & ~0xFFF or 0x1000
        return addr

    def string(self, s: str) -> int:
        return self.alloc(s.encode() + b"\0")

    def obj(self, slots: dict[int, int], size: int = 256) -> int:
        """An object of ``size`` bytes with u64 ``slots`` (offset -> value)."""
        data = bytearray(size)
        for off, v in slots.items():
            struct.pack_into("<Q", data, off, v)
        return self.alloc(bytes(data))

    def read(self, addr: int, size: int) -> bytes | None:
        for base, data in self.regions.items():
            if base <= addr < base + len(data):
                return bytes(data[addr - base: addr - base + size])
        return None


def decoys(mem: Memory) -> dict[int, int]:
    """Pointers to other strings and to memory that is no string, and a plain integer."""
    return {0x00: 0x1234, 0x08: mem.string("sm_80"), 0x18: mem.string("/tmp/module.cubin"),
            0x28: mem.alloc(b"\x01\x02\x03"), 0x30: mem.string(".text.vecAdd")}


def objects(mem: Memory, names: list[str], offset) -> list[int]:
    return [mem.obj({**decoys(mem), offset(i): mem.string(n)}) for i, n in enumerate(names)]


def test_direct_offset_names_every_handle():
    mem = Memory()
    names = ["_Z6vecAddPKfS0_Pfi", "plain_c_kernel", "_ZN2ns5innerEPd"]
    hs = objects(mem, names, lambda i: 0x58)
    r = scan(mem.read, hs, {}, KERNELS)
    assert (r.path, r.reason, r.handles_read) == ((0x58,), None, 3)
    assert r.names == dict(zip(hs, names))


def test_one_indirection():
    mem = Memory()
    names = ["_Z5scaleIfEvPT_S0_i", "plain_c_kernel"]
    infos = [mem.obj({**decoys(mem), 0x10: mem.string(n)}, size=64) for n in names]
    hs = [mem.obj({**decoys(mem), 0x40: info}) for info in infos]
    r = scan(mem.read, hs, {}, KERNELS)
    assert (r.path, r.reason) == ((0x40, 0x10), None)
    assert r.names == dict(zip(hs, names))
    assert scan(mem.read, hs, {}, KERNELS, depth=1).reason == name_scan.NO_OFFSET


def test_known_handle_checks_the_offset():
    """A handle named at run time must read its own name at the offset; a
    run-time name cut at the record's size matches the full string."""
    mem = Memory()
    hs = objects(mem, ["_Z6vecAddPKfS0_Pfi", "plain_c_kernel"], lambda i: 0x60)
    r = scan(mem.read, hs[1:], {hs[0]: "_Z6vecAddPKf"}, KERNELS, truncated_at=12)
    assert (r.path, r.names) == ((0x60,), {hs[1]: "plain_c_kernel"})
    wrong = scan(mem.read, hs[1:], {hs[0]: "_ZN2ns5innerEPd"}, KERNELS)
    assert (wrong.names, wrong.reason) == ({}, name_scan.WRONG_KNOWN)


@pytest.mark.parametrize("case, reason", [
    ("offset per handle", name_scan.DISAGREE),
    ("not fatbin names", name_scan.NO_OFFSET),
    ("two name offsets", name_scan.AMBIGUOUS),
    ("one handle", name_scan.ONE_HANDLE),
    ("unreadable handles", name_scan.NO_HANDLES),
    ("no fatbin kernels", name_scan.NO_CANDIDATES),
])
def test_refusals(case, reason):
    mem = Memory()
    names = ["_Z6vecAddPKfS0_Pfi", "plain_c_kernel", "_ZN2ns5innerEPd"]
    kernels = KERNELS
    if case == "offset per handle":
        hs = objects(mem, names, lambda i: 0x50 + 8 * i)
    elif case == "not fatbin names":
        hs = objects(mem, ["vecAdd", "plain", "inner"], lambda i: 0x58)
    elif case == "two name offsets":  # another slot names other kernels just as consistently
        hs = [mem.obj({0x58: mem.string(n), 0x70: mem.string(m)}) for n, m in zip(names, names[1:] + names[:1])]
    elif case == "one handle":
        hs = objects(mem, names[:1], lambda i: 0x58)
    elif case == "unreadable handles":
        hs = [0x5A0000001000, 0x5A0000001010]
    else:
        hs, kernels = objects(mem, names, lambda i: 0x58), set()
    r = scan(mem.read, hs, {}, kernels)
    assert (r.names, r.path, r.reason) == ({}, None, reason)


def test_object_at_the_end_of_a_mapping():
    """A short read (the object ends its mapping) is scanned as far as it goes."""
    mem = Memory()
    hs = [mem.alloc(struct.pack("<QQ", 7, mem.string(n))) for n in ("plain_c_kernel", "_ZN2ns5innerEPd")]
    r = scan(mem.read, hs, {}, KERNELS)
    assert (r.path, r.names) == ((8,), {hs[0]: "plain_c_kernel", hs[1]: "_ZN2ns5innerEPd"})
    assert name_scan.read_path(mem.read, hs[1], (8,), 64) == "_ZN2ns5innerEPd"
    assert name_scan.read_path(mem.read, hs[1], (0x400,), 64) is None
