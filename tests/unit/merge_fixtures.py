"""Hand-built captures for the merge tests: every expected value is computed
by hand in the tests from the rows written here."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl

from pasta_trace import schema

GPU_OFFSET = 10**18  # pid 10's GPU timer reads host time + 1e18 exactly


def frame(rows: list[dict], sch: dict[str, pl.DataType]) -> pl.DataFrame:
    cols = {k: [r.get(k) for r in rows] for k in sch}
    return pl.DataFrame(cols, schema={k: (pl.String if isinstance(v, (pl.Enum, pl.Categorical)) else v)
                                      for k, v in sch.items()}).cast(sch)


def ev(ts: int, pid: int, tid: int, api: str, kind: str, **kw) -> dict:
    return {"ts_ns": ts, "pid": pid, "tid": tid, "api": api, "kind": kind, "comm": "app", **kw}


def launch(ts: int, pid: int, tid: int, func: int, **kw) -> dict:
    return ev(ts, pid, tid, "cuLaunchKernel", "launch", func=func, stream=0x50, grid_x=4, grid_y=1, grid_z=1,
              block_x=128, block_y=1, block_z=1, shmem=0, dur_ns=20, **kw)


#: pid 10, thread 11.  Allocation ids follow alloc time: A=0, C=1, B=2.
EVENTS_10 = [
    ev(100, 10, 11, "cuMemAlloc_v2", "alloc", ptr=0x10000, size=0x20000, ret=0),  # A
    ev(150, 10, 11, "cuMemAllocManaged", "alloc", ptr=0x40000, size=0x10000, ret=0),  # C
    launch(200, 10, 11, 0xA),  # seq 0
    ev(300, 10, 11, "cuMemFree_v2", "free", ptr=0x10000, ret=0),  # frees A
    ev(400, 10, 11, "cuMemAlloc_v2", "alloc", ptr=0x10000, size=0x8000, ret=0),  # B: A's address again
    launch(500, 10, 11, 0xB),  # seq 1
    ev(600, 10, 11, "cuMemAlloc_v2", "alloc", ptr=0x90000, size=0x1000, ret=2),  # failed: no allocation
    ev(650, 10, 11, "cuMemFree_v2", "free", ptr=0x77000, ret=0),  # frees nothing we know
    ev(700, 10, 11, "cuMemFree_v2", "free", ptr=0x40000, ret=0),  # frees C
    launch(800, 10, 11, 0xA),  # seq 2
]

#: pid 20: the device module saw only its second launch, plus one it
#: cannot place (no host launch of that thread within the tolerance).
EVENTS_20 = [
    launch(1500, 20, 21, 0xC),  # seq 0: never seen by the device
    launch(2500, 20, 21, 0xC),  # seq 1
    ev(2600, 20, 21, "cuMemAlloc_v2", "alloc", ptr=0x5000, size=0x100, ret=0),  # D, leaked
    ev(3000, 20, 21, "cuMemAlloc_v2", "alloc", ptr=0x5000, size=0x100, ret=0),  # E: D's free was missed
    ev(3100, 20, 21, "cuMemFree_v2", "free", ptr=0x5000, ret=0),  # frees E
]

NAMES = [
    {"pid": 10, "handle": 0xA, "name": "axpy", "source": "module_get_function", "ts_ns": 50, "api": "cuModuleGetFunction"},
    {"pid": 10, "handle": 0xB, "name": "gemm_old", "source": "module_get_function", "ts_ns": 60, "api": "cuModuleGetFunction"},
    # the module was reloaded: handle 0xB names another kernel from t=450 on
    {"pid": 10, "handle": 0xB, "name": "gemm", "source": "module_get_function", "ts_ns": 450, "api": "cuModuleGetFunction"},
]


def dev_launch(pid: int, launch_id: int, tid: int, begin: int, func: int, **kw) -> dict:
    return {"pid": pid, "launch_id": launch_id, "host_mono_begin": begin, "host_mono_end": begin + 10, "ctx": 1,
            "stream": 0x50, "func": func, "grid_id": kw.pop("grid_id", launch_id), "grid_x": 4, "grid_y": 1,
            "grid_z": 1, "block_x": 128, "block_y": 1, "block_z": 1, "device": 0, "correlation_id": 0,
            "name_id": 0, "tid": tid, "name": None, **kw}


DEVICE = {
    "launches": [
        dev_launch(10, 1, 11, 210, 0xA), dev_launch(10, 2, 11, 510, 0xB), dev_launch(10, 3, 11, 810, 0xA),
        dev_launch(20, 7, 21, 2600, 0xC),
        dev_launch(20, 8, 21, 2700, 0xC),  # claims seq 1 as well: 7 keeps it, 8 stays unmatched
    ],
    "kernel_summaries": [
        {"pid": 10, "launch_id": i, "gpu_t_first": GPU_OFFSET + t0, "gpu_t_last": GPU_OFFSET + t0 + 40,
         "gld": 100 * i, "gst": 10 * i, "blocks_in": 4, "blocks_out": 4, "warp_instrs": 0, "thread_instrs": 0,
         "gatom": 0, "gld_warp": 0, "gst_warp": 0, "gatom_warp": 0, "bytes": 400 * i, "shared": 0, "local": 0,
         "dropped": 0}
        for i, t0 in ((1, 230), (2, 530), (3, 830))
    ],
    "clock_sync": [
        {"pid": 10, "host_mono_before": t, "gpu_globaltimer": GPU_OFFSET + t, "host_mono_after": t, "device": 0}
        for t in (0, 2_000_000_000)
    ],
    # page_shift 12: page p holds addresses p*4096 ..
    "page_hist": [
        {"pid": 10, "launch_id": 1, "page_shift": 12, "page": 0x10, "count": 5},  # A
        {"pid": 10, "launch_id": 1, "page_shift": 12, "page": 0x28, "count": 3},  # A (A ends at 0x30000)
        {"pid": 10, "launch_id": 1, "page_shift": 12, "page": 0x40, "count": 2},  # C
        {"pid": 10, "launch_id": 1, "page_shift": 12, "page": 0x80, "count": 1},  # nothing there
        {"pid": 10, "launch_id": 2, "page_shift": 12, "page": 0x10, "count": 7},  # B
        {"pid": 10, "launch_id": 2, "page_shift": 12, "page": 0x28, "count": 4},  # A's tail, A is freed: none
        {"pid": 10, "launch_id": 2, "page_shift": 12, "page": 0x40, "count": 1},  # C
        {"pid": 10, "launch_id": 3, "page_shift": 12, "page": 0x40, "count": 6},  # C freed at 700: none
        {"pid": 10, "launch_id": 3, "page_shift": 12, "page": 0x11, "count": 2},  # B
    ],
    "alloc_touch": [
        {"pid": 10, "launch_id": 1, "alloc_base": 0x10000, "touches": 8, "bytes": 32, "unique_pages": 2},  # A
        {"pid": 10, "launch_id": 2, "alloc_base": 0x10000, "touches": 9, "bytes": 36, "unique_pages": 1},  # B
        {"pid": 10, "launch_id": 3, "alloc_base": 0x40000, "touches": 6, "bytes": 24, "unique_pages": 1},  # freed
    ],
    "access_samples": [
        # launch 1: A, two lanes of 8 bytes
        {"pid": 10, "launch_id": 1, "address": 0x28010, "gpu_time": 0, "block": 0, "warp": 0, "size": 8,
         "flags": 0, "lanes": 0x3},
        # launch 2: B, four lanes; then A's freed tail: nobody's
        {"pid": 10, "launch_id": 2, "address": 0x10004, "gpu_time": 0, "block": 0, "warp": 0, "size": 4,
         "flags": 0, "lanes": 0xF},
        {"pid": 10, "launch_id": 2, "address": 0x28010, "gpu_time": 0, "block": 1, "warp": 0, "size": 4,
         "flags": 1, "lanes": 0x1},
    ],
}


def write(path: Path, *, device: bool = True, shuffle: int | None = None,
          events: list[dict] | None = None, dev: dict | None = None) -> Path:
    """Write the golden capture; `shuffle` seeds a row shuffle of every file
    (the merge must not depend on file order)."""
    path.mkdir(parents=True, exist_ok=True)

    def out(df: pl.DataFrame, p: Path) -> None:
        if shuffle is not None and df.height:
            df = df.sample(fraction=1.0, shuffle=True, seed=shuffle)
        df.write_parquet(p)

    out(frame(events if events is not None else EVENTS_10 + EVENTS_20, schema.EVENTS_SCHEMA),
        path / "events-00000.parquet")
    out(frame(NAMES, schema.NAMES_SCHEMA), path / "names.parquet")
    (path / "manifest.json").write_text(json.dumps(
        {"format_version": "1.0", "complete": True, "start_ns": 0, "end_ns": 4000, "host": "golden",
         "counts": {"lost_events": 0, "lost_names": 0}}))
    if device:
        (path / "device").mkdir(exist_ok=True)
        for name, rows in (dev if dev is not None else DEVICE).items():
            out(frame(rows, schema.DEVICE_FRAMES[name]), path / "device" / f"{name}.parquet")
    return path
