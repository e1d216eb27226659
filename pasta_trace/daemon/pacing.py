"""When the daemon's main loop wakes, and what it looks at when it does.

The event rings are written without a wake-up (BPF_RB_NO_WAKEUP: one would
cost every traced call), so the loop drains them on a timer: every
POLL_INTERVAL_S while events come, and, once a drain finds none, after
idle_poll_s(): as long as the events ring takes to fill at FLOOD_RATE (47 ms
with the default 16 MiB ring, at most IDLE_POLL_MAX_S), so that a flood
starting on an idle daemon still finds room.  What an idle daemon also paid
for was the rest of each turn, a hundred times a second: the discover watcher
(a walk of the stops map, its guardians' waits, the other tracers' maps) and
the `-a` rescan of /proc.  Those now wait for a reason:

- the discover ring's descriptor polls readable while the ring holds a record,
  and a stop or an exec wakes the poll at once (bpf/discover.bpf.c submits
  those with BPF_RB_FORCE_WAKEUP), so a stopped process waits for its own
  handling only; forks and exits are seen at the next turn;
- what leaves no record (a stop whose notice found the ring full, a guardian
  that died, the other tracers' processes) is looked at every WATCH_S;
- the `-a` rescan, a safety net for libraries that reached a process without
  an open the hook saw (docs/host-tracing.md), runs every RESCAN_S: every
  open and executable mapping of a GPU library is caught by the hook at once.
"""

from __future__ import annotations

import select
import time

from ..capture.bpf.ringbuf import RingBuffer, record_stride
from ..capture.output.drain import POLL_INTERVAL_S

#: the fastest the probes fill the events ring, events/s: one thread of the stand-in library under a
#: probe makes ~0.5 M/s on our VM (docs/daemon.md's flood); a few such threads at once
FLOOD_RATE = 2_000_000
#: the longest an idle daemon sleeps between drains
IDLE_POLL_MAX_S = 0.1
#: the longest a turn without a discover record goes without the watcher
WATCH_S = 0.1
#: the daemon's -a rescan of /proc (capture: every second); each new process it finds costs a read of its maps
RESCAN_S = 30.0


def idle_poll_s(events: RingBuffer) -> float:
    """How long an idle daemon may sleep: the records the events ring holds last that long at FLOOD_RATE."""
    held = events.size // record_stride(events.dtype.itemsize)
    return min(IDLE_POLL_MAX_S, max(POLL_INTERVAL_S, held / FLOOD_RATE))


class Pacer:
    """The loop's poll set: ``watch_fd`` (the discover ring) and any others (the control socket, ...)."""

    def __init__(self, watch_fd: int | None, *fds: int, idle_s: float = POLL_INTERVAL_S, clock=time.monotonic):
        self._poll = select.poll()
        self._watch_fd = watch_fd
        self._clock = clock
        self._next_watch = 0.0
        self.idle_s = idle_s
        self._drained = -1
        #: the descriptors found readable by the last wait()
        self.ready: set[int] = set()
        for fd in (watch_fd, *fds):
            if fd is not None:
                self.register(fd)

    def register(self, fd: int) -> None:
        self._poll.register(fd, select.POLLIN)

    def wait(self, timeout_s: float) -> set[int]:
        """Sleep until a descriptor is readable or ``timeout_s`` has passed; returns the readable ones."""
        self.ready = {fd for fd, _ in self._poll.poll(timeout_s * 1000)}
        return self.ready

    def tick(self, drained: int) -> float:
        """The next wait: POLL_INTERVAL_S if the drains' running count of events, ``drained``, moved
        since the last call, else idle_s."""
        moved, self._drained = drained != self._drained, drained
        return POLL_INTERVAL_S if moved else self.idle_s

    def watch_due(self) -> bool:
        """Whether the watcher should run this turn: a discover record is waiting, or WATCH_S has passed."""
        now = self._clock()
        if (self._watch_fd is not None and self._watch_fd in self.ready) or now >= self._next_watch:
            self._next_watch = now + WATCH_S
            return True
        return False
