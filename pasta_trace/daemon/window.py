"""The flight recorder's memory: the last ``seconds`` (or ``max_bytes``) of
drained events, in segments of a fraction of a second each.

Drained records are gathered into the open segment; a segment closes after
SEGMENT_S or once it holds a sixteenth of the byte budget, and is then one
array.  Whole segments are dropped, oldest first, once their newest event is
older than the window or the segments together pass the byte budget: what the
window holds is bounded whatever the event rate, and every dropped event is
counted (``dropped``).  A dump (snapshot) takes the segments as they are
(closed segments are never changed) and trims to its start time itself.

Names are kept per process while any event of that process is held or the
process lives: a name is small, and a handle named long ago may be launched
in the window.  Python stacks (daemon.stacks) are kept while an event held
refers to them, and count in the byte budget.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..runs import distinct
from .stacks import HeldStacks, StackStore

#: the longest a segment stays open: the granularity at which old events leave
SEGMENT_S = 0.25
#: a segment closes once it holds this fraction of the byte budget
SEGMENTS_PER_BUDGET = 16


@dataclass
class Segment:
    records: np.ndarray
    first_ns: int  # the oldest event's ts_ns
    last_ns: int  # the newest event's ts_ns
    pids: frozenset[int]
    #: the stack ids its events refer to (0, no stack, left out)
    stacks: np.ndarray = field(default_factory=lambda: np.empty(0, np.uint64))


@dataclass
class Snapshot:
    """What a dump writes: the segments held when it was asked for, and the
    names of their processes."""

    segments: list[Segment]
    names: np.ndarray
    #: events drained since the recorder began (of the process asked for) and not in ``segments``
    dropped: int
    #: events in ``segments``
    held: int
    #: every event from this instant on (CLOCK_MONOTONIC ns) is in ``segments``: the recorder's start,
    #: or just after the newest event dropped
    since_ns: int = 0
    pids: set[int] = field(default_factory=set)
    #: the Python stacks the segments' events refer to (None: the daemon records no stacks)
    stacks: HeldStacks | None = None


class Window:
    def __init__(self, seconds: float, max_bytes: int, names_dtype: np.dtype, *,
                 clock: Callable[[], int] = lambda: time.clock_gettime_ns(time.CLOCK_MONOTONIC),
                 stacks: StackStore | None = None):
        self.window_ns = int(seconds * 1e9)
        self.max_bytes = max_bytes
        self._clock = clock
        self._segments: deque[Segment] = deque()
        self._open: list[np.ndarray] = []
        self._open_stacks: list[np.ndarray] = []  # the stack ids of each array of _open
        self.stacks = stacks
        self._open_bytes = 0
        self._opened_at = 0
        self.bytes = 0  # of the closed segments
        self.peak_bytes = 0  # the most held at once, the open segment included
        self.drained = 0  # every event added
        self.dropped = 0  # events that left the window
        self.dropped_by_pid: dict[int, int] = {}
        self._names: dict[int, list[np.ndarray]] = {}
        self._names_dtype = names_dtype
        self.since_ns = clock()  # every event from then on is held (Snapshot.since_ns)

    # ------------------------------------------------------------------ input

    def add(self, recs: np.ndarray) -> None:
        """Records just drained (an array the caller will not reuse)."""
        if recs.size:
            if not self._open:
                self._opened_at = self._clock()
            self._open.append(recs)
            if self.stacks is not None:
                ids = distinct(recs["stack_id"])
                self._open_stacks.append(ids[ids != 0])
            self._open_bytes += recs.nbytes
            self.drained += int(recs.size)
            self.peak_bytes = max(self.peak_bytes, self.bytes + self._open_bytes)
        self.age()

    def add_names(self, recs: np.ndarray) -> None:
        for pid in np.unique(recs["pid"]).tolist() if recs.size else ():
            self._names.setdefault(pid, []).append(recs[recs["pid"] == pid])

    def age(self) -> None:
        """Close the open segment when due, and drop what left the window."""
        now = self._clock()
        if self._open and (now - self._opened_at >= SEGMENT_S * 1e9
                           or self._open_bytes * SEGMENTS_PER_BUDGET >= self.max_bytes):
            self._close()
        dropped = self._drop(now - self.window_ns)
        if self.stacks is not None and (dropped or self.stacks.due()):
            self.stacks.collect(self._live_stacks())

    def _drop(self, cutoff: int = 0) -> bool:
        """Drop segments whose newest event is older than ``cutoff``, and the
        oldest past the byte budget (less what the stacks take); whether any went."""
        budget = self.max_bytes - (self.stacks.bytes if self.stacks is not None else 0)
        dropped = False
        while self._segments and (self._segments[0].last_ns < cutoff or self.bytes > budget):
            old = self._segments.popleft()
            self.since_ns = max(self.since_ns, old.last_ns + 1)
            self.bytes -= old.records.nbytes
            self.dropped += int(old.records.size)
            pids, counts = np.unique(old.records["pid"], return_counts=True)
            for p, n in zip(pids.tolist(), counts.tolist()):
                self.dropped_by_pid[p] = self.dropped_by_pid.get(p, 0) + n
            dropped = True
        return dropped

    def _live_stacks(self) -> np.ndarray:
        """The stack ids the events held refer to (with repeats)."""
        return np.concatenate([np.empty(0, np.uint64), *(s.stacks for s in self._segments), *self._open_stacks])

    def _close(self) -> None:
        recs = np.concatenate(self._open) if len(self._open) > 1 else self._open[0]
        ts = recs["ts_ns"]
        stacks = np.unique(np.concatenate(self._open_stacks)) if self._open_stacks else np.empty(0, np.uint64)
        self._segments.append(Segment(recs, int(ts.min()), int(ts.max()),
                                      frozenset(distinct(recs["pid"]).tolist()), stacks))
        self.bytes += recs.nbytes
        self._open.clear()
        self._open_stacks.clear()
        self._open_bytes = 0

    def forget_names(self, alive: Callable[[int], bool]) -> None:
        """Forget the names and drop counts of processes that have exited and have no event held."""
        held = self.held_pids()
        for table in (self._names, self.dropped_by_pid):
            for pid in [p for p in table if p not in held and not alive(p)]:
                del table[pid]

    def held_pids(self) -> set[int]:
        """The processes with events held."""
        pids: set[int] = set()
        for s in self._segments:
            pids |= s.pids
        for recs in self._open:
            pids.update(np.unique(recs["pid"]).tolist())
        return pids

    # ------------------------------------------------------------------ output

    def snapshot(self, pid: int | None = None) -> Snapshot:
        """Everything held now (the open segment closed first); ``pid``: that process's only."""
        if self._open:
            self._close()
            self._drop()
        segments = list(self._segments)
        stacks = self.stacks.held(self._live_stacks(), pid) if self.stacks is not None else None
        if pid is not None:
            segments = [Segment(s.records[s.records["pid"] == pid], s.first_ns, s.last_ns, frozenset({pid}))
                        for s in segments if pid in s.pids]
        pids = set().union(*(s.pids for s in segments)) if segments else set()
        names = [a for p in sorted(pids) for a in self._names.get(p, ())]
        held = sum(int(s.records.size) for s in segments)
        dropped = self.dropped if pid is None else self.dropped_by_pid.get(pid, 0)
        return Snapshot(segments, np.concatenate(names) if names else np.empty(0, self._names_dtype),
                        dropped, held, pids=pids, since_ns=self.since_ns, stacks=stacks)

    @property
    def held(self) -> int:
        return sum(int(s.records.size) for s in self._segments) + sum(int(r.size) for r in self._open)
