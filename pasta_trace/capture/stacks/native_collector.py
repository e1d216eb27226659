"""The capture's side of native stacks (--native-stacks): drain the user
stacks bpf/nativestack.h copies, unwind and name them while the process
runs (stacks.native), put the event's Python frames in place of the eval
loop's activations, and give each distinct stack one stack_id.

An event with a native stack arrives carrying its sample number
(schema.FLAG_NATIVE_STACK); :meth:`NativeCollector.resolve` replaces it with
the stack_id before the event is written.  The sample is committed before
its event, so draining this ring before the events ring (and once more for a
sample that raced in between) finds every sample an event names.

A library seen for the first time on this machine has its .eh_frame parsed
in a worker thread (seconds for a large one; then it is in the disk cache):
meanwhile the samples that need it wait (their process's maps already
read), and so do their events, so the drain and the Python stacks'
symbolization go on.  At the end of the capture :meth:`settle` waits for
them.

Unwinding costs user-space time per event (tens of microseconds); identical
stacks share one stack_id and one set of rows."""

from __future__ import annotations

import ctypes
import hashlib
import struct
import time
from pathlib import Path
from typing import Callable

import numpy as np

from ... import schema
from ...probes import uprobe_link
from ...stacks import native
from ..procs import reach
from ..bpf.ringbuf import open_table
from .stack_collector import StackCollector, StackRows

_FLAG = np.uint8(schema.FLAG_NATIVE_STACK)

#: how long the end of a capture waits for tables still being built
SETTLE_TIMEOUT_S = 300
#: how long the end of a capture spends finding source lines
SOURCES_BUDGET_S = 60


