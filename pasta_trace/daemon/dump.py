"""A dump: the flight recorder's window written as an ordinary capture
directory (docs/formats.md), which report, merge and export read unchanged,
with what triggered it in the manifest's ``trigger`` object (format 1.10; an
automatic trigger's fields, daemon.triggers: 1.11).

Everything is written through safe_output, as a capture is: the directory is
claimed new under the daemon's output directory, each file is written to a
temporary name and renamed into place, and the manifest says complete: true
last.  Retention (prune) removes whole dump directories, oldest first.
"""

from __future__ import annotations

import os
import shutil
import socket
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import polars as pl

from .. import schema
from ..errors import UsageError
from ..capture.output import manifest as mf
from ..capture.output.collectives import CommunicatorTable, Sequencer
from ..capture.output.decode import events_frame
from ..capture.output.event_writer import COMMUNICATORS, FILE_BYTES, kind_counts, write_atomic, write_events
from ..capture.session.finish import complete_manifest
from ..capture.output.tensor_sizes import TensorSizes
from ..safe_output import OutputDir
from .naming import dump_names
from .window import Snapshot

PREFIX = "dump-"
#: the triggers this daemon has: `pasta-trace dump` and SIGUSR1, then the automatic ones (daemon.triggers)
TRIGGERS = ("demand", "signal", "oom", "cuda_error", "init_failed", "nccl_hang", "quiet", "killed", "exit")


@dataclass
class Trigger:
    kind: str  # one of TRIGGERS
    cause: str  # what made it, in words: "pasta-trace dump from uid 0 (PID 4242)", "SIGUSR1"
    at: mf.ClockSample  # the snapshot's moment: the window's end
    pid: int | None = None  # the one process dumped; None: every process; an automatic trigger's: its process
    #: when an automatic trigger fired (None: at); the window is the one before it, and what came until ``at``
    fired: mf.ClockSample | None = None
    #: an automatic trigger's own fields for the manifest (api, error, comm_id, sequence, ...: docs/daemon.md)
    details: dict = field(default_factory=dict)


@dataclass
class Tables:
    """What the daemon knows besides the window, at the dump's moment."""

    command_line: list[str]
    api_names: list[str]
    processes: pl.DataFrame  # processes.parquet rows of every process seen
    libraries: pl.DataFrame
    entries: list[mf.LibraryEntry]
    buffer_pages: int
    window_s: float
    window_bytes: int
    #: each loss counter, counted since the window's start (at most a second before it)
    lost: dict[str, int] = field(default_factory=dict)
    #: the maps saved for each process of the dump, and the build-ids of their files (daemon.naming)
    maps: dict[int, str] = field(default_factory=dict)
    build_ids: dict[int, dict] = field(default_factory=dict)
    #: the manifest's `stacks` object (daemon.stacks.stacks_manifest); None: no stacks recorded
    stacks: dict | None = None


@dataclass
class Written:
    path: Path
    events: int
    dropped: int


def dump_name(trigger: Trigger) -> str:
    """dump-<UTC time to the millisecond>-<trigger>[-pid<PID>]: names sort in time order."""
    secs, ns = divmod(trigger.at.realtime_ns, 1_000_000_000)
    when = time.strftime("%Y%m%dT%H%M%S", time.gmtime(secs)) + f".{ns // 1_000_000:03d}Z"
    return f"{PREFIX}{when}-{trigger.kind}" + (f"-pid{trigger.pid}" if trigger.pid is not None else "")


def write_dump(root: Path, snap: Snapshot, trigger: Trigger, tables: Tables,
               owner: tuple[int, int] | None) -> Written:
    """Write ``snap`` under ``root`` as a capture directory named by dump_name."""
    out, path = _claim(root, dump_name(trigger))
    try:
        return _write(out, path, snap, trigger, tables, owner)
    finally:
        if out.fd >= 0:
            out.close()


