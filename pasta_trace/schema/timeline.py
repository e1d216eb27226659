"""The merged timeline's frames (docs/merge.md)."""

from __future__ import annotations

import polars as pl

from .device import DEV_KERNEL_SUMMARY, DeviceAllocKind
from .tables import record_columns


#: Memory kind of an allocation instance (`allocations.kind`), from the API
#: name (host events) or the device ALLOC record's `kind`.
#: beyond the device module's kinds: "physical" is VMM memory made by cuMemCreate/hipMemCreate (its
#: `base` is the opaque handle, no address), "mapping" a range cuMemMap/hipMemMap mapped it at (an
#: address range with no memory of its own: its bytes are the physical allocation's)
ALLOC_KIND_NAMES = [k.name.rstrip("_") for k in DeviceAllocKind] + ["other", "physical", "mapping"]

#: How a host launch found its device execution (`kernels.match`).
MATCH_NAMES = ["exact", "time"]

_SUMMARY_COUNTERS = {
    k: v for k, v in record_columns(DEV_KERNEL_SUMMARY).items() if k not in ("gpu_t_first", "gpu_t_last")
}

#: Frames written by `pasta-trace merge` (one Parquet file each in the
#: timeline directory, see docs/merge.md) and returned by pasta_trace.merge.
TIMELINE_FRAMES: dict[str, dict[str, pl.DataType]] = {
    # one row per host launch event, with its device execution when one matched
    "kernels": {
        "pid": pl.UInt32,
        "tid": pl.UInt32,
        "ts_ns": pl.Int64,
        "dur_ns": pl.Int64,
        "api": pl.Categorical,
        "func": pl.UInt64,
        "name": pl.String,
        "stream": pl.UInt64,
        "grid_x": pl.UInt32,
        "grid_y": pl.UInt32,
        "grid_z": pl.UInt32,
        "block_x": pl.UInt32,
        "block_y": pl.UInt32,
        "block_z": pl.UInt32,
        "shmem": pl.UInt32,
        "launch_seq": pl.Int64,  # 0-based order of the launch among its process's launches
        # timeline 1.3: the launch call's return code (null: not read); a failed launch ran no kernel
        "ret": pl.Int32,
        # timeline 1.2: a kernel a CUDA graph launch ran (one row per kernel per graph launch), and its exec
        "via_graph": pl.Boolean,
        "graph_exec": pl.UInt64,
        # timeline 1.4: CUPTI's ids of the graph and node that ran the kernel (null: not run by a
        # graph launch, or no CUPTI record of it); the node is the exec's, made at instantiation
        "graph_id": pl.UInt32,
        "graph_node_id": pl.UInt64,
        "match": pl.Enum(MATCH_NAMES),  # null: no device execution matched
        "launch_id": pl.UInt64,
        "device": pl.UInt32,
        "grid_id": pl.Int64,
        "correlation_id": pl.UInt32,
        "gpu_start_ns": pl.Int64,  # CLOCK_MONOTONIC
        "gpu_end_ns": pl.Int64,  # CLOCK_MONOTONIC
        **_SUMMARY_COUNTERS,
    },
    # one row per allocation instance (an address reused later is a new row)
    "allocations": {
        "alloc_id": pl.UInt32,
        "pid": pl.UInt32,
        "tid": pl.UInt32,
        "base": pl.UInt64,
        "size": pl.UInt64,
        "api": pl.Categorical,
        "kind": pl.Enum(ALLOC_KIND_NAMES),
        "alloc_ts_ns": pl.Int64,
        "free_ts_ns": pl.Int64,  # null: never freed during the capture
        "free_api": pl.Categorical,
    },
    # device pages (page histogram, or access samples folded to pages) with
    # the allocation live at that address when the kernel was launched
    "pages": {
        "pid": pl.UInt32,
        "launch_id": pl.UInt64,
        "name": pl.String,
        "alloc_id": pl.UInt32,
        "alloc_base": pl.UInt64,  # null: no live allocation holds this page
        "alloc_size": pl.UInt64,
        "alloc_api": pl.Categorical,
        "page_shift": pl.UInt32,
        "page": pl.UInt64,  # address >> page_shift
        "count": pl.UInt64,  # thread-level accesses
        "bytes": pl.UInt64,  # null where the source does not report bytes
    },
    # device ALLOC_TOUCH rows resolved to allocation instances
    "alloc_touches": {
        "pid": pl.UInt32,
        "launch_id": pl.UInt64,
        "name": pl.String,
        "alloc_id": pl.UInt32,
        "alloc_base": pl.UInt64,
        "alloc_size": pl.UInt64,
        "alloc_api": pl.Categorical,
        "touches": pl.UInt64,
        "bytes": pl.UInt64,
        "unique_pages": pl.UInt32,
    },
    # per kernel execution, from access samples: the working set
    "working_set": {
        "pid": pl.UInt32,
        "launch_id": pl.UInt64,
        "samples": pl.UInt32,  # warp-level access records
        "accesses": pl.UInt64,  # thread-level (active lanes)
        "bytes": pl.UInt64,
        "pages": pl.UInt32,  # distinct pages (page_shift of the merge, 4 KiB by default)
    },
    # per allocation instance, from access samples: how hot it was
    "hotness": {
        "pid": pl.UInt32,
        "alloc_id": pl.UInt32,
        "base": pl.UInt64,
        "size": pl.UInt64,
        "api": pl.Categorical,
        "samples": pl.UInt32,
        "accesses": pl.UInt64,
        "bytes": pl.UInt64,
        "launches": pl.UInt32,
    },
}


def empty_frame(schema: dict[str, pl.DataType]) -> pl.DataFrame:
    return pl.DataFrame(schema=schema)
