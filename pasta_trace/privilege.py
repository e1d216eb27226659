"""Who pasta-trace acts as: the one place that decides it (docs/security.md).

Run by root without sudo (no ``SUDO_UID``, or ``SUDO_UID=0``), pasta-trace is
root throughout.  Run with ``sudo`` by a user, it keeps root only for what
needs it and acts as that user for everything else:

- the offline verbs (report, merge, export, doctor) become the user for good
  before they read anything (drop_to_user): whatever a capture, a timeline or
  a Dask cluster hands them is handled with the user's reach, no more;
- a capture (record) needs root for BPF and uprobes, so it stays root, but
  every file and directory it makes is made with the user's filesystem
  credentials (as_user): it can only go where the user could write, and it is
  the user's from the moment it exists.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import pwd
from contextlib import contextmanager
from typing import Iterator

from .errors import PastaError

#: the raw system calls, by architecture: glibc's setfsuid/setgroups wrappers
#: apply the change to every thread of the process (the setxid broadcast);
#: the system calls themselves change the calling thread's credentials only
_SYSCALLS = {
    "x86_64": {"setgroups": 116, "setfsuid": 122, "setfsgid": 123},
    "aarch64": {"setgroups": 159, "setfsuid": 151, "setfsgid": 152},
}


def invoking_user() -> tuple[int, int] | None:
    """(uid, gid) of the user who ran sudo, when we run as root under sudo."""
    uid, gid = os.environ.get("SUDO_UID"), os.environ.get("SUDO_GID")
    if os.geteuid() == 0 and uid and gid and uid != "0":
        return int(uid), int(gid)
    return None


def _groups(uid: int, gid: int) -> list[int]:
    """The user's supplementary groups, as login would give them; only the
    primary group when the uid has no passwd entry."""
    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        return [gid]
    return os.getgrouplist(name, gid)


def drop_to_user() -> tuple[int, int] | None:
    """Under sudo, become the user who ran it, for good: their groups, gid and
    uid (real, effective and saved), and their HOME, USER and LOGNAME.  Returns
    (uid, gid), or None where there is nobody to become (root's own use).
    Called before any thread starts: setresuid applies to the whole process."""
    user = invoking_user()
    if user is None:
        return None
    uid, gid = user
    os.setgroups(_groups(uid, gid))
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    try:
        os.setresuid(0, 0, 0)
    except PermissionError:
        pass
    else:  # never go on as root believing we are the user
        raise PastaError("could not give up root (setresuid back to 0 succeeded)")
    try:
        entry = pwd.getpwuid(uid)
    except KeyError:
        os.environ.pop("HOME", None)
    else:
        os.environ.update(HOME=entry.pw_dir, USER=entry.pw_name, LOGNAME=entry.pw_name)
    return user


class _Calls:
    """The thread-local credential system calls, through libc's syscall()."""

    def __init__(self) -> None:
        numbers = _SYSCALLS.get(platform.machine())
        if numbers is None:
            raise PastaError(f"acting as the user under sudo is not supported on {platform.machine()}",
                             hint="run pasta-trace as root without sudo")
        self._nr = numbers
        self._syscall = ctypes.CDLL(None, use_errno=True).syscall
        self._syscall.restype = ctypes.c_long

    def setfsuid(self, uid: int) -> int:
        """Sets the thread's fsuid, returns the one before (-1 only asks)."""
        return self._syscall(self._nr["setfsuid"], ctypes.c_uint(uid & 0xFFFFFFFF)) & 0xFFFFFFFF

    def setfsgid(self, gid: int) -> int:
        return self._syscall(self._nr["setfsgid"], ctypes.c_uint(gid & 0xFFFFFFFF)) & 0xFFFFFFFF

    def setgroups(self, groups: list[int]) -> None:
        array = (ctypes.c_uint * max(len(groups), 1))(*groups)
        if self._syscall(self._nr["setgroups"], ctypes.c_size_t(len(groups)), array) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))


_calls: _Calls | None = None
#: as_user()'s default: the user who ran sudo
_INVOKING = object()


@contextmanager
def as_user(user: tuple[int, int] | None | object = _INVOKING) -> Iterator[None]:
    """For the calling thread only: the user's filesystem credentials (fsuid,
    fsgid, supplementary groups) while the block runs, root's again after.
    Files made meanwhile are the user's, and every permission check is the
    user's: while the fsuid is not 0 the kernel also takes CAP_DAC_OVERRIDE,
    CAP_FOWNER, CAP_CHOWN and the other filesystem capabilities out of the
    thread's effective set.  `user` defaults to invoking_user(); with nobody
    to act as (None: root's own use, or after drop_to_user) this does nothing.
    A thread or process started inside the block keeps the user's
    credentials: start none there."""
    global _calls
    if user is _INVOKING:
        user = invoking_user()
    if user is None:
        yield
        return
    if _calls is None:
        _calls = _Calls()
    uid, gid = user  # type: ignore[misc]
    groups = os.getgroups()  # the calling thread's (the system call reads the thread's credentials)
    _calls.setgroups(_groups(uid, gid))
    old_gid = _calls.setfsgid(gid)
    old_uid = _calls.setfsuid(uid)
    try:
        if (_calls.setfsuid(-1), _calls.setfsgid(-1)) != (uid, gid):
            raise PastaError(f"could not take the filesystem credentials of uid {uid}")
        yield
    finally:
        _calls.setfsuid(old_uid)
        _calls.setfsgid(old_gid)
        _calls.setgroups(groups)
        if _calls.setfsuid(-1) != old_uid:  # a thread left half the user's would misjudge every later check
            raise OSError(errno.EPERM, "could not restore root's filesystem credentials")
