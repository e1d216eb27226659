"""What a remote call needs to know of a running process, and when it must not
be made: its libc (dlopen, errno, the rt_sigreturn trampoline), its threads
and what each is doing.  Read from /proc and from the process's own memory
(the code that will run), never from a file that could differ from it."""

from __future__ import annotations

import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path

from ...errors import PermissionsError, UsageError
from ...probes.elf import exported_symbols

#: `mov $15,%rax; syscall`: glibc's __restore_rt, the return path of every signal handler
RESTORE_RT = bytes.fromhex("48c7c00f0000000f05")
#: glibc's __errno_location: mov GOT(%rip),%rax; add %fs:0,%rax; ret (endbr64 first where built with CET)
_ERRNO_LOCATION = re.compile(rb"(?:\xf3\x0f\x1e\xfa)?\x48\x8b\x05(....)\x64\x48\x03\x04\x25\x00\x00\x00\x00\xc3", re.S)

#: system calls that a ptrace interruption restarts (-ERESTART*), so that the
#: program never sees EINTR; the idle waits first, where a thread holds no lock
#: of the C library.  Others (epoll_wait, semop, sigtimedwait...) may return
#: EINTR after any stop (signal(7)): a thread in one is never chosen.
IDLE_SYSCALLS = {0: "read", 7: "poll", 23: "select", 34: "pause", 35: "nanosleep", 230: "clock_nanosleep",
                 270: "pselect6", 271: "ppoll", 61: "wait4", 247: "waitid", 19: "readv", 17: "pread64",
                 43: "accept", 288: "accept4", 45: "recvfrom", 47: "recvmsg", 130: "rt_sigsuspend"}
LOCK_SYSCALLS = {202: "futex"}


@dataclass(frozen=True)
class Mapping:
    start: int
    end: int
    perms: str
    offset: int
    inode: int
    path: str


def maps(pid: int) -> list[Mapping]:
    out = []
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            parts = line.split(maxsplit=5)
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            out.append(Mapping(lo, hi, parts[1], int(parts[2], 16), int(parts[4]),
                               parts[5].rstrip("\n") if len(parts) > 5 else ""))
    return out


