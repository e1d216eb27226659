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

Should the events writer die too (killed with the tracer, or during its
takeover), a guardian (capture.procs.guardian), once it has resumed every stopped
process and the writer is gone, goes on where they left off
(guardian_completes): the ledger the three share (capture.output.ledger) says how
many events the tracer handed over and the writer took from the kernel's
ring, and where in that ring; the guardian drains the rest to the capture's
end and counts it, and everything handed or taken that is not in a complete
events file is counted in ``lost_writer_died``.
"""

from __future__ import annotations

import json
import os
import select
import time
from typing import NamedTuple

import numpy as np

from ... import schema
from ...privilege import as_user, invoking_user
from ...safe_output import OutputDir
from ..procs import tracer_end
from . import manifest as mf
from .ledger import Ledger
from ..bpf.map_fds import Map
from ..bpf.ringbuf import RingBuffer

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
    from ..bpf.map_fds import map_info

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


class Takeover:
    """Whoever drains the events ring after the tracer's death: the events
    writer (open, when the spec arrives: the tracer holds the maps then), or
    a guardian once the writer is dead too (``maps`` opened by it earlier)."""

    def __init__(self, spec: dict, ledger: Ledger, maps: tuple[int, dict[str, int]], pidfd: int):
        self.tracer = int(spec["tracer"])
        self._pidfd = pidfd
        self._ledger = ledger
        events_fd, counter_fds = maps
        self._ring = RingBuffer(events_fd, int(spec["events_bytes"]), schema.HOST_EVENT.dtype)
        ncpus = possible_cpus()
        self._counters = {name: Map(fd, 4, 8 * ncpus) for name, fd in counter_fds.items()}
        #: where the kernel's ring is read from (the end of the last whole batch announced, then
        #: of what was taken); from that batch, the events the tracer held back and dropped so far
        self.bpf_end = 0
        self.held = 0
        self.dropped = 0
        #: events of whole batches accepted from the tracer (handed over by it)
        self.received = 0
        #: events drained from the kernel's ring after the tracer's death
        self.taken = 0
        #: CLOCK_MONOTONIC when the tracer was seen to exit: the capture's end
        self.end_ns: int | None = None

    @classmethod
    def open(cls, spec: dict, ledger: Ledger) -> "Takeover":
        """The events writer's: the maps by id and a pidfd of the tracer, its parent (OSError: gone)."""
        maps = tracer_end.open_maps(spec)
        try:
            return cls(spec, ledger, maps, os.pidfd_open(int(spec["tracer"])))
        except BaseException:
            tracer_end.close_maps(maps)
            raise

    def resume(self, end_ns: int) -> None:
        """A guardian's: go on from the ledger (where a takeover left off, or
        from what the tracer last handed over); ``end_ns``: when the guardian
        saw the tracer's exit, the end unless a takeover set one."""
        taken = self._ledger.read("TAKEN")
        if taken is not None:
            self.received, self.taken, self.bpf_end, self.held, self.dropped, self.end_ns = taken
        else:
            self.received, self.bpf_end, self.held, self.dropped = self._ledger.read("TRACER") or (0, 0, 0, 0)
            self.end_ns = end_ns

    def seen(self, bpf_end: int, held: int, dropped: int) -> None:
        if bpf_end:
            self.bpf_end = bpf_end
        self.held, self.dropped = held, dropped

    def tracer_exiting(self) -> bool:
        """Whether the tracer has begun to exit (or is gone): the capture ends
        then, as it ends when a tracer removes its probes.  The pidfd first: a
        PID reused after the tracer's end is never mistaken for it."""
        if select.select([self._pidfd], [], [], 0)[0] or tracer_end.exiting(self.tracer):
            if self.end_ns is None:
                self.end_ns = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
            return True
        return False

    def _publish(self) -> None:
        self._ledger.publish("TAKEN", (self.received, self.taken, self.bpf_end, self.held, self.dropped,
                                       self.end_ns))

    def drain_to_end(self, add, received: int | None = None) -> None:
        """Hand ``add`` every record of a call made before the capture's end
        (the tracer's exit) left in the kernel's ring.  The probes may still
        write records of later calls until the kernel has released them:
        those are past the end, like the calls after a normal capture, and
        are left.  Records lie in the ring in the order they were made, so
        the first record of a call that began after the end ends the
        reading; so does the ring found empty twice, SETTLE_S apart.
        ``received``: the events of whole batches accepted from the tracer
        (the events writer's; a guardian has it from the ledger).  What was
        taken is published in the ledger before it is handed on and before
        its space is given back: whoever goes on after a death starts there."""
        self.tracer_exiting()  # the end: now, if the input ended before it was seen
        if received is not None:
            self.received = received
        self.bpf_end = max(self.bpf_end, self._ring.consumed)
        self._publish()
        recs, end = self._ring.take(self.bpf_end)
        empty = 0
        deadline = time.monotonic() + DRAIN_LIMIT_S
        while True:
            late = np.flatnonzero(recs["ts_ns"] > self.end_ns) if recs.size else np.empty(0, np.int64)
            if late.size:
                recs = recs[:late[0]]
            self.taken += int(recs.size)
            self.bpf_end = end
            self._publish()
            if recs.size:
                add(recs)
            self._ring.commit(end)
            if late.size or time.monotonic() > deadline:
                return
            empty = 0 if recs.size else empty + 1
            if empty == 2:
                return
            if empty:
                time.sleep(tracer_end.SETTLE_S)
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


