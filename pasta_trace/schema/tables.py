"""The Polars schemas of the capture directory's Parquet files."""

from __future__ import annotations

import polars as pl

from .records import CTYPES, Record
from .host import COPY_KIND_NAMES, KIND_NAMES, LAYER_NAMES, NAME_SOURCE_NAMES, NCCL_DATATYPE_NAMES, NCCL_OP_NAMES
from .stacks import STACK_KIND_NAMES
from .device import DEV_ACCESS_SAMPLE, DEV_ALLOC, DEV_ALLOC_TOUCH_ENTRY, DEV_CLOCK_SYNC, DEV_CUPTI_KERNEL, DEV_CUPTI_MEMOP, DEV_DROPPED, DEV_KERNEL_SUMMARY, DEV_LAUNCH, DEV_OPCODE_HIST_ENTRY, DEV_PAGE_HIST_ENTRY, DEV_TOOL_STATUS, DEV_WS_BITMAP_HEADER


#: events*.parquet.  Payload columns are null where the API does not set them.
EVENTS_SCHEMA: dict[str, pl.DataType] = {
    "ts_ns": pl.Int64,
    "dur_ns": pl.Int64,
    "pid": pl.UInt32,
    "tid": pl.UInt32,
    "comm": pl.Categorical,
    "api": pl.Categorical,
    "kind": pl.Enum(KIND_NAMES),
    "ret": pl.Int32,
    "stream": pl.UInt64,
    "func": pl.UInt64,
    "grid_x": pl.UInt32,
    "grid_y": pl.UInt32,
    "grid_z": pl.UInt32,
    "block_x": pl.UInt32,
    "block_y": pl.UInt32,
    "block_z": pl.UInt32,
    "shmem": pl.UInt32,
    "ptr": pl.UInt64,
    "size": pl.UInt64,
    "dst": pl.UInt64,
    "src": pl.UInt64,
    "copy_kind": pl.Enum(COPY_KIND_NAMES),
    "aux": pl.UInt32,
    "stack_id": pl.UInt64,  # -> stacks.parquet (pid, stack_id); null: no stack (format 1.1+)
    # format 1.2: where the call was seen
    "layer": pl.Enum(LAYER_NAMES),  # null: an API this reader does not know
    # format 1.2: tensor_alloc / tensor_free only (KIND_PAYLOAD); null elsewhere
    "device": pl.Categorical,  # "cpu", "cuda:0", ... (torch.device's spelling)
    "allocated_bytes": pl.UInt64,  # the allocator's running total after this event; null: it gives none
    "reserved_bytes": pl.UInt64,  # bytes the allocator holds from the driver (its cache); null: none given
    # format 1.3: NCCL calls (NCCL_SLOTS); null for every other kind.  `comm`
    # above is the task's command name, so the handle is `communicator`.
    "communicator": pl.UInt64,  # ncclComm_t
    "comm_id": pl.UInt64,  # nccl_comm_id(ncclUniqueId): one value per communicator across ranks and hosts
    "seq": pl.Int64,  # collectives: 0-based among the successful ones on this communicator, in call order
    "count": pl.UInt64,  # elements
    "datatype": pl.Enum(NCCL_DATATYPE_NAMES),
    "op": pl.Enum(NCCL_OP_NAMES),
    "root": pl.Int32,
    "peer": pl.Int32,
    "nranks": pl.Int32,
    "rank": pl.Int32,
    # format 1.4: the runtime <-> driver pairing
    "outer_ts_ns": pl.Int64,  # kind "nested": ts_ns of the call (same pid, tid) it is part of
    "caller": pl.UInt64,  # runtime launches: return address at entry (in the host stub)
    "caller_fp": pl.UInt64,  # runtime launches: return address one frame up, through the frame pointer
    # format 1.7: tensor_alloc / tensor_free made during interpreter finalization (FLAG_AT_EXIT):
    # CPython frees every tensor left at exit; true: this one was; null: no finalization probe saw it
    "at_exit": pl.Boolean,
}

#: Columns of events*.parquet (and communicators.parquet) stored DELTA_BINARY_PACKED:
#: times, which rise within a file (a dictionary of 10^5 distinct values is
#: only tried and dropped).  Every other column is dictionary-encoded.  Either
#: way a reader sees the same values; this is how the events writer keeps its
#: Parquet encoding cheap (docs/performance.md, "the events file encoded by Arrow").
DELTA_ENCODED_COLUMNS: tuple[str, ...] = ("ts_ns", "outer_ts_ns", "end_ts_ns")

