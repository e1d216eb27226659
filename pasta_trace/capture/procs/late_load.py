"""Libraries loaded after the capture starts, traced from their first call.

bpf/discover.bpf.c (its text: probes.program.build) stops (SIGSTOP) a traced process whose open of a
libcuda.so* / libcudart.so* / libamdhip64.so* / libc10.so* / libnccl.so* file for reading succeeded, before the open
returns, and records it in the pt_stops map.  The watcher resolves the opened
file through /proc/PID/fd/<fd>, attaches the probes through that same
descriptor (capture.bpf.probe_set, probes.pinned) if its inode is new,
records the file's (device, inode) as known (so the next open of that file,
by any path, does not stop anyone) and resumes the process with SIGCONT.  A
file that got no probe (a library still being written, say) is not made
known: its next open is stopped and tried again.

A library of any name is stopped the same way at its first executable
mapping (mmap with PROT_EXEC, before ld.so relocates it or runs any of its
code): one with the CUDA runtime linked in (`nvcc -shared` links
libcudart_static) is probed there, before its first launch, and any other
goes into the kernel's plain_files, so that it stops nobody again.  With a pid
filter every executable mapping is reported too (on_map): the tracker keeps
it with the process's maps, which offline naming reads once the process has
gone.  The same program reports forks, execs and exits of traced processes.

A guardian process (capture.procs.guardian) resumes every recorded stop if the
tracer dies before it could.

Caveat (documented in README): a process that was already stopped by job
control when it opened the library is resumed by our SIGCONT.
"""

from __future__ import annotations

import enum
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from ... import schema
from . import guardian
from ..bpf.map_fds import Map, MapsByName, map_info
from ..bpf.ringbuf import RingBuffer, open_table

DiscoverType = schema.DiscoverType
DISCOVER_EVENT = schema.DISCOVER_EVENT
STOP_RECORD = schema.STOP_RECORD
#: pt_stops fd of a Python process held at its interpreter's finalization (bpf/discover.bpf.c)
FINALIZING_FD = -2
#: how often the own processes of other tracers are looked for (LateLoadWatcher.own_others)
OTHERS_INTERVAL_S = 1.0


def kernel_dev(st_dev: int) -> int:
    """stat's st_dev in the kernel's own encoding (what BPF reads from a super_block)."""
    return (os.major(st_dev) << 20) | os.minor(st_dev)


class Opened(enum.IntEnum):
    """What a stopped process's library came to (``on_library``'s answer; True and False also do)."""

    RETRY = 0  # no probe (yet): its next open or mapping stops again
    PROBED = 1  # it has probes: its opens and mappings stop nobody
    PLAIN = 2  # nothing in it to probe: its mappings stop nobody


@dataclass
class OpenedLibrary:
    pid: int
    path: str  # as the process named it in open() (empty: caught at its mapping)
    ns_path: str  # the file's path inside the process's mount namespace
    attach_path: str  # reachable from the tracer
    dev: int
    inode: int


def resolve_open(pid: int, fd: int, path: str, proc: Path = Path("/proc")) -> OpenedLibrary | None:
    """The file behind ``fd`` in the stopped process (None if it is gone)."""
    fd_link = proc / str(pid) / "fd" / str(fd)
    try:
        st = os.stat(fd_link)
        ns_path = os.readlink(fd_link)
    except OSError:
        return None
    # attached through the descriptor itself: a path through the process's root can have
    # another file mounted over it (unshare -Urm) between this look and the attach
    return OpenedLibrary(pid, path, ns_path, str(fd_link), st.st_dev, st.st_ino)


