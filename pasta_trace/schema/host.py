"""The host side: event kinds, copy kinds, layers and the BPF event record."""

from __future__ import annotations

import enum

import numpy as np

from ..return_codes import CUDA_DRIVER, CUDA_RUNTIME, HIP, NCCL
from .records import Record, fields


class Kind(enum.IntEnum):
    """Category of a host API call (the `kind` column)."""

    launch = 0
    alloc = 1
    free = 2
    memcpy = 3
    memset = 4
    sync = 5
    graph = 6
    module = 7
    other = 8
    #: memory a framework's allocator handed out or took back (PyTorch's
    #: tensors, libc10): never summed with the driver's alloc/free (format 1.2)
    tensor_alloc = 9
    tensor_free = 10
    # libnccl (format 1.3): their arguments fill the named columns of NCCL_SLOTS
    collective = 11  # AllReduce, Broadcast, Reduce, AllGather, ReduceScatter, AlltoAll, Gather, Scatter
    p2p = 12  # Send, Recv
    group = 13  # GroupStart, GroupEnd
    comm = 14  # communicator life: GetUniqueId, CommInitRank*, CommInitAll, CommSplit, CommFinalize/Destroy/Abort
    #: a call made inside a traced call of a higher layer that does the same
    #: thing (cuLaunchKernel inside cudaLaunchKernel): that outer call counts
    #: it; `outer_ts_ns` names it (format 1.4)
    nested = 15
    #: a launch made on a stream under capture, or a kernel node added to a
    #: graph: recorded into a graph, not run; the graph's launches run it
    #: (format 1.6); a copy or memset made on a stream under capture too
    #: (format 1.9: never bytes moved)
    captured = 16


KIND_NAMES = [k.name for k in Kind]


def kind_index(kinds: np.ndarray) -> np.ndarray:
    """Kind values as indexes into KIND_NAMES: a value this reader does not
    know (a newer program) reads as `other`."""
    return np.where(kinds < len(KIND_NAMES), kinds, int(Kind.other))


class CopyKind(enum.IntEnum):
    """Direction of a copy; numbering follows cudaMemcpyKind / hipMemcpyKind."""

    h2h = 0
    h2d = 1
    d2h = 2
    d2d = 3
    default = 4  # unified addressing: direction decided by the driver
    peer = 5
    unknown = 6


COPY_KIND_NAMES = [k.name for k in CopyKind]


class NameSource(enum.IntEnum):
    """Where a handle -> kernel name mapping came from (`source` column)."""

    module_get_function = 0  # cuModuleGetFunction / hipModuleGetFunction
    library_get_kernel = 1  # cuLibraryGetKernel / hipLibraryGetKernel
    kernel_get_function = 2  # cuKernelGetFunction: CUfunction aliases a CUkernel
    register_function = 3  # __hipRegisterFunction / __cudaRegisterFunction
    get_proc_address = 4  # cuGetProcAddress: `handle` is the returned entry point
    func_get_name = 5  # cuFuncGetName / cuKernelGetName
    elf_stub = 6  # host stub's ELF symbol (runtime-API launches), found offline
    fatbin = 7  # the name exists in the process's fatbins
    unknown = 8
    host_stub = 9  # cudaGetFuncBySymbol / cudaGetKernel: the handle of a host stub named through the ELF (1.4)
    runtime_launch = 10  # a driver handle launched inside a named runtime launch (1.4)
    driver_object = 11  # read from the driver's object behind a handle looked up before the attach (1.5)


NAME_SOURCE_NAMES = [s.name for s in NameSource]


class Layer(enum.IntEnum):
    """Where a call was seen (the `layer` column, format 1.2): a layer calls
    the ones below it.  Each probed API has one (probes.catalog)."""

    driver = 0  # libcuda.so.1
    runtime = 1  # libcudart (shared or linked into the executable), libamdhip64
    framework = 2  # libraries above the runtime (PyTorch's libc10)
    nccl = 3  # collective libraries (libnccl)


LAYER_NAMES = [k.name for k in Layer]

