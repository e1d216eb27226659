"""What a tracer's guardians (capture.procs.guardian) and the takeover of its
capture (capture.output.takeover) both need when the tracer ends: seeing that
it has begun to exit, how long to let what raced with its end land, and the
events ring and loss counters it names by id, held so that they outlive it.
A module of its own so that neither of the two imports the other for it."""

from __future__ import annotations

import os

#: after disarming, stops that raced with it may still land: look again this often (guardian.SETTLE_ROUNDS
#: times); a ring found empty is looked at again this much later
SETTLE_S = 0.02
#: how often the events writer looks for the tracer's exit in /proc/PID/stat while it writes (the pidfd
#: wakes it at once anyway)
EXIT_POLL_S = 0.025
#: how often a guardian does, all the while the tracer runs: a process held at a library load is resumed
#: within a second of a SIGKILL of the tracer (tests/live/test_kill_matrix.py), and at 25 ms the reads cost
#: an idle daemon 0.5 % of a core per guardian on a loaded 2-core machine (docs/performance.md)
GUARDIAN_POLL_S = 0.2
#: the flag of a task that has begun to exit (include/linux/sched.h)
PF_EXITING = 0x4


def exiting(pid: int) -> bool:
    """Whether ``pid`` has begun to exit (or is gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return True
    return bool(int(fields[6]) & PF_EXITING)


def open_maps(spec: dict) -> tuple[int, dict[str, int]]:
    """The events ring and the loss counters a takeover.spec_of names by id (OSError: one is gone)."""
    from ..bpf.map_fds import lib

    fds: dict[str, int] = {}
    try:
        for name, ident in [("", spec["events_id"]), *spec["counters"].items()]:
            fd = lib().bpf_map_get_fd_by_id(ident)
            if fd < 0:
                raise OSError("the map is gone")
            fds[name] = fd
    except BaseException:
        close_maps((-1, fds))
        raise
    return fds.pop(""), fds


def close_maps(maps: tuple[int, dict[str, int]]) -> None:
    for fd in [maps[0], *maps[1].values()]:
        if fd >= 0:
            os.close(fd)
