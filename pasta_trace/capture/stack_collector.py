"""The capture's side of Python stacks: tell the BPF walker about each traced
Python process, drain the new stacks it reports, symbolize them while the
process is alive, and write stacks.parquet.

Symbolization is once per (pid, code object) and once per (pid, code,
instruction); a stack arrives once (bpf/pystack.h deduplicates), so the
per-event cost stays in BPF."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import polars as pl

from .. import schema
from ..stacks import interpreter
from ..stacks.offsets import Unsupported
from ..stacks.pycode import Code, ProcessMemory, Unreadable, read_code
from .ringbuf import open_table


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
        self._rows: list[pl.DataFrame] = []
        self._unsymbolized = 0
        self.changed = False
        self._install_tail_call()

    def _install_tail_call(self) -> None:
        from bcc import BPF  # noqa: PLC0415 - only reached with a loaded program

        from ..probes.program import STACK_PROGRAM

        fn = self.bpf.load_func(STACK_PROGRAM.encode(), BPF.KPROBE)
        self.bpf["pt_stack_tail"][ctypes.c_int(0)] = ctypes.c_int(fn.fd)

    # ------------------------------------------------------------------ processes

    def register(self, pid: int, final: bool = True) -> None:
        """Start walking ``pid``'s stacks if it runs a supported CPython; say
        why not otherwise (once per process).  ``final=False``: the process
        may still be mapping its libraries (just exec'd): a failure is not
        kept, the next look decides."""
        if pid in self._procs or pid in self.status:
            return
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
        self._procs[pid] = _Process(interp, mem)
        key = self._procs_map.Key(pid)
        self._procs_map[key] = self._procs_map.Leaf.from_buffer_copy(
            interp.layout.bpf_value(interp.runtime, interp.version))
        self._count_unregistered(pid)  # after the registration: its later events have stacks
        self.status[pid] = {"python": interp.version_text, "interpreter": interp.path, "stacks": True}
        if self.verbose:
            self.say(f"PID {pid}: Python {interp.version_text} ({interp.path}), _PyRuntime at 0x{interp.runtime:x}:"
                     " recording its stacks")

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
        p = self._procs.pop(pid, None)
        self.status.pop(pid, None)
        if p is not None:
            p.mem.close()
            try:
                del self._procs_map[self._procs_map.Key(pid)]
            except KeyError:
                pass
        self.register(pid, final=False)

    # ------------------------------------------------------------------ stacks

    @property
    def fd(self) -> int:
        """The stack ring's descriptor: readable (poll) as soon as a new stack is written."""
        return self._ring.fd

    def drain(self) -> None:
        recs = self._ring.drain()
        if recs.size:
            self._symbolize(recs)

    def _code(self, p: _Process, addr: int) -> Code | None:
        if addr not in p.codes:
            try:
                p.codes[addr] = read_code(p.mem, p.interp.layout, addr, p.interp.code_type)
            except Unreadable:  # the process exited before its stack was drained: counted, not hidden
                p.codes[addr] = None
        return p.codes[addr]

    def _symbolize(self, recs: np.ndarray) -> None:
        rows: dict[str, list] = {c: [] for c in schema.STACKS_SCHEMA}
        for rec in recs:  # one record per distinct stack, not per event
            pid, sid = int(rec["pid"]), int(rec["stack_id"])
            if (pid, sid) in self._seen:
                continue  # evicted from the BPF dedup table and reported again
            self._seen.add((pid, sid))
            p = self._procs.get(pid)
            n = int(rec["depth"])
            truncated = bool(rec["flags"] & schema.STACK_FLAG_TRUNCATED)
            shim = p.interp.layout.shim_owner if p is not None else None
            depth = 0
            for code_addr, instr, owner in zip(rec["code"][:n].tolist(), rec["instr"][:n].tolist(),
                                               rec["owner"][:n].tolist()):
                if shim is not None and owner >= shim:
                    continue  # a C-stack shim frame, not Python code
                code = self._code(p, code_addr) if p is not None else None
                if code is None:
                    self._unsymbolized += 1
                rows["pid"].append(pid)
                rows["stack_id"].append(sid)
                rows["depth"].append(depth)
                rows["kind"].append("python")
                rows["function"].append(code.qualname if code else None)
                rows["file"].append(code.filename if code else None)
                rows["line"].append(code.line_at(instr) if code else None)
                rows["module"].append(None)
                rows["addr"].append(code_addr)
                rows["truncated"].append(truncated)
                depth += 1
        if rows["pid"]:
            self._rows.append(pl.DataFrame(rows, schema=schema.STACKS_SCHEMA))
            self.changed = True

    def frame(self) -> pl.DataFrame:
        if not self._rows:
            return schema.empty_frame(schema.STACKS_SCHEMA)
        self._rows = [pl.concat(self._rows)]
        return self._rows[0]

    def write(self, writer) -> None:
        """(Re)write stacks.parquet with every stack so far."""
        self.changed = False
        writer.write_frame(writer.dir / "stacks.parquet", self.frame())

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
        return out

    def close(self) -> None:
        self.drain()
        self._ring.close()
        for p in self._procs.values():
            p.mem.close()
        self._procs.clear()