#: Event `flags` bits.
FLAG_HAS_RET = 1 << 0  # `ret` holds the return code (a uretprobe ran)
FLAG_HAS_DUR = 1 << 1  # `dur_ns` is entry->return
FLAG_OUTPTR_FAULT = 1 << 2  # the out-pointer could not be read at return
FLAG_NATIVE_STACK = 1 << 3  # stack_id is a native sample number (pt_native), replaced by the tracer before writing
#: made while the process's Python interpreter was finalizing (from the entry of
#: Py_FinalizeEx/Py_Finalize on): the `at_exit` column (tensor events, format 1.7)
FLAG_AT_EXIT = 1 << 4

#: Bit positions in the event's `valid` mask: which payload columns the probe
#: set.  The decoder turns unset ones into nulls.
PAYLOAD_BITS = {
    "stream": 0,
    "func": 1,
    "ptr": 2,
    "size": 3,
    "dst": 4,
    "src": 5,
    "grid": 6,  # grid_x, grid_y, grid_z
    "block": 7,  # block_x, block_y, block_z
    "shmem": 8,
    "copy_kind": 9,
    "aux": 10,
    "caller": 11,
    "caller_fp": 12,
    # the NCCL kinds' named columns (NCCL_SLOTS), from bit 16 on
    "count": 16,
    "datatype": 17,
    "op": 18,
    "root": 19,
    "peer": 20,
    "communicator": 21,
    "nranks": 22,
    "rank": 23,
    "comm_id": 24,
}

#: Kinds whose events carry named values in the record's generic payload
#: slots: HOST_EVENT field -> the events column it is decoded into (format
#: 1.2).  For these kinds the slot's own column is null, and the valid bit of
#: the slot says whether the named column is set.
TENSOR_PAYLOAD = {"dst": "allocated_bytes", "src": "reserved_bytes", "aux": "device"}
KIND_PAYLOAD: dict[Kind, dict[str, str]] = {Kind.tensor_alloc: TENSOR_PAYLOAD, Kind.tensor_free: TENSOR_PAYLOAD}

#: c10::DeviceType names, as PyTorch spells them (torch.device("cuda:0")).
#: A tensor event's `aux` is c10::Device as the C++ ABI packs it: the type in
#: bits 0-7, the index (int8, -1 = none) in bits 8-15.
TORCH_DEVICE_TYPES = [
    "cpu", "cuda", "mkldnn", "opengl", "opencl", "ideep", "hip", "fpga", "maia", "xla", "vulkan", "metal", "xpu",
    "mps", "meta", "hpu", "ve", "lazy", "ipu", "mtia", "privateuseone",
]

#: The NCCL kinds (collective, p2p, group, comm) carry their own arguments in
#: payload slots no NCCL call uses otherwise: named column -> record field.
#: Each named column has its own PAYLOAD_BITS bit; the slot's generic column
#: (dst, ptr, grid_x, ...) stays null for these events.  `stream` and `size`
#: (bytes = count x element size) are the generic columns.
NCCL_SLOTS: dict[str, str] = {
    "count": "dst",  # elements (sendcount of AllGather, recvcount of ReduceScatter)
    "communicator": "ptr",  # the ncclComm_t handle
    "comm_id": "src",  # nccl_comm_id() of the communicator's ncclUniqueId
    "datatype": "grid_x",  # ncclDataType_t
    "op": "grid_y",  # ncclRedOp_t
    "root": "grid_z",  # int
    "peer": "block_x",  # int
    "nranks": "block_y",  # int
    "rank": "block_z",  # int
}

#: ncclDataType_t in order (nccl.h), with the element size in bytes.
NCCL_DATATYPES: tuple[tuple[str, int], ...] = (
    ("int8", 1), ("uint8", 1), ("int32", 4), ("uint32", 4), ("int64", 8), ("uint64", 8), ("float16", 2),
    ("float32", 4), ("float64", 8), ("bfloat16", 2), ("float8e4m3", 1), ("float8e5m2", 1),
)
#: a datatype this table does not know (a newer NCCL) reads as "unknown", with no size
NCCL_DATATYPE_NAMES = [n for n, _ in NCCL_DATATYPES] + ["unknown"]
#: ncclRedOp_t: the five built-in ops, then the ones ncclRedOpCreatePreMulSum makes (its only creator)
NCCL_OP_NAMES = ["sum", "prod", "max", "min", "avg", "premulsum"]

