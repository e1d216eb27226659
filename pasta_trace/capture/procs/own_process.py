"""The name pasta-trace's own processes show.

Every pasta-trace process (a tracer, `doctor`, `--dry-run`, the events
writer, a guardian) names itself OWN_COMM, so `ps` and `top` say what it is.
The name is for display only: a user's program may be named `pasta-trace` as
well, and is traced like any other.  The discover program tells a tracer's
own processes apart by tgid (its `pt_own` map, filled by
capture.procs.late_load.LateLoadWatcher.own as each starts).  The name is inherited
by threads and by forked children until they exec, so naming the process at
start covers all its threads.
"""

from __future__ import annotations

import ctypes

OWN_COMM = "pasta-trace"
_PR_SET_NAME = 15


def mark() -> None:
    """Name the calling thread (and what it starts from now on) OWN_COMM."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_NAME, OWN_COMM.encode(), 0, 0, 0)
    except (OSError, AttributeError):
        pass  # a display name only: nothing depends on it
