"""The daemon's automatic triggers (docs/daemon.md, "Triggers"): what in the
drained events, the calls in flight and the processes' exits makes a dump.

- **oom**: an allocation (any API of kind alloc) returned out of memory (2 in
  every family: CUDA_ERROR_OUT_OF_MEMORY, cudaErrorMemoryAllocation,
  hipErrorOutOfMemory);
- **cuda_error**: any CUDA driver, runtime or HIP call returned an illegal
  address (700) or a launch failure (719);
- **init_failed**: cuInit returned anything but success;
- **nccl_hang**: an NCCL collective, send/recv or communicator creation
  entered and not returned after ``hang_after`` seconds;
- **quiet**: a process with GPU calls made none for ``quiet_after`` seconds
  while it lives (off unless asked for);
- **killed** / **exit**: a process with GPU calls ended by a signal, or
  exiting with a status other than 0.

The return codes are checked with numpy on each drained batch (a scan of the
`flags` and `ret` columns; the rows are looked at one by one only once a
batch holds a failure).  A call in flight is seen in the probes' own
entry -> return state, the per-thread `inflight` task storage of bpf/pasta.h,
read from user space with a pidfd of each thread (PIDFD_THREAD, Linux 6.9):
the probes pay nothing more for it.  Only the threads of processes that made
NCCL calls are read, once a second at most.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from .. import schema
from ..probes.catalog import APIS
from ..schema import FLAG_HAS_RET, Kind
from ..schema.host import NCCL_SLOTS, PAYLOAD_BITS

#: every trigger kind, as the manifest's trigger.kind and the dump's name say it
KINDS = ("oom", "cuda_error", "init_failed", "nccl_hang", "quiet", "killed", "exit")

OUT_OF_MEMORY = 2  # CUDA_ERROR_OUT_OF_MEMORY, cudaErrorMemoryAllocation, hipErrorOutOfMemory
FAULTS = (700, 719)  # illegal address, launch failure: the same codes in the driver, the runtime and HIP
#: pidfd_open's flag for a pidfd of one thread (not of the process)
PIDFD_THREAD = os.O_EXCL
#: NCCL calls that wait for the other ranks: their communicator is the frame's a[1]
#: (bpf/nccl.bpf.c), but the creations', whose frame holds the comm_id in a[3]
_CREATES = ("ncclCommInitRank", "ncclCommInitRankConfig")


@dataclass
class Firing:
    """A trigger that fired: what kind, for which process, why (in words), and
    the fields the manifest's trigger object gets (api, error, comm_id, ...)."""

    kind: str
    pid: int
    cause: str
    details: dict = field(default_factory=dict)
    #: more calls of the same cause and process folded into this one (a storm of failures in one drain)
    repeats: int = 0


def _by_api(pick: Callable[[object], bool]) -> np.ndarray:
    return np.array([pick(a) for a in APIS] + [False], bool)  # the last: an api id this table does not know


class ErrorScan:
    """The failed returns a drained batch holds that a trigger fires on."""

    def __init__(self) -> None:
        self._alloc = _by_api(lambda a: a.kind == Kind.alloc)
        self._gpu = _by_api(lambda a: a.family in ("cuda", "cudart", "hip"))
        self._init = _by_api(lambda a: a.symbol == "cuInit")
        self._family = [a.family for a in APIS]

    def scan(self, recs: np.ndarray) -> list[Firing]:
        # one pass over `ret` (most batches fail nowhere); the rest looks at the non-zero codes only
        nonzero = np.flatnonzero(recs["ret"])
        if not nonzero.size:
            return []
        some = recs[nonzero]
        ret = some["ret"]
        failed = (some["flags"] & FLAG_HAS_RET) != 0  # a code no return probe wrote means nothing
        api = np.minimum(some["api"], len(APIS)).astype(np.intp)
        code = np.full(some.size, -1, np.int8)
        code[failed & self._gpu[api] & np.isin(ret, FAULTS)] = KINDS.index("cuda_error")
        code[failed & self._alloc[api] & (ret == OUT_OF_MEMORY)] = KINDS.index("oom")
        code[failed & self._init[api]] = KINDS.index("init_failed")
        hits = np.flatnonzero(code >= 0)
        if not hits.size:
            return []
        recs = some
        # the first call of each (process, kind): a storm of failures fires once
        hits = hits[np.argsort(recs["ts_ns"][hits], kind="stable")]
        pairs = recs["pid"][hits].astype(np.int64) * len(KINDS) + code[hits]
        _, first, counts = np.unique(pairs, return_index=True, return_counts=True)
        order = np.argsort(first)
        return [self._firing(recs[hits[i]], KINDS[code[hits[i]]], n - 1)
                for i, n in zip(first[order].tolist(), counts[order].tolist())]

    def _firing(self, rec: np.void, kind: str, repeats: int) -> Firing:
        api, ret, pid, tid = int(rec["api"]), int(rec["ret"]), int(rec["pid"]), int(rec["tid"])
        name = APIS[api].api_name if api < len(APIS) else f"api {api}"
        error = error_name(self._family[api] if api < len(APIS) else "", ret)
        return Firing(kind, pid, f"{name} returned {error} ({ret}) in PID {pid} (thread {tid})",
                      {"api": name, "error": error, "ret": ret, "tid": tid, "call_ns": int(rec["ts_ns"])}, repeats)


