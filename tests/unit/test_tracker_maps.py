"""capture.procs.tracker: a process's maps are read again when it launches from an
address in none of the maps saved for it (a library mapped since), on our own
process's real maps."""

from __future__ import annotations

import ctypes
import os

import numpy as np

from pasta_trace import schema
from pasta_trace.capture.procs.tracker import ProcessTracker

PID = os.getpid()
#: a saved maps text from before the libraries were mapped: a heap only
HEAP = "10000-20000 rw-p 00000000 00:00 0 [heap]\n"


def _launches(*funcs: int, kind: int = int(schema.Kind.launch)) -> np.ndarray:
    recs = np.zeros(len(funcs), dtype=schema.HOST_EVENT.dtype)
    recs["pid"], recs["kind"], recs["func"] = PID, kind, funcs
    return recs


def _tracker() -> ProcessTracker:
    t = ProcessTracker(None, mode="launch", pids=[], say=print)
    t.maps[PID] = HEAP
    return t


def test_launch_from_a_library_mapped_since_rereads_the_maps():
    libc_func = ctypes.cast(ctypes.CDLL(None).printf, ctypes.c_void_p).value
    t = _tracker()
    t.seen_launches(_launches(libc_func))
    assert t.maps[PID] != HEAP
    assert any(line.split()[5].split("/")[-1].startswith("libc") for line in t.maps[PID].splitlines()
               if len(line.split()) == 6)


def test_addresses_already_mapped_or_never_mapped_cost_no_read():
    t = _tracker()
    t.seen_launches(_launches(0x10800, 0))  # in the saved heap (a driver handle); none
    t.seen_launches(_launches(0x8, kind=int(schema.Kind.alloc)))  # not a launch
    assert t.maps[PID] == HEAP
    t.seen_launches(_launches(0x8))  # in no mapping: one read ...
    assert t.maps[PID] != HEAP
    t.maps[PID] = HEAP
    t.seen_launches(_launches(0x8))  # ... and no more for that address
    assert t.maps[PID] == HEAP
