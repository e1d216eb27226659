"""How pasta-trace's own processes are told apart from the traced ones.

Every pasta-trace process (a tracer, `doctor`, `--dry-run`, the events
writer, a guardian) carries the process name OWN_COMM.  The late-load hook
never stops a process with that name, so tracers never stop each other or
themselves.  The name is inherited by threads and by forked children until
they exec, so naming the process at start covers all its threads.
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
        pass  # without prctl the tracer is still exempt by tgid; other tracers may pause us briefly
