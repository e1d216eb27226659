"""The capture's side of Python stacks: tell the BPF walker about each traced
Python process, drain the new stacks it reports, symbolize them while the
process is alive, and write stacks.parquet.

Symbolization is once per (pid, code object) and once per (pid, code,
instruction); a stack arrives once (bpf/pystack.h deduplicates), so the
per-event cost stays in BPF."""

from __future__ import annotations

import ctypes
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import polars as pl

from ... import schema
from ...probes import uprobe_link
from ...stacks import interpreter
from ...stacks.native import Frame, activations
from ...stacks.offsets import Unsupported
from ...stacks.pycode import Code, ProcessMemory, Unreadable, read_code
from ..procs import reach
from ..bpf.ringbuf import open_table


#: how long a just-exec'd process is looked at again for an interpreter (its
#: loader maps libpython after the exec; the first look may come before)
EXEC_RETRY_S = 2.0


def _runs_python(pid: int) -> bool:
    """Whether ``pid``'s executable is named like an interpreter (only those are
    looked at again after an exec: in -a mode every process of the machine execs)."""
    try:
        return "python" in os.path.basename(os.readlink(f"/proc/{pid}/exe"))
    except OSError:
        return False


@dataclass
class _Process:
    interp: interpreter.Interpreter
    mem: ProcessMemory
    codes: dict[int, Code | None] = field(default_factory=dict)


