"""Names for CUDA driver launches whose handle was looked up before the
attach (`-p`, `-a`): read from the driver's objects while the process lives.

The drain loop shows it each batch of events and names (``observe``): a
driver launch whose handle has no run-time name makes its process due for a
scan (capture.naming.name_scan over capture.procs.process_memory), run on a worker thread
so that the drain never waits on it, at most once per SCAN_INTERVAL_S per
process and only when new unnamed handles arrived.  At the end (``finish``,
before the probes go) each live process with unnamed handles is scanned once
more.  Names found are written with source `driver_object`; every launched
handle that stays unnamed gets an `unknown@0x...` row with the reason
(``unnamed_rows``), and the manifest keeps the outcome per process."""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np
import polars as pl

from ... import schema
from ...hexfmt import hex_expr
from . import name_scan
from .pairing import launch_apis
from ..procs.process_memory import FatbinNames, ProcessGone, ProcessMemory

SCAN_INTERVAL_S = 1.0
FINISH_WAIT_S = 60.0  # the longest the end of a capture waits for a scan (a first parse of large fatbins)
MAX_CHECKED = 64  # handles whose objects are read to find the offset; the rest only at the offset found

#: the names ring sources that name a driver handle with its kernel's name
_NAMING = {int(schema.NameSource.module_get_function), int(schema.NameSource.library_get_kernel),
           int(schema.NameSource.func_get_name)}

NOT_LOOKED_UP = "looked up before the attach"
EXITED = "the process exited before its driver objects were read"
UNSCANNED = "the scan of the driver objects did not finish before the capture ended"
OFF_PATH = "no kernel name at the offset that names the process's other handles"


@dataclass
class _Process:
    known: dict[int, str] = field(default_factory=dict)  # run-time names
    aliases: dict[int, int] = field(default_factory=dict)  # CUfunction -> CUkernel (cuKernelGetFunction)
    launched: dict[int, tuple[int, int]] = field(default_factory=dict)  # handle -> (first ts, api id)
    found: dict[int, str] = field(default_factory=dict)  # named by the scan
    tried: set[int] = field(default_factory=set)  # unknown handles a scan has looked at
    last_scan: float = float("-inf")
    untried: str = EXITED  # why a handle no scan looked at has no name
    outcome: dict | None = None  # the manifest's entry