def status_field(path: str, name: str) -> str | None:
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(name + ":"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        return None
    return None


def refusal(pid: int) -> UsageError | PermissionsError | None:
    """Why no code may be run in ``pid`` now (a one-line error), or None."""
    try:
        scope = Path("/proc/sys/kernel/yama/ptrace_scope").read_text().strip()
    except OSError:
        scope = "0"
    if scope == "3":
        return PermissionsError("--device cupti -p needs ptrace, which kernel.yama.ptrace_scope = 3 forbids "
                                "to everyone until the next boot")
    tracer = status_field(f"/proc/{pid}/status", "TracerPid")
    if tracer is None:
        return UsageError(f"PID {pid} is gone")
    if tracer != "0":
        return PermissionsError(f"PID {pid} is already traced by PID {tracer} (a debugger?): "
                                "--device cupti -p cannot attach next to it")
    root, mine = os.stat(f"/proc/{pid}/root"), os.stat("/")
    if (root.st_dev, root.st_ino) != (mine.st_dev, mine.st_ino):
        return UsageError(f"PID {pid} runs in another root (a container): --device cupti -p loads the "
                          "collector by a path of this machine's; launch the program with -- CMD inside instead")
    features = status_field(f"/proc/{pid}/status", "x86_Thread_features") or ""
    if "shstk" in features.split():
        return UsageError(f"PID {pid} runs with a shadow stack (CET): a call made in it through ptrace "
                          "could not return; launch it with --device cupti -- CMD instead")
    return None


@dataclass(frozen=True)
class Libc:
    """Addresses in the target of what a remote call uses."""

    dlopen: int
    restore_rt: int
    errno_tpoff: int  # errno is at fs_base + errno_tpoff in every thread


def find_libc(pid: int, mapped: list[Mapping] | None = None, read=None) -> Libc:
    """Raises UsageError for a process with no shared libc (a static binary) or no dlopen in it."""
    mapped = maps(pid) if mapped is None else mapped
    libc = [m for m in mapped if re.search(r"/libc(\.so\.6|-[0-9.]+\.so)$", m.path)]
    if not libc:
        return _no("has no shared C library mapped (a static binary?): nothing in it can load a library")
    base_map = min((m for m in libc if m.offset == 0), key=lambda m: m.start, default=None)
    if base_map is None:
        return _no("maps its C library strangely (no mapping of its start)")
    base = base_map.start
    syms = exported_symbols(f"/proc/{pid}/map_files/{base_map.start:x}-{base_map.end:x}")
    dlopen = syms.get("dlopen")
    errno_loc = syms.get("__errno_location")
    if dlopen is None:
        for m in mapped:  # glibc before 2.34 keeps dlopen in libdl
            if re.search(r"/libdl(\.so\.2|-[0-9.]+\.so)$", m.path) and m.offset == 0:
                d = exported_symbols(f"/proc/{pid}/map_files/{m.start:x}-{m.end:x}").get("dlopen")
                if d is not None:
                    dlopen = d
                    dl_base = m.start
                    break
        else:
            return _no("has no dlopen (a C library older than glibc 2.34, without libdl loaded)")
    else:
        dl_base = base
    if errno_loc is None:
        return _no("has a C library without __errno_location (not glibc)")
    read = read or _reader(pid)
    code = [m for m in libc if "x" in m.perms]
    restore_rt = None
    for m in code:
        i = read(m.start, m.end - m.start).find(RESTORE_RT)
        if i >= 0:
            restore_rt = m.start + i
            break
    if restore_rt is None:
        return _no("has a C library without the signal-return trampoline (not glibc)")
    at = base + errno_loc.vaddr
    m = _ERRNO_LOCATION.match(read(at, 24))
    if m is None:
        return _no("has an __errno_location of an unknown shape: errno could not be kept")
    disp = struct.unpack("<i", m.group(1))[0]
    got = at + m.start(1) + 4 + disp
    tpoff = struct.unpack("<q", read(got, 8))[0]
    return Libc(dlopen=dl_base + dlopen.vaddr, restore_rt=restore_rt, errno_tpoff=tpoff)


def _no(why: str):
    raise UsageError(f"--device cupti -p: the process {why}")


def _reader(pid: int):
    def read(addr: int, size: int) -> bytes:
        fd = os.open(f"/proc/{pid}/mem", os.O_RDONLY | os.O_CLOEXEC)
        try:
            return os.pread(fd, size, addr)
        finally:
            os.close(fd)

    return read


def thread_syscall(pid: int, tid: int) -> int | None:
    """The system call ``tid`` is blocked in, -1 blocked outside one, None running (or gone)."""
    try:
        text = Path(f"/proc/{pid}/task/{tid}/syscall").read_text().split()
    except OSError:
        return None
    if not text or text[0] == "running":
        return None
    return int(text[0])


def candidate_threads(pid: int) -> list[int]:
    """The threads a call may be made on, best first: blocked in an idle
    system call, then in a futex wait, then running.  Raises UsageError when
    every thread is in a system call that an interruption would break."""
    try:
        tids = sorted(int(t) for t in os.listdir(f"/proc/{pid}/task"))
    except OSError:
        raise UsageError(f"PID {pid} is gone") from None
    idle, lock, running, broken = [], [], [], []
    for tid in tids:
        nr = thread_syscall(pid, tid)
        if nr is None:
            running.append(tid)
        elif nr in IDLE_SYSCALLS:
            idle.append(tid)
        elif nr in LOCK_SYSCALLS:
            lock.append(tid)
        else:
            broken.append(nr)
    order = idle + lock + running
    if not order:
        raise UsageError(f"every thread of PID {pid} is in a system call that a stop would end with EINTR "
                         f"(numbers {sorted(set(broken))}): try again when it is not")
    return order


def sigblk(pid: int, tid: int) -> int:
    v = status_field(f"/proc/{pid}/task/{tid}/status", "SigBlk")
    if v is None:
        raise ProcessLookupError(tid)
    return int(v, 16)


def in_libc_or_loader(rip: int, mapped: list[Mapping]) -> bool:
    """Whether ``rip`` is in the C library or the dynamic loader, where a thread
    may hold the locks (malloc's, the loader's) that dlopen takes."""
    for m in mapped:
        if m.start <= rip < m.end:
            name = m.path.rsplit("/", 1)[-1]
            return name.startswith(("libc.so", "libc-", "ld-linux", "libpthread"))
    return False