class StackCollector:
    def __init__(self, bpf, depth: int, *, say: Callable[[str], None], verbose: bool = False,
                 proc: Path = Path("/proc")):
        self.bpf = bpf
        self.depth = depth
        self.say = say
        self.verbose = verbose
        self.proc = proc
        #: under sudo, the only uid whose processes are read (capture.procs.reach): a process
        #: looked at again after an exec may have exec'd a setuid program meanwhile
        self._uid = reach.traced_uid()
        self.record = schema.py_stack_record(depth)
        self._ring = open_table(bpf, "pystacks", self.record.dtype)
        self._procs_map = bpf["py_procs"]
        self._unregistered_map = bpf["py_unregistered"]
        #: events of Python processes before they were registered (they carry no stack)
        self._unregistered = 0
        self._finder = interpreter.Finder(proc)
        self._procs: dict[int, _Process] = {}
        #: pid -> what the manifest says about it: interpreter and version, or why there are no stacks
        self.status: dict[int, dict] = {}
        self._seen: set[tuple[int, int]] = set()
        #: (pid, stack_id) -> (frames cut where each eval-loop activation starts, truncated): native stacks
        #: put each group in place of its activation (stacks.native.interleave)
        self._groups: dict[tuple[int, int], tuple[list[list[Frame]], bool]] = {}
        self.rows = StackRows()
        #: told (pid, interpreter file) of each Python process registered (capture.procs.finalize_probe)
        self.on_python: Callable[[int, str], None] | None = None
        self._unsymbolized = 0
        #: pid -> until when: just exec'd, not (yet) seen as Python: its loader may still be mapping
        #: libpython, so it is looked at again at every drain until then
        self._exec_pending: dict[int, float] = {}
        #: exited: forgotten after the next drain (stacks of theirs may still wait in the ring)
        self._exited: set[int] = set()
        #: Python processes py_procs could not hold (their events carry no stack)
        self._full = 0
        self._install_tail_call()

    def _install_tail_call(self) -> None:
        from ...probes.program import STACK_PROGRAM

        fn = uprobe_link.load(self.bpf, STACK_PROGRAM)  # the handlers' attach type: they tail-call it
        self.bpf["pt_stack_tail"][ctypes.c_int(0)] = ctypes.c_int(fn.fd)

    # ------------------------------------------------------------------ processes

    def register(self, pid: int, final: bool = True) -> None:
        """Start walking ``pid``'s stacks if it runs a supported CPython; say
        why not otherwise (once per process).  ``final=False``: the process
        may still be mapping its libraries (just exec'd): a failure is not
        kept, the next look decides."""
        if pid in self._procs or pid in self.status:
            return
        if not reach.may_trace(pid, self._uid, self.proc):
            return  # no longer the user's (a setuid exec): nothing of it is read
        try:
            interp = self._finder.find(pid)
        except interpreter.NotPython:
            return
        except Unsupported as e:
            if not final:
                return
            self.status[pid] = {"python": None, "stacks": False, "reason": str(e)}
            self.say(f"PID {pid}: no Python stacks: {e}; tracing goes on without them")
            return
        except OSError:
            return  # gone already
        except Exception as e:  # noqa: BLE001 - a damaged interpreter file must not stop the tracing
            if final:
                self.status[pid] = {"python": None, "stacks": False, "reason": f"{type(e).__name__}: {e}"}
            return
        self._add(pid, interp)

    def _add(self, pid: int, interp: interpreter.Interpreter) -> None:
        try:
            mem = ProcessMemory(pid, self.proc)
        except OSError:
            self._count_unregistered(pid)  # gone, but it was Python: its events had no stack
            return
        # checked again once its memory is open: the descriptor holds the image the
        # process had at the open, so a setuid exec before it shows here, and one after
        # it leaves the descriptor on the old, dead image (nothing of the new is read)
        if reach.foreign(pid, self._uid, self.proc):
            mem.close()
            return
        if not self._put(pid, interp):
            mem.close()
            self._full += 1
            self.status[pid] = {"python": interp.version_text, "interpreter": interp.path, "stacks": False,
                                "reason": f"more than {self._procs_map.max_entries} Python processes at once"}
            if self._full == 1:
                self.say(f"warning: more than {self._procs_map.max_entries} Python processes at once: "
                         f"PID {pid} and later ones get no Python stacks (counted); tracing goes on")
            return
        self._procs[pid] = _Process(interp, mem)
        self._count_unregistered(pid)  # after the registration: its later events have stacks
        if self.on_python is not None:
            self.on_python(pid, interp.path)
        self.status[pid] = {"python": interp.version_text, "interpreter": interp.path, "stacks": True}
        if self.verbose:
            self.say(f"PID {pid}: Python {interp.version_text} ({interp.path}), _PyRuntime at 0x{interp.runtime:x}:"
                     " recording its stacks")

    def _put(self, pid: int, interp: interpreter.Interpreter) -> bool:
        """Tell the BPF walker about ``pid``; False if py_procs is full even
        after the processes seen gone are taken out of it."""
        key = self._procs_map.Key(pid)
        leaf = self._procs_map.Leaf.from_buffer_copy(interp.layout.bpf_value(interp.runtime, interp.version))
        for attempt in range(2):
            try:
                self._procs_map[key] = leaf
                return True
            except Exception:  # noqa: BLE001 - BCC raises a bare Exception (E2BIG: the table is full)
                if attempt == 0:
                    self._forget_gone()
        return False

    def _forget_gone(self) -> None:
        """Forget the registered processes that have exited (their exit may
        not have been reported: a notification lost, a process that became
        another user's)."""
        for pid in list(self._procs):
            if not os.path.exists(self.proc / str(pid)):
                self._forget(pid)

    def exited(self, pid: int) -> None:
        """``pid`` exited: forgotten once the stacks it left in the ring are drained."""
        if pid in self._procs:
            self._exited.add(pid)

    def _forget(self, pid: int) -> None:
        """Out of py_procs (the kernel deletes it at exit too) and of our table;
        its stacks and status stay."""
        p = self._procs.pop(pid, None)
        if p is not None:
            p.mem.close()
        try:
            del self._procs_map[self._procs_map.Key(pid)]
        except KeyError:
            pass

    def _count_unregistered(self, pid: int) -> None:
        """Take the count of ``pid``'s events before its registration (bpf/pystack.h)."""
        key = self._unregistered_map.Key(pid)
        try:
            self._unregistered += int(self._unregistered_map[key].value)
            del self._unregistered_map[key]
        except KeyError:
            pass

    def fork(self, pid: int, ppid: int) -> None:
        """A forked child has its parent's interpreter at the same addresses."""
        parent = self._procs.get(ppid)
        if parent is not None and pid not in self._procs:
            self._add(pid, interpreter.Interpreter(pid, parent.interp.path, parent.interp.version,
                                                   parent.interp.runtime, parent.interp.code_type,
                                                   parent.interp.layout))

    def exec(self, pid: int) -> None:
        """``pid`` exec'd: its addresses mean nothing any more.  The new image
        is looked at now (a library already traced is not reported when it
        opens it) and again when it opens a traced library or shows up in the
        events."""
        self.status.pop(pid, None)
        self._forget(pid)
        self.register(pid, final=False)
        if pid not in self._procs and pid not in self.status and _runs_python(pid):
            self._exec_pending[pid] = time.monotonic() + EXEC_RETRY_S

    # ------------------------------------------------------------------ stacks

    @property
    def fd(self) -> int:
        """The stack ring's descriptor: readable (poll) as soon as a new stack is written."""
        return self._ring.fd

    def drain(self) -> None:
        if self._exec_pending:
            now = time.monotonic()
            for pid, until in list(self._exec_pending.items()):
                self.register(pid, final=now >= until)
                if pid in self._procs or pid in self.status or now >= until:
                    del self._exec_pending[pid]
        recs = self._ring.drain()
        if recs.size:
            self._symbolize(recs)
        if self._exited:
            for pid in self._exited:
                self._forget(pid)
            self._exited.clear()

    def _code(self, p: _Process, addr: int) -> Code | None:
        if addr not in p.codes:
            try:
                p.codes[addr] = read_code(p.mem, p.interp.layout, addr, p.interp.code_type)
            except Unreadable:  # the process exited before its stack was drained: counted, not hidden
                p.codes[addr] = None
        return p.codes[addr]

    def _symbolize(self, recs: np.ndarray) -> None:
        for rec in recs:  # one record per distinct stack, not per event
            pid, sid = int(rec["pid"]), int(rec["stack_id"])
            if (pid, sid) in self._seen:
                continue  # evicted from the BPF dedup table and reported again
            self._seen.add((pid, sid))
            truncated = bool(rec["flags"] & schema.STACK_FLAG_TRUNCATED)
            groups = self._frames(self._procs.get(pid), rec)
            self._groups[(pid, sid)] = (groups, truncated)
            self.rows.add(pid, sid, [f for g in groups for f in g], truncated)

    def _frames(self, p: _Process | None, rec) -> list[list[Frame]]:
        """The stack's Python frames, cut where each activation of the eval
        loop begins: 3.12+ mark it with a C-stack shim frame (dropped, as
        traceback drops it), 3.11 with is_entry on the activation's first frame."""
        n = int(rec["depth"])
        owners = rec["owner"][:n].tolist()
        layout = p.interp.layout if p is not None else None
        where = activations(owners, layout.shim_owner if layout else None,
                            layout is not None and layout.frame_entry is not None)
        groups: list[list[Frame]] = [[] for _ in range(max((g for g in where if g is not None), default=0) + 1)]
        for code_addr, instr, g in zip(rec["code"][:n].tolist(), rec["instr"][:n].tolist(), where):
            if g is None:
                continue  # a C-stack shim frame, not Python code
            code = self._code(p, code_addr) if p is not None else None
            if code is None:
                self._unsymbolized += 1
            groups[g].append(Frame("python", code.qualname if code else None, code.filename if code else None,
                                   code.line_at(instr) if code else None, None, code_addr))
        return groups

    def forget_stacks(self, keys: list[tuple[int, int]], *, symbols: bool) -> None:
        """Have BPF send the stacks ``keys`` (pid, stack_id) again with the
        next event that has one (out of py_seen); ``symbols``: forget them
        here too, so that one sent again is symbolized and added again.  The
        daemon forgets the stacks its window no longer refers to (daemon.stacks)."""
        seen = self.bpf["py_seen"]
        for pid, sid in keys:
            try:
                del seen[seen.Key(sid)]
            except KeyError:
                pass  # evicted already (an LRU table)
            if symbols:
                self._seen.discard((pid, sid))
                self._groups.pop((pid, sid), None)

    def groups(self, pid: int, stack_id: int) -> tuple[list[list[Frame]], bool] | None:
        """The Python stack ``stack_id`` of ``pid`` by eval-loop activation,
        innermost first, and whether it was truncated; None if not seen yet."""
        return self._groups.get((pid, stack_id))

    def manifest(self) -> dict:
        """The manifest's `stacks` object: settings and each Python process's status."""
        return {"python": True, "depth": self.depth, "native": False,
                "processes": {str(pid): s for pid, s in sorted(self.status.items())}}

    def counts(self) -> dict:
        t = self.bpf["py_stats"]
        out = {name: int(sum(t[t.Key(i)])) for name, i in schema.PY_STATS.items()}
        out["stacks"] = len(self._seen)
        out["unsymbolized_frames"] = self._unsymbolized
        out["unregistered_python"] = self._unregistered
        out["unregistered_python_processes"] = self._full
        return out

    def close(self) -> None:
        self.drain()
        self._ring.close()
        for p in self._procs.values():
            p.mem.close()
        self._procs.clear()