#: ncclUniqueId is 128 bytes; comm_id is its FNV-1a hash over 16 little-endian u64 words
NCCL_UNIQUE_ID_BYTES = 128
FNV_OFFSET, FNV_PRIME = 0xCBF29CE484222325, 0x100000001B3


def nccl_comm_id(unique_id: bytes) -> int:
    """The comm_id of a communicator made from ``unique_id`` (what the probes
    compute from the 128 bytes: the same on every rank and every host)."""
    if len(unique_id) != NCCL_UNIQUE_ID_BYTES:
        raise ValueError(f"an ncclUniqueId has {NCCL_UNIQUE_ID_BYTES} bytes, not {len(unique_id)}")
    h = FNV_OFFSET
    for w in np.frombuffer(unique_id, "<u8").tolist():
        h = ((h ^ w) * FNV_PRIME) & 0xFFFF_FFFF_FFFF_FFFF
    return h

COMM_LEN = 16
NAME_LEN = 208

#: Return-code names per API family, generated from the vendor headers
#: (scripts/gen_return_codes.py writes pasta_trace/return_codes.py).  The
#: family of an API is read from its name (pasta_trace.call_result).
RETURN_CODES: dict[str, dict[int, str]] = {"cuda": CUDA_DRIVER, "cudart": CUDA_RUNTIME, "hip": HIP, "nccl": NCCL}

# --------------------------------------------------------------------------- host records

HOST_EVENT = Record(
    "pt_event",
    fields(
        [
            ("ts_ns", "u64", "ns CLOCK_MONOTONIC", "entry time (bpf_ktime_get_ns)"),
            ("dur_ns", "u64", "ns", "return - entry; valid if FLAG_HAS_DUR"),
            ("pid", "u32", "", "host tgid"),
            ("tid", "u32", "", "host thread id"),
            ("api", "u16", "", "index into the capture's API table"),
            ("kind", "u8", "", "Kind"),
            ("flags", "u8", "", "FLAG_* bits"),
            ("ret", "i32", "", "return code; valid if FLAG_HAS_RET"),
            ("valid", "u32", "", "PAYLOAD_BITS mask"),
            ("copy_kind", "u32", "", "CopyKind"),
            ("stream", "u64", "", "stream handle"),
            ("func", "u64", "", "CUfunction/CUkernel/host stub/graph exec/host fn"),
            ("ptr", "u64", "", "allocated/freed/set address or handle"),
            ("size", "u64", "bytes", ""),
            ("dst", "u64", "", "copy destination"),
            ("src", "u64", "", "copy source"),
            ("grid_x", "u32", "", ""),
            ("grid_y", "u32", "", ""),
            ("grid_z", "u32", "", ""),
            ("block_x", "u32", "", ""),
            ("block_y", "u32", "", ""),
            ("block_z", "u32", "", ""),
            ("shmem", "u32", "bytes", "dynamic shared memory"),
            ("aux", "u32", "", "API-specific: alloc flags, memset value, event/ctx low bits"),
            ("comm", f"char[{COMM_LEN}]", "", "task comm"),
            ("stack_id", "u64", "", "the caller's stack in stacks.parquet; 0 = none"),
            ("outer_ts", "u64", "ns CLOCK_MONOTONIC", "entry time of the traced call this one is nested in; 0 = none"),
            ("caller", "u64", "", "return address at entry: the call site (runtime launches)"),
            ("caller_fp", "u64", "", "return address of the frame rbp points at (runtime launches)"),
        ]
    ),
    "one traced API call, as written into the events ring buffer",
)

HOST_NAME = Record(
    "pt_name",
    fields(
        [
            ("ts_ns", "u64", "ns CLOCK_MONOTONIC", ""),
            ("pid", "u32", "", ""),
            ("tid", "u32", "", ""),
            ("handle", "u64", "", "CUfunction/CUkernel/host stub/entry point"),
            ("alias", "u64", "", "for kernel_get_function: the CUkernel this handle aliases"),
            ("api", "u16", "", "API that produced it"),
            ("source", "u16", "", "NameSource"),
            ("ret", "i32", "", "return code of the lookup (0 when entry-only)"),
            ("name", f"char[{NAME_LEN}]", "", "NUL-terminated, truncated"),
        ]
    ),
    "a handle -> name observation, written into the names ring buffer",
)

