"""The events writer process takes the events ring over from a dead tracer.

A tracer killed in a flood leaves events in the kernel's ring buffer, and
its probes go on filling it until the kernel has released its uprobe links
(seconds after the SIGKILL).  The events writer outlives it, so it holds the
ring and the loss counters too (by map id, opened while the tracer still
holds them: ``spec``), and once its input ends without the tracer's close
it drains the ring itself until the tracer is gone, writes those events,
reads the kernel's loss counters and completes the manifest.  Nothing is
then left uncounted:

- The tracer gives the ring's space back to the kernel only once the events
  writer was told where the records lie in the ring they share (its sender
  thread commits a batch's end after writing the message that names it), so
  every record is either announced to the writer (in the pipe, which
  outlives the tracer) or still in the kernel's ring past the last position
  announced: this takes over from there, and nothing is read twice.
- Each message also carries what the tracer counted itself: the events it
  dropped because the shared ring was full (``lost_writer_behind``) and the
  events it held back, drained but not handed over (with native stacks,
  events whose stack is not unwound yet): those are lost with the tracer's
  memory, counted in ``lost_tracer_died``.
- The kernel counted every event it could not put in a ring (``lost_events``
  and the other BPF counters), read here once the probes are gone.

So events on disk plus the counted losses are every call the probes saw.
"""

from __future__ import annotations

import json
import os
import select
import time

import numpy as np

from .. import schema
from ..privilege import as_user
from ..safe_output import OutputDir
from . import guardian
from . import manifest as mf
from .map_fds import Map, lib
from .ringbuf import RingBuffer

#: how long the events left in the ring are read, at most (a ring a flood keeps full never empties)
DRAIN_LIMIT_S = 30.0
#: a manifest larger than this is not the one the tracer wrote
MANIFEST_MAX = 16 << 20


def possible_cpus(path: str = "/sys/devices/system/cpu/possible") -> int:
    """How many values a per-CPU map holds per key ("0-3,5" -> 5)."""
    with open(path) as f:
        text = f.read().strip()
    n = 0
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        n = max(n, int(hi or lo) + 1)
    return n


def spec_of(bpf) -> dict:
    """What the events writer needs to take over (the tracer's side: call
    while the program is loaded): the events ring and every per-CPU counter
    array of schema.LOSSES and the tallies the program has, by map id."""
    from .map_fds import map_info

    counters = {}
    for name in [*dict.fromkeys(loss.counter for loss in schema.LOSSES if loss.counter), "tally"]:
        try:
            table = bpf[name]
        except KeyError:
            continue
        counters[name] = map_info(table.map_fd)[0]
    events = bpf["events"]
    return {"tracer": os.getpid(), "events_id": map_info(events.map_fd)[0], "events_bytes": int(events.max_entries),
            "counters": counters}


def _map_fd(ident: int) -> int:
    fd = lib().bpf_map_get_fd_by_id(ident)
    if fd < 0:
        raise OSError("the map is gone")
    return fd


