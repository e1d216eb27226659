"""Calling a function in a running process, on one of its threads, through ptrace.

The call is made the way the kernel runs a signal handler: below the thread's
stack pointer (past the 128-byte red zone) we write the arguments' data, a
copy of the thread's XSAVE state, and an rt_sigframe holding its registers and
signal mask; the function is entered with the frame's return address pointing
at glibc's own ``__restore_rt`` (``mov $15,%rax; syscall``).  When the function
returns, rt_sigreturn puts back every register, the FPU/AVX state and the
signal mask, exactly as a signal handler's return does.  No code is written
anywhere, and nothing depends on the tracer: if pasta-trace is killed at any
moment (SIGKILL included), the kernel detaches the thread, which finishes the
call and returns through the frame to where it was.

While alive, the tracer follows the call's system calls (PTRACE_SYSCALL) until
the rt_sigreturn of its own frame, reads back what the function wrote, puts
back errno (a libc variable the call may change, that no frame holds), and
after the sigreturn sets the registers and XSAVE state it saved once more.

A thread stopped inside a system call that the stop interrupted (-ERESTART*)
has the restart applied in the frame (the instruction pointer moved back to
the ``syscall`` instruction, rax = the call number again), as the kernel does
when no handler runs: the program never sees EINTR.  For -ERESTART_RESTARTBLOCK
(poll, nanosleep or a futex wait with a relative timeout) the kernel would
call restart_syscall, which resumes the wait with the time left; but
rt_sigreturn, our frame's way back, makes any pending restart_syscall return
EINTR (it resets the thread's restart block), so the call itself is made
again, with its arguments (still in its registers) and so its whole timeout:
such a wait may last up to one timeout longer, never ends early.
"""

from __future__ import annotations

import signal
import struct
import time
from dataclasses import dataclass
from typing import Callable

from . import target as tg
from .ptrace import PTRACE_EVENT_STOP, SYSCALL_INFO_ENTRY, SYSCALL_INFO_EXIT, PtraceError, Regs, Tracee

RED_ZONE = 128
ERESTARTSYS, ERESTARTNOINTR, ERESTARTNOHAND, ERESTART_RESTARTBLOCK = 512, 513, 514, 516
NR_RT_SIGRETURN = 15
UC_FP_XSTATE, UC_SIGCONTEXT_SS, UC_STRICT_RESTORE_SS = 1, 2, 4
FP_XSTATE_MAGIC1, FP_XSTATE_MAGIC2 = 0x46505853, 0x46505845
#: an invalid sigaltstack mode: rt_sigreturn's restore_altstack then changes nothing
SS_NO_CHANGE = 3
X86_EFLAGS_DF = 0x400
#: rt_sigframe: pretcode + ucontext (flags, link, stack_t, sigcontext, sigset) + siginfo
FRAME_SIZE = 8 + (8 + 8 + 24 + 256 + 8) + 128
#: tries to find the thread outside libc and the loader, a millisecond apart
STOP_TRIES = 300

Step = Callable[[str], None]


class RemoteCallError(Exception):
    """The call could not be made or did not return; the message says why and
    what became of the thread."""


@dataclass
class CallResult:
    data: bytes  # the argument area as the function left it