class StackRows:
    """The rows of stacks.parquet gathered so far: column lists for the
    stacks added since the last frame(), one frame for the rest."""

    def __init__(self) -> None:
        self._cols: dict[str, list] = {c: [] for c in schema.STACKS_SCHEMA}
        self._done = schema.empty_frame(schema.STACKS_SCHEMA)
        #: rows were added since stacks.parquet was last written
        self.changed = False

    def add(self, pid: int, sid: int, frames: list[Frame], truncated: bool) -> None:
        """One stack, innermost frame first."""
        cols = self._cols
        for depth, f in enumerate(frames):
            for name, value in (("pid", pid), ("stack_id", sid), ("depth", depth), ("kind", f.kind),
                                ("function", f.function), ("file", f.file), ("line", f.line),
                                ("module", f.module), ("addr", f.addr), ("truncated", truncated)):
                cols[name].append(value)
        self.changed = self.changed or bool(frames)

    def frame(self) -> pl.DataFrame:
        if self._cols["pid"]:
            new = pl.DataFrame(self._cols, schema=schema.STACKS_SCHEMA)
            self._cols = {c: [] for c in schema.STACKS_SCHEMA}
            self._done = pl.concat([self._done, new])
        return self._done


def write_stacks(writer, *collectors) -> None:
    """(Re)write stacks.parquet with every stack the collectors (Python, native; None: off) have so far."""
    rows = [c.rows for c in collectors if c is not None]
    for r in rows:
        r.changed = False
    writer.write_frame(writer.dir / "stacks.parquet",
                       pl.concat([r.frame() for r in rows]) if rows else schema.empty_frame(schema.STACKS_SCHEMA))