class Takeover:
    """The writer's side: opened when the spec arrives (the tracer holds the maps then)."""

    def __init__(self, spec: dict):
        self.tracer = int(spec["tracer"])
        self._pidfd = os.pidfd_open(self.tracer)
        self._ring = RingBuffer(_map_fd(spec["events_id"]), int(spec["events_bytes"]), schema.HOST_EVENT.dtype)
        ncpus = possible_cpus()
        self._counters = {name: Map(_map_fd(ident), 4, 8 * ncpus) for name, ident in spec["counters"].items()}
        #: from the last whole batch announced: its end in the kernel's ring, the events the
        #: tracer held back and those it dropped so far
        self.bpf_end = 0
        self.held = 0
        self.dropped = 0
        #: events drained here after the tracer's death
        self.taken = 0
        #: CLOCK_MONOTONIC when the tracer was seen to exit: the capture's end
        self.end_ns: int | None = None

    def seen(self, bpf_end: int, held: int, dropped: int) -> None:
        if bpf_end:
            self.bpf_end = bpf_end
        self.held, self.dropped = held, dropped

    def tracer_exiting(self) -> bool:
        """Whether the tracer has begun to exit (or is gone): the capture ends
        then, as it ends when a tracer removes its probes.  The pidfd first: a
        PID reused after the tracer's end is never mistaken for it."""
        if select.select([self._pidfd], [], [], 0)[0] or guardian.exiting(self.tracer):
            if self.end_ns is None:
                self.end_ns = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
            return True
        return False

    def drain_to_end(self, add) -> None:
        """Hand ``add`` every record of a call made before the capture's end
        (the tracer's exit) left in the kernel's ring.  The probes may still
        write records of later calls until the kernel has released them:
        those are past the end, like the calls after a normal capture, and
        are left.  Records lie in the ring in the order they were made, so
        the first record of a call that began after the end ends the
        reading; so does the ring found empty twice, SETTLE_S apart."""
        self.tracer_exiting()  # the end: now, if the input ended before it was seen
        recs, end = self._ring.take(max(self.bpf_end, self._ring.consumed))
        empty = 0
        deadline = time.monotonic() + DRAIN_LIMIT_S
        while True:
            late = np.flatnonzero(recs["ts_ns"] > self.end_ns) if recs.size else np.empty(0, np.int64)
            if late.size:
                recs = recs[:late[0]]
            if recs.size:
                self.taken += int(recs.size)
                add(recs)
            self._ring.commit(end)
            if late.size or time.monotonic() > deadline:
                return
            empty = 0 if recs.size else empty + 1
            if empty == 2:
                return
            if empty:
                time.sleep(guardian.SETTLE_S)
            recs, end = self._ring.take()

    def counters(self) -> tuple[dict[str, int], dict[str, int]]:
        """The kernel's loss counters and tallies, summed over CPUs (schema.LOSSES, schema.TALLIES)."""
        lost: dict[str, int] = {}
        tallies = {t.name: 0 for t in schema.TALLIES}
        rows = [(loss.counter, loss.index, loss.name, lost) for loss in schema.LOSSES if loss.counter]
        rows += [("tally", t.index, t.name, tallies) for t in schema.TALLIES]
        for counter, index, name, into in rows:
            m = self._counters.get(counter)
            if m is None:
                continue
            val = m.lookup(index.to_bytes(4, "little"))
            if val is not None:
                into[name] = int(np.frombuffer(val, np.uint64).sum())
        return lost, tallies


def _read_own(out: OutputDir, name: str) -> bytes | None:
    """A file of the capture directory, opened as the invoking user (never
    through a link, never blocking), bounded; None if it is not there."""
    try:
        with as_user(out.user):
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=out.fd)
    except OSError:
        return None
    try:
        return os.read(fd, MANIFEST_MAX + 1)
    finally:
        os.close(fd)


def _rows(out: OutputDir, name: str) -> int:
    import pyarrow.parquet as pq

    try:
        with as_user(out.user):
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=out.fd)
    except OSError:
        return 0
    try:
        with os.fdopen(fd, "rb") as f:
            return pq.ParquetFile(f).metadata.num_rows
    except Exception:  # noqa: BLE001 - a count for the manifest, never a reason to lose it
        return 0


def complete_manifest(out: OutputDir, files, take: Takeover) -> bool:
    """The manifest the tracer wrote at its start, completed with the counts:
    the events on disk, the kernel's losses and those counted by the tracer
    and by this process.  False where there is no such manifest to complete."""
    raw = _read_own(out, mf.NAME)
    if raw is None or len(raw) > MANIFEST_MAX:
        return False
    try:
        doc = json.loads(raw)
    except ValueError:
        return False
    if not isinstance(doc, dict) or doc.get("complete") is not False:
        return False
    lost, tallies = take.counters()
    lost |= {"lost_writer_behind": take.dropped, "lost_unwritten": files.unwritten, "lost_writer_died": 0,
             "lost_tracer_died": take.held}
    by_kind = {k: int(n) for k, n in zip(schema.KIND_NAMES, files.by_kind.tolist())}
    doc["counts"] = mf.counts(events=files.written, names=_rows(out, "names.parquet"), lost=lost, by_kind=by_kind,
                              tallies=tallies)
    end = mf.ClockSample.now()
    doc["clock"]["end_ns"] = take.end_ns
    doc["clock"]["end_sample"] = {"mono_before_ns": end.mono_before_ns, "realtime_ns": end.realtime_ns,
                                  "mono_after_ns": end.mono_after_ns}
    doc["notes"] = [*doc.get("notes", []), (
        f"the tracer (PID {take.tracer}) died during the capture: the events writer wrote what it had been "
        f"handed and the {take.taken:,} events left in the kernel's ring; events the tracer held back "
        f"({take.held:,}) are counted in lost_tracer_died; names.parquet, processes.parquet and libraries.parquet "
        "hold what the tracer wrote before")]
    doc["complete"] = True
    out.write_bytes(mf.NAME, (json.dumps(doc, indent=2) + "\n").encode())
    return True