def _signed(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


def resume_regs(r: Regs) -> Regs:
    """The registers the thread must resume with: a system call the stop
    interrupted is restarted, as the kernel restarts it when no handler runs."""
    out = r.copy()
    nr, ret = _signed(r.orig_rax), -_signed(r.rax)
    if nr >= 0 and ret in (ERESTARTSYS, ERESTARTNOINTR, ERESTARTNOHAND, ERESTART_RESTARTBLOCK):
        out.rip = r.rip - 2  # `syscall` is two bytes
        # not restart_syscall for -ERESTART_RESTARTBLOCK: after our rt_sigreturn it returns EINTR
        out.rax = nr
    out.orig_rax = (1 << 64) - 1
    return out


def sigcontext(r: Regs, fpstate: int) -> bytes:
    return struct.pack(
        "<18Q4H5Q64x",
        r.r8, r.r9, r.r10, r.r11, r.r12, r.r13, r.r14, r.r15,
        r.rdi, r.rsi, r.rbp, r.rbx, r.rdx, r.rax, r.rcx, r.rsp, r.rip, r.eflags,
        r.cs, 0, 0, r.ss,
        0, 0, 0, 0, fpstate,
    )


def fpstate_image(xstate: bytes) -> bytes:
    """The XSAVE area as a signal frame holds it: the software bytes say how
    big it is and which features it has, and a second magic follows it.  The
    size and features are those of the kernel's own signal frames (a larger
    area, AMX's 11 KiB on a CPU that has it, makes rt_sigreturn restore x87
    and SSE only)."""
    size, features = signal_xstate()
    size = min(size, len(xstate))
    xfeatures = (struct.unpack_from("<Q", xstate, 512)[0] & features) | 3  # XSTATE_BV; x87 and SSE always
    sw = struct.pack("<IIQI", FP_XSTATE_MAGIC1, size + 4, xfeatures, size).ljust(48, b"\0")
    return xstate[:464] + sw + xstate[512:size] + struct.pack("<I", FP_XSTATE_MAGIC2)


_SIGNAL_XSTATE: tuple[int, int] | None = None


def signal_xstate() -> tuple[int, int]:
    """(xstate_size, xfeatures) of the signal frames this kernel writes (the
    default user size, the same for every process not granted AMX): read once
    from a frame it writes for us, a SIGURG raised into a C-level handler."""
    global _SIGNAL_XSTATE
    if _SIGNAL_XSTATE is None:
        import ctypes

        seen: list[tuple[int, int]] = []
        handler_t = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)

        def handler(sig: int, info: int, uc: int) -> None:
            fp = ctypes.c_uint64.from_address(uc + 40 + 184).value  # uc_mcontext.fpstate
            magic, _ext, feats, size = struct.unpack("<IIQI", ctypes.string_at(fp + 464, 20))
            seen.append((size, feats) if magic == FP_XSTATE_MAGIC1 else (512, 3))

        cb = handler_t(handler)

        class Sigaction(ctypes.Structure):  # the C library's struct sigaction
            _fields_ = [("handler", handler_t), ("mask", ctypes.c_uint64 * 16), ("flags", ctypes.c_int),
                        ("restorer", ctypes.c_void_p)]

        libc = ctypes.CDLL(None, use_errno=True)
        new, old = Sigaction(cb, (ctypes.c_uint64 * 16)(), 4), Sigaction()  # SA_SIGINFO
        if libc.sigaction(signal.SIGURG, ctypes.byref(new), ctypes.byref(old)) != 0:
            raise OSError(ctypes.get_errno(), "sigaction")
        try:
            signal.pthread_kill(__import__("threading").get_ident(), signal.SIGURG)
        finally:
            libc.sigaction(signal.SIGURG, ctypes.byref(old), None)
        _SIGNAL_XSTATE = seen[0] if seen else (512, 3)
    return _SIGNAL_XSTATE


