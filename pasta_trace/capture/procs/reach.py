"""Which processes a capture may trace.

Under sudo (a non-root SUDO_UID), only the invoking user's own processes: a
process whose real, effective, saved and file-system uids are all that user's.
A setuid program the user started is not the user's (it holds another uid),
and neither is a process of theirs once it has become another uid.  Root's
own use (no SUDO_UID, or SUDO_UID=0) reaches every process.

The kernel side enforces the same rule on every event and every stop
(PT_ALLOWED_UID, bpf/reach.h); user space checks it before it reads anything
of a process (its maps, cmdline, environment or memory).
"""

from __future__ import annotations

import pwd
from pathlib import Path

from ...errors import PermissionsError
from ...privilege import invoking_user


def traced_uid() -> int | None:
    """The only uid whose processes may be traced, or None: every process."""
    user = invoking_user()
    return user[0] if user is not None else None


def uids(pid: int, proc: Path = Path("/proc")) -> tuple[int, ...] | None:
    """Real, effective, saved and file-system uids of ``pid`` (None if gone)."""
    try:
        with open(proc / str(pid) / "status", "rb") as f:
            for line in f:
                if line.startswith(b"Uid:"):
                    return tuple(int(u) for u in line.split()[1:])
    except (OSError, ValueError):
        return None
    return None


def may_trace(pid: int, uid: int | None, proc: Path = Path("/proc")) -> bool:
    """Whether ``pid`` is a process the capture may trace (uid None: any)."""
    if uid is None:
        return True
    ids = uids(pid, proc)
    return ids is not None and set(ids) == {uid}


def foreign(pid: int, uid: int | None, proc: Path = Path("/proc")) -> bool:
    """Whether ``pid`` runs now as another uid than ``uid`` (a setuid exec, say).
    A process that is gone is not: what is read of it then comes from copies
    made while it was the user's (its saved maps)."""
    if uid is None:
        return False
    ids = uids(pid, proc)
    return ids is not None and set(ids) != {uid}


def user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def refusal(pid: int, uid: int | None, proc: Path = Path("/proc")) -> PermissionsError | None:
    """Why ``pid`` may not be traced (a one-line error, exit 77, naming the PID
    and its owner), or None if it may (or is gone: the caller says so)."""
    if uid is None:
        return None
    ids = uids(pid, proc)
    if ids is None or set(ids) == {uid}:
        return None
    real, effective = ids[0], ids[1]
    if real == uid:
        owner = f"{user_name(effective)} (effective uid {effective}: a setuid program, or one that changed uid)"
    else:
        owner = f"{user_name(real)} (uid {real})"
    return PermissionsError(f"PID {pid} belongs to {owner}, not to {user_name(uid)} (uid {uid}): "
                            "under sudo pasta-trace traces only the invoking user's own processes")
