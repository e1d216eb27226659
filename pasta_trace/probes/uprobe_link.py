"""uprobes as BPF links of type uprobe_multi (Linux 6.6+), made with the bpf()
system call because BCC 0.26 cannot make them.

Why: a uprobe made by perf_event_open (BCC's way) is removed under the
kernel's event_mutex while it waits for an RCU grace period, so every removal
waits behind every other (0.05-0.25 s each on our machines: a minute for a
few hundred probes), and a new attach, by any tracer, waits behind them too.
A uprobe_multi link is released without that mutex, and closes made from
several threads share their grace periods.  Measured on the 2-core VM (load
~15): 100 perf-event uprobes closed from 16 threads 10.3 s; 200 uprobe_multi
links closed from 16 threads 0.96 s.

The handlers are loaded with the uprobe_multi attach type (the kernel refuses
to link a program loaded without it), so a process uses one way or the other
for all its probes: `available()` decides once, from the kernel's BTF."""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct
import weakref
from functools import lru_cache

BPF_LINK_CREATE = 28
BPF_TRACE_UPROBE_MULTI = 48
BPF_F_UPROBE_MULTI_RETURN = 1
_NR_BPF = {"x86_64": 321, "aarch64": 280}
#: union bpf_attr is larger; the kernel wants the bytes past link_create's fields zero
_ATTR_SIZE = 128


class LinkError(OSError):
    """bpf(BPF_LINK_CREATE) failed; errno and strerror say why."""


@lru_cache(maxsize=1)
def available() -> bool:
    """Whether this kernel makes uprobe_multi links (its BTF declares the
    link type) and we know the bpf() syscall number here.
    PASTA_TRACE_PERF_UPROBES=1 forces BCC's perf-event uprobes (to compare)."""
    if os.environ.get("PASTA_TRACE_PERF_UPROBES") == "1" or platform.machine() not in _NR_BPF:
        return False
    try:
        with open("/sys/kernel/btf/vmlinux", "rb") as f:
            return b"\0bpf_uprobe_multi_link\0" in f.read()
    except OSError:
        return False


def load(bpf, fn_name: str):
    """``fn_name`` of ``bpf`` loaded as our uprobe handlers are (once per BPF
    object).  A program that they tail-call must be loaded this way too: the
    kernel lets a program array hold only programs of its first user's attach type."""
    from bcc import BPF  # local: importing bcc needs the system package

    return bpf.load_func(fn_name.encode(), BPF.KPROBE,
                         attach_type=BPF_TRACE_UPROBE_MULTI if available() else -1)


def prog_fd(bpf, fn_name: str) -> int:
    """The handler ``fn_name`` loaded for uprobe_multi links."""
    return load(bpf, fn_name).fd


#: the links made for each BPF object, until `take` hands them over for closing
_links: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def made(bpf) -> list[int]:
    """The fds of the links made for ``bpf`` and not yet taken."""
    return list(_links.get(bpf, []))


def take(bpf) -> list[int]:
    """The fds of every link made for ``bpf`` since the last call (the caller closes them)."""
    return _links.pop(bpf, [])


_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def attach(bpf, fn_name: str, path: str, file_offset: int, *, retprobe: bool = False) -> int:
    """A uprobe (or uretprobe) running handler ``fn_name`` of ``bpf`` at
    ``file_offset`` of ``path``, for every process: the link's fd (kept for
    `take`), whose close removes it."""
    fd = _link(prog_fd(bpf, fn_name), path, file_offset, retprobe=retprobe)
    _links.setdefault(bpf, []).append(fd)
    return fd


def _link(prog: int, path: str, file_offset: int, *, retprobe: bool = False) -> int:
    c_path = ctypes.create_string_buffer(os.fsencode(path))
    offsets = (ctypes.c_uint64 * 1)(file_offset)
    attr = ctypes.create_string_buffer(_ATTR_SIZE)
    # link_create: prog_fd, target_fd, attach_type, flags; then uprobe_multi:
    # path, offsets, ref_ctr_offsets, cookies, cnt, flags, pid
    struct.pack_into("=IIII", attr, 0, prog, 0, BPF_TRACE_UPROBE_MULTI, 0)
    struct.pack_into("=QQQQIII", attr, 16, ctypes.addressof(c_path), ctypes.addressof(offsets), 0, 0, 1,
                     BPF_F_UPROBE_MULTI_RETURN if retprobe else 0, 0)
    fd = _libc.syscall(_NR_BPF[platform.machine()], BPF_LINK_CREATE, attr, _ATTR_SIZE)
    if fd < 0:
        err = ctypes.get_errno() or errno.EINVAL
        raise LinkError(err, f"cannot attach at {path}+{file_offset:#x}: {os.strerror(err)}")
    return int(fd)
