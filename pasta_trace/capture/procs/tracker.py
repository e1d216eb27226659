"""The processes of one capture: which PIDs are traced, their forks, execs
and exits, the maps each had, and (system-wide) the rescan for new ones."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable, Iterable

import numpy as np

from ... import schema
from ...runs import distinct
from . import discovery, reach
from ..naming.build_ids import BuildIds
from .late_load import Opened, OpenedLibrary, kernel_dev
from ..bpf.probe_set import ProbeSet
from ..stacks.native_collector import NativeCollector
from ..stacks.stack_collector import StackCollector
from .processes import ProcessTable
from .targets import alive, unreadable

RESCAN_INTERVAL_S = 1.0
PAGE = 4096


def _ranges(maps: str) -> tuple[np.ndarray, np.ndarray]:
    """(starts, ends) of every mapping of a /proc/PID/maps text, sorted."""
    bounds = [line.split(None, 1)[0].partition("-") for line in maps.splitlines() if line]
    starts = np.array([int(a, 16) for a, _, _ in bounds], dtype=np.uint64)
    ends = np.array([int(b, 16) for _, _, b in bounds], dtype=np.uint64)
    return starts, ends


def _unmapped(ranges: tuple[np.ndarray, np.ndarray], addrs: np.ndarray) -> np.ndarray:
    """The ``addrs`` in no mapping of ``ranges``."""
    starts, ends = ranges
    i = np.searchsorted(starts, addrs, side="right") - 1
    inside = (i >= 0) & (addrs < ends[np.maximum(i, 0)])
    return addrs[~inside]


class ProcessTracker:
    def __init__(self, probes: ProbeSet, *, mode: str, pids: list[int], say: Callable[[str], None],
                 stacks: StackCollector | None = None, native: NativeCollector | None = None):
        self._probes = probes
        self._stacks = stacks
        self._native = native
        self._mode = mode
        self._pids = list(pids)  # the ones asked for with -p
        self._say = say
        #: under sudo, the invoking user's uid: only that user's processes are read or recorded (capture.procs.reach)
        self.uid = reach.traced_uid()
        self.processes = ProcessTable(uid=self.uid)
        self.traced_pids: set[int] = set(pids)
        #: each traced process's latest /proc/PID/maps: offline naming needs them after it has gone
        self.maps: dict[int, str] = {}
        #: the build-ids of the files in each one's saved maps: offline naming refuses a file that has another
        self.build_ids = BuildIds()
        self._seen_pids: set[int] = set()
        self._recent_pids: set[int] = set()
        #: per process: the saved maps text and its parsed ranges
        self._ranges_of: dict[int, tuple[str, tuple[np.ndarray, np.ndarray]]] = {}
        self._unmappable: dict[int, set[int]] = {}  # launch addresses in no mapping even after a re-read
        #: (kernel dev, inode) -> path of each file a stopped process opened or mapped (for on_map)
        self._paths: dict[tuple[int, int], str] = {}
        self._last_rescan = 0.0

    # ------------------------------------------------------------------ the start

    def launched(self, pid: int) -> None:
        self.traced_pids.add(pid)
        self._probes.filter_pid(pid)

    def start_pids(self) -> None:
        """-p: attach to what each PID maps now."""
        for pid in self._pids:
            self._probes.filter_pid(pid)
            self._attach_pid(pid)
        for pid in self._pids:
            if not alive(pid):  # exited while the program compiled: no exit event will come
                self.on_exit(pid, time.clock_gettime_ns(time.CLOCK_MONOTONIC))

    def start_system(self) -> None:
        """-a: attach to what every process maps now."""
        for found in discovery.scan_all(skip={os.getpid()}, uid=self.uid):
            for lib in found.traced:
                self._probes.attach(lib)
            self.processes.add(found.pid)
            self.save_maps([found.pid])
            self._seen_pids.add(found.pid)
            self._python(found.pid)
        self._last_rescan = time.monotonic()

    def _attach_pid(self, pid: int) -> None:
        try:
            found = discovery.scan_pid(pid)
        except OSError as e:
            if not alive(pid):  # it existed at the start (check_pids) and exited during the compile
                self._say(f"PID {pid} exited before its probes were attached")
                return  # start_pids ends it like any exit; the other PIDs are traced
            raise unreadable(pid, e) from None  # not ours to read: say why
        self.processes.add(pid)
        # now, while it surely runs: native stacks of a process that exits before the
        # first drain, and offline naming of its runtime launches at the end, need them
        self.save_maps([pid])
        self._python(pid)
        for lib in found.traced:
            self._probes.attach(lib)
        if not found.traced:
            others = f" (it maps {', '.join(os.path.basename(p) for p in found.other_gpu)})" if found.other_gpu else ""
            self._say(f"PID {pid} has not loaded libcuda.so, libcudart.so, libamdhip64.so, libc10.so or libnccl.so "
                      f"yet{others}: waiting for it to load one; its first call will be traced")

    # ------------------------------------------------------------------ callbacks from the discover program

    def on_library(self, lib: OpenedLibrary) -> Opened:
        """Attach to a library a stopped process opened or mapped: a traced
        name, or any file with the CUDA runtime linked in (its .symtab)."""
        self._paths[(kernel_dev(lib.dev), lib.inode)] = lib.ns_path
        fam = discovery.family_of(lib.ns_path) or discovery.family_of(lib.path)
        if fam is None:
            if not discovery.holds_cudart(lib.attach_path):
                return Opened.PLAIN
            fam = "cudart"
        entry = self._probes.attach(lib, family=fam)
        self.processes.add(lib.pid)
        self.save_maps([lib.pid])
        self._python(lib.pid)
        if entry is not None and entry.symbols_attached:
            self._say(f"PID {lib.pid} loaded {lib.ns_path}: attached {len(entry.symbols_attached)} probes "
                      "before its first call")
        return Opened.PROBED if self._probes.has_probes(lib.dev, lib.inode) else Opened.RETRY

    def on_map(self, rec: np.void) -> None:
        """A traced process mapped a file executable (with a pid filter): kept
        with its saved maps unless they hold that address already, so that a
        process that exits before its maps are read again (within one drain of
        its first launch) has the launches from that file named offline."""
        pid, addr, dev, ino = int(rec["pid"]), int(rec["addr"]), int(rec["dev"]), int(rec["ino"])
        probed = self._probes.attached.get((os.makedev(dev >> 20, dev & 0xFFFFF), ino))
        path = self._paths.get((dev, ino)) or (probed.path if probed is not None else None)
        if path is None or not reach.may_trace(pid, self.uid):
            return
        saved = self.maps.get(pid, "")
        if saved and not self._unmapped(pid, np.array([addr], dtype=np.uint64)).size:
            return
        end = (addr + int(rec["len"]) + PAGE - 1) // PAGE * PAGE
        line = f"{addr:x}-{end:x} r-xp {int(rec['pgoff']):08x} {dev >> 20:02x}:{dev & 0xFFFFF:02x} {ino} {path}\n"
        self.maps[pid] = saved + ("" if not saved or saved.endswith("\n") else "\n") + line
        self.build_ids.record(pid, self.maps[pid])

    def on_fork(self, pid: int, ppid: int, ts: int) -> None:
        if pid != ppid:
            self.traced_pids.add(pid)
            self.processes.add(pid)
            if self._stacks is not None:
                self._stacks.fork(pid, ppid)

    def on_exec(self, pid: int, cgroup_id: int) -> None:
        self.processes.refresh(pid, cgroup_id=cgroup_id)
        if pid in self.traced_pids:
            self.save_maps([pid])
            # an executable with the CUDA runtime linked in: attached as soon as
            # its exec is seen (its first calls may run before: say so in the docs)
            exe = discovery.static_cudart(pid)
            if exe is not None and self._probes.attach(exe) is not None:
                self._say(f"PID {pid} runs {exe.path}, which has the CUDA runtime linked in: attached")
        if self._stacks is not None:
            self._stacks.exec(pid)
        if self._native is not None:
            self._native.exec(pid)

    def on_exit(self, pid: int, ts: int) -> None:
        if pid in self.processes:
            self.processes.exited(pid, ts)
        if self._stacks is not None:
            self._stacks.exited(pid)
        if pid in self.traced_pids and self._mode == "pid":
            self._say(f"PID {pid} exited; still tracing the others" if self.alive_pids() else f"PID {pid} exited")

    # ------------------------------------------------------------------ while draining

    def alive_pids(self) -> list[int]:
        """The -p processes still running."""
        return [p for p in self._pids if alive(p)]

    def seen_in_events(self, pids: list[int]) -> None:
        """PIDs of the events just drained (a handful per drain)."""
        self._recent_pids.update(pids)
        new = [p for p in pids if p not in self._seen_pids]
        self.save_maps(new)
        for pid in new:
            self._seen_pids.add(pid)
            self.processes.add(pid)
            self._python(pid)

    def seen_launches(self, recs: np.ndarray) -> None:
        """Re-read the maps of a process that launched from an address in no
        mapping of the maps saved for it (a runtime launch's host stub, or the
        code that called the runtime, in a library mapped since): offline
        naming reads the saved maps once the process is gone, and a process
        may open a library, launch from it and exit between two flushes.  A
        driver handle lies in memory mapped already (the heap): it costs
        nothing; an address still in no mapping after a re-read is not looked
        for again."""
        # columns, never whole records, and runs folded before any sort (runs): this runs on every drained batch
        at = np.flatnonzero(recs["kind"] == int(schema.Kind.launch))
        if not at.size:
            return
        pids = recs["pid"][at]
        each = distinct(pids).tolist()
        for pid in each:
            if pid not in self.maps:
                continue
            mine = at if len(each) == 1 else at[pids == pid]
            addrs = distinct(np.concatenate([recs[c][mine] for c in ("func", "caller", "caller_fp")]))
            addrs = addrs[addrs != 0]
            gone = self._unmappable.setdefault(pid, set())
            missing = [a for a in self._unmapped(pid, addrs).tolist() if a not in gone]
            if missing:
                self.save_maps([pid])
                gone.update(self._unmapped(pid, np.array(missing, dtype=np.uint64)).tolist())

    def _unmapped(self, pid: int, addrs: np.ndarray) -> np.ndarray:
        saved = self.maps[pid]
        if self._ranges_of.get(pid, (None,))[0] is not saved:
            self._ranges_of[pid] = (saved, _ranges(saved))
        return _unmapped(self._ranges_of[pid][1], addrs)

    def save_recent_maps(self) -> None:
        self.save_maps(self._recent_pids)
        self._recent_pids.clear()

    def save_maps(self, pids: Iterable[int]) -> None:
        for pid in pids:
            if not reach.may_trace(pid, self.uid):
                continue  # it became another user's since its last event: nothing more of it is read
            try:
                text = Path(f"/proc/{pid}/maps").read_text()
            except OSError:
                continue
            if text:  # an exiting process (its memory released, not yet reaped) reads empty: keep what it had
                self.maps[pid] = text
                self.build_ids.record(pid, text)

    def forget_exited(self, keep: set[int]) -> list[int]:
        """Drop all that is kept of each process that has exited, but those in
        ``keep``: its maps, build-ids and process row.  A tracer that runs for
        weeks (the daemon) stays bounded by the processes alive, and a PID
        reused later is read anew (scanned, its row made again).  Returns the
        PIDs forgotten."""
        known = self._seen_pids | self.maps.keys() | set(self.processes.pids())
        gone = [p for p in known if p not in keep and not os.path.exists(f"/proc/{p}")]
        for pid in gone:
            self._seen_pids.discard(pid)
            self._recent_pids.discard(pid)
            self.maps.pop(pid, None)
            self.build_ids.of_pid.pop(pid, None)
            self._ranges_of.pop(pid, None)
            self._unmappable.pop(pid, None)
            self.processes.forget(pid)
        return gone

    def rescan_if_due(self, interval_s: float = RESCAN_INTERVAL_S) -> None:
        if self._mode == "system" and time.monotonic() - self._last_rescan >= interval_s:
            self.rescan()

    def rescan(self) -> None:
        """-a: attach to the libraries of processes that appeared since the last scan."""
        self._last_rescan = time.monotonic()
        for pid in discovery.all_pids():
            if pid in self._seen_pids or pid == os.getpid():
                continue
            self._seen_pids.add(pid)
            if not reach.may_trace(pid, self.uid):
                continue
            try:
                found = discovery.scan_pid(pid)
            except OSError:
                continue
            for lib in found.traced:
                if self._probes.attach(lib) is not None:
                    self._say(f"new library {lib.path} (PID {pid}): attached")
            if found.traced:
                self.processes.add(pid)
                self._python(pid)

    def _python(self, pid: int) -> None:
        """Record ``pid``'s Python stacks from now on, if it runs CPython: called
        once its libraries are mapped (at attach, or when it opens a traced one)."""
        if self._stacks is not None and reach.may_trace(pid, self.uid):
            self._stacks.register(pid)

    def write_processes(self, writer) -> None:
        """Rewrite processes.parquet when a process was added or changed."""
        if self.processes.changed:
            self.processes.changed = False
            writer.write_frame(writer.dir / "processes.parquet", self.processes.frame())
