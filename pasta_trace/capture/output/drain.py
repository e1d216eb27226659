"""The drain loop: empties the rings every POLL_INTERVAL_S into the writer,
handles late-loaded libraries, and decides when the capture ends.

With Python stacks on, the loop also wakes as soon as a new stack is written
(the BPF side sends each distinct stack once, with a wake-up): its code
objects are read from the process at once, while they still exist.  With
native stacks on, the first native stack of each process wakes it too: the
process's maps are read while it runs."""

from __future__ import annotations

import os
import select
import time
from typing import Callable

import numpy as np

from ... import schema
from . import takeover
from ..naming.attach_names import AttachNamer
from ..bpf.bpf_maps import read_lost
from .heap import keep_freed_memory
from ..procs.late_load import LateLoadWatcher
from ..procs.launch import HeldCommand
from ..stacks.native_collector import NativeCollector
from ..bpf.ringbuf import open_table
from ..stacks.stack_collector import StackCollector
from ..procs.tracker import ProcessTracker
from .writer import CaptureWriter

POLL_INTERVAL_S = 0.01

#: Nice value of the draining thread: it sleeps almost all the time, and when it
#: wakes it must win the CPU from the traced threads or the ring overflows.
DRAIN_NICE = -10


def boost_drain_thread() -> None:
    """Raise the calling thread's priority (Linux nice values are per thread)."""
    try:
        os.setpriority(os.PRIO_PROCESS, 0, DRAIN_NICE)
    except OSError:
        pass  # without CAP_SYS_NICE: normal priority, a larger --buffer-pages helps instead


def status_text(events: int, lost: dict[str, int]) -> str:
    """The live status line: events so far, and every kind of loss that counted."""
    return f"{events:,} events, lost: {schema.loss_text(lost) or 0}"


class DrainLoop:
    """Owns the event and name rings of one capture while it runs."""

    def __init__(self, bpf, writer: CaptureWriter, tracker: ProcessTracker, watcher: LateLoadWatcher, *,
                 on_flush: Callable[[], None], say: Callable[[str], None], status: Callable[[str], None] | None,
                 stacks: StackCollector | None = None, native: NativeCollector | None = None,
                 namer: AttachNamer | None = None, on_events: Callable[[np.ndarray], None] | None = None):
        self._bpf = bpf
        self._on_events = on_events  # each drain's records (--device cupti -p: a late injection)
        self._namer = namer
        self._stacks = stacks
        self._native = native
        self._say = say
        self._writer = writer
        self._tracker = tracker
        self._watcher = watcher
        self._on_flush = on_flush
        self._status = status
        # drained into the same memory each time: the records are copied on
        # (into the writer's shared ring) before the next drain
        self._events = open_table(bpf, "events", schema.HOST_EVENT.dtype, reuse=True)
        self._names = open_table(bpf, "names", schema.HOST_NAME.dtype)
        # should we die, the writer process drains the events ring (capture.output.takeover): its
        # space is given back only once the writer process knows where its records went
        spec = takeover.spec_of(bpf)
        writer.take_over(spec, self._events.commit)
        watcher.guard_capture(writer.notice(spec))  # should the writer die too, a guardian completes the capture
        self._held = 0  # events drained and held back (native stacks), as last told to the writer
        self._wake = None
        # a new stack, a new process's native stack or an exec wakes the loop before POLL_INTERVAL_S
        for fd in [c.fd for c in (stacks, native) if c is not None] + [watcher.wake_fd]:
            if fd is not None:
                self._wake = self._wake or select.poll()
                self._wake.register(fd, select.POLLIN)
        self._open = True

    def _sleep(self) -> None:
        """Wait POLL_INTERVAL_S, or less when a new stack (or a new process's native stack) or an exec arrives."""
        if self._wake is None:
            time.sleep(POLL_INTERVAL_S)
            return
        self._wake.poll(POLL_INTERVAL_S * 1000)
        for c in (self._stacks, self._native):
            if c is not None:
                c.drain()

    def run(self, *, stop: Callable[[], bool], held: HeldCommand | None, mode: str,
            duration: float | None) -> int | None:
        """Drain until ``stop()``, the duration, the launched command's exit or
        (-p) the exit of every traced process, or the death of the events writer
        process.  Returns the command's exit code."""
        boost_drain_thread()
        keep_freed_memory()  # each drain's records are copied out into memory freed by the ones before
        deadline = time.monotonic() + duration if duration else None
        exit_code = None
        last_status = 0.0
        while not stop():
            self.drain()
            self._watcher.poll()
            now = time.monotonic()
            if self._writer.due():
                self._writer.flush_async()
                self._on_flush()
            self._tracker.rescan_if_due()
            if self._namer is not None:
                self._namer.poll()
            if self._status and now - last_status >= 0.25:
                last_status = now
                self._status(status_text(self._writer.events, read_lost(self._bpf)))
            if deadline is not None and now >= deadline:
                break
            if held is not None and (code := held.poll()) is not None:
                exit_code = code
                break
            if not self._writer.check_alive():
                # nothing more can be written: end now, counting what it left (CaptureWriter.close)
                self._say(f"error: {self._writer.died}: ending the capture")
                break
            if mode == "pid" and not self._tracker.alive_pids():
                self._say("all traced processes exited")
                break
            self._sleep()
        # what the probes wrote before we stopped
        self.drain()
        if self._native is not None and (held_events := self._native.settle()) is not None:
            self._writer.add_events(held_events)
        self._watcher.disarm()
        return exit_code

    def drain(self) -> None:
        if self._stacks is not None:  # first: a stack is symbolized while its process is alive
            self._stacks.drain()
        if self._native is not None:  # then the native ones, which name the Python ones
            self._native.drain()
        recs, end = self._events.take()
        if self._native is not None:
            recs = self._native.resolve(recs)  # less the events whose native stack is not unwound yet
        held = self._native.held if self._native is not None else 0
        if recs.size or held != self._held or end > self._events.consumed:
            self._writer.add_events(recs, bpf_end=end, held=held)
            self._held = held
        if recs.size:
            self._tracker.seen_in_events(np.unique(recs["pid"]).tolist())
            self._tracker.seen_launches(recs)
            if self._on_events is not None:
                self._on_events(recs)
        names = self._names.drain()
        self._writer.add_names(names)
        if self._namer is not None:
            self._namer.observe(recs, names)

    def close(self) -> None:
        if self._open:
            self._open = False
            self._events.close()
            self._names.close()