def _claim(root: Path, name: str) -> tuple[OutputDir, Path]:
    """A new directory ``name`` (``name``.2, .3, ... when two dumps share a millisecond)."""
    for n in range(1, 100):
        path = root / (name if n == 1 else f"{name}.{n}")
        try:
            return OutputDir.claim(path, force=False, reuse_empty=False), path
        except UsageError:
            if not os.path.lexists(path):
                raise  # not taken: the output directory itself is refused
    raise UsageError(f"cannot name a dump under {root}: {name} and its 99 variants exist")


def _write(out: OutputDir, path: Path, snap: Snapshot, trigger: Trigger, tables: Tables,
           owner: tuple[int, int] | None) -> Written:
    # from here on every event is in the dump: the window's length back (from the trigger's firing), or just
    # after the newest dropped
    fired = trigger.fired or trigger.at
    start_ns = max(fired.mono_before_ns - int(tables.window_s * 1e9), snap.since_ns)
    manifest = mf.Manifest(command_line=tables.command_line, mode="system", start=_sample_at(trigger.at, start_ns),
                           buffer_pages=tables.buffer_pages)
    manifest.libraries = tables.entries
    # an automatic trigger's dump holds every process: the memory an OOM lacked, or a hang's other ranks
    manifest.pids = sorted(snap.pids) if trigger.pid is None or trigger.fired is not None else [trigger.pid]
    manifest.trigger = {"kind": trigger.kind, "cause": trigger.cause, "pid": trigger.pid,
                        "window_s": tables.window_s, "window_bytes": tables.window_bytes,
                        "window_start_ns": start_ns, "dropped_events": 0}
    if trigger.fired is not None:
        manifest.trigger.update(fired_ns=trigger.fired.mono_before_ns,
                                after_s=round((trigger.at.mono_before_ns - trigger.fired.mono_before_ns) / 1e9, 3),
                                **trigger.details)
    manifest.write(out, complete=False)
    # the window's segments hold whole drains: events older than the window's start are trimmed here
    parts = [recs for s in snap.segments if (recs := s.records[s.records["ts_ns"] >= start_ns]).size]
    events, by_kind, comms = _write_events(out, parts, tables.api_names)
    dropped = snap.dropped + snap.held - events
    stacks = None
    if snap.stacks is not None:
        rows = snap.stacks.frame(_stack_keys(parts))
        write_atomic(out, "stacks.parquet", rows)
        manifest.stacks = tables.stacks
        stacks = {"stacks": rows.select("pid", "stack_id").n_unique() if rows.height else 0}
    named = dump_names(path, parts, snap.names, tables.api_names, tables.maps, tables.build_ids)
    names = named.names
    write_atomic(out, "names.parquet", names)
    manifest.attach_names = named.attach_names
    processes = _with_minimal_rows(tables.processes.filter(pl.col("pid").is_in(manifest.pids)), comms)
    write_atomic(out, "processes.parquet", processes)
    write_atomic(out, "libraries.parquet", tables.libraries)
    manifest.end = trigger.at
    manifest.trigger["dropped_events"] = dropped
    manifest.counts = mf.counts(events=events, names=names.height, lost=tables.lost, stacks=stacks,
                                by_kind={k: int(n) for k, n in zip(schema.KIND_NAMES, by_kind.tolist())})
    manifest.notes = [*named.notes, *mf.FILE_PROBLEMS.take()]
    if (why := complete_manifest(out, manifest)) is not None:
        raise OSError(f"{path}/manifest.json: {why}")
    out.hand_over(owner)
    return Written(path, events, dropped)


def _stack_keys(parts: list[np.ndarray]) -> list[tuple[int, int]]:
    """The (pid, stack_id) the events of ``parts`` refer to."""
    keys = [pl.DataFrame({"pid": p["pid"], "stack_id": p["stack_id"]}).filter(pl.col("stack_id") != 0)
            for p in parts]
    return pl.concat(keys).unique().rows() if keys else []