def error_name(family: str, ret: int) -> str:
    return schema.RETURN_CODES.get(family, {}).get(ret, f"error {ret}")


class NcclWatch:
    """NCCL calls entered and not returned for ``hang_after_ns``, with the
    communicator's comm_id and the collective's sequence number where known."""

    #: the longest one check reads threads for (the main loop drains every 10 ms)
    BUDGET_S = 0.005

    def __init__(self, inflight_fd: int, hang_after_ns: int):
        from ..capture.bpf.map_fds import Map

        # bpf/pasta.h's struct pt_frames (the value) of struct pt_frame; the key is a pidfd (an int)
        self._frames = np.dtype([("api", "<u8"), ("ts", "<u8"), ("outer", "<u8"), ("a", "<u8", 4)])
        self._storage = np.dtype([("depth", "<u8"), ("f", self._frames, schema.INFLIGHT_DEPTH)])
        self._none = np.empty(0, self._frames)
        self._map = Map(inflight_fd, 4, self._storage.itemsize)
        self.hang_after_ns = hang_after_ns
        nccl_kinds = (Kind.collective, Kind.p2p, Kind.group, Kind.comm)
        self._waits = _by_api(lambda a: a.kind in (Kind.collective, Kind.p2p) or a.symbol in _CREATES)
        self._creates = _by_api(lambda a: a.symbol in _CREATES or a.symbol in ("ncclCommInitAll", "ncclCommSplit"))
        self._kinds = np.array([int(k) for k in nccl_kinds])
        self._bit = {c: 1 << PAYLOAD_BITS[c] for c in ("communicator", "comm_id")}
        self.pids: set[int] = set()  # processes that made NCCL calls
        self._comm_ids: dict[tuple[int, int], int] = {}  # (pid, communicator) -> comm_id
        self._done: dict[tuple[int, int], int] = {}  # (pid, communicator) -> collectives done (the next seq)
        self._fired: set[tuple[int, int, int]] = set()  # (pid, tid, entry ts) of the calls fired on
        self._still: set[tuple[int, int, int]] = set()  # those of the calls past hang_after this round saw
        self._todo: list[tuple[int, int]] = []  # (pid, tid) of the threads this round has yet to read

    def note(self, recs: np.ndarray) -> None:
        """Take in a drained batch: which processes call NCCL, their communicators, their collectives done."""
        nccl = recs[np.isin(recs["kind"], self._kinds)]
        if not nccl.size:
            return
        self.pids.update(np.unique(nccl["pid"]).tolist())
        nccl = nccl[np.argsort(nccl["ts_ns"], kind="stable")]
        comm = nccl[NCCL_SLOTS["communicator"]]
        has_comm = (nccl["valid"] & self._bit["communicator"]) != 0
        ok = ((nccl["flags"] & FLAG_HAS_RET) != 0) & (nccl["ret"] == 0)
        api = np.minimum(nccl["api"], len(APIS)).astype(np.intp)
        made = np.flatnonzero(ok & has_comm & self._creates[api])
        for i in made.tolist():  # communicators made: rare, one a rank per communicator
            key = (int(nccl["pid"][i]), int(comm[i]))
            self._done[key] = 0
            if nccl["valid"][i] & self._bit["comm_id"]:
                self._comm_ids[key] = int(nccl[NCCL_SLOTS["comm_id"]][i])
        # collectives done, counted per communicator after its creation in this batch (Sequencer's numbering)
        coll = ok & has_comm & (nccl["kind"] == Kind.collective)
        for i in made.tolist():
            coll &= ~((nccl["pid"] == nccl["pid"][i]) & (comm == comm[i]) & (nccl["ts_ns"] <= nccl["ts_ns"][i]))
        if coll.any():
            keys = np.empty(int(coll.sum()), [("pid", "<u4"), ("comm", "<u8")])
            keys["pid"], keys["comm"] = nccl["pid"][coll], comm[coll]
            uniq, counts = np.unique(keys, return_counts=True)
            for (pid, c), n in zip(uniq.tolist(), counts.tolist()):
                self._done[(pid, c)] = self._done.get((pid, c), 0) + n

    @property
    def busy(self) -> bool:
        """A round of reads is under way: the next check goes on with it."""
        return bool(self._todo)

    def check(self, now_ns: int) -> list[Firing]:
        """The calls in flight longer than hang_after, each fired on once.  A round reads every thread of
        the NCCL processes, BUDGET_S at most a check (one thread at least): a process of thousands of
        threads is read over several checks, and the drain between them is never held up long."""
        if not self._todo:
            self._todo = self._threads()
        out = []
        deadline = time.monotonic() + self.BUDGET_S
        while self._todo:
            pid, tid = self._todo.pop()
            for f in self._in_flight(tid):
                api = int(f["api"])
                if api >= len(APIS) or not self._waits[api] or now_ns - int(f["ts"]) < self.hang_after_ns:
                    continue
                key = (pid, tid, int(f["ts"]))
                self._still.add(key)
                if key not in self._fired:
                    self._fired.add(key)
                    out.append(self._firing(pid, tid, api, f, now_ns))
            if time.monotonic() >= deadline:
                break
        if not self._todo:  # a round done: the calls fired on that returned since are forgotten
            self._fired &= self._still
            self._still = set()
        return out

    def _threads(self) -> list[tuple[int, int]]:
        todo = []
        for pid in list(self.pids):
            try:
                todo += [(pid, int(t)) for t in os.listdir(f"/proc/{pid}/task")]
            except OSError:
                self.gone(pid)
        return todo

    def _in_flight(self, tid: int) -> np.ndarray:
        try:
            fd = os.pidfd_open(tid, PIDFD_THREAD)
        except OSError:  # the thread is gone
            return self._none
        try:
            raw = self._map.lookup(fd.to_bytes(4, "little"))
        finally:
            os.close(fd)
        if raw is None:  # no probed call made on this thread yet
            return self._none
        s = np.frombuffer(raw, self._storage)[0]
        return s["f"][: min(int(s["depth"]), schema.INFLIGHT_DEPTH)]

    def _firing(self, pid: int, tid: int, api: int, frame: np.void, now_ns: int) -> Firing:
        name = APIS[api].api_name
        waited = (now_ns - int(frame["ts"])) / 1e9
        d: dict = {"api": name, "tid": tid, "call_ns": int(frame["ts"]), "waited_s": round(waited, 3)}
        if APIS[api].symbol in _CREATES:
            d["comm_id"] = int(frame["a"][3]) or None
            d["sequence"] = None
        else:
            comm = int(frame["a"][1])
            d["communicator"] = comm
            d["comm_id"] = self._comm_ids.get((pid, comm))
            d["sequence"] = self._done.get((pid, comm)) if APIS[api].kind == Kind.collective else None
        seq = f", collective {d['sequence']}" if d.get("sequence") is not None else ""
        comm_id = f" of communicator {d['comm_id']:#018x}" if d["comm_id"] is not None else ""
        return Firing("nccl_hang", pid, f"{name}{comm_id}{seq} in PID {pid} (thread {tid}) not returned "
                                         f"after {waited:.1f} s", d)

    def gone(self, pid: int) -> None:
        self.pids.discard(pid)
        for table in (self._comm_ids, self._done):
            for key in [k for k in table if k[0] == pid]:
                del table[key]