def _open_own(out: OutputDir, name: str) -> int | None:
    """A file of the capture directory, opened as the invoking user (never
    through a link, never blocking); None if it is not there."""
    try:
        with as_user(out.user):
            return os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=out.fd)
    except OSError:
        return None


def _read_own(out: OutputDir, name: str) -> bytes | None:
    """A file of the capture directory (_open_own), bounded; None if it is not there."""
    fd = _open_own(out, name)
    if fd is None:
        return None
    try:
        return os.read(fd, MANIFEST_MAX + 1)
    finally:
        os.close(fd)


def _rows(out: OutputDir, name: str) -> int:
    import pyarrow.parquet as pq

    fd = _open_own(out, name)
    if fd is None:
        return 0
    try:
        with os.fdopen(fd, "rb") as f:
            return pq.ParquetFile(f).metadata.num_rows
    except Exception:  # noqa: BLE001 - a count for the manifest, never a reason to lose it
        return 0


class OnDisk(NamedTuple):
    """The events files of a capture whose writer died, as found on disk."""

    files: list[str]
    rows: int
    by_kind: np.ndarray  # events per schema.KIND_NAMES
    comms: dict[int, str]  # a comm per process


def events_on_disk(out: OutputDir) -> OnDisk:
    """Remove the half-written temporary files of a dead writer (OutputDir.new_temp's
    names; nobody else writes in the directory meanwhile), then read what the
    complete events files hold: each was renamed into place whole."""
    import polars as pl

    names = sorted(os.listdir(out.fd))
    with as_user(out.user):
        for name in names:
            if name.startswith(".") and name.endswith(".tmp"):
                try:
                    os.unlink(name, dir_fd=out.fd)
                except OSError:
                    pass
    codes = {k: i for i, k in enumerate(schema.KIND_NAMES)}
    files = [n for n in names if n.startswith("events-") and n.endswith(".parquet")]
    rows, by_kind, comms = 0, np.zeros(len(schema.KIND_NAMES), np.int64), {}
    for name in files:
        fd = _open_own(out, name)
        if fd is None:
            raise OSError(f"{name} cannot be opened")
        with os.fdopen(fd, "rb") as f:
            data = pl.read_parquet(f, columns=["pid", "comm", "kind"])
        rows += data.height
        for kind, n in data.group_by(pl.col("kind").cast(pl.String)).len().iter_rows():
            by_kind[codes[kind]] += n
        for pid, comm in data.select("pid", "comm").unique(subset="pid", keep="any").with_columns(
                pl.col("comm").cast(pl.String)).iter_rows():
            comms.setdefault(pid, comm)
    return OnDisk(files, rows, by_kind, comms)