class NativeCollector:
    def __init__(self, bpf, setting: str, *, python: StackCollector | None, say: Callable[[str], None],
                 verbose: bool = False, proc: Path = Path("/proc"),
                 saved_maps: Callable[[int], str | None] = lambda pid: None, cache: Path | None = None):
        self.bpf = bpf
        self.setting = setting  # "default" | "all"
        self._python = python
        self._say = say
        self._verbose = verbose
        self._proc = proc
        self._saved_maps = saved_maps
        #: under sudo, the only uid whose processes are read (capture.procs.reach)
        self._uid = reach.traced_uid()
        self._ring = open_table(bpf, "nativestacks", schema.NATIVE_SAMPLE.dtype)
        self._modules = native.ModuleCache(cache, background=True)
        self._spaces: dict[int, native.AddressSpace] = {}
        #: sample number -> stack_id, until its event is resolved
        self._pending: dict[int, int] = {}
        #: samples waiting for a file's tables, and the events waiting for them
        self._parked: list[np.ndarray] = []
        #: processes whose maps were read since samples began to wait
        self._read_parked: set[int] = set()
        self._held: np.ndarray | None = None
        #: (pid, Python stack id, return addresses, truncated) -> stack_id
        self._ids: dict[tuple, int] = {}
        self.rows = StackRows()
        #: each distinct stack's parts (pid, native frames, Python groups, truncated) and its id
        self._stacks: list[tuple] = []
        self._sids: list[int] = []
        self._said: set[str] = set()
        self.samples = 0
        self.truncated = 0
        self.unresolved = 0
        #: samples of processes that were no longer the user's when they were unwound
        self.not_read = 0
        self._install_tail_call()

    def _install_tail_call(self) -> None:
        from ...probes.program import NATIVE_PROGRAM, NATIVE_TAIL_SLOT

        fn = uprobe_link.load(self.bpf, NATIVE_PROGRAM)  # the handlers' attach type: they tail-call it
        slot = NATIVE_TAIL_SLOT if self._python is not None else 0  # alone, it is the handlers' tail call
        self.bpf["pt_stack_tail"][ctypes.c_int(slot)] = ctypes.c_int(fn.fd)

    def exec(self, pid: int) -> None:
        """``pid`` exec'd: its old mappings mean nothing any more, and its next sample wakes us again."""
        self._spaces.pop(pid, None)
        t = self.bpf["native_pids"]
        try:
            del t[t.Key(pid)]
        except KeyError:
            pass

    @property
    def fd(self) -> int:
        """The ring's descriptor: readable (poll) when a process's first sample is written."""
        return self._ring.fd

    # ------------------------------------------------------------------ samples

    def drain(self) -> None:
        recs = self._ring.drain()
        self.samples += int(recs.size)
        if not self._parked:
            self._read_parked.clear()
        elif recs.size:
            # these samples wait behind others: their processes' maps are read now, while
            # they still run (one that dlopens a library and exits before its samples are
            # unwound would otherwise be read dead, showing only the maps saved at its exec);
            # once per process while samples wait, not at every drain
            for pid in np.setdiff1d(recs["pid"], list(self._read_parked)).tolist():
                self._read_parked.add(pid)
                if pid in self._spaces:
                    self._spaces[pid].refresh()
                else:
                    self._space(pid)  # reads them
        if self._parked and not self._modules.building:
            recs = np.concatenate([*self._parked, recs])
            self._parked.clear()
        for i, rec in enumerate(recs):
            if self._parked:  # a library is being parsed: keep the samples in order
                self._parked.append(recs[i:])
                return
            self._unwind(recs, i)

    def _unwind(self, recs: np.ndarray, i: int) -> None:
        rec = recs[i]
        try:
            self._pending[int(rec["sample"])] = self._stack_id(rec)
        except native.Pending:
            self._parked.append(recs[i:i + 1])

    def resolve(self, events: np.ndarray) -> np.ndarray:
        """The drained ``events`` whose stack is known, with stack ids in
        place of sample numbers (events held earlier first); the others are
        held until their sample is unwound."""
        if self._held is not None:
            events = np.concatenate([self._held, events])
            self._held = None
        marked = np.flatnonzero(events["flags"] & _FLAG)
        if not marked.size:
            return events
        samples = events["stack_id"][marked].tolist()
        if any(s not in self._pending for s in samples):
            self.drain()  # written after the last drain, before its event
        ready = np.ones(events.size, bool)
        ids = []
        for j, s in zip(marked.tolist(), samples):
            sid = self._pending.pop(s, None)
            if sid is None:
                ready[j] = False
                sid = s
            ids.append(sid)
        events["stack_id"][marked] = np.array(ids, dtype=np.uint64)
        events["flags"][marked[ready[marked]]] &= ~_FLAG
        if ready.all():
            return events
        self._held = events[~ready]
        return events[ready]

    @property
    def held(self) -> int:
        """Events held back by resolve() until their sample is unwound."""
        return 0 if self._held is None else int(self._held.size)

    def settle(self, timeout: float = SETTLE_TIMEOUT_S) -> np.ndarray | None:
        """The end of the capture: wait for the tables being built, unwind
        what waited for them, and return the held events (stack ids set;
        a sample that cannot be unwound leaves its event the Python stack
        only, counted in unresolved_native_stacks)."""
        deadline = time.monotonic() + timeout
        while self._parked and time.monotonic() < deadline:
            self._modules.wait(max(0.0, deadline - time.monotonic()))
            self.drain()
        for recs in self._parked:  # out of time: these keep their Python stack only
            for rec in recs:
                self._pending[int(rec["sample"])] = int(rec["py_stack_id"])
                self.unresolved += 1
        self._parked.clear()
        if self._held is None:
            return None
        events, self._held = self._held, None
        marked = np.flatnonzero(events["flags"] & _FLAG)
        for j in marked.tolist():
            sid = self._pending.pop(int(events["stack_id"][j]), None)
            if sid is None:  # its sample never arrived (cannot happen: it is written first)
                self.unresolved += 1
            events["stack_id"][j] = sid or 0
        events["flags"][marked] &= ~_FLAG
        return events

    def _space(self, pid: int) -> native.AddressSpace:
        space = self._spaces.get(pid)
        if space is None:
            space = self._spaces[pid] = native.AddressSpace(pid, self._modules, proc=self._proc,
                                                             saved_maps=self._saved_maps)
        return space

    def _stack_id(self, rec) -> int:
        pid = int(rec["pid"])
        size = int(rec["size"])
        # the sample was the user's when the kernel took it (bpf/reach.h); unwinding reads the
        # process's maps and mapped files now, so the rule is checked again before and after
        # (a setuid exec in between): what was read of another uid's process is dropped
        if not self._readable(pid):
            return self._not_read(pid, rec)
        frames, truncated = native.Unwinder(self._space(pid)).unwind(
            ip=int(rec["ip"]), sp=int(rec["sp"]), bp=int(rec["bp"]), stack=rec["stack"][:size].tobytes(),
            at_entry=bool(rec["flags"] & schema.NATIVE_AT_ENTRY))
        if not self._readable(pid):
            return self._not_read(pid, rec)
        self.truncated += truncated
        self._report_problems()
        py = int(rec["py_stack_id"])
        key = (pid, py, tuple(f.addr for f in frames), truncated)
        sid = self._ids.get(key)
        if sid is None:
            sid = self._ids[key] = self._new_stack(pid, py, frames, truncated)
        return sid

    def _readable(self, pid: int) -> bool:
        return not reach.foreign(pid, self._uid, self._proc)

    def _not_read(self, pid: int, rec) -> int:
        """A sample of a process that is not the user's any more: its event keeps its
        Python stack only, and nothing read of the process is kept."""
        self._spaces.pop(pid, None)
        self.not_read += 1
        return int(rec["py_stack_id"])

    def _python_groups(self, pid: int, py: int) -> tuple[list, bool]:
        if not py or self._python is None:
            return [], False
        found = self._python.groups(pid, py)
        if found is None:  # its record raced in after the last drain of the Python ring
            self._python.drain()
            found = self._python.groups(pid, py)
        return found if found is not None else ([], False)

    def _new_stack(self, pid: int, py: int, frames: list[native.NativeFrame], truncated: bool) -> int:
        groups, py_truncated = self._python_groups(pid, py)
        self._stacks.append((pid, frames, groups, truncated or py_truncated))
        h = hashlib.blake2b(struct.pack(f"<IQ?{len(frames)}Q", pid, py, truncated, *(f.addr for f in frames)),
                            digest_size=8, person=b"pasta-native")
        sid = int.from_bytes(h.digest(), "little") or 1  # 0 means "no stack"
        self._sids.append(sid)
        self.rows.add(pid, sid, native.interleave(frames, groups), truncated or py_truncated)
        return sid

    def add_sources(self, budget_s: float = SOURCES_BUDGET_S) -> None:
        """Give native frames their file and line (DWARF line tables), once the capture has ended:
        decoding a large compilation unit takes a second, which the drain cannot spare.  Stops
        after ``budget_s`` (the rest keep null lines)."""
        deadline = time.monotonic() + budget_s
        rows = StackRows()
        for sid, (pid, frames, groups, truncated) in zip(self._sids, self._stacks):
            if time.monotonic() < deadline:
                space = self._space(pid)
                frames = [space.with_source(f) for f in frames]
            rows.add(pid, sid, native.interleave(frames, groups), truncated)
        self.rows = rows

    def _report_problems(self) -> None:
        for path, why in self._modules.problems.items():
            if path not in self._said:
                self._said.add(path)
                if self._verbose:
                    self._say(f"native stacks: {path}: {why}; frames in it are unnamed and end the unwinding")

    # ------------------------------------------------------------------ output

    def manifest(self) -> dict:
        """The native part of the manifest's `stacks` object."""
        return {"native": "all" if self.setting == "all" else True, "native_bytes": schema.NATIVE_STACK_BYTES,
                "native_unreadable_files": dict(sorted(self._modules.problems.items()))}

    def counts(self) -> dict:
        t = self.bpf["native_stats"]
        out = {name: int(sum(t[t.Key(i)])) for name, i in schema.NATIVE_STATS.items()}
        out["native_samples"] = self.samples
        out["native_stacks"] = len(self._ids)
        out["truncated_native_stacks"] = self.truncated
        out["unresolved_native_stacks"] = self.unresolved
        out["native_stacks_not_read"] = self.not_read
        return out

    def close(self) -> None:
        """Samples still in the ring belong to events that were not drained: not unwound."""
        self._modules.close()
        self._ring.close()
