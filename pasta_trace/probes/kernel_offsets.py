"""Offsets of the few kernel struct members that bpf/discover.bpf.c reads, from
the running kernel's BTF (/sys/kernel/btf/vmlinux, through libbpf).

BCC compiles against whatever kernel headers are installed, and those often
belong to another kernel than the one running (a distribution's headers on a
newer kernel), so a member read through the headers' struct layout can read
the wrong bytes.  The running kernel's BTF is always right; the program gets
the offsets as #defines and reads each member with bpf_probe_read_kernel.
"""

from __future__ import annotations

import ctypes
from functools import lru_cache

from ..errors import PastaError
from .libbpf import lib

BTF_KIND_STRUCT = 4
BTF_KIND_UNION = 5

#: (define, struct, member path) read by discover.bpf.c to find the file behind a descriptor,
#: and a process's exit status (the daemon's exit triggers)
MEMBERS = (
    ("PT_OFF_TASK_FILES", "task_struct", "files"),
    ("PT_OFF_TASK_EXIT_CODE", "task_struct", "exit_code"),
    ("PT_OFF_FILES_FDT", "files_struct", "fdt"),
    ("PT_OFF_FDT_FD", "fdtable", "fd"),
    ("PT_OFF_FILE_INODE", "file", "f_inode"),
    ("PT_OFF_INODE_INO", "inode", "i_ino"),
    ("PT_OFF_INODE_SB", "inode", "i_sb"),
    ("PT_OFF_SB_DEV", "super_block", "s_dev"),
)


class _BtfType(ctypes.Structure):
    _fields_ = [("name_off", ctypes.c_uint32), ("info", ctypes.c_uint32), ("size", ctypes.c_uint32)]


class _BtfMember(ctypes.Structure):
    _fields_ = [("name_off", ctypes.c_uint32), ("type", ctypes.c_uint32), ("offset", ctypes.c_uint32)]


def _setup(libbpf) -> None:
    libbpf.btf__load_vmlinux_btf.restype = ctypes.c_void_p
    libbpf.btf__find_by_name_kind.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_uint32]
    libbpf.btf__find_by_name_kind.restype = ctypes.c_int32
    libbpf.btf__type_by_id.argtypes = [ctypes.c_void_p, ctypes.c_uint32]
    libbpf.btf__type_by_id.restype = ctypes.POINTER(_BtfType)
    libbpf.btf__resolve_type.argtypes = [ctypes.c_void_p, ctypes.c_uint32]
    libbpf.btf__resolve_type.restype = ctypes.c_int32
    libbpf.btf__name_by_offset.argtypes = [ctypes.c_void_p, ctypes.c_uint32]
    libbpf.btf__name_by_offset.restype = ctypes.c_char_p
    libbpf.btf__free.argtypes = [ctypes.c_void_p]


def _member_offset(libbpf, btf, type_id: int, member: str) -> int | None:
    """Byte offset of ``member`` in the struct ``type_id``, looking inside
    anonymous structs and unions (newer kernels wrap members in them)."""
    t = libbpf.btf__type_by_id(btf, type_id).contents
    kind, vlen, kflag = (t.info >> 24) & 0x1F, t.info & 0xFFFF, t.info >> 31
    if kind not in (BTF_KIND_STRUCT, BTF_KIND_UNION):
        return None
    base = ctypes.addressof(t) + ctypes.sizeof(_BtfType)
    members = (_BtfMember * vlen).from_address(base)
    for m in members:
        bits = m.offset & 0xFFFFFF if kflag else m.offset
        if m.name_off:
            if libbpf.btf__name_by_offset(btf, m.name_off) == member.encode():
                return bits // 8
            continue
        inner = libbpf.btf__resolve_type(btf, m.type)
        if inner > 0 and (off := _member_offset(libbpf, btf, inner, member)) is not None:
            return bits // 8 + off
    return None


@lru_cache(maxsize=1)
def discover_offsets() -> dict[str, int]:
    """{define: byte offset} for MEMBERS, from the running kernel."""
    libbpf = lib()
    _setup(libbpf)
    btf = libbpf.btf__load_vmlinux_btf()
    if not btf:
        raise PastaError("the kernel has no BTF (/sys/kernel/btf/vmlinux): late-loaded libraries cannot be found",
                         hint="use a kernel built with CONFIG_DEBUG_INFO_BTF=y")
    try:
        out = {}
        for define, struct, member in MEMBERS:
            tid = libbpf.btf__find_by_name_kind(btf, struct.encode(), BTF_KIND_STRUCT)
            off = _member_offset(libbpf, btf, tid, member) if tid > 0 else None
            if off is None:
                raise PastaError(f"this kernel's BTF has no {struct}.{member}: late-loaded libraries cannot be found")
            out[define] = off
        return out
    finally:
        libbpf.btf__free(btf)