def _sample_at(now: mf.ClockSample, mono_ns: int) -> mf.ClockSample:
    """The wall time of monotonic instant ``mono_ns``, from a sample taken later (same bracket)."""
    back = now.mono_before_ns - mono_ns
    return mf.ClockSample(mono_ns, now.realtime_ns - back, now.mono_after_ns - back)


def _with_minimal_rows(processes: pl.DataFrame, comms: dict[int, str]) -> pl.DataFrame:
    """``processes`` plus a row of pid and comm for each process of the events it lacks
    (gone before the daemon read its /proc), as a capture's end adds them."""
    missing = [{**dict.fromkeys(schema.PROCESSES_SCHEMA), "pid": pid, "comm": comm}
               for pid, comm in sorted(comms.items()) if pid not in set(processes["pid"].to_list())]
    if not missing:
        return processes
    return pl.concat([processes, pl.DataFrame(missing, schema=schema.PROCESSES_SCHEMA, orient="row")])


def _write_events(out: OutputDir, parts: list[np.ndarray],
                  api_names: list[str]) -> tuple[int, np.ndarray, dict[int, str]]:
    """events-NNNNN.parquet files of FILE_BYTES of records at most, as the events writer makes them;
    returns the events written, their count by kind, and each process's comm."""
    sizes, sequencer = TensorSizes(), Sequencer()
    communicators = CommunicatorTable(socket.gethostname())
    by_kind = np.zeros(len(schema.KIND_NAMES), np.int64)
    comms: dict[int, str] = {}
    events = files = 0
    while parts:
        n, size = 0, 0
        while n < len(parts) and (n == 0 or size + parts[n].nbytes <= FILE_BYTES):
            size += parts[n].nbytes
            n += 1
        taken, parts = parts[:n], parts[n:]
        data = sizes.fill(events_frame(taken, api_names, sequencer))
        write_events(out, f"events-{files:05d}.parquet", data)
        files += 1
        events += data.height
        by_kind += kind_counts(data)
        for pid, comm in data.select("pid", pl.col("comm").cast(pl.String)).unique("pid", keep="any").iter_rows():
            comms.setdefault(pid, comm)
        if communicators.add(data):
            write_atomic(out, COMMUNICATORS, communicators.rows)
    return events, by_kind, comms


# ---------------------------------------------------------------------- retention

def dumps(root: Path) -> list[tuple[str, int]]:
    """The dump directories under ``root``, oldest first, with their sizes in bytes."""
    try:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return []
    try:
        found = []
        for name in sorted(os.listdir(fd)):
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            if name.startswith(PREFIX) and stat.S_ISDIR(st.st_mode):
                found.append((name, _tree_bytes(fd, name)))
        return found
    finally:
        os.close(fd)


def _tree_bytes(dir_fd: int, name: str) -> int:
    fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dir_fd)
    try:
        total = 0
        for entry in os.listdir(fd):
            st = os.stat(entry, dir_fd=fd, follow_symlinks=False)
            total += _tree_bytes(fd, entry) if stat.S_ISDIR(st.st_mode) else st.st_size
        return total
    finally:
        os.close(fd)


def prune(root: Path, keep: int | None, keep_bytes: int | None) -> list[str]:
    """Remove the oldest dumps until at most ``keep`` remain and they hold at
    most ``keep_bytes`` (the newest always stays).  Returns the names removed."""
    found = dumps(root)
    total = sum(size for _, size in found)
    removed = []
    while len(found) > 1 and ((keep is not None and len(found) > keep)
                              or (keep_bytes is not None and total > keep_bytes)):
        name, size = found.pop(0)
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            shutil.rmtree(name, dir_fd=fd)  # by descriptor: a link planted inside is removed, never followed
        finally:
            os.close(fd)
        total -= size
        removed.append(name)
    return removed
