"""The single source of truth for every record layout in pasta-trace.

Each binary record is declared once here as a :class:`Record` (fields with a
C type, a unit and a meaning).  Everything else is derived from it:

* the C struct text that the BPF programs include (``bpf_c_header()``),
* the C header of the device records (``device_c_header()``, checked in as
  ``gpu_probes/include/gpu_probes/record.h`` and compared in a test),
* the numpy structured dtypes used to decode ring-buffer spans and device files,
* the Polars schemas of the capture directory's Parquet files.

Tests compile the generated C and compare ``sizeof``/``offsetof`` with
:meth:`Record.offsets`.  Change a layout here, bump the relevant version, and
regenerate (``python -m pasta_trace.schema --write``).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Iterable

import numpy as np
import polars as pl

from .return_codes import CUDA_DRIVER, CUDA_RUNTIME, HIP, NCCL

# --------------------------------------------------------------------------- versions

#: Version of the capture directory layout (manifest.json + Parquet files).
#: Readers refuse a newer major with a clear message.
#: 1.9: copies and memsets under capture are kind captured (ptr = the address written, dst = the
#: capture id), on streams joined to a capture by an event wait too; event record and stream wait probed
#: 1.10: the manifest's trigger object (a daemon's dump: its trigger and the window it holds)
CAPTURE_FORMAT_VERSION = (1, 10)

#: Version of the device record file (TLV) format, written in its file header
#: (1.1: TOOL_STATUS, what the injection library's set-up calls returned;
#: 1.2: CUPTI_KERNEL's graph_node_id and graph_id, read as 0 from a 1.1 record).
DEVICE_FORMAT_VERSION = (1, 2)

#: Version of the merged timeline layout (1.1: cluster timelines, many captures in one;
#: 1.2: kernels' via_graph and graph_exec; 1.3: kernels' ret; 1.4: kernels' graph_id and
#: graph_node_id, read as null from an older timeline).
TIMELINE_FORMAT_VERSION = (1, 4)

DEVICE_MAGIC = 0x42525047  # bytes b"GPRB" little-endian

# --------------------------------------------------------------------------- C types

_CTYPES: dict[str, tuple[str, str, pl.DataType]] = {
    # name: (numpy dtype, C type, Polars type)
    "u8": ("<u1", "__u8", pl.UInt8),
    "u16": ("<u2", "__u16", pl.UInt16),
    "u32": ("<u4", "__u32", pl.UInt32),
    "u64": ("<u8", "__u64", pl.UInt64),
    "i32": ("<i4", "__s32", pl.Int32),
    "i64": ("<i8", "__s64", pl.Int64),
}


@dataclass(frozen=True)
class Field:
    name: str
    ctype: str  # a key of _CTYPES, "char[N]" (a C string), or "<key>[N]" (an array of N)
    unit: str = ""
    doc: str = ""

    @property
    def _array(self) -> tuple[str, int] | None:
        base, sep, rest = self.ctype.partition("[")
        return (base, int(rest[:-1])) if sep else None

    @property
    def array_len(self) -> int | None:
        """Length of a char[N] string field (bytes in Parquet), else None."""
        a = self._array
        return a[1] if a and a[0] == "char" else None

    @property
    def element(self) -> str:
        """The C type key of one element (the field itself when scalar)."""
        a = self._array
        return a[0] if a else self.ctype

    @property
    def count(self) -> int:
        a = self._array
        return a[1] if a else 1

    @property
    def size(self) -> int:
        if self.element == "char":
            return self.count
        return np.dtype(_CTYPES[self.element][0]).itemsize * self.count

    @property
    def align(self) -> int:
        return 1 if self.element == "char" else np.dtype(_CTYPES[self.element][0]).itemsize

    def c_decl(self) -> str:
        if self.element == "char":
            return f"char {self.name}[{self.count}];"
        dims = f"[{self.count}]" if self._array else ""
        return f"{_CTYPES[self.element][1]} {self.name}{dims};"

    def np_type(self):
        if self.element == "char":
            return f"S{self.count}"
        base = _CTYPES[self.element][0]
        return (base, (self.count,)) if self._array else base


@dataclass(frozen=True)
class Record:
    """A fixed-layout C struct.  Fields must be declared naturally aligned
    and the total size must be a multiple of 8, so that the C compiler, numpy
    and the BPF verifier all agree without padding rules."""

    name: str
    fields: tuple[Field, ...]
    doc: str = ""

    def __post_init__(self) -> None:
        off = 0
        for f in self.fields:
            if off % f.align:
                raise ValueError(f"{self.name}.{f.name} at {off} is not {f.align}-aligned")
            off += f.size
        if off % 8:
            raise ValueError(f"{self.name} size {off} is not a multiple of 8")

    @property
    def size(self) -> int:
        return sum(f.size for f in self.fields)

    def offsets(self) -> dict[str, int]:
        out, off = {}, 0
        for f in self.fields:
            out[f.name] = off
            off += f.size
        return out

    @property
    def dtype(self) -> np.dtype:
        return np.dtype([(f.name, f.np_type()) for f in self.fields])

    def field(self, name: str) -> Field:
        for f in self.fields:
            if f.name == name:
                return f
        raise KeyError(name)

    def c_struct(self, prefix: str = "") -> str:
        lines = [f"/* {self.doc} */"] if self.doc else []
        lines.append(f"struct {prefix}{self.name} {{")
        for f in self.fields:
            unit = f" /* {f.unit} */" if f.unit else ""
            lines.append(f"    {f.c_decl()}{unit}")
        lines.append("};")
        return "\n".join(lines)


def _fields(spec: Iterable[tuple]) -> tuple[Field, ...]:
    return tuple(Field(*s) for s in spec)


# --------------------------------------------------------------------------- host enums


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
_FNV_OFFSET, _FNV_PRIME = 0xCBF29CE484222325, 0x100000001B3


def nccl_comm_id(unique_id: bytes) -> int:
    """The comm_id of a communicator made from ``unique_id`` (what the probes
    compute from the 128 bytes: the same on every rank and every host)."""
    if len(unique_id) != NCCL_UNIQUE_ID_BYTES:
        raise ValueError(f"an ncclUniqueId has {NCCL_UNIQUE_ID_BYTES} bytes, not {len(unique_id)}")
    h = _FNV_OFFSET
    for w in np.frombuffer(unique_id, "<u8").tolist():
        h = ((h ^ w) * _FNV_PRIME) & 0xFFFF_FFFF_FFFF_FFFF
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
    _fields(
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
    _fields(
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
    _fields(
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
    _fields(
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
    _fields(
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
        ]
    ),
    "process-lifetime notification, written into the discover_events ring buffer",
)

KNOWN_FILE = Record(
    "pt_file",
    _fields(
        [
            ("dev", "u64", "", "the file's device, as the kernel encodes it (major << 20 | minor)"),
            ("ino", "u64", "", "the file's inode number"),
        ]
    ),
    "key of known_files: a library file that has probes, whatever path reaches it",
)

STOP_RECORD = Record(
    "pt_stop",
    _fields(
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

# --------------------------------------------------------------------------- stacks

#: --stack-depth: frames kept per Python stack (deeper stacks keep the
#: innermost ones and are marked truncated).
DEFAULT_STACK_DEPTH = 64
MAX_STACK_DEPTH = 256


class StackKind(enum.IntEnum):
    """What a frame of stacks.parquet is (`kind` column)."""

    python = 0
    native = 1


STACK_KIND_NAMES = [k.name for k in StackKind]

#: pt_pystack `flags` bits.
STACK_FLAG_TRUNCATED = 1 << 0  # the thread had more frames than --stack-depth

#: Indices of the per-CPU `py_stats` counters of bpf/pystack.h.
PY_STATS = {
    "lost_stacks": 0,  # a new stack found the stacks ring full: its events carry no stack_id
    "unreadable_stacks": 1,  # a Python thread whose frames could not be read (fault, freed memory)
    "no_python_thread": 2,  # events of a Python process from a thread running no Python code (not a loss)
    "truncated_stacks": 3,  # events whose stack was cut at --stack-depth
    # Python processes that finalized without being held until their stacks were read (pt_stops full)
    "unheld_exits": 4,
}

#: Marks an unused offset in pt_py_proc (no _PyCFrame hop, no owner to filter).
PY_NO_OFFSET = 0xFFFF

PY_PROC = Record(
    "pt_py_proc",
    _fields(
        [
            ("runtime", "u64", "", "address of _PyRuntime in the process"),
            ("version", "u32", "", "PY_VERSION_HEX"),
            ("code_tag", "u32", "", "low bits to clear from the frame's code pointer (3.14 _PyStackRef tags)"),
            ("runtime_interp_head", "u16", "bytes", "_PyRuntimeState.interpreters.head"),
            ("interp_next", "u16", "bytes", "PyInterpreterState.next"),
            ("interp_threads_head", "u16", "bytes", "PyInterpreterState.threads.head"),
            ("tstate_next", "u16", "bytes", "PyThreadState.next"),
            ("tstate_native_tid", "u16", "bytes", "PyThreadState.native_thread_id"),
            ("tstate_frame", "u16", "bytes", "PyThreadState.cframe (3.11/3.12) or .current_frame (3.13+)"),
            ("cframe_frame", "u16", "bytes", "_PyCFrame.current_frame, or PY_NO_OFFSET"),
            ("frame_code", "u16", "bytes", "_PyInterpreterFrame.f_code / f_executable"),
            ("frame_previous", "u16", "bytes", "_PyInterpreterFrame.previous"),
            ("frame_instr", "u16", "bytes", "_PyInterpreterFrame.prev_instr / instr_ptr"),
            ("frame_owner", "u16", "bytes", "_PyInterpreterFrame.owner"),
            ("pad", "u16", "", ""),
        ]
    ),
    "per-process interpreter layout: value of the py_procs BPF map, keyed by tgid",
)


def py_stack_record(depth: int = DEFAULT_STACK_DEPTH) -> Record:
    """The pystacks ring record for --stack-depth ``depth``: one new
    (deduplicated) Python stack, innermost frame first."""
    if not 1 <= depth <= MAX_STACK_DEPTH:
        raise ValueError(f"stack depth {depth} is not in 1..{MAX_STACK_DEPTH}")
    return Record(
        "pt_pystack",
        _fields(
            [
                ("stack_id", "u64", "", "hash of (pid, frames); the events' stack_id"),
                ("pid", "u32", "", "tgid"),
                ("tid", "u32", "", "thread that first had this stack"),
                ("depth", "u16", "", "frames recorded"),
                ("flags", "u16", "", "STACK_FLAG_* bits"),
                ("pad", "u32", "", ""),
                ("code", f"u64[{depth}]", "", "code object of each frame (f_code / f_executable, untagged)"),
                ("instr", f"u64[{depth}]", "", "instruction pointer of each frame"),
                ("owner", f"u8[{(depth + 7) // 8 * 8}]", "", "frame owner (C-stack shims are dropped offline)"),
            ]
        ),
        "a Python stack, written into the pystacks ring the first time it is seen",
    )


# --------------------------------------------------------------------------- native stacks

#: --native-stacks: bytes of the user stack copied per event, from the stack
#: pointer up (perf's default dump size).  A multiple of 4 KiB: near the top of
#: the stack the copy is cut at the last readable page.
NATIVE_STACK_BYTES = 8192

#: Kinds whose events carry a native stack under plain --native-stacks; a
#: failed call (non-zero return) always does, and --native-stacks=all covers
#: every event, launches included.
NATIVE_STACK_KINDS = (Kind.alloc, Kind.free, Kind.memcpy, Kind.sync)

#: pt_native `flags` bits.
NATIVE_AT_ENTRY = 1 << 0  # copied at the function's entry: ip is in the callee, [sp] the return address

#: Indices of the per-CPU `native_stats` counters of bpf/nativestack.h.
NATIVE_STATS = {
    "lost_native_stacks": 0,  # the nativestacks ring was full: the event carries its Python stack only
    "unreadable_native_stacks": 1,  # not one byte of the user stack could be read: the same
    "short_native_stacks": 2,  # copies cut at the top of the stack (shallow threads; not a loss)
}

NATIVE_SAMPLE = Record(
    "pt_native",
    _fields(
        [
            ("sample", "u64", "", "the event's stack_id until the tracer replaces it (FLAG_NATIVE_STACK)"),
            ("py_stack_id", "u64", "", "the Python stack of the same event (pt_pystack.stack_id), 0: none"),
            ("pid", "u32", "", "tgid"),
            ("tid", "u32", "", ""),
            ("ip", "u64", "", "instruction pointer at the probe"),
            ("sp", "u64", "", "stack pointer at the probe: stack[0] is the byte at this address"),
            ("bp", "u64", "", "rbp at the probe (frame pointer, where the code keeps one)"),
            ("size", "u32", "bytes", "bytes of stack copied"),
            ("flags", "u32", "", "NATIVE_* bits"),
            ("stack", f"u8[{NATIVE_STACK_BYTES}]", "", "the user stack from sp up"),
        ]
    ),
    "one event's user stack and registers, written into the nativestacks ring; unwound by the tracer",
)


def native_stacks_c_header(kinds: Iterable[Kind] | None = NATIVE_STACK_KINDS) -> str:
    """C text bpf/nativestack.h needs; ``kinds`` None: every event."""
    mask = 0xFFFFFFFF if kinds is None else sum(1 << int(k) for k in kinds)
    out = [
        "/* Generated from pasta_trace/schema.py: do not edit. */",
        f"#define PT_NATIVE_STACK_BYTES {NATIVE_STACK_BYTES}",
        f"#define PT_NATIVE_KINDS 0x{mask:x}u",
        f"#define PT_NATIVE_AT_ENTRY {NATIVE_AT_ENTRY}",
        f"#define PT_FLAG_NATIVE_STACK {FLAG_NATIVE_STACK}",
        *(f"#define PT_NATIVE_{name.upper()} {i}" for name, i in NATIVE_STATS.items()),
        f"#define PT_NATIVE_NSTATS {len(NATIVE_STATS)}",
        NATIVE_SAMPLE.c_struct(),
    ]
    return "\n".join(out) + "\n"


def stacks_c_header(depth: int = DEFAULT_STACK_DEPTH) -> str:
    """C text bpf/pystack.h needs: its records, flags and counter indices."""
    out = [
        "/* Generated from pasta_trace/schema.py: do not edit. */",
        f"#define PT_STACK_DEPTH {depth}",
        f"#define PT_STACK_FLAG_TRUNCATED {STACK_FLAG_TRUNCATED}",
        f"#define PT_PY_NO_OFFSET {PY_NO_OFFSET}",
        *(f"#define PT_PY_{name.upper()} {i}" for name, i in PY_STATS.items()),
        f"#define PT_PY_NSTATS {len(PY_STATS)}",
        PY_PROC.c_struct(),
        py_stack_record(depth).c_struct(),
    ]
    return "\n".join(out) + "\n"


# --------------------------------------------------------------------------- losses

#: Probed calls one thread may have in flight at once (entered, not returned):
#: the frame stack bpf/pasta.h keeps per thread (a power of two).  A call
#: nested deeper is not recorded and is counted in lost_inflight.
INFLIGHT_DEPTH = 4

#: Rows (pid, API, kernel, shape, return code) the --aggregate map holds by
#: default, and at most: the kernel allocates them all when the program loads
#: (about 128 bytes each).
DEFAULT_AGGREGATE_MAX = 65536
MAX_AGGREGATE_MAX = 1 << 22


@dataclass(frozen=True)
class Loss:
    """A counter of what a capture could not keep, and what cures it.

    The manifest stores each under its ``name`` in ``counts`` (in
    ``counts[section]`` when ``section`` is set); the summary prints each that
    counted with its ``meaning`` and ``remedy``; every report's INCOMPLETE
    banner adds them all up.  ``counter`` is the per-CPU BPF array that counts
    it and ``index`` its slot there (the C side's ``PT_<NAME>``); a counter
    kept by the tracer's own code has ``counter`` "" and ``index`` -1.
    ``flag`` is the option that ``remedy`` raises, if any."""

    name: str
    counter: str
    index: int
    what: str  # what was lost, as counted: "events"
    meaning: str
    remedy: str
    flag: str | None = None
    section: str | None = None

    @property
    def c_define(self) -> str:
        return f"PT_{self.name.upper()}"

    def count_in(self, counts: dict) -> int:
        """Its value in a manifest's ``counts`` (0 when absent: an older capture, or not counted)."""
        holder = counts.get(self.section) if self.section else counts
        value = holder.get(self.name, 0) if isinstance(holder, dict) else 0
        return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


LOSSES: tuple[Loss, ...] = (
    Loss("lost_events", "lost", 0, "events", "the events ring buffer was full",
         "raise --buffer-pages", "--buffer-pages"),
    Loss("lost_names", "lost", 1, "kernel names", "the names ring buffer was full",
         "raise --buffer-pages: the names ring grows with it", "--buffer-pages"),
    Loss("lost_inflight", "lost", 2, "nested calls",
         f"more than {INFLIGHT_DEPTH} probed calls in flight on one thread",
         "a fixed limit of the probes: --buffer-pages does not change it"),
    Loss("lost_agg", "lost", 3, "aggregated calls", "the --aggregate map was full",
         "raise --aggregate-max", "--aggregate-max"),
    Loss("lost_stacks", "py_stats", PY_STATS["lost_stacks"], "Python stacks", "the stacks ring buffer was full",
         "raise --stack-buffer-pages", "--stack-buffer-pages", section="stacks"),
    Loss("unreadable_stacks", "py_stats", PY_STATS["unreadable_stacks"], "unreadable Python stacks",
         "frames changed or were freed while read",
         "no option changes it; their events are kept, without a stack", section="stacks"),
    Loss("lost_native_stacks", "native_stats", NATIVE_STATS["lost_native_stacks"], "native stacks",
         "the native stacks ring buffer was full", "raise --native-stack-buffer-pages",
         "--native-stack-buffer-pages", section="stacks"),
    Loss("unreadable_native_stacks", "native_stats", NATIVE_STATS["unreadable_native_stacks"],
         "unreadable native stacks", "not one byte of the user stack could be read",
         "no option changes it; their events keep their Python stack only", section="stacks"),
    # counted by the tracer (capture.stacks.native_collector): a library's unwind tables not built when the capture ended
    Loss("unresolved_native_stacks", "", -1, "unresolved native stacks",
         "a library's unwind tables were not ready when the capture ended",
         "no option changes it; their events keep their Python stack only", section="stacks"),
    Loss("unpaused_opens", "discover_lost", 0, "unpaused library opens",
         "too many processes waited for probes at once",
         "no option changes it; the first calls after those opens may be missing"),
    Loss("lost_notifications", "discover_lost", 1, "process notifications",
         "the fork/exec/exit ring buffer was full",
         "no option changes it; processes.parquet may miss those processes"),
    # drained from the ring, then dropped: the tracer's queue to its events
    # writer process was full (capture.output.writer_queue)
    Loss("lost_writer_behind", "", -1, "events", "the events writer fell behind",
         "use --aggregate or trace fewer processes"),
    # reached the events writer process but could not be written (a full disk)
    Loss("lost_unwritten", "", -1, "events", "they could not be written: the disk was full",
         "free space or choose another -o"),
    Loss("untraced_children", "discover_lost", 2, "untraced child processes",
         "the table of traced processes was full when they started",
         "no option changes it; trace fewer processes at once"),
    # counted by the tracer (capture.stacks.stack_collector): py_procs was full when they were registered
    Loss("unregistered_python_processes", "", -1, "Python processes without stacks",
         "more Python processes ran at once than the table of interpreters holds",
         "no option changes it; their events are kept, without a stack", section="stacks"),
    # handed to the events writer process, or drained, after it died (killed): not on disk (capture.output.writer)
    Loss("lost_writer_died", "", -1, "events", "the events writer process died before it wrote them",
         "no option changes it; the manifest's notes say how it died"),
    # drained by a tracer that died, and held back in its memory (native stacks not unwound yet): counted by
    # the events writer process, which wrote everything else (capture.output.takeover)
    Loss("lost_tracer_died", "", -1, "events", "the tracer died while it held them",
         "no option changes it; the manifest's notes say so"),
    # bpf/pasta.h pt_capture_join, pt_capture_record: the table of streams under capture, or of events
    # recorded under capture (per process), was full
    Loss("lost_captures", "lost", 4, "stream captures",
         "more streams or events were under capture at once than the probes' tables hold",
         "no option changes it; the launches, copies and memsets captured on those streams count as run"),
    # bpf/nccl.bpf.c pt_nccl_remember: the table of communicators' comm_ids (per process) was full
    Loss("lost_comm_ids", "lost", 5, "communicator ids",
         "more communicators were alive at once than the probes' table holds",
         "no option changes it; the communicators split from those have no comm_id"),
)

LOSS_BY_NAME = {loss.name: loss for loss in LOSSES}


@dataclass(frozen=True)
class Tally:
    """A count the probes keep of calls they handled without an event of
    their own, on purpose: not a loss.  The manifest stores each in
    ``counts`` under ``name``; ``index`` is its slot in the per-CPU BPF array
    ``tally`` (the C side's ``PT_TALLY_<NAME>``)."""

    name: str
    index: int
    meaning: str
    summary: str  # the capture summary's line, after the count

    @property
    def c_define(self) -> str:
        return f"PT_TALLY_{self.name.upper()}"


TALLIES: tuple[Tally, ...] = (
    # bpf/pasta.h pt_inner: a thread records each (runtime launch function,
    # driver handle) pair once, in the first nested driver launch that shows it
    Tally("folded_launches", 0,
          "driver launches made inside a runtime launch whose pair of runtime function and driver handle its "
          "thread had recorded already: counted by the runtime launch, written without a nested event",
          "driver launches folded into their runtime launch (kernel seen before)"),
)


#: Slots of the per-thread table that remembers which (runtime launch
#: function, driver handle) pairs a thread has written (bpf/pasta.h
#: pt_inner): direct-mapped by the function (fold_slot); a power of two.
FOLD_SLOTS = 64


def fold_slot(func: int) -> int:
    """The table slot of a runtime launch's function, as the probes compute it
    (pt_fold_slot): two launch functions with the same slot take it from each
    other, so neither's nested launches fold."""
    return ((func >> 4) ^ (func >> 12)) & (FOLD_SLOTS - 1)


def tally_c_defines() -> str:
    """``#define PT_TALLY_<NAME> <slot>`` for each tally, and ``PT_TALLY_N``."""
    out = [f"#define {t.c_define} {t.index}" for t in TALLIES]
    out.append(f"#define PT_TALLY_N {len(TALLIES)}")
    out.append(f"#define PT_FOLD_N {FOLD_SLOTS}")
    return "\n".join(out) + "\n"


def loss_counters(counter: str) -> tuple[Loss, ...]:
    """The losses one BPF array counts, in slot order."""
    return tuple(sorted((loss for loss in LOSSES if loss.counter == counter), key=lambda loss: loss.index))


def loss_c_defines(counter: str) -> str:
    """``#define PT_<NAME> <slot>`` for each loss ``counter`` counts, and
    ``PT_<COUNTER>_N``, the array's size."""
    rows = loss_counters(counter)
    out = [f"#define {loss.c_define} {loss.index}" for loss in rows]
    out.append(f"#define PT_{counter.upper()}_N {len(rows)}")
    return "\n".join(out) + "\n"


def loss_text(lost: dict[str, int]) -> str:
    """"5 events, 2 Python stacks": each loss that counted, in table order ("" when none)."""
    return ", ".join(f"{lost[loss.name]:,} {loss.what}" for loss in LOSSES if lost.get(loss.name))


# --------------------------------------------------------------------------- device records (TLV)


class DeviceRecordType(enum.IntEnum):
    CLOCK_SYNC = 1
    LAUNCH = 2
    KERNEL_SUMMARY = 3
    PAGE_HIST = 4
    ALLOC_TOUCH = 5
    WS_BITMAP = 6
    ALLOC = 7
    FREE = 8
    OPCODE_HIST = 9
    STRING = 10
    DROPPED = 11
    ACCESS_SAMPLES = 12
    CUPTI_KERNEL = 13
    CUPTI_MEMCPY = 14
    CUPTI_MEMSET = 15
    TOOL_STATUS = 16  # format 1.1


class DeviceBackend(enum.IntEnum):
    cupti = 1
    sanitizer = 2
    nvbit = 3
    cupti_sass = 4
    synthetic = 99  # written by tests and benchmarks


class DeviceAllocKind(enum.IntEnum):
    """`kind` of a device ALLOC record (gpu_probes' GP_ALLOC_*)."""

    device = 0
    managed = 1
    host = 2  # pinned or mapped host memory
    async_ = 3  # stream-ordered (cudaMallocAsync, pools)
    virtual = 4  # a virtual-address reservation: no memory of its own



DEV_FILE_HEADER = Record(
    "gp_file_header",
    _fields(
        [
            ("magic", "u32", "", "DEVICE_MAGIC"),
            ("ver_major", "u16", "", ""),
            ("ver_minor", "u16", "", ""),
            ("header_size", "u32", "bytes", "readers skip unknown tails"),
            ("flags", "u32", "", ""),
            ("pid", "u64", "", ""),
            ("mono_open", "u64", "ns CLOCK_MONOTONIC", ""),
            ("real_open", "u64", "ns CLOCK_REALTIME", ""),
            ("mono_after", "u64", "ns CLOCK_MONOTONIC", ""),
            ("backend", "u32", "", "DeviceBackend"),
            ("device_count", "u32", "", ""),
            ("page_shift", "u32", "", "page size used by the aggregation"),
            ("reserved", "u32", "", ""),
        ]
    ),
    "device record file header",
)

DEV_RECORD_HEADER = Record(
    "gp_record_header",
    _fields(
        [
            ("type", "u16", "", "DeviceRecordType"),
            ("flags", "u16", "", ""),
            ("total_len", "u32", "bytes", "header + payload, padded to 8"),
            ("launch_id", "u64", "", "per-process launch counter; 0 if not per launch"),
        ]
    ),
    "16-byte header in front of every record",
)

DEV_CLOCK_SYNC = Record(
    "gp_clock_sync",
    _fields(
        [
            ("host_mono_before", "u64", "ns", ""),
            ("gpu_globaltimer", "u64", "ns", "%globaltimer"),
            ("host_mono_after", "u64", "ns", ""),
            ("device", "u32", "", ""),
            ("pad", "u32", "", ""),
        ]
    ),
)

DEV_LAUNCH = Record(
    "gp_launch",
    _fields(
        [
            ("host_mono_begin", "u64", "ns", "API enter"),
            ("host_mono_end", "u64", "ns", "API exit"),
            ("ctx", "u64", "", ""),
            ("stream", "u64", "", ""),
            ("func", "u64", "", "CUfunction"),
            ("grid_id", "i64", "", "Sanitizer gridId / CUPTI grid_id"),
            ("grid_x", "u32", "", ""),
            ("grid_y", "u32", "", ""),
            ("grid_z", "u32", "", ""),
            ("block_x", "u32", "", ""),
            ("block_y", "u32", "", ""),
            ("block_z", "u32", "", ""),
            ("device", "u32", "", ""),
            ("correlation_id", "u32", "", "CUPTI correlation id, 0 if unknown"),
            ("name_id", "u32", "", "-> STRING"),
            ("tid", "u32", "", "host thread that launched"),
        ]
    ),
)

DEV_KERNEL_SUMMARY = Record(
    "gp_kernel_summary",
    _fields(
        [
            ("gpu_t_first", "u64", "ns %globaltimer", ""),
            ("gpu_t_last", "u64", "ns %globaltimer", ""),
            ("warp_instrs", "u64", "", "NVBit only"),
            ("thread_instrs", "u64", "", "NVBit only"),
            ("gld", "u64", "", "thread-level global loads"),
            ("gst", "u64", "", "thread-level global stores"),
            ("gatom", "u64", "", "thread-level global atomics"),
            ("gld_warp", "u64", "", "warp-level global loads"),
            ("gst_warp", "u64", "", "warp-level global stores"),
            ("gatom_warp", "u64", "", "warp-level global atomics"),
            ("bytes", "u64", "bytes", "sum of accessSize x active lanes"),
            ("shared", "u64", "", "shared accesses (thread level)"),
            ("local", "u64", "", "local accesses (thread level)"),
            ("blocks_in", "u64", "", ""),
            ("blocks_out", "u64", "", ""),
            ("dropped", "u64", "", "page-hash overflow + raw-sample drops"),
        ]
    ),
)

DEV_PAGE_HIST_HEADER = Record(
    "gp_page_hist_header",
    _fields([("page_shift", "u32", "", ""), ("n", "u32", "", "entries that follow")]),
)
DEV_PAGE_HIST_ENTRY = Record(
    "gp_page_hist_entry", _fields([("page", "u64", "", "address >> page_shift"), ("count", "u64", "", "")])
)

DEV_ALLOC_TOUCH_HEADER = Record(
    "gp_alloc_touch_header", _fields([("n", "u32", "", ""), ("pad", "u32", "", "")])
)
DEV_ALLOC_TOUCH_ENTRY = Record(
    "gp_alloc_touch_entry",
    _fields(
        [
            ("alloc_base", "u64", "", ""),
            ("touches", "u64", "", "thread-level accesses"),
            ("bytes", "u64", "bytes", ""),
            ("unique_pages", "u32", "", ""),
            ("pad", "u32", "", ""),
        ]
    ),
)

DEV_WS_BITMAP_HEADER = Record(
    "gp_ws_bitmap_header",
    _fields(
        [
            ("alloc_base", "u64", "", ""),
            ("page_shift", "u32", "", ""),
            ("nbits", "u32", "", "pages in the allocation"),
            ("encoding", "u32", "", "0 = raw little-endian u64 words"),
            ("pad", "u32", "", ""),
        ]
    ),
)

DEV_ALLOC = Record(
    "gp_alloc",
    _fields(
        [
            ("host_mono", "u64", "ns", ""),
            ("address", "u64", "", ""),
            ("size", "u64", "bytes", ""),
            ("ctx", "u64", "", ""),
            ("stream", "u64", "", ""),
            ("kind", "u32", "", "DeviceAllocKind: 0 device, 1 managed, 2 host pinned, 3 async/pool, 4 virtual"),
            ("pad", "u32", "", ""),
        ]
    ),
    "ALLOC and FREE share this payload",
)

DEV_OPCODE_HIST_HEADER = Record(
    "gp_opcode_hist_header", _fields([("n", "u32", "", ""), ("pad", "u32", "", "")])
)
DEV_OPCODE_HIST_ENTRY = Record(
    "gp_opcode_hist_entry",
    _fields([("opcode_id", "u32", "", "-> STRING id"), ("pad", "u32", "", ""), ("count", "u64", "", "")]),
)

DEV_STRING_HEADER = Record(
    "gp_string_header", _fields([("id", "u32", "", ""), ("len", "u32", "bytes", "utf-8 bytes that follow")])
)

DEV_DROPPED = Record(
    "gp_dropped",
    _fields(
        [
            ("records", "u64", "", "records the writer could not queue"),
            ("accesses", "u64", "", "raw access samples dropped on the device"),
            ("page_overflow", "u64", "", "thread-level accesses whose page found no hash slot (histogram + overflow = all global accesses)"),
        ]
    ),
)

DEV_ACCESS_SAMPLES_HEADER = Record(
    "gp_access_samples_header",
    _fields(
        [
            ("n", "u32", "", "entries that follow"),
            ("sample_every", "u32", "", "1 in N warp instructions (or CTAs)"),
            ("dropped", "u64", "", "samples lost because the buffer was full"),
        ]
    ),
)
DEV_ACCESS_SAMPLE = Record(
    "gp_access_sample",
    _fields(
        [
            ("address", "u64", "", ""),
            ("gpu_time", "u64", "ns %globaltimer", ""),
            ("block", "u32", "", "linear block index"),
            ("warp", "u16", "", "warp in block"),
            ("size", "u8", "bytes", "access size per lane"),
            ("flags", "u8", "", "bit0 write, bit1 atomic, bit2 shared, bit3 local"),
            ("lanes", "u32", "", "active lane mask"),
            ("pad", "u32", "", ""),
        ]
    ),
)

DEV_CUPTI_KERNEL = Record(
    "gp_cupti_kernel",
    _fields(
        [
            ("start", "u64", "ns CLOCK_MONOTONIC", "via CUPTI timestamp callback"),
            ("end", "u64", "ns CLOCK_MONOTONIC", ""),
            ("grid_id", "i64", "", ""),
            ("stream_id", "u32", "", ""),
            ("correlation_id", "u32", "", ""),
            ("device", "u32", "", ""),
            ("name_id", "u32", "", "-> STRING"),
            ("grid_x", "u32", "", ""),
            ("grid_y", "u32", "", ""),
            ("grid_z", "u32", "", ""),
            ("block_x", "u32", "", ""),
            ("block_y", "u32", "", ""),
            ("block_z", "u32", "", ""),
            # format 1.2: a 1.1 record ends above (DEVICE_PAYLOAD_MIN_SIZES) and reads these as 0
            ("graph_node_id", "u64", "", "CUPTI's node of the graph that launched it; 0: not a graph's"),
            ("graph_id", "u32", "", "CUPTI's id of that graph; 0: not launched by a graph"),
            ("pad", "u32", "", ""),
        ]
    ),
)

#: The payload size of a record type before fields were appended to it (an
#: older minor version): a record that short reads those fields as 0; anything
#: shorter is damage.
DEVICE_PAYLOAD_MIN_SIZES: dict[DeviceRecordType, int] = {DeviceRecordType.CUPTI_KERNEL: 64}  # 1.1

DEV_CUPTI_MEMOP = Record(
    "gp_cupti_memop",
    _fields(
        [
            ("start", "u64", "ns CLOCK_MONOTONIC", ""),
            ("end", "u64", "ns CLOCK_MONOTONIC", ""),
            ("bytes", "u64", "bytes", ""),
            ("stream_id", "u32", "", ""),
            ("correlation_id", "u32", "", ""),
            ("device", "u32", "", ""),
            ("copy_kind", "u32", "", "CUpti_ActivityMemcpyKind, or memset value"),
        ]
    ),
    "CUPTI_MEMCPY and CUPTI_MEMSET share this payload",
)

#: `rc_*` of TOOL_STATUS for a call not made (yet); other values are SanitizerResult codes.
TOOL_STATUS_NOT_CALLED = -1


class ToolStage(enum.IntEnum):
    """When a TOOL_STATUS record was written: the last one of a file is the run's final word."""

    init = 1  # after the subscribe
    module = 2  # after a module was patched (or failed to be)
    final = 3  # at exit, with the device fallback counters read back


class LoadingMode(enum.IntEnum):
    """CUDA_MODULE_LOADING as the process saw it (unset: the driver's default, lazy since CUDA 12.2)."""

    unset = 0
    lazy = 1
    eager = 2
    other = 3


class InjectionMode(enum.IntEnum):
    """How the injection library came in: LD_PRELOAD (its static initializer) or the driver's CUDA_INJECTION64_PATH."""

    preload = 1
    injection = 2


DEV_TOOL_STATUS = Record(
    "gp_tool_status",
    _fields(
        [
            ("host_mono", "u64", "ns CLOCK_MONOTONIC", ""),
            ("stage", "u32", "", "ToolStage"),
            ("injection_mode", "u32", "", "InjectionMode"),
            ("loading_mode", "u32", "", "LoadingMode"),
            ("rc_subscribe", "i32", "", "sanitizerSubscribe's SanitizerResult"),
            ("rc_add_patches", "i32", "", "sanitizerAddPatches: the first failure, else 0; -1 not called"),
            ("rc_patch_instructions", "i32", "", "sanitizerPatchInstructions: the first failure, else 0; -1 not called"),
            ("rc_patch_module", "i32", "", "sanitizerPatchModule: the first failure, else 0; -1 not called"),
            ("rc_set_callback_data", "i32", "", "sanitizerSetCallbackData(function): the first failure, else 0"),
            ("rc_set_launch_data", "i32", "", "sanitizerSetLaunchCallbackData: the first failure, else 0"),
            ("rc_loaded_status", "i32", "", "sanitizerGetFunctionLoadedStatus: the first failure, else 0"),
            ("rc_fallback_read", "i32", "", "reading the patches' fallback counters back; -1 never published"),
            ("modules_patched", "u32", "", "modules sanitizerPatchModule instrumented"),
            ("modules_failed", "u32", "", "modules whose patching failed"),
            ("functions_not_loaded", "u32", "", "launches whose function was not fully loaded at LAUNCH_BEGIN"),
            ("launches", "u64", "", "LAUNCH_BEGIN callbacks seen"),
            ("launches_with_data", "u64", "", "launches given their buffer"),
            ("patch_null_calls", "u64", "", "patch calls that got no buffer (device fallback counter)"),
            ("patch_data_calls", "u64", "", "block entries that got their buffer (device fallback counter)"),
        ]
    ),
    "what the Sanitizer injection's set-up calls returned (format 1.1)",
)

#: Fixed payload (or payload header) of each device record type.
DEVICE_PAYLOADS: dict[DeviceRecordType, Record] = {
    DeviceRecordType.CLOCK_SYNC: DEV_CLOCK_SYNC,
    DeviceRecordType.LAUNCH: DEV_LAUNCH,
    DeviceRecordType.KERNEL_SUMMARY: DEV_KERNEL_SUMMARY,
    DeviceRecordType.PAGE_HIST: DEV_PAGE_HIST_HEADER,
    DeviceRecordType.ALLOC_TOUCH: DEV_ALLOC_TOUCH_HEADER,
    DeviceRecordType.WS_BITMAP: DEV_WS_BITMAP_HEADER,
    DeviceRecordType.ALLOC: DEV_ALLOC,
    DeviceRecordType.FREE: DEV_ALLOC,
    DeviceRecordType.OPCODE_HIST: DEV_OPCODE_HIST_HEADER,
    DeviceRecordType.STRING: DEV_STRING_HEADER,
    DeviceRecordType.DROPPED: DEV_DROPPED,
    DeviceRecordType.ACCESS_SAMPLES: DEV_ACCESS_SAMPLES_HEADER,
    DeviceRecordType.CUPTI_KERNEL: DEV_CUPTI_KERNEL,
    DeviceRecordType.CUPTI_MEMCPY: DEV_CUPTI_MEMOP,
    DeviceRecordType.CUPTI_MEMSET: DEV_CUPTI_MEMOP,
    DeviceRecordType.TOOL_STATUS: DEV_TOOL_STATUS,
}

#: Variable-length arrays that follow a payload header: type -> entry record.
DEVICE_ENTRIES: dict[DeviceRecordType, Record] = {
    DeviceRecordType.PAGE_HIST: DEV_PAGE_HIST_ENTRY,
    DeviceRecordType.ALLOC_TOUCH: DEV_ALLOC_TOUCH_ENTRY,
    DeviceRecordType.OPCODE_HIST: DEV_OPCODE_HIST_ENTRY,
    DeviceRecordType.ACCESS_SAMPLES: DEV_ACCESS_SAMPLE,
}

DEVICE_RECORDS = tuple(
    dict.fromkeys(
        [DEV_FILE_HEADER, DEV_RECORD_HEADER, *DEVICE_PAYLOADS.values(), *DEVICE_ENTRIES.values()]
    )
)

# --------------------------------------------------------------------------- Arrow / Polars schemas

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


def _record_columns(r: Record, skip: tuple[str, ...] = ("pad",)) -> dict[str, pl.DataType]:
    cols: dict[str, pl.DataType] = {}
    for f in r.fields:
        if f.name in skip:
            continue
        cols[f.name] = pl.Binary if f.array_len is not None else _CTYPES[f.ctype][2]
    return cols


_PER_PROCESS = {"pid": pl.UInt32}
_PER_LAUNCH = {"pid": pl.UInt32, "launch_id": pl.UInt64}

#: Frames produced by pasta_trace.device (the reader of device record files and
#: CUPTI records) and consumed by merge and the tools.  This is the seam between
#: the device side and the offline side: both are tested against these schemas.
DEVICE_FRAMES: dict[str, dict[str, pl.DataType]] = {
    "clock_sync": {**_PER_PROCESS, **_record_columns(DEV_CLOCK_SYNC)},
    "launches": {**_PER_LAUNCH, **_record_columns(DEV_LAUNCH), "name": pl.String},
    "kernel_summaries": {**_PER_LAUNCH, **_record_columns(DEV_KERNEL_SUMMARY)},
    "page_hist": {**_PER_LAUNCH, "page_shift": pl.UInt32, **_record_columns(DEV_PAGE_HIST_ENTRY)},
    "alloc_touch": {**_PER_LAUNCH, **_record_columns(DEV_ALLOC_TOUCH_ENTRY)},
    "ws_bitmaps": {
        **_PER_LAUNCH,
        **_record_columns(DEV_WS_BITMAP_HEADER),
        "bits": pl.Binary,  # decoded to raw little-endian u64 words
    },
    "allocs": {**_PER_PROCESS, **_record_columns(DEV_ALLOC)},
    "frees": {**_PER_PROCESS, **_record_columns(DEV_ALLOC)},
    "opcode_hist": {**_PER_LAUNCH, **_record_columns(DEV_OPCODE_HIST_ENTRY), "opcode": pl.String},
    "access_samples": {**_PER_LAUNCH, **_record_columns(DEV_ACCESS_SAMPLE)},
    "dropped": {**_PER_LAUNCH, **_record_columns(DEV_DROPPED)},
    "cupti_kernels": {**_PER_PROCESS, **_record_columns(DEV_CUPTI_KERNEL), "name": pl.String},
    "cupti_memcpy": {**_PER_PROCESS, **_record_columns(DEV_CUPTI_MEMOP)},
    "cupti_memset": {**_PER_PROCESS, **_record_columns(DEV_CUPTI_MEMOP)},
    "tool_status": {**_PER_PROCESS, **_record_columns(DEV_TOOL_STATUS)},
}


# --------------------------------------------------------------------------- merged timeline frames

#: Memory kind of an allocation instance (`allocations.kind`), from the API
#: name (host events) or the device ALLOC record's `kind`.
#: beyond the device module's kinds: "physical" is VMM memory made by cuMemCreate/hipMemCreate (its
#: `base` is the opaque handle, no address), "mapping" a range cuMemMap/hipMemMap mapped it at (an
#: address range with no memory of its own: its bytes are the physical allocation's)
ALLOC_KIND_NAMES = [k.name.rstrip("_") for k in DeviceAllocKind] + ["other", "physical", "mapping"]

#: How a host launch found its device execution (`kernels.match`).
MATCH_NAMES = ["exact", "time"]

_SUMMARY_COUNTERS = {
    k: v for k, v in _record_columns(DEV_KERNEL_SUMMARY).items() if k not in ("gpu_t_first", "gpu_t_last")
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


# --------------------------------------------------------------------------- JSON documents

#: manifest.json: the JSON type of each key a reader uses (pasta_trace.json_doc
#: shapes: a type, [shape] for an array, {key: shape} for an object).  A
#: manifest where one of them has another type is refused; other keys are free,
#: and any key may be missing or null.
MANIFEST_SHAPE: dict = {
    "format_version": str,
    "complete": bool,
    "command_line": [str],
    "mode": str,
    "host": str,
    "kernel_release": str,
    "clock": {"start_ns": int, "end_ns": int,
              "start_sample": {"realtime_ns": int, "mono_before_ns": int, "mono_after_ns": int},
              "end_sample": {"realtime_ns": int, "mono_before_ns": int, "mono_after_ns": int}},
    "counts": {"lost_events": int, "lost_names": int},
}

#: timeline.json of a merged timeline (`merge_stats`: pasta_trace.merge.MergeStats's fields, all integers).
TIMELINE_SHAPE: dict = {
    "format_version": str,
    "capture_manifest": MANIFEST_SHAPE,
    "merge_stats": {},
    "problems": [str],
}


# --------------------------------------------------------------------------- C header generation


def bpf_c_header() -> str:
    """C text prepended to the BPF programs: structs, enums and bits."""
    out = ["/* Generated from pasta_trace/schema.py: do not edit. */"]
    for k in Kind:
        out.append(f"#define PT_KIND_{k.name.upper()} {int(k)}")
    for k in CopyKind:
        out.append(f"#define PT_COPY_{k.name.upper()} {int(k)}")
    for s in NameSource:
        out.append(f"#define PT_NAME_{s.name.upper()} {int(s)}")
    for name, bit in PAYLOAD_BITS.items():
        out.append(f"#define PT_V_{name.upper()} (1u << {bit})")
    for name, slot in NCCL_SLOTS.items():
        out.append(f"#define PT_NCCL_{name.upper()} {slot}")
    sizes = sum(size << (4 * i) for i, (_, size) in enumerate(NCCL_DATATYPES))
    out += [
        f"#define PT_NCCL_NUM_TYPES {len(NCCL_DATATYPES)}",
        f"#define PT_NCCL_ELEM_SIZES 0x{sizes:x}ULL /* 4 bits per ncclDataType_t */",
        f"#define PT_NCCL_FNV_OFFSET 0x{_FNV_OFFSET:x}ULL",
        f"#define PT_NCCL_FNV_PRIME 0x{_FNV_PRIME:x}ULL",
    ]
    out += [
        f"#define PT_FLAG_HAS_RET {FLAG_HAS_RET}",
        f"#define PT_FLAG_HAS_DUR {FLAG_HAS_DUR}",
        f"#define PT_FLAG_OUTPTR_FAULT {FLAG_OUTPTR_FAULT}",
        f"#define PT_FLAG_AT_EXIT {FLAG_AT_EXIT}",
        f"#define PT_COMM_LEN {COMM_LEN}",
        f"#define PT_NAME_LEN {NAME_LEN}",
        f"#define PT_DEPTH {INFLIGHT_DEPTH}",
    ]
    out.append(loss_c_defines("lost").rstrip("\n"))
    out.append(tally_c_defines().rstrip("\n"))
    for r in HOST_RECORDS:
        out.append(r.c_struct())
    return "\n".join(out) + "\n"


def device_c_header() -> str:
    """C/C++ header for gpu_probes (checked in as include/gpu_probes/record.h)."""
    out = [
        "/* Generated from pasta_trace/schema.py by `python -m pasta_trace.schema --write`: do not edit. */",
        "#pragma once",
        "#include <stdint.h>",
        "typedef uint8_t __u8; typedef uint16_t __u16; typedef uint32_t __u32; typedef uint64_t __u64;",
        "typedef int32_t __s32; typedef int64_t __s64;",
        f"#define GP_MAGIC 0x{DEVICE_MAGIC:08X}u",
        f"#define GP_VER_MAJOR {DEVICE_FORMAT_VERSION[0]}",
        f"#define GP_VER_MINOR {DEVICE_FORMAT_VERSION[1]}",
    ]
    for t in DeviceRecordType:
        out.append(f"#define GP_REC_{t.name} {int(t)}")
    for b in DeviceBackend:
        out.append(f"#define GP_BACKEND_{b.name.upper()} {int(b)}")
    for k in DeviceAllocKind:
        out.append(f"#define GP_ALLOC_{k.name.rstrip('_').upper()} {int(k)}")
    for prefix, e in (("GP_STAGE", ToolStage), ("GP_LOADING", LoadingMode), ("GP_INJECTION", InjectionMode)):
        out.extend(f"#define {prefix}_{k.name.upper()} {int(k)}" for k in e)
    out.append(f"#define GP_RC_NOT_CALLED ({TOOL_STATUS_NOT_CALLED})")
    for r in DEVICE_RECORDS:
        out.append(r.c_struct())
        out.append(
            f"#ifdef __cplusplus\nstatic_assert(sizeof(struct {r.name}) == {r.size}, \"{r.name} size\");\n#endif"
        )
    return "\n".join(out) + "\n"


DEVICE_HEADER_PATH = "gpu_probes/include/gpu_probes/record.h"


def main(argv: list[str] | None = None) -> int:
    import argparse
    import pathlib

    ap = argparse.ArgumentParser(prog="python -m pasta_trace.schema", description=__doc__.splitlines()[0])
    ap.add_argument("--bpf", action="store_true", help="print the BPF C header")
    ap.add_argument("--device", action="store_true", help="print the device C header")
    ap.add_argument("--write", action="store_true", help=f"regenerate {DEVICE_HEADER_PATH}")
    a = ap.parse_args(argv)
    if a.write:
        root = pathlib.Path(__file__).resolve().parent.parent
        p = root / DEVICE_HEADER_PATH
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(device_c_header())
        print(f"Wrote {p}")
    if a.bpf:
        print(bpf_c_header())
    if a.device:
        print(device_c_header())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
