"""The processes and library files a capture starts with."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from ...errors import PastaError, PermissionsError, UsageError
from ..session import checks
from . import discovery, needed, python_env, reach

PF_KTHREAD = 0x00200000  # include/linux/sched.h: the task is a kernel thread
CAP_SYS_PTRACE = 19


def alive(pid: int) -> bool:
    """Running (a zombie waiting for its parent has exited already)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def check_pids(pids: list[int]) -> None:
    """Each PID is a running user process that we may trace (under sudo: one
    of the invoking user's, capture.procs.reach), or a one-line error that says why
    not.  Ownership is checked first: nothing else of another user's process
    is read."""
    uid = reach.traced_uid()
    for pid in pids:
        if pid <= 0 or not Path(f"/proc/{pid}").is_dir():
            raise no_such_process(pid)
        refused = reach.refusal(pid, uid)
        if refused is not None:
            raise refused
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError as e:
            raise unreadable(pid, e) from None
        comm = stat[stat.find("(") + 1:stat.rfind(")")]
        if int(stat.rsplit(")", 1)[1].split()[6]) & PF_KTHREAD:
            raise UsageError(f"{comm} (PID {pid}) is a kernel thread: it has no user memory to trace",
                             hint="give the PID of a program, e.g. from `pgrep -f NAME`")


def check_readable(pids: list[int]) -> None:
    """We may read each PID's memory map (checked once our own privileges are,
    which are the likelier thing to lack), or a one-line error that says why not."""
    for pid in pids:
        try:
            with open(f"/proc/{pid}/maps", "rb") as f:
                f.read(1)
        except OSError as e:
            raise unreadable(pid, e) from None


def no_such_process(pid: int) -> PastaError:
    hidden = _hidepid()
    why = f" (/proc is mounted with hidepid={hidden}: other users' processes are hidden)" if hidden else ""
    return PastaError(f"no such process: {pid}{why}")


def unreadable(pid: int, err: OSError) -> PastaError:
    """Why the memory map of `pid` cannot be read: gone, or which permission is missing."""
    if isinstance(err, (FileNotFoundError, ProcessLookupError)) or not Path(f"/proc/{pid}").is_dir():
        return no_such_process(pid)
    status = _status(pid)
    name = f"{status.get('Name', '?')} (PID {pid})"
    if not isinstance(err, PermissionError):
        return PastaError(f"cannot read the memory map of {name}: {err.strerror}")
    caps = checks.effective_caps()
    if caps & (1 << CAP_SYS_PTRACE):
        why = "a security module (AppArmor, SELinux) or a user namespace boundary denies it"
        hint = "look for the denial in `dmesg`; trace from the user namespace of the process or above it"
    else:
        uids = {int(u) for u in status.get("Uid", "").split()}
        their_caps = int(status.get("CapPrm", "0"), 16)
        if uids and uids != {os.geteuid()}:
            owner = status["Uid"].split()[1]
            why = (f"it runs as uid {owner}, not as you (uid {os.geteuid()})" if os.geteuid() != 0
                   else f"it runs as uid {owner}, and this process lacks CAP_SYS_PTRACE")
        elif their_caps & ~caps:
            why = "it holds capabilities this process lacks, and this process lacks CAP_SYS_PTRACE"
        else:
            why = ("it is not dumpable (a setuid program, or it called prctl(PR_SET_DUMPABLE, 0)), "
                   "and this process lacks CAP_SYS_PTRACE")
        hint = (f"run it as root: `{checks.rerun_as_root()}`" if os.geteuid() != 0
                else "grant CAP_SYS_PTRACE (in a container: --cap-add SYS_PTRACE)")
    return PermissionsError(f"cannot read the memory map of {name}: {err.strerror}: {why}", hint=hint)


def _status(pid: int) -> dict[str, str]:
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return {}
    return {k: v.strip() for k, _, v in (line.partition(":") for line in lines)}


def _hidepid() -> str | None:
    """The hidepid option of the /proc we read, if it hides processes."""
    try:
        mounts = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return None
    for line in mounts:
        fields = line.split()
        if len(fields) > 3 and fields[1] == "/proc":
            for opt in fields[3].split(","):
                key, _, value = opt.partition("=")
                if key == "hidepid" and value not in ("0", "off"):
                    return value
    return None


def ld_cache_entries() -> list[tuple[str, str, str]]:
    """The ld.so cache (`ldconfig -p`): (library name, its flags, path) each."""
    try:
        out = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        out = ""
    rows = []
    for line in out.splitlines():
        name, _, target = line.strip().partition(" => ")
        if target:
            lib, _, flags = name.partition(" ")
            rows.append((lib, flags, target))
    return rows


def ld_cache(entries: list[tuple[str, str, str]] | None = None) -> dict[str, str]:
    """Library name -> path from the ld.so cache, a 64-bit entry first (ld.so's choice for our programs)."""
    best: dict[str, tuple[str, str]] = {}
    for lib, flags, target in entries if entries is not None else ld_cache_entries():
        if lib not in best or ("64" in flags and "64" not in best[lib][0]):
            best[lib] = (flags, target)
    return {lib: target for lib, (_, target) in best.items()}


def launch_candidates(env: dict[str, str], argv: list[str] | None = None) -> list[discovery.Library]:
    """Traced library files a launched command can load by name: those in
    LD_LIBRARY_PATH and in the ld.so cache, and, when the command is a Python
    interpreter, those its environment's packages hold (torch's libc10.so);
    and the command's executable and the libraries it loads at start
    (capture.procs.needed) that have the CUDA runtime linked in.
    Others are caught when opened."""
    paths: list[str] = python_env.traced_libraries(argv[0], env) if argv else []
    for d in filter(None, env.get("LD_LIBRARY_PATH", "").split(":")):
        p = Path(d)
        if p.is_dir():
            paths += [str(f) for f in sorted(p.iterdir()) if discovery.family_of(f.name)]
    entries = ld_cache_entries()
    paths += [target for name, _, target in entries if discovery.family_of(name)]
    cache = ld_cache(entries)
    libs: dict[tuple[int, int], discovery.Library] = {}
    for p in paths:
        try:
            lib = discovery.resolve_library_file(p)
        except OSError:
            continue
        if lib is not None:
            libs.setdefault(lib.key, lib)
    exe = shutil.which(argv[0], path=env.get("PATH")) if argv else None
    # the executable and the libraries it loads at start, where the runtime may be linked in
    for path in [exe, *needed.needed_files(exe, env, cache)] if exe else []:
        lib = discovery.executable_library(path)
        if lib is not None:
            libs.setdefault(lib.key, lib)
    return list(libs.values())