class LateLoadWatcher:
    """Handles the stops and drains the notifications of bpf/discover.bpf.c;
    calls back into the session for each: ``on_library`` for a library opened
    by a traced name, ``on_mapped`` for a file stopped at its first executable
    mapping.  Each returns an Opened (or whether the file has probes now): only
    a file with probes is made known to the kernel, and only a file with
    nothing to probe plain."""

    def __init__(
        self,
        bpf,
        *,
        on_library: Callable[[OpenedLibrary], Opened | bool],
        on_fork: Callable[[int, int, int], None],
        on_exec: Callable[[int, int], None],
        on_exit: Callable[[int, int], None],
        on_warning: Callable[[str], None] = lambda msg: None,
        on_mapped: Callable[[OpenedLibrary], Opened | bool] = lambda lib: Opened.PLAIN,
        on_map: Callable[[np.void], None] = lambda rec: None,
        on_finalizing: Callable[[], None] = lambda: None,
        on_exit_status: Callable[[int, int], None] = lambda pid, exit_code: None,
    ):
        self._bpf = bpf
        self._ring: RingBuffer | None = open_table(bpf, "discover_events", DISCOVER_EVENT.dtype)
        self._known = bpf["known_files"]
        self._plain = bpf["plain_files"]
        self.on_library, self.on_fork, self.on_exec, self.on_exit = on_library, on_fork, on_exec, on_exit
        self.on_mapped, self.on_map = on_mapped, on_map
        #: (pid, wait status) of each traced process's exit (the daemon's exit triggers)
        self.on_exit_status = on_exit_status
        #: Python processes held at their finalization wait for it (it reads their stacks' code objects)
        self.on_finalizing = on_finalizing
        self.on_warning = on_warning
        stops_fd = bpf["pt_stops"].map_fd
        self._stops = Map(stops_fd, 4, STOP_RECORD.dtype.itemsize)
        self._others = MapsByName(guardian.STOPS_MAP, 4, STOP_RECORD.dtype.itemsize, {map_info(stops_fd)[0]})
        self._cfg = bpf["discover_cfg"]
        self._cfg[self._cfg.Key(0)] = self._cfg.Leaf(os.getpid())
        self._own = bpf["pt_own"]
        self.own(os.getpid())
        # the tracers beside us: we stop none of their processes at a mapping (nor they ours), or
        # two tracers each stopped at a module it imports would wait for each other
        self._other_owns = MapsByName("pt_own", 4, 1, {map_info(self._own.map_fd)[0]})
        self._others_seen = 0.0
        # armed only once someone outlives us to resume what we stop
        self._guardian_args = (stops_fd, self._cfg.map_fd, STOP_RECORD.dtype.itemsize,
                               STOP_RECORD.dtype.fields["tgid"][1])
        self._guardians = guardian.start(guardian.GUARDIANS, *self._guardian_args)
        for g in self._guardians:
            self.own(g.pid)
        self.guardians_replaced = 0
        self._notice: guardian.Notice | None = None  # for the guardians, should we and our writer die
        # the other tracers' processes before we stop anyone: a tracer in its set-up opens the
        # libraries of the processes it scans, and does not poll; two of them, each stopping the
        # other at such an open before it knew it, waited for each other for good.  Of two tracers
        # each marks itself before it looks: at least the later one sees the other
        self.own_others()
        self._cfg[self._cfg.Key(1)] = self._cfg.Leaf(1)
        self.stops = 0  # opens of a traced name paused
        self.map_stops = 0  # first executable mappings of a file paused
        self._unremembered: set[tuple[int, int]] = set()  # files with probes the kernel could not remember

    def own(self, pid: int) -> None:
        """A process of this tracer's (its events writer, say): never stopped.
        The kernel forgets it when it exits."""
        self._own[self._own.Key(pid)] = self._own.Leaf(1)

    def disown_elsewhere(self, pid: int) -> None:
        """``pid``, our child but not one of our own processes (the launched
        command), taken out of the other tracers' `pt_own`: under -a a child
        of a tracer (ours counts as theirs) is one of its own from its first
        instruction, so a system-wide tracer running beside us would never
        trace the command.  Twice: a tracer may copy it from another's map
        between our deletes."""
        key = pid.to_bytes(4, "little")
        for _ in range(2):
            self._other_owns.delete_everywhere(key)

    @property
    def guardian_pid(self) -> int:
        return self._guardians[0].pid

    @property
    def guardian_pids(self) -> list[int]:
        return [g.pid for g in self._guardians]

    def guard_spec(self) -> dict:
        """What another of our processes needs to guard our stops too (guardian.watch_in_thread)."""
        stops_fd, cfg_fd, value_size, tgid_offset = self._guardian_args
        return {"tracer": os.getpid(), "stops_id": map_info(stops_fd)[0], "cfg_id": map_info(cfg_fd)[0],
                "value_size": value_size, "tgid_offset": tgid_offset}

    def guard_capture(self, notice: guardian.Notice) -> None:
        """Have every guardian, now and replaced, complete the capture should we and its events writer die."""
        self._notice = notice
        for g in self._guardians:
            g.notify(notice)

    def _keep_guardians(self) -> None:
        """Replace each guardian that died (a SIGKILL): while we live, GUARDIANS of them watch us."""
        dead = [g for g in self._guardians if g.ended()]
        if not dead:
            return
        new = guardian.start(len(dead), *self._guardian_args)
        for g in new:
            self.own(g.pid)
            if self._notice is not None:
                g.notify(self._notice)
        self._guardians = [g for g in self._guardians if g not in dead] + new
        self.guardians_replaced += len(dead)

    def disarm(self) -> None:
        """Stop stopping processes, then resume any stopped just before.

        Called before the tracer stops polling: the probes outlive the session
        for a while (their removal runs in the background), and a process that
        opened a library then must not wait for a SIGCONT that never comes."""
        if self._ring is None:
            return
        self._cfg[self._cfg.Key(1)] = self._cfg.Leaf(0)
        self.poll()

    def add_known(self, dev: int, inode: int) -> None:
        """A file (stat's st_dev, inode) that has probes: its opens need no stop."""
        self._add_known_key(kernel_dev(dev), inode)

    def _add_known_key(self, kdev: int, inode: int) -> None:
        key = self._known.Key(kdev, inode)
        if key in self._known:
            return
        try:
            self._known[key] = self._known.Leaf(1)
        except Exception:  # noqa: BLE001 - BCC raises a bare Exception (E2BIG: the table is full)
            first = not self._unremembered
            self._unremembered.add((kdev, inode))
            if first:
                self.on_warning(f"more than {self._known.max_entries} library files have probes: each later "
                                "open of another one pauses its process for a moment")

    @property
    def known_full(self) -> int:
        """Library files with probes that the full known_files table could not hold."""
        return len(self._unremembered)

    @property
    def wake_fd(self) -> int | None:
        """The fd of the notification ring, readable when an exec was noted (None once closed)."""
        return self._ring.fd if self._ring is not None else None

    def arm_mappings(self) -> None:
        """Stop processes at their first executable mapping of a file from now
        on: once the set-up that keeps the tracer from polling (compiling,
        scanning every process) is done, before the banner tells the user the
        probes are on."""
        self.own_others()
        self._cfg[self._cfg.Key(2)] = self._cfg.Leaf(1)

    def own_others(self) -> None:
        """Count the processes of the other tracers on this machine (their
        pt_own) as our own: never stopped.  The kernel forgets each at its exit."""
        self._others_seen = time.monotonic()
        for key in self._other_owns.keys():
            try:
                self._own[self._own.Key(int.from_bytes(key, "little"))] = self._own.Leaf(1)
            except Exception:  # noqa: BLE001 - BCC raises a bare Exception (E2BIG: the table is full)
                return

    def poll(self) -> int:
        """Handle every pending stop and notification; returns how many there were."""
        self._keep_guardians()
        if time.monotonic() - self._others_seen >= OTHERS_INTERVAL_S:
            self.own_others()
        # the stops first, then the ring: the program writes a process's exec record
        # before its stop record, so every exec stop read here has its record in this
        # drain, and its maps are read (on_exec) before it is resumed below.  The other
        # order let an exec landing between the two be resumed with its maps unread.
        pending = self._pending_stops()
        recs = self._ring.drain()
        maps = []
        for rec in recs:  # rare events (forks, exits), not the event stream
            kind = int(rec["type"])
            pid = int(rec["pid"])
            if kind == DiscoverType.FORK:
                self.on_fork(pid, int(rec["ppid"]), int(rec["ts_ns"]))
            elif kind == DiscoverType.EXEC:
                maps = [m for m in maps if int(m["pid"]) != pid]  # the old image's: gone with it
                self.on_exec(pid, int(rec["cgroup_id"]))
            elif kind == DiscoverType.EXIT:
                self.on_exit(pid, int(rec["ts_ns"]))
                self.on_exit_status(pid, int(rec["exit_code"]))
            elif kind == DiscoverType.MAP:
                maps.append(rec)
        handled = self._handle_stops(pending)
        for rec in maps:  # after the stops: a file's first mapping is named by its stop
            self.on_map(rec)
        return int(recs.size) + handled

    def _pending_stops(self) -> list[tuple[bytes, np.void]]:
        pending = []
        for key in self._stops.keys():
            val = self._stops.lookup(key)
            if val is not None:
                pending.append((key, np.frombuffer(val, STOP_RECORD.dtype)[0]))
        return pending

    def _handle_stops(self, pending: list[tuple[bytes, np.void]]) -> int:
        """Attach for every stopped process, then resume them all: a process
        with two threads stopped at two libraries resumes once both have probes."""
        if not pending:
            return 0
        opened = [len(st["path"]) > 0 for _, st in pending]  # an empty path: stopped at an mmap
        self.stops += sum(o and int(st["fd"]) >= 0 for o, (_, st) in zip(opened, pending))  # not execs
        self.map_stops += sum(not o and int(st["fd"]) >= 0 for o, (_, st) in zip(opened, pending))
        try:
            if any(int(st["fd"]) == FINALIZING_FD for _, st in pending):
                self.on_finalizing()
            for _, st in pending:
                if int(st["fd"]) < 0:
                    continue  # stopped at its exec: its maps were read when the ring's exec record was (on_exec)
                path = bytes(st["path"]).split(b"\0", 1)[0].decode("utf-8", "replace")
                lib = resolve_open(int(st["tgid"]), int(st["fd"]), path)
                if lib is None:
                    continue
                outcome = self.on_library(lib) if path else self.on_mapped(lib)
                # the key the kernel computed (ProbeSet made stat's known): an overlay's device
                # may differ.  Only for the inode looked at: a process sharing the stopped one's
                # descriptors can put another file at its fd before we look, and the file it
                # opened must then stay unknown (its next open stops again)
                if lib.inode != int(st["ino"]):
                    continue
                if outcome == Opened.PROBED:
                    self._add_known_key(int(st["dev"]), int(st["ino"]))
                elif outcome == Opened.PLAIN:
                    self._plain[self._plain.Key(int(st["dev"]), int(st["ino"]))] = self._plain.Leaf(1)
        finally:
            # never leave a process stopped, whatever happened above
            for key, st in pending:
                guardian.release(self._stops, self._others, key, int(st["tgid"]))
        return len(pending)

    def close(self) -> None:
        if self._ring is None:
            return
        try:
            self.disarm()  # its loss counters (schema.LOSSES) are read with the probes' (bpf_maps.read_lost)
        finally:
            self._ring.close()
            self._ring = None
            guardian.close_all(self._guardians)
            if self._notice is not None:
                self._notice.close()
