"""When the daemon's main loop wakes, and what it looks at when it does.

The event rings are written without a wake-up (BPF_RB_NO_WAKEUP: one would
cost every traced call), so the loop drains them on a timer, and the timer is
set by what the events ring holds: the next drain comes before the ring can
fill at FLOOD_RATE, or at four times the rate of the events just drained if
that is higher (Pacer.tick): 47 ms with the default 16 MiB ring up to
500,000 events/s, less above it, never less than POLL_INTERVAL_S (a capture's
pace) nor more than IDLE_POLL_MAX_S.  A flood that starts on an idle daemon
finds room, and a steady 100,000 launches/s costs 21 drains a second, not
100: each drain's fixed cost (numpy calls on its batch, the loop's own turn)
was most of what the daemon paid at that rate.  What an idle daemon also paid
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
#: the next drain comes before the rate of the events just drained, this many times over, fills the ring
RATE_MARGIN = 4
#: the longest the daemon sleeps between drains
IDLE_POLL_MAX_S = 0.1
#: the longest a turn without a discover record goes without the watcher
WATCH_S = 0.1
#: the daemon's -a rescan of /proc (capture: every second); each new process it finds costs a read of its maps
RESCAN_S = 30.0


def ring_records(events: RingBuffer) -> int:
    """How many records the events ring holds."""
    return events.size // record_stride(events.dtype.itemsize)


class Pacer:
    """The loop's poll set: ``watch_fd`` (the discover ring) and any others (the control socket, ...)."""

    def __init__(self, watch_fd: int | None, *fds: int, held: int = 0, clock=time.monotonic):
        """``held``: how many records the events ring holds (ring_records)."""
        self._poll = select.poll()
        self._watch_fd = watch_fd
        self._clock = clock
        self._next_watch = 0.0
        self._held = held
        self._drained = 0
        self._ticked: float | None = None
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
        """The next wait, from ``drained``, the drains' running count of events: the ring fills no sooner
        at FLOOD_RATE, nor at RATE_MARGIN times the rate since the last call."""
        now = self._clock()
        rate = 0.0
        if self._ticked is not None:
            rate = (drained - self._drained) / max(now - self._ticked, POLL_INTERVAL_S)
        self._drained, self._ticked = drained, now
        return min(IDLE_POLL_MAX_S, max(POLL_INTERVAL_S, self._held / max(FLOOD_RATE, RATE_MARGIN * rate)))

    def watch_due(self) -> bool:
        """Whether the watcher should run this turn: a discover record is waiting, or WATCH_S has passed."""
        now = self._clock()
        if (self._watch_fd is not None and self._watch_fd in self.ready) or now >= self._next_watch:
            self._next_watch = now + WATCH_S
            return True
        return False