#: communicators.parquet (format 1.3): one row per NCCL communicator a traced
#: process created, keyed across captures by comm_id (rank r of nranks).
COMMUNICATORS_SCHEMA: dict[str, pl.DataType] = {
    "host": pl.String,  # the machine that recorded it (manifest's host)
    "pid": pl.UInt32,
    "communicator": pl.UInt64,  # ncclComm_t in that process
    "comm_id": pl.UInt64,  # null: made by ncclCommInitAll, or split from a parent created before the capture
    "rank": pl.Int32,  # null: not known at the call (ncclCommSplit)
    "nranks": pl.Int32,
    "api": pl.String,  # the call that made it
    "ts_ns": pl.Int64,  # when that call was entered
    "end_ts_ns": pl.Int64,  # ncclCommDestroy/ncclCommAbort entered; null: alive at the end
}

#: clocks.parquet of a cluster timeline (many captures merged, docs/cluster.md):
#: one row per capture, how its CLOCK_MONOTONIC was put on the timeline's
#: clock (the first capture's CLOCK_MONOTONIC): timeline ns = capture ns + offset_ns.
CLOCK_OFFSETS_SCHEMA: dict[str, pl.DataType] = {
    "capture": pl.UInt32,  # position among the merged captures (0: the reference)
    "path": pl.String,  # the capture directory merged
    "node": pl.String,  # its manifest's host
    "pid_offset": pl.UInt32,  # added to its pids and tids (0 unless they collide with an earlier capture's)
    "offset_ns": pl.Int64,  # the fitted offset
    "uncertainty_ns": pl.Int64,  # how far the true offset may be from it; null: not known (no clock samples)
    "method": pl.String,  # reference | realtime | collectives | none
    "realtime_offset_ns": pl.Int64,  # from the CLOCK_REALTIME/CLOCK_MONOTONIC samples at start and end
    "realtime_uncertainty_ns": pl.Int64,  # their brackets, the drift between them, and --clock-sync-us across nodes
    "collective_offset_ns": pl.Int64,  # median over shared collectives of (reference entry - this entry)
    "collective_uncertainty_ns": pl.Int64,  # median absolute deviation of those differences
    "collectives": pl.UInt32,  # collectives (comm_id, seq) shared with the reference capture
}

#: events/node=<host>/rank=<r>/*.parquet of a cluster timeline: EVENTS_SCHEMA
#: with its `rank` (the rank argument of a communicator-making call) as
#: `comm_rank`, since the hive path's `rank` (the process's) is a column
#: too, and Spark, Dask and Arrow refuse a file column named like a partition.
CLUSTER_EVENTS_SCHEMA: dict[str, pl.DataType] = {
    ("comm_rank" if k == "rank" else k): v for k, v in EVENTS_SCHEMA.items()}

#: ranks.parquet of a cluster timeline: one row per process, its node and
#: rank (the hive partition its events are under).
CLUSTER_RANKS_SCHEMA: dict[str, pl.DataType] = {
    "capture": pl.UInt32,
    "node": pl.String,
    "pid": pl.UInt32,  # in the timeline (host_pid + the capture's pid_offset)
    "host_pid": pl.UInt32,  # as the capture recorded it
    "rank": pl.Int32,  # RANK from its environment, else its rank in its largest communicator; -1: none
}

#: stacks.parquet: one row per frame of each distinct stack.
STACKS_SCHEMA: dict[str, pl.DataType] = {
    "pid": pl.UInt32,
    "stack_id": pl.UInt64,
    "depth": pl.UInt16,  # 0 = the innermost frame, the one that made the call
    "kind": pl.Enum(STACK_KIND_NAMES),
    "function": pl.String,  # qualname (Python) or symbol (native); null: could not be read
    "file": pl.String,
    "line": pl.UInt32,
    "module": pl.String,  # library path of a native frame; null for Python frames
    "addr": pl.UInt64,  # code object (Python) or instruction address (native)
    "truncated": pl.Boolean,  # the stack was deeper than --stack-depth (same on every row of it)
}

NAMES_SCHEMA: dict[str, pl.DataType] = {
    "pid": pl.UInt32,
    "handle": pl.UInt64,
    "name": pl.String,
    "source": pl.Enum(NAME_SOURCE_NAMES),
    "ts_ns": pl.Int64,
    "api": pl.Categorical,
    "reason": pl.String,  # why `name` is unknown@0x...; null when the handle is named
}

