"""The queue between the drain and the pipe to the events writer process.

It holds framed messages of a few bytes each: control messages (flush,
close) and where each batch of records lies in the ring both processes map
(capture.output.shared_ring).  A sender thread writes them to the pipe, so the drain
never blocks on a full pipe.  It needs no bound of its own: the records are
in the ring, which is bounded, and a batch that does not fit there makes no
message.
"""

from __future__ import annotations

import threading
from collections import deque


class WriterQueue:
    """A FIFO of framed messages; None ends the consumer."""

    def __init__(self) -> None:
        self._items: deque[bytes | None] = deque()
        self._ready = threading.Condition()

    def put(self, msg: bytes | None) -> None:
        with self._ready:
            self._items.append(msg)
            self._ready.notify()

    def get(self) -> bytes | None:
        with self._ready:
            while not self._items:
                self._ready.wait()
            return self._items.popleft()