class QuietWatch:
    """Processes with GPU calls whose calls stopped while they live."""

    def __init__(self, quiet_after_ns: int):
        self.quiet_after_ns = quiet_after_ns
        self._last: dict[int, int] = {}  # pid -> its newest call's ts_ns
        self._fired: dict[int, int] = {}  # pid -> the newest call's ts_ns when it fired

    def note(self, pids: np.ndarray, last_ns: np.ndarray) -> None:
        for pid, ts in zip(pids.tolist(), last_ns.tolist()):  # one per process in the batch
            if ts > self._last.get(pid, 0):
                self._last[pid] = ts

    def check(self, now_ns: int) -> list[Firing]:
        out = []
        for pid, last in list(self._last.items()):
            if now_ns - last < self.quiet_after_ns or self._fired.get(pid) == last:
                continue
            if not os.path.exists(f"/proc/{pid}"):
                self.gone(pid)
                continue
            self._fired[pid] = last
            quiet = (now_ns - last) / 1e9
            out.append(Firing("quiet", pid, f"PID {pid} made no GPU call for {quiet:.1f} s",
                              {"last_call_ns": last, "quiet_s": round(quiet, 3)}))
        return out

    def gone(self, pid: int) -> None:
        self._last.pop(pid, None)
        self._fired.pop(pid, None)


