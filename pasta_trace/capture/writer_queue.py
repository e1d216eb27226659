"""The queue between the drain and the events writer process.

It is bounded in bytes of event records: when the writer process falls
behind (a flood faster than it can decode and compress, a slow disk), the
records that do not fit are dropped and counted, instead of piling up in the
tracer's memory, where a SIGKILL would lose them all.  Control messages
(flush, close) always go in: they are a few bytes each.
"""

from __future__ import annotations

import threading
from collections import deque

#: Event records waiting for the writer process, at most.  A SIGKILLed tracer
#: loses at most this much: the writer process survives it and writes what
#: reached it, and it reads on while it writes (event_writer.EventFiles), so
#: this queue fills only when the writer is slower than the events.  16 MiB is
#: about 110,000 events (the default ring's size).
BUDGET_BYTES = 16 << 20


class WriterQueue:
    """A FIFO of framed messages; ``put`` takes ``size`` bytes of the budget
    until the message is taken out by ``get``."""

    def __init__(self, budget: int = BUDGET_BYTES):
        self.budget = budget
        self._items: deque[tuple[bytes | tuple | None, int]] = deque()
        self._ready = threading.Condition()
        #: bytes of records waiting now
        self.queued = 0

    def room(self) -> int:
        """Bytes of records that still fit.  Only the consumer changes it
        between calls, and it only makes room."""
        with self._ready:
            return max(0, self.budget - self.queued)

    def put(self, msg: bytes | tuple | None, size: int = 0) -> None:
        """Add a message (None ends the consumer); ``size`` bytes count
        against the budget (the caller checked room())."""
        with self._ready:
            self._items.append((msg, size))
            self.queued += size
            self._ready.notify()

    def get(self) -> bytes | tuple | None:
        with self._ready:
            while not self._items:
                self._ready.wait()
            msg, size = self._items.popleft()
            self.queued -= size
            return msg
