"""ptrace(2) on x86-64 through ctypes: the few requests a remote call needs.

Every request about a thread must come from the thread of ours that seized it
(the kernel ties a tracee to one tracer thread), so a ``Tracee`` is used from
one thread only.  PTRACE_SEIZE, never PTRACE_ATTACH: a seized thread gets no
SIGSTOP, and when its tracer dies (even by SIGKILL) the kernel detaches it and
it runs on.
"""

from __future__ import annotations

import ctypes
import errno as errno_mod
import os
import struct

PTRACE_CONT = 7
PTRACE_DETACH = 17
PTRACE_SYSCALL = 24
PTRACE_GETREGS = 12
PTRACE_SETREGS = 13
PTRACE_GETREGSET = 0x4204
PTRACE_SETREGSET = 0x4205
PTRACE_SEIZE = 0x4206
PTRACE_INTERRUPT = 0x4207
PTRACE_GET_SYSCALL_INFO = 0x420E
PTRACE_O_TRACESYSGOOD = 1
PTRACE_EVENT_STOP = 128
NT_X86_XSTATE = 0x202
WAIT_ALL = 0x40000000
#: the largest XSAVE area a CPU has today is ~11 KiB (AMX tiles); the kernel fills in what it has
XSTATE_BUFFER = 16384
SYSCALL_INFO_ENTRY, SYSCALL_INFO_EXIT = 1, 2

_libc = ctypes.CDLL(None, use_errno=True)
_libc.ptrace.restype = ctypes.c_long
_libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]

REG_NAMES = ("r15", "r14", "r13", "r12", "rbp", "rbx", "r11", "r10", "r9", "r8", "rax", "rcx", "rdx", "rsi",
             "rdi", "orig_rax", "rip", "cs", "eflags", "rsp", "ss", "fs_base", "gs_base", "ds", "es", "fs", "gs")


class Regs(ctypes.Structure):
    """struct user_regs_struct (sys/user.h)."""

    _fields_ = [(n, ctypes.c_ulonglong) for n in REG_NAMES]

    def copy(self) -> "Regs":
        r = Regs()
        ctypes.pointer(r)[0] = self
        return r

    def as_tuple(self) -> tuple[int, ...]:
        return tuple(getattr(self, n) for n in REG_NAMES)


class _Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


class PtraceError(OSError):
    pass


def _call(req: int, tid: int, addr: int = 0, data: int | ctypes.c_void_p | None = 0) -> int:
    arg = data if isinstance(data, ctypes.c_void_p) else ctypes.c_void_p(data)
    r = _libc.ptrace(req, tid, ctypes.c_void_p(addr), arg)
    if r == -1:
        e = ctypes.get_errno()
        raise PtraceError(e, f"ptrace({req:#x}) on thread {tid}: {os.strerror(e)}")
    return r


class Tracee:
    """One seized thread: its stops, registers and memory."""

    def __init__(self, pid: int, tid: int) -> None:
        self.pid, self.tid = pid, tid
        self.seized = False
        self._mem = -1

    # ------------------------------------------------------------------ attach and stops

    def seize(self) -> None:
        _call(PTRACE_SEIZE, self.tid, 0, PTRACE_O_TRACESYSGOOD)
        self.seized = True

    def interrupt(self) -> None:
        _call(PTRACE_INTERRUPT, self.tid)

    def wait(self) -> int:
        """The next wait status of the thread (EINTR retried)."""
        while True:
            try:
                _, status = os.waitpid(self.tid, WAIT_ALL)
                return status
            except InterruptedError:
                continue

    def cont(self, sig: int = 0, *, syscall: bool = False) -> None:
        _call(PTRACE_SYSCALL if syscall else PTRACE_CONT, self.tid, 0, sig)

    def detach(self) -> None:
        if self._mem >= 0:
            os.close(self._mem)
            self._mem = -1
        if self.seized:
            self.seized = False
            try:
                _call(PTRACE_DETACH, self.tid, 0, 0)
            except PtraceError as e:
                if e.errno != errno_mod.ESRCH:
                    raise
                # not in a stop (or gone): a seized thread that runs is detached by waking it
                # into a stop first; one that is gone needs nothing
                try:
                    _call(PTRACE_INTERRUPT, self.tid)
                    self.wait()
                    _call(PTRACE_DETACH, self.tid, 0, 0)
                except (PtraceError, ChildProcessError):
                    pass

    # ------------------------------------------------------------------ registers

    def regs(self) -> Regs:
        r = Regs()
        _call(PTRACE_GETREGS, self.tid, 0, ctypes.c_void_p(ctypes.addressof(r)))
        return r

    def set_regs(self, r: Regs) -> None:
        _call(PTRACE_SETREGS, self.tid, 0, ctypes.c_void_p(ctypes.addressof(r)))

    def xstate(self) -> bytes:
        """The thread's whole FPU/SSE/AVX state in XSAVE's user layout (NT_X86_XSTATE)."""
        buf = ctypes.create_string_buffer(XSTATE_BUFFER)
        iov = _Iovec(ctypes.addressof(buf), XSTATE_BUFFER)
        _call(PTRACE_GETREGSET, self.tid, NT_X86_XSTATE, ctypes.c_void_p(ctypes.addressof(iov)))
        return buf.raw[: iov.len]

    def set_xstate(self, data: bytes) -> None:
        buf = ctypes.create_string_buffer(data, len(data))
        iov = _Iovec(ctypes.addressof(buf), len(data))
        _call(PTRACE_SETREGSET, self.tid, NT_X86_XSTATE, ctypes.c_void_p(ctypes.addressof(iov)))

    def syscall_stop(self) -> tuple[int, int]:
        """(op, nr) of a syscall stop: op SYSCALL_INFO_ENTRY or _EXIT; nr at an entry, else -1."""
        buf = ctypes.create_string_buffer(88)
        _call(PTRACE_GET_SYSCALL_INFO, self.tid, 88, ctypes.c_void_p(ctypes.addressof(buf)))
        op = buf.raw[0]
        nr = struct.unpack_from("<q", buf.raw, 24)[0] if op == SYSCALL_INFO_ENTRY else -1
        return op, nr

    # ------------------------------------------------------------------ memory

    def _mem_fd(self) -> int:
        if self._mem < 0:
            self._mem = os.open(f"/proc/{self.tid}/mem", os.O_RDWR | os.O_CLOEXEC)
        return self._mem

    def read(self, addr: int, size: int) -> bytes:
        data = os.pread(self._mem_fd(), size, addr)
        if len(data) != size:
            raise OSError(errno_mod.EIO, f"read {len(data)} of {size} bytes at {addr:#x}")
        return data

    def write(self, addr: int, data: bytes) -> None:
        n = os.pwrite(self._mem_fd(), data, addr)
        if n != len(data):
            raise OSError(errno_mod.EIO, f"wrote {n} of {len(data)} bytes at {addr:#x}")