def exit_firing(pid: int, status: int) -> Firing | None:
    """The trigger of a process with GPU calls that ended with wait status ``status``; None: exit 0."""
    sig = status & 0x7F
    if sig:
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        core = bool(status & 0x80)
        return Firing("killed", pid, f"PID {pid} killed by {name}" + (" (core dumped)" if core else ""),
                      {"signal": sig, "signal_name": name, "core_dumped": core})
    code = (status >> 8) & 0xFF
    if code:
        return Firing("exit", pid, f"PID {pid} exited with status {code}", {"exit_status": code})
    return None


class Debounce:
    """One firing per (kind, process) per ``interval_ns``; the others are counted."""

    def __init__(self, interval_ns: int):
        self.interval_ns = interval_ns
        self._last: dict[tuple[str, int], int] = {}
        self.suppressed: dict[str, int] = {}

    def admit(self, kind: str, pid: int, now_ns: int, repeats: int = 0) -> bool:
        """Whether a firing (and ``repeats`` more folded into it) makes a dump; those that do not are counted."""
        last = self._last.get((kind, pid))
        admitted = last is None or now_ns - last >= self.interval_ns
        if repeats or not admitted:
            self.suppressed[kind] = self.suppressed.get(kind, 0) + repeats + (not admitted)
        if not admitted:
            return False
        self._last[(kind, pid)] = now_ns
        if len(self._last) > 4096:  # the daemon runs for weeks: forget what can no longer suppress
            self._last = {k: t for k, t in self._last.items() if now_ns - t < self.interval_ns}
        return True


class Triggers:
    """Every automatic trigger of one daemon: fed each drained batch and each
    traced process's exit, asked every loop what fired."""

    #: the most often the quiet processes and the calls in flight are looked at
    CHECK_S = 1.0
    #: the calls in flight are looked at every hang_after / HANG_CHECKS (CHECK_S at least): each look reads
    #: every thread of the NCCL processes (measured 0.1-0.5 ms a thread), and a hang is seen at most
    #: hang_after / HANG_CHECKS late
    HANG_CHECKS = 8

    def __init__(self, inflight_fd: int, *, hang_after_s: float | None, quiet_after_s: float | None):
        self._errors = ErrorScan()
        self._nccl = NcclWatch(inflight_fd, int(hang_after_s * 1e9)) if hang_after_s else None
        self._quiet = QuietWatch(int(quiet_after_s * 1e9)) if quiet_after_s else None
        self._gpu: set[int] = set()  # processes that made GPU calls (their exit may fire)
        self._exits: list[tuple[int, int]] = []
        self._found: list[Firing] = []
        self._next_check = self._next_hang_check = 0
        self._check_ns = int(min([self.CHECK_S, *([quiet_after_s / 2] if quiet_after_s else [])]) * 1e9)
        self._hang_check_ns = int(max(self.CHECK_S, (hang_after_s or 0) / self.HANG_CHECKS) * 1e9)

    def note(self, recs: np.ndarray) -> None:
        """A batch just drained (the window's order: before any dump's snapshot)."""
        if not recs.size:
            return
        self._found += self._errors.scan(recs)
        # a batch holds a few runs of one process each (runs.py): each run's process and newest call
        pid = recs["pid"]
        starts = np.flatnonzero(np.concatenate(([True], pid[1:] != pid[:-1])))
        pids, inverse = np.unique(pid[starts], return_inverse=True)
        self._gpu.update(pids.tolist())
        if self._quiet is not None:
            last = np.zeros(pids.size, np.uint64)
            np.maximum.at(last, inverse, np.maximum.reduceat(recs["ts_ns"], starts))
            self._quiet.note(pids, last)
        if self._nccl is not None:
            self._nccl.note(recs)

    def exited(self, pid: int, status: int) -> None:
        """A traced process ended (discover.bpf.c); looked at after the next drain, which holds its last calls."""
        self._exits.append((pid, status))

    def poll(self, now_ns: int) -> list[Firing]:
        """What fired since the last poll; call it after a drain."""
        found, self._found = self._found, []
        exits, self._exits = self._exits, []
        for pid, status in exits:
            if pid in self._gpu and (f := exit_firing(pid, status)) is not None:
                found.append(f)
            self._gpu.discard(pid)
            for watch in (self._nccl, self._quiet):
                if watch is not None:
                    watch.gone(pid)
        if self._quiet is not None and now_ns >= self._next_check:
            self._next_check = now_ns + self._check_ns
            found += self._quiet.check(now_ns)
        if self._nccl is not None and (self._nccl.busy or now_ns >= self._next_hang_check):
            if not self._nccl.busy:  # a new round
                self._next_hang_check = now_ns + self._hang_check_ns
            found += self._nccl.check(now_ns)
        return found
