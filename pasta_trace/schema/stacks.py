"""Python and native stack records, and the frames they resolve to."""

from __future__ import annotations

import enum
from typing import Iterable

from .records import Record, fields
from .host import FLAG_NATIVE_STACK, Kind


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
    fields(
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
        fields(
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
    fields(
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
        "/* Generated from pasta_trace/schema/: do not edit. */",
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
        "/* Generated from pasta_trace/schema/: do not edit. */",
        f"#define PT_STACK_DEPTH {depth}",
        f"#define PT_STACK_FLAG_TRUNCATED {STACK_FLAG_TRUNCATED}",
        f"#define PT_PY_NO_OFFSET {PY_NO_OFFSET}",
        *(f"#define PT_PY_{name.upper()} {i}" for name, i in PY_STATS.items()),
        f"#define PT_PY_NSTATS {len(PY_STATS)}",
        PY_PROC.c_struct(),
        py_stack_record(depth).c_struct(),
    ]
    return "\n".join(out) + "\n"