def _incomplete_manifest(out: OutputDir) -> dict | None:
    """The manifest the tracer wrote at its start, if it is still to be completed."""
    raw = _read_own(out, mf.NAME)
    if raw is None or len(raw) > MANIFEST_MAX:
        return None
    try:
        doc = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(doc, dict) or doc.get("complete") is not False:
        return None
    return doc


def complete_manifest(out: OutputDir, take: Takeover, *, events: int, by_kind: np.ndarray, lost: dict[str, int],
                      note: str) -> bool:
    """The manifest the tracer wrote at its start, completed with the counts:
    ``events`` on disk, the kernel's losses and ``lost`` (counted by the
    tracer and by whoever took over), and ``note``.  False where there is no
    such manifest to complete."""
    doc = _incomplete_manifest(out)
    if doc is None:
        return False
    kernel, tallies = take.counters()
    doc["counts"] = mf.counts(events=events, names=_rows(out, "names.parquet"), lost=kernel | lost,
                              by_kind={k: int(n) for k, n in zip(schema.KIND_NAMES, by_kind.tolist())},
                              tallies=tallies)
    end = mf.ClockSample.now()
    doc["clock"]["end_ns"] = take.end_ns
    doc["clock"]["end_sample"] = {"mono_before_ns": end.mono_before_ns, "realtime_ns": end.realtime_ns,
                                  "mono_after_ns": end.mono_after_ns}
    doc["notes"] = [*doc.get("notes", []), note]
    doc["complete"] = True
    out.write_bytes(mf.NAME, (json.dumps(doc, indent=2) + "\n").encode())
    return True


def writer_completes(out: OutputDir, files, take: Takeover) -> bool:
    """The events writer's end after the tracer's death: everything it was
    handed and took is written (``files``: its EventFiles) or counted."""
    lost = {"lost_writer_behind": take.dropped, "lost_unwritten": files.unwritten, "lost_writer_died": 0,
            "lost_tracer_died": take.held}
    return complete_manifest(out, take, events=files.written, by_kind=files.by_kind, lost=lost, note=(
        f"the tracer (PID {take.tracer}) died during the capture: the events writer wrote what it had been "
        f"handed and the {take.taken:,} events left in the kernel's ring; events the tracer held back "
        f"({take.held:,}) are counted in lost_tracer_died; names.parquet, processes.parquet and libraries.parquet "
        "hold what the tracer wrote before"))


def guardian_completes(out: OutputDir, take: Takeover, ledger: Ledger, end_ns: int) -> bool:
    """A guardian's end of a capture whose tracer and events writer both
    died (call once both are gone, one guardian at a time): drain the
    kernel's ring to the capture's end and count what is in it, count what
    the writer was handed or took and did not write (capture.output.ledger), and
    complete the manifest from the events files on disk.  False where the
    manifest needs nothing (the writer completed it, or the tracer did)."""
    if _incomplete_manifest(out) is None:
        return False
    take.resume(end_ns)
    before = take.taken
    take.drain_to_end(lambda recs: None)  # counted in take.taken: nobody is left to write them
    disk = events_on_disk(out)
    unwritten = (ledger.read("UNWRITTEN") or (0,))[0]
    died = take.received + take.taken - disk.rows - unwritten
    lost = {"lost_writer_behind": take.dropped, "lost_unwritten": unwritten, "lost_writer_died": died,
            "lost_tracer_died": take.held}
    done = complete_manifest(out, take, events=disk.rows, by_kind=disk.by_kind, lost=lost, note=(
        f"the tracer (PID {take.tracer}) and its events writer died during the capture; a guardian completed it "
        f"from the {len(disk.files)} events files on disk: the {died:,} events handed to the writer or left in "
        f"the kernel's ring ({take.taken - before:,} drained by the guardian) and not written are counted in "
        f"lost_writer_died, events the tracer held back ({take.held:,}) in lost_tracer_died; names.parquet, "
        "processes.parquet and libraries.parquet hold what the tracer wrote before"))
    out.hand_over(invoking_user(), also=[*disk.files, mf.NAME])
    return done
