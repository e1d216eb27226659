"""The capture's side of native stacks (--native-stacks): drain the user
stacks bpf/nativestack.h copies, unwind and name them while the process
runs (stacks.native), put the event's Python frames in place of the eval
loop's activations, and give each distinct stack one stack_id.

An event with a native stack arrives carrying its sample number
(schema.FLAG_NATIVE_STACK); :meth:`NativeCollector.resolve` replaces it with
the stack_id before the event is written.  The sample is committed before
its event, so draining this ring before the events ring (and once more for a
sample that raced in between) finds every sample an event names.

Unwinding costs user-space time per event (tens of microseconds); identical
stacks share one stack_id and one set of rows."""

from __future__ import annotations

import ctypes
import hashlib
import struct
from pathlib import Path
from typing import Callable

import numpy as np
import polars as pl

from .. import schema
from ..stacks import native
from .ringbuf import open_table
from .stack_collector import StackCollector, add_rows

_FLAG = np.uint8(schema.FLAG_NATIVE_STACK)


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
        self._ring = open_table(bpf, "nativestacks", schema.NATIVE_SAMPLE.dtype)
        self._modules = native.ModuleCache(cache)
        self._spaces: dict[int, native.AddressSpace] = {}
        #: sample number -> stack_id, until its event is resolved
        self._pending: dict[int, int] = {}
        #: (pid, Python stack id, return addresses, truncated) -> stack_id
        self._ids: dict[tuple, int] = {}
        self._rows: list[pl.DataFrame] = []
        self._said: set[str] = set()
        self.samples = 0
        self.truncated = 0
        self.unresolved = 0
        self.changed = False
        self._install_tail_call()

    def _install_tail_call(self) -> None:
        from bcc import BPF  # noqa: PLC0415 - only reached with a loaded program

        from ..probes.program import NATIVE_PROGRAM, NATIVE_TAIL_SLOT

        fn = self.bpf.load_func(NATIVE_PROGRAM.encode(), BPF.KPROBE)
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
        for rec in recs:
            self._pending[int(rec["sample"])] = self._stack_id(rec)
        self.samples += int(recs.size)

    def resolve(self, events: np.ndarray) -> None:
        """Replace the sample numbers in ``events`` (drained ring records) by stack ids."""
        marked = np.flatnonzero(events["flags"] & _FLAG)
        if not marked.size:
            return
        samples = events["stack_id"][marked].tolist()
        if any(s not in self._pending for s in samples):
            self.drain()  # written after the last drain, before its event
        ids = []
        for s in samples:
            sid = self._pending.pop(s, None)
            if sid is None:
                self.unresolved += 1
                sid = 0
            ids.append(sid)
        events["stack_id"][marked] = np.array(ids, dtype=np.uint64)
        events["flags"][marked] &= ~_FLAG

    def _space(self, pid: int) -> native.AddressSpace:
        space = self._spaces.get(pid)
        if space is None:
            space = self._spaces[pid] = native.AddressSpace(pid, self._modules, proc=self._proc,
                                                             saved_maps=self._saved_maps)
        return space

    def _stack_id(self, rec) -> int:
        pid = int(rec["pid"])
        size = int(rec["size"])
        frames, truncated = native.Unwinder(self._space(pid)).unwind(
            ip=int(rec["ip"]), sp=int(rec["sp"]), bp=int(rec["bp"]), stack=rec["stack"][:size].tobytes(),
            at_entry=bool(rec["flags"] & schema.NATIVE_AT_ENTRY))
        self.truncated += truncated
        self._report_problems()
        py = int(rec["py_stack_id"])
        key = (pid, py, tuple(f.addr for f in frames), truncated)
        sid = self._ids.get(key)
        if sid is None:
            sid = self._ids[key] = self._new_stack(pid, py, frames, truncated)
        return sid

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
        stack = native.interleave(frames, groups)
        h = hashlib.blake2b(struct.pack(f"<IQ?{len(frames)}Q", pid, py, truncated, *(f.addr for f in frames)),
                            digest_size=8, person=b"pasta-native")
        sid = int.from_bytes(h.digest(), "little") or 1  # 0 means "no stack"
        rows: dict[str, list] = {c: [] for c in schema.STACKS_SCHEMA}
        add_rows(rows, pid, sid, stack, truncated or py_truncated)
        self._rows.append(pl.DataFrame(rows, schema=schema.STACKS_SCHEMA))
        self.changed = True
        return sid

    def _report_problems(self) -> None:
        for path, why in self._modules.problems.items():
            if path not in self._said:
                self._said.add(path)
                if self._verbose:
                    self._say(f"native stacks: {path}: {why}; frames in it are unnamed and end the unwinding")

    # ------------------------------------------------------------------ output

    def frame(self) -> pl.DataFrame:
        if not self._rows:
            return schema.empty_frame(schema.STACKS_SCHEMA)
        self._rows = [pl.concat(self._rows)]
        return self._rows[0]

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
        return out

    def close(self) -> None:
        """Samples still in the ring belong to events that were not drained: not unwound."""
        self._ring.close()