class AttachNamer:
    def __init__(self, api_names: Sequence[str], proc: Path = Path("/proc")):
        launch = set(launch_apis(schema.Layer.driver))
        #: api id -> whether it is a driver launch (ids are u16)
        self._is_launch = np.zeros(1 << 16, dtype=bool)
        self._is_launch[[i for i, n in enumerate(api_names) if n in launch]] = True
        self._proc = proc
        self._procs: dict[int, _Process] = {}
        self._fatbins = FatbinNames()
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pasta-attach-names")
        self._running: tuple[int, Future] | None = None

    # ------------------------------------------------------------------ the drain thread

    def observe(self, events: np.ndarray, names: np.ndarray) -> None:
        """Note run-time names and the handles of driver launches (numpy records, as drained)."""
        for r in names[(names["ret"] == 0) & (names["handle"] != 0)] if names.size else ():
            p = self._procs.setdefault(int(r["pid"]), _Process())
            # a lookup can succeed with no name (the 550 driver's cuFuncGetName on a zeroed object):
            # numpy gives such a field as b"", and the handle stays unknown
            name = bytes(r["name"]).split(b"\0", 1)[0]
            if int(r["source"]) in _NAMING and name:
                p.known[int(r["handle"])] = name.decode(errors="replace")
            elif int(r["source"]) == int(schema.NameSource.kernel_get_function):
                p.aliases[int(r["handle"])] = int(r["alias"])
        if not events.size:
            return
        # a driver launch nested in a runtime launch is named through it (capture.naming.pairing), offline.
        # Columns, not records: this runs on every drained batch, a million launches a second in a flood
        func = events["func"]
        kind = events["kind"]  # a launch recorded into a CUDA graph is named as one that ran
        at = np.flatnonzero(self._is_launch[events["api"]] & (func != 0)
                            & ((kind == int(schema.Kind.launch)) | (kind == int(schema.Kind.captured))))
        if not at.size:
            return
        pids = events["pid"][at]
        each = np.unique(pids).tolist()
        for pid in each:
            mine = at if len(each) == 1 else at[pids == pid]
            handles, first = np.unique(func[mine], return_index=True)
            p = self._procs.setdefault(pid, _Process())
            for h, i in zip(handles.tolist(), mine[first].tolist()):
                if h not in p.launched:
                    p.launched[h] = (int(events["ts_ns"][i]), int(events["api"][i]))

    def _unnamed(self, p: _Process) -> list[int]:
        return [h for h in p.launched if self._name(p, h) is None and h not in p.found]

    @staticmethod
    def _name(p: _Process, handle: int) -> str | None:
        return p.known.get(handle, p.known.get(p.aliases.get(handle, 0)))

    def poll(self) -> None:
        """Take a finished scan's result; start the next one that is due."""
        if self._running is not None:
            pid, fut = self._running
            if not fut.done():
                return
            self._running = None
            self._apply(pid, fut.result())
        now = time.monotonic()
        for pid, p in self._procs.items():
            if now - p.last_scan >= SCAN_INTERVAL_S and any(h not in p.tried for h in self._unnamed(p)):
                p.last_scan = now
                self._running = (pid, self._pool.submit(self._scan, pid, *self._inputs(p)))
                return

    # ------------------------------------------------------------------ the worker thread

    def _inputs(self, p: _Process) -> tuple[list[int], dict[int, str]]:
        unknown = self._unnamed(p)
        known = {h: n for h in [*p.known, *p.aliases] if (n := self._name(p, h)) is not None}
        known |= p.found  # named by an earlier scan: a later one must agree with it
        known = dict(list(known.items())[: MAX_CHECKED // 2])
        return unknown, known

    def _scan(self, pid: int, unknown: list[int], known: dict[int, str]) -> tuple[list[int], name_scan.ScanResult]:
        try:
            kernels = self._fatbins.of_process(pid, self._proc)
            with ProcessMemory(pid, self._proc) as mem:
                checked = unknown[: MAX_CHECKED - len(known)]
                res = name_scan.scan(mem.read, checked, known, kernels, truncated_at=schema.NAME_LEN - 1)
                if res.path is not None:  # the others are read at the offset found, and must be kernels too
                    longest = max(map(len, kernels | set(known.values())))
                    for h in unknown[len(checked):]:
                        if (s := name_scan.read_path(mem.read, h, res.path, longest)) in kernels:
                            res.names[h] = s
        except ProcessGone:
            res = name_scan.ScanResult(reason=EXITED)
        except Exception as e:  # noqa: BLE001 - naming is best effort; the drain must go on
            res = name_scan.ScanResult(reason=f"the scan of the driver objects failed: {type(e).__name__}: {e}")
        return unknown, res

    def _apply(self, pid: int, done: tuple[list[int], name_scan.ScanResult]) -> None:
        unknown, res = done
        p = self._procs[pid]
        if res.reason == EXITED:  # the handles stay untried; an earlier scan's outcome stays
            p.outcome = p.outcome or {"handles_read": 0, "named": 0, "path": None, "reason": EXITED}
            return
        p.tried.update(unknown)
        p.found.update(res.names)
        p.outcome = {"handles_read": res.handles_read, "named": len(p.found),
                     "path": list(res.path) if res.path else None, "reason": res.reason}

    # ------------------------------------------------------------------ the end

    def unnamed_pids(self) -> list[int]:
        """The processes with launched handles that no lookup and no scan named (yet)."""
        return [pid for pid, p in self._procs.items() if self._unnamed(p)]

    def finish(self, names: pl.DataFrame | None = None) -> pl.DataFrame:
        """Scan once more each process with handles no scan has named (while
        it still runs: call before the probes go); returns the names found
        (schema.NAMES_SCHEMA, source `driver_object`).  ``names``: the
        capture's names found offline; driver handles named through their
        runtime launch (`runtime_launch`) are known names for the check."""
        for pid, handle, name in self._runtime_named(names):
            if pid in self._procs:
                self._procs[pid].known.setdefault(handle, name)
        if self._running is not None:
            pid, fut = self._running
            self._running = None
            try:
                self._apply(pid, fut.result(timeout=FINISH_WAIT_S))
            except TimeoutError:
                pass
        deadline = time.monotonic() + FINISH_WAIT_S
        for pid, p in self._procs.items():
            unknown = self._unnamed(p)
            if unknown and time.monotonic() < deadline:
                fut = self._pool.submit(self._scan, pid, *self._inputs(p))
                try:
                    self._apply(pid, fut.result(timeout=max(deadline - time.monotonic(), 0)))
                except TimeoutError:
                    p.outcome = p.outcome or {"handles_read": 0, "named": 0, "path": None, "reason": UNSCANNED}
                    p.untried = UNSCANNED
        self._pool.shutdown(wait=False, cancel_futures=True)
        rows = [(pid, h, n, p.launched[h][0]) for pid, p in self._procs.items() for h, n in p.found.items()]
        return pl.DataFrame(
            {"pid": [r[0] for r in rows], "handle": [r[1] for r in rows], "name": [r[2] for r in rows],
             "source": "driver_object", "ts_ns": [r[3] for r in rows], "api": None, "reason": None},
            schema={k: (pl.String if k in ("source", "api") else v) for k, v in schema.NAMES_SCHEMA.items()},
        ).cast(schema.NAMES_SCHEMA)

    @staticmethod
    def _runtime_named(names: pl.DataFrame | None) -> list[tuple[int, int, str]]:
        if names is None or names.is_empty():
            return []
        return names.filter((pl.col("source") == "runtime_launch") & pl.col("reason").is_null()
                            & pl.col("name").is_not_null()).select("pid", "handle", "name").unique().rows()

    def reason(self, pid: int, handle: int) -> str:
        """Why a launched handle of ``pid`` that has no name stays unnamed."""
        p = self._procs.get(pid)
        if p is None or p.outcome is None or handle not in p.tried:
            return f"{NOT_LOOKED_UP}; {p.untried if p is not None else EXITED}"
        return f"{NOT_LOOKED_UP}; {p.outcome['reason'] or OFF_PATH}"

    def unnamed_rows(self, names: pl.DataFrame, api_names: Sequence[str]) -> pl.DataFrame:
        """An `unknown@0x...` row, with the reason, for each launched driver
        handle that ``names`` (every name of the capture) leaves unnamed."""
        rows = [(pid, h, ts, api_names[api] if api < len(api_names) else None, self.reason(pid, h))
                for pid, p in self._procs.items() for h, (ts, api) in p.launched.items()]
        launched = pl.DataFrame(rows, schema={"pid": pl.UInt32, "handle": pl.UInt64, "ts_ns": pl.Int64,
                                              "api": pl.String, "reason": pl.String}, orient="row")
        named = names.filter(pl.col("name").is_not_null() & pl.col("reason").is_null()).select("pid", "handle")
        return (
            launched.join(named.unique(), on=["pid", "handle"], how="anti")
            .select("pid", "handle", pl.format("unknown@{}", hex_expr(pl.col("handle"))).alias("name"),
                    pl.lit("unknown").alias("source"), "ts_ns", "api", "reason")
            .sort("pid", "ts_ns")
            .cast(schema.NAMES_SCHEMA)
        )

    def manifest(self) -> dict:
        """Per process (by PID) with launched handles that no lookup or runtime launch named: what the scan found."""
        return {str(pid): {**(p.outcome or {"handles_read": 0, "named": 0, "path": None, "reason": EXITED}),
                           "unnamed_handles": len([h for h in p.launched if self._name(p, h) is None])}
                for pid, p in sorted(self._procs.items()) if any(self._name(p, h) is None for h in p.launched)}
