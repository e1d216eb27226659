"""The Python stacks the daemon's window refers to, bounded with it.

The stack collector (capture.stacks.stack_collector) symbolizes each new
stack once and adds it here (``add``: a StackStore stands in for its
StackRows).  BPF sends a stack only the first time an event has it (py_seen,
bpf/pystack.h), so a stack cannot simply be dropped when the last event
referring to it leaves the window: the next event with the same stack would
refer to a stack no one has.  So a stack no held event refers to is
*retired*: taken out of py_seen, so that BPF sends it again with the next
event that has it, and kept GRACE_S more, because events written before that
(drained after) may still refer to it.  An event of the window referring to a
retired stack brings it back; once the grace has passed with none, it is
forgotten, here and by the collector, and a later event with the same stack
makes it new again.

Its bytes (``bytes``: an estimate of the rows' strings and numbers) count in
the window's byte budget."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Iterable

import numpy as np
import polars as pl

from .. import schema
from ..stacks.native import Frame

#: how long a retired stack is kept: events drained after its retirement may refer to it
GRACE_S = 0.5
#: the bytes counted for one frame besides its strings (its numbers, and the objects that hold them)
FRAME_BYTES = 120

Key = tuple[int, int]  # (pid, stack_id)


@dataclass
class _Stack:
    frames: list[Frame]
    truncated: bool
    nbytes: int
    retired_ns: int | None = None


@dataclass(frozen=True)
class HeldStacks:
    """The stacks of a snapshot: (pid, stack_id) -> (frames innermost first, truncated)."""

    stacks: dict[Key, tuple[list[Frame], bool]]

    def frame(self, keys: Iterable[Key] | None = None) -> pl.DataFrame:
        """stacks.parquet rows of ``keys`` (None: all), by pid and stack_id."""
        cols: dict[str, list] = {c: [] for c in schema.STACKS_SCHEMA}
        for key in sorted(self.stacks if keys is None else (k for k in keys if k in self.stacks)):
            frames, truncated = self.stacks[key]
            for depth, f in enumerate(frames):
                for name, value in (("pid", key[0]), ("stack_id", key[1]), ("depth", depth), ("kind", f.kind),
                                    ("function", f.function), ("file", f.file), ("line", f.line),
                                    ("module", f.module), ("addr", f.addr), ("truncated", truncated)):
                    cols[name].append(value)
        return pl.DataFrame(cols, schema=schema.STACKS_SCHEMA)


class StackStore:
    """``retire(keys)``: take the stacks out of py_seen; ``forget(keys)``: the
    same, and make the collector forget it saw them (StackCollector.forget_stacks)."""

    def __init__(self, retire: Callable[[list[Key]], None], forget: Callable[[list[Key]], None], *,
                 clock: Callable[[], int] = lambda: time.clock_gettime_ns(time.CLOCK_MONOTONIC)):
        self._retire = retire
        self._forget = forget
        self._clock = clock
        self._stacks: dict[Key, _Stack] = {}
        self._next_due: int | None = None  # the earliest retired stack's end of grace
        self.bytes = 0
        self.forgotten = 0  # stacks forgotten since the start

    # ------------------------------------------------------------------ the collector's side (StackRows)

    def add(self, pid: int, sid: int, frames: list[Frame], truncated: bool) -> None:
        """One new stack, innermost frame first."""
        nbytes = sum(FRAME_BYTES + len(f.function or "") + len(f.file or "") + len(f.module or "") for f in frames)
        old = self._stacks.pop((pid, sid), None)
        if old is not None:
            self.bytes -= old.nbytes
        self._stacks[(pid, sid)] = _Stack(frames, truncated, nbytes)
        self.bytes += nbytes

    # ------------------------------------------------------------------ the window's side

    def __len__(self) -> int:
        return len(self._stacks)

    def due(self) -> bool:
        """Whether a retired stack's grace has passed (collect() would forget it)."""
        return self._next_due is not None and self._clock() >= self._next_due

    def collect(self, live: np.ndarray) -> None:
        """``live``: the stack ids the window's events refer to.  Retire the
        stacks not among them, bring back the retired ones that are, and
        forget those retired GRACE_S ago or more."""
        now = self._clock()
        grace = int(GRACE_S * 1e9)
        held = set(np.unique(live).tolist()) if live.size else set()
        retire: list[Key] = []
        forget: list[Key] = []
        due = None
        for key, s in self._stacks.items():
            if key[1] in held:
                s.retired_ns = None
            elif s.retired_ns is None:
                s.retired_ns = now
                retire.append(key)
                due = now + grace if due is None else due
            elif now - s.retired_ns >= grace:
                forget.append(key)
            else:
                due = s.retired_ns + grace if due is None else min(due, s.retired_ns + grace)
        for key in forget:
            self.bytes -= self._stacks.pop(key).nbytes
        self.forgotten += len(forget)
        self._next_due = due
        if retire:
            self._retire(retire)
        if forget:
            self._forget(forget)

    def held(self, live: np.ndarray, pid: int | None = None) -> HeldStacks:
        """The stacks of ids ``live`` (of ``pid`` only, if given), retired ones included."""
        ids = set(np.unique(live).tolist()) if live.size else set()
        return HeldStacks({k: (s.frames, s.truncated) for k, s in self._stacks.items()
                           if k[1] in ids and (pid is None or k[0] == pid)})


def follow(collector) -> StackStore:
    """A store that takes the stacks ``collector`` (a StackCollector) symbolizes from now on, and has it
    forget those the window no longer refers to."""
    store = StackStore(lambda keys: collector.forget_stacks(keys, symbols=False),
                       lambda keys: collector.forget_stacks(keys, symbols=True))
    collector.rows = store
    return store


def stacks_manifest(collector, pids: set[int]) -> dict | None:
    """The manifest's `stacks` object of a dump of ``pids`` (None: no stacks recorded)."""
    if collector is None:
        return None
    out = collector.manifest()
    out["processes"] = {p: s for p, s in out["processes"].items() if int(p) in pids}
    return out