class HeldThread:
    """A thread of ``pid`` stopped by ptrace, outside libc and the loader, for remote calls."""

    def __init__(self, pid: int, libc: tg.Libc, *, step: Step | None = None,
                 on_signal: Callable[[int], bool] | None = None) -> None:
        self.pid = pid
        self.libc = libc
        self.step = step or (lambda name: None)
        # a signal that arrives during a call: True keeps it from the program.  pasta-trace's
        # own late-load stop (a SIGSTOP at the collector's mapping, capture/procs/late_load.py) must
        # be handled by its watcher while this thread is held here, not delivered
        self.on_signal = on_signal or (lambda sig: False)
        self.tracee: Tracee | None = None
        self.saved: Regs | None = None
        self.xstate = b""
        self.frame_restored: bool | None = None

    def stop(self) -> None:
        """Seize and stop the best thread; raises RemoteCallError (nothing left stopped)."""
        try:
            mapped = tg.maps(self.pid)
        except OSError:
            raise RemoteCallError(f"PID {self.pid} exited") from None
        for tid in tg.candidate_threads(self.pid):
            t = Tracee(self.pid, tid)
            try:
                t.seize()
            except PtraceError as e:
                raise RemoteCallError(f"cannot trace PID {self.pid}: {e.strerror}") from None
            self.step("seized")
            try:
                if self._stop_outside_libc(t, mapped):
                    self.tracee = t
                    self.saved = t.regs()
                    self.xstate = t.xstate()
                    self.step("stopped")
                    return
            except BaseException:
                t.detach()
                raise
            t.detach()
        raise RemoteCallError(f"no thread of PID {self.pid} stopped outside the C library and the loader "
                              f"in {STOP_TRIES} tries")

    def _stop_outside_libc(self, t: Tracee, mapped: list[tg.Mapping]) -> bool:
        for _ in range(STOP_TRIES):
            t.interrupt()
            self._wait_stop(t)
            r = t.regs()
            in_syscall = _signed(r.orig_rax) >= 0
            if in_syscall and -_signed(r.rax) == 4 and (_signed(r.orig_rax) not in tg.IDLE_SYSCALLS):
                # it entered a call that an interruption ends with EINTR: too late for it,
                # and another stop would do it again; this thread is not used
                return False
            if in_syscall or not tg.in_libc_or_loader(r.rip, mapped):
                return True
            t.cont()
            time.sleep(0.001)
        return False

    def _wait_stop(self, t: Tracee) -> None:
        """Wait for the interrupt's stop, handing on any signal that came first."""
        while True:
            status = t.wait()
            if _gone(status):
                raise RemoteCallError(f"PID {self.pid} exited")
            sig = _stopsig(status)
            if (status >> 16) == PTRACE_EVENT_STOP:
                return
            t.cont(sig)  # a signal of the program's own: delivered as if we were not here

    def call(self, func: int, args: tuple[int, ...], data: bytes, data_args: tuple[int, ...] = (),
             timeout: float = 30.0) -> CallResult:
        """Call ``func`` with integer ``args``; each index in ``data_args`` is an
        offset into ``data`` (copied below the stack) that becomes its address."""
        t, saved = self.tracee, self.saved
        assert t is not None and saved is not None
        errno_addr = saved.fs_base + self.libc.errno_tpoff
        errno_value = t.read(errno_addr, 4)
        back = resume_regs(saved)
        top = saved.rsp - RED_ZONE - 256
        data_at = (top - len(data)) & ~63
        fp = fpstate_image(self.xstate)
        fp_at = (data_at - len(fp)) & ~63
        frame_at = ((fp_at - FRAME_SIZE) & ~15) - 8  # as after a call: (rsp + 8) % 16 == 0
        uc = struct.pack("<QQQiiQ", UC_FP_XSTATE | UC_SIGCONTEXT_SS | UC_STRICT_RESTORE_SS, 0, 0, SS_NO_CHANGE, 0, 0)
        frame = (struct.pack("<Q", self.libc.restore_rt) + uc + sigcontext(back, fp_at)
                 + struct.pack("<Q", tg.sigblk(self.pid, t.tid)) + bytes(128))
        assert len(frame) == FRAME_SIZE
        try:
            t.write(data_at, data)
            t.write(fp_at, fp)
            t.write(frame_at, frame)
        except OSError as e:
            raise RemoteCallError(f"cannot write below the stack of thread {t.tid}: {e}") from None
        self.step("frame written")
        r = saved.copy()
        values = list(args)
        for i in data_args:
            values[i] += data_at
        for name, v in zip(("rdi", "rsi", "rdx", "rcx", "r8", "r9"), values):
            setattr(r, name, v & ((1 << 64) - 1))
        r.rip, r.rsp, r.rax = func, frame_at, 0
        r.orig_rax = (1 << 64) - 1  # no restart of the interrupted system call on the way in
        r.eflags &= ~X86_EFLAGS_DF
        t.set_regs(r)
        self.step("calling")
        result = self._follow(t, frame_at, data_at, len(data), timeout)
        t.write(errno_addr, errno_value)
        t.cont(syscall=True)  # into rt_sigreturn: the frame restores the thread
        status = t.wait()
        if _gone(status):
            raise RemoteCallError(f"PID {self.pid} exited during the call")
        self.step("returned")
        # the kernel restored it from the frame (what a thread whose tracer died gets); kept for
        # the tests, then what we saved is set once more, exactly
        self.frame_restored = t.regs().as_tuple() == back.as_tuple() and t.xstate() == self.xstate
        t.set_regs(back)
        t.set_xstate(self.xstate)
        self.saved = back
        return result

    def _follow(self, t: Tracee, frame_at: int, data_at: int, size: int, timeout: float) -> CallResult:
        """Run the call until the rt_sigreturn of our frame; signals of the
        program's own are delivered as they come."""
        deadline = time.monotonic() + timeout
        sig, first = 0, True
        while True:
            t.cont(sig, syscall=True)
            sig = 0
            status = t.wait()
            if _gone(status):
                raise RemoteCallError(f"PID {self.pid} died during the call ({_death(status)})")
            s = _stopsig(status)
            if s == (signal.SIGTRAP | 0x80):
                op, nr = t.syscall_stop()
                if op == SYSCALL_INFO_ENTRY and nr == NR_RT_SIGRETURN and t.regs().rsp == frame_at + 8:
                    return CallResult(t.read(data_at, size))
                if first:
                    first = False
                    self.step("in call")
                if op not in (SYSCALL_INFO_ENTRY, SYSCALL_INFO_EXIT):
                    continue
            elif (status >> 16) == PTRACE_EVENT_STOP:
                pass  # a group stop or our interrupt: go on
            elif not self.on_signal(s):
                sig = s
            if time.monotonic() > deadline:
                self.step("timed out")
                raise RemoteCallError(f"the call in PID {self.pid} did not return in {timeout:g} s: it was left "
                                      "to finish on its own (it returns to where it was)")

    def release(self) -> None:
        """Detach: the thread resumes (a system call the stop interrupted is restarted)."""
        if self.tracee is not None:
            self.tracee.detach()
            self.tracee = None


def _gone(status: int) -> bool:
    return (status & 0x7F) == 0 or ((status & 0x7F) != 0x7F and (status & 0x7F) != 0)


def _stopsig(status: int) -> int:
    return (status >> 8) & 0xFF


def _death(status: int) -> str:
    if (status & 0x7F) == 0:
        return f"exit code {(status >> 8) & 0xFF}"
    return f"signal {status & 0x7F}"