PROCESSES_SCHEMA: dict[str, pl.DataType] = {
    "pid": pl.UInt32,
    "ppid": pl.UInt32,
    "comm": pl.String,
    "cmdline": pl.String,
    "cgroup": pl.String,
    "container_id": pl.String,  # null outside containers
    "mnt_ns": pl.UInt64,
    "start_ns": pl.Int64,  # CLOCK_MONOTONIC (from /proc/PID/stat starttime)
    "exit_ns": pl.Int64,  # null while alive at the end of the capture
    # the process's place in a distributed job, from RANK, LOCAL_RANK and
    # WORLD_SIZE in its environment (torchrun, mpirun -x, SLURM wrappers);
    # null when unset or unreadable (format 1.1+; older files read as null)
    "rank": pl.Int32,
    "local_rank": pl.Int32,
    "world_size": pl.Int32,
}

LIBRARIES_SCHEMA: dict[str, pl.DataType] = {
    "path": pl.String,  # as seen inside the process (maps)
    "attach_path": pl.String,  # /proc/PID/root/... used to attach
    "dev": pl.UInt64,
    "inode": pl.UInt64,
    "build_id": pl.String,
    "family": pl.Categorical,  # cuda | hip | cudart (libcudart, or an executable it is linked into)
    "symbols_attached": pl.UInt32,
    "symbols_missing": pl.UInt32,
}

#: --aggregate mode output (aggregate.parquet).
AGGREGATE_SCHEMA: dict[str, pl.DataType] = {
    "pid": pl.UInt32,
    "api": pl.Categorical,
    "kind": pl.Enum(KIND_NAMES),
    "func": pl.UInt64,
    "grid_x": pl.UInt32,
    "grid_y": pl.UInt32,
    "grid_z": pl.UInt32,
    "block_x": pl.UInt32,
    "block_y": pl.UInt32,
    "block_z": pl.UInt32,
    "ret": pl.Int32,  # null where no return code was read (entry-only probes)
    "count": pl.UInt64,
    "bytes": pl.UInt64,
    "first_ts_ns": pl.Int64,
    "last_ts_ns": pl.Int64,
}


def record_columns(r: Record, skip: tuple[str, ...] = ("pad",)) -> dict[str, pl.DataType]:
    cols: dict[str, pl.DataType] = {}
    for f in r.fields:
        if f.name in skip:
            continue
        cols[f.name] = pl.Binary if f.array_len is not None else CTYPES[f.ctype][2]
    return cols


_PER_PROCESS = {"pid": pl.UInt32}
_PER_LAUNCH = {"pid": pl.UInt32, "launch_id": pl.UInt64}

#: Frames produced by pasta_trace.device (the reader of device record files and
#: CUPTI records) and consumed by merge and the tools.  This is the seam between
#: the device side and the offline side: both are tested against these schemas.
DEVICE_FRAMES: dict[str, dict[str, pl.DataType]] = {
    "clock_sync": {**_PER_PROCESS, **record_columns(DEV_CLOCK_SYNC)},
    "launches": {**_PER_LAUNCH, **record_columns(DEV_LAUNCH), "name": pl.String},
    "kernel_summaries": {**_PER_LAUNCH, **record_columns(DEV_KERNEL_SUMMARY)},
    "page_hist": {**_PER_LAUNCH, "page_shift": pl.UInt32, **record_columns(DEV_PAGE_HIST_ENTRY)},
    "alloc_touch": {**_PER_LAUNCH, **record_columns(DEV_ALLOC_TOUCH_ENTRY)},
    "ws_bitmaps": {
        **_PER_LAUNCH,
        **record_columns(DEV_WS_BITMAP_HEADER),
        "bits": pl.Binary,  # decoded to raw little-endian u64 words
    },
    "allocs": {**_PER_PROCESS, **record_columns(DEV_ALLOC)},
    "frees": {**_PER_PROCESS, **record_columns(DEV_ALLOC)},
    "opcode_hist": {**_PER_LAUNCH, **record_columns(DEV_OPCODE_HIST_ENTRY), "opcode": pl.String},
    "access_samples": {**_PER_LAUNCH, **record_columns(DEV_ACCESS_SAMPLE)},
    "dropped": {**_PER_LAUNCH, **record_columns(DEV_DROPPED)},
    "cupti_kernels": {**_PER_PROCESS, **record_columns(DEV_CUPTI_KERNEL), "name": pl.String},
    "cupti_memcpy": {**_PER_PROCESS, **record_columns(DEV_CUPTI_MEMOP)},
    "cupti_memset": {**_PER_PROCESS, **record_columns(DEV_CUPTI_MEMOP)},
    "tool_status": {**_PER_PROCESS, **record_columns(DEV_TOOL_STATUS)},
}