AGG_KEY = Record(
    "pt_agg_key",
    fields(
        [
            ("pid", "u32", "", ""),
            ("api", "u16", "", ""),
            ("kind", "u16", "", ""),
            ("func", "u64", "", ""),
            ("grid_x", "u32", "", ""),
            ("grid_y", "u32", "", ""),
            ("grid_z", "u32", "", ""),
            ("block_x", "u32", "", ""),
            ("block_y", "u32", "", ""),
            ("block_z", "u32", "", ""),
            ("ret", "i32", "", "return code; valid if FLAG_HAS_RET: failed calls are their own rows"),
            ("flags", "u32", "", "FLAG_HAS_RET or 0"),
        ]
    ),
    "--aggregate mode key: one row per (pid, api, kernel, shape, return code)",
)

AGG_VAL = Record(
    "pt_agg_val",
    fields(
        [
            ("count", "u64", "", "calls"),
            ("bytes", "u64", "bytes", "sum of size for allocs/copies/memsets; 0 for failed calls"),
            ("first_ts", "u64", "ns", ""),
            ("last_ts", "u64", "ns", ""),
        ]
    ),
    "--aggregate mode value",
)

HOST_RECORDS = (HOST_EVENT, HOST_NAME, AGG_KEY, AGG_VAL)

DISCOVER_PATH_LEN = 256


class DiscoverType(enum.IntEnum):
    """What bpf/discover.bpf.c reports in its ring (pasta_trace/capture/procs/late_load.py).
    Stopped processes are in the pt_stops map (STOP_RECORD); a STOP record only wakes the tracer."""

    FORK = 2
    EXEC = 3
    EXIT = 4
    #: a process was stopped (a pt_stops record): wakes the tracer to resume it at once
    STOP = 5
    #: a traced process (with a pid filter) mapped a file executable: addr, len, pgoff, dev, ino
    MAP = 6


DISCOVER_EVENT = Record(
    "pt_discover",
    fields(
        [
            ("ts_ns", "u64", "ns CLOCK_MONOTONIC", ""),
            ("pid", "u32", "", "tgid"),
            ("tid", "u32", "", ""),
            ("ppid", "u32", "", "FORK: the parent's tgid"),
            ("type", "u32", "", "DiscoverType"),
            ("cgroup_id", "u64", "", "cgroup v2 id of the task (its cgroupfs directory's inode)"),
            ("addr", "u64", "", "MAP: where the mapping starts"),
            ("len", "u64", "bytes", "MAP: its length"),
            ("pgoff", "u64", "bytes", "MAP: the file offset it maps"),
            ("dev", "u64", "", "MAP: KNOWN_FILE.dev of the mapped file"),
            ("ino", "u64", "", "MAP: inode of the mapped file"),
            ("exit_code", "u32", "", "EXIT: task->exit_code, the wait status (exit status << 8, or the "
                                     "killing signal | 0x80 if it dumped core)"),
            ("pad", "u32", "", "zero"),
        ]
    ),
    "process-lifetime notification, written into the discover_events ring buffer",
)

KNOWN_FILE = Record(
    "pt_file",
    fields(
        [
            ("dev", "u64", "", "the file's device, as the kernel encodes it (major << 20 | minor)"),
            ("ino", "u64", "", "the file's inode number"),
        ]
    ),
    "key of known_files: a library file that has probes, whatever path reaches it",
)

STOP_RECORD = Record(
    "pt_stop",
    fields(
        [
            ("ts_ns", "u64", "ns CLOCK_MONOTONIC", "when the process was stopped"),
            ("dev", "u64", "", "KNOWN_FILE.dev of the opened file"),
            ("ino", "u64", "", "inode of the opened file"),
            ("tgid", "u32", "", "the stopped process"),
            ("fd", "i32", "", "the descriptor the open returned (or mapped); -1: stopped at its exec; "
             "-2: at its interpreter's finalization (Python stacks)"),
            ("path", f"char[{DISCOVER_PATH_LEN}]", "", "the name passed to open (empty: stopped at an mmap)"),
        ]
    ),
    "value of pt_stops (key: the opener's tid): a process stopped at its open of a traced library, at its "
    "first executable mapping of a file not looked at yet, or (with a pid filter) at its exec, until a "
    "tracer or its guardian resumes it",
)
