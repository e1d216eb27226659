"""Where CPython keeps what a stack walk reads, per minor version.

3.11 and 3.12 have no self-description: their layouts are the table below,
checked against ``offsetof()`` of each interpreter's internal headers by
tests/unit/test_pystack_offsets.py.  From 3.13 on, ``_PyRuntime`` starts with
``_Py_DebugOffsets`` (cookie ``xdebugpy``, PY_VERSION_HEX, then groups of u64
offsets); its field list is stable only within a minor version, so each
supported minor has its own list here, and the cookie and version are checked
before any offset is believed.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

from .. import schema

DEBUG_COOKIE = b"xdebugpy"


class Unsupported(Exception):
    """This interpreter cannot be walked; the message says why."""


@dataclass(frozen=True)
class PyLayout:
    # walked in BPF (schema.PY_PROC)
    runtime_interp_head: int
    interp_next: int
    interp_threads_head: int
    tstate_next: int
    tstate_native_tid: int
    tstate_frame: int  # PyThreadState.cframe (3.11/3.12) or .current_frame
    cframe_frame: int  # _PyCFrame.current_frame, or schema.PY_NO_OFFSET
    frame_code: int
    frame_previous: int
    frame_instr: int
    frame_owner: int
    code_tag: int = 0  # low bits of a tagged _PyStackRef (3.14)
    #: owner values from this one up are C-stack shims, not Python frames; None: no shims (3.11)
    shim_owner: int | None = None
    # read offline (pasta_trace.stacks.pycode)
    code_filename: int = 112
    code_name: int = 120
    code_qualname: int = 128
    code_firstlineno: int = 68
    code_linetable: int = 136
    code_adaptive: int = 192
    ob_type: int = 8
    bytes_size: int = 16
    bytes_sval: int = 32
    unicode_length: int = 16
    unicode_state: int = 32
    ascii_size: int = 40
    compact_size: int = 56  # sizeof(PyCompactUnicodeObject): non-ASCII data follows it

    def bpf_value(self, runtime: int, version: int) -> bytes:
        """The py_procs map value (schema.PY_PROC) for a process."""
        rec = schema.PY_PROC
        names = [f.name for f in rec.fields]
        values = {n: getattr(self, n, 0) for n in names}
        values.update(runtime=runtime, version=version, pad=0)
        arr = np.zeros(1, rec.dtype)
        for n in names:
            arr[n] = values[n]
        return arr.tobytes()


#: 3.11 and 3.12: offsetof() on x86-64, default (GIL) builds.
TABLE: dict[tuple[int, int], PyLayout] = {
    (3, 11): PyLayout(
        runtime_interp_head=40, interp_next=0, interp_threads_head=16, tstate_next=8, tstate_native_tid=160,
        tstate_frame=56, cframe_frame=8, frame_code=32, frame_previous=48, frame_instr=56, frame_owner=69,
        shim_owner=None, code_firstlineno=72, code_adaptive=184, ascii_size=48, compact_size=72,
    ),
    (3, 12): PyLayout(
        runtime_interp_head=40, interp_next=0, interp_threads_head=72, tstate_next=8, tstate_native_tid=144,
        tstate_frame=56, cframe_frame=0, frame_code=0, frame_previous=8, frame_instr=56, frame_owner=70,
        shim_owner=3, code_firstlineno=68, code_adaptive=192, ascii_size=40, compact_size=56,
    ),
}

#: _Py_DebugOffsets after cookie, version and free_threaded: (group, fields) in
#: declaration order, as in CPython's Include/internal/pycore_debug_offsets.h of
#: each minor's releases.  The list must be complete: every field shifts the ones after it.
_GROUPS_313 = [
    ("runtime_state", ["size", "finalizing", "interpreters_head"]),
    ("interpreter_state", ["size", "id", "next", "threads_head", "gc", "imports_modules", "sysdict", "builtins",
                           "ceval_gil", "gil_runtime_state", "gil_runtime_state_enabled",
                           "gil_runtime_state_locked", "gil_runtime_state_holder"]),
    ("thread_state", ["size", "prev", "next", "interp", "current_frame", "thread_id", "native_thread_id",
                      "datastack_chunk", "status"]),
    ("interpreter_frame", ["size", "previous", "executable", "instr_ptr", "localsplus", "owner"]),
    ("code_object", ["size", "filename", "name", "qualname", "linetable", "firstlineno", "argcount",
                     "localsplusnames", "localspluskinds", "co_code_adaptive"]),
    ("pyobject", ["size", "ob_type"]),
    ("type_object", ["size", "tp_name", "tp_repr", "tp_flags"]),
    ("tuple_object", ["size", "ob_item", "ob_size"]),
    ("list_object", ["size", "ob_item", "ob_size"]),
    ("dict_object", ["size", "ma_keys", "ma_values"]),
    ("float_object", ["size", "ob_fval"]),
    ("long_object", ["size", "lv_tag", "ob_digit"]),
    ("bytes_object", ["size", "ob_size", "ob_sval"]),
    ("unicode_object", ["size", "state", "length", "asciiobject_size"]),
    ("gc", ["size", "collecting"]),
]


def _groups_314() -> list[tuple[str, list[str]]]:
    """3.14.0 against 3.13: interpreter_state gained threads_main (after threads_head),
    code_object_generation and tlbc_generation; interpreter_frame stackpointer and
    tlbc_index; code_object co_tlbc; set_object follows list_object; gen_object,
    llist_node and debugger_support follow gc.  (The tlbc fields are 0 outside
    free-threaded builds, which are refused anyway.)"""
    added = {
        "interpreter_state": (["threads_main"], ["code_object_generation", "tlbc_generation"]),
        "interpreter_frame": ([], ["stackpointer", "tlbc_index"]),
        "code_object": ([], ["co_tlbc"]),
    }
    out = []
    for name, fields in _GROUPS_313:
        if name == "interpreter_state":
            fields = fields[:4] + added[name][0] + fields[4:]
        out.append((name, fields + added.get(name, ([], []))[1]))
        if name == "list_object":
            out.append(("set_object", ["size", "used", "table", "mask"]))
    out.append(("gen_object", ["size", "gi_name", "gi_iframe", "gi_frame_state"]))
    out.append(("llist_node", ["next", "prev"]))
    out.append(("debugger_support", ["eval_breaker", "remote_debugger_support", "remote_debugging_enabled",
                                     "debugger_pending_call", "debugger_script_path",
                                     "debugger_script_path_size"]))
    return out


DEBUG_GROUPS: dict[tuple[int, int], list[tuple[str, list[str]]]] = {(3, 13): _GROUPS_313, (3, 14): _groups_314()}

#: Owner value of C-stack shim frames, and the tag bits of the frame's code
#: reference, where the debug offsets do not say.
_SHIM_OWNER = {(3, 13): 3, (3, 14): 3}  # 3.14: 3 = interpreter-owned entry frame, 4 = C stack
_CODE_TAG = {(3, 13): 0, (3, 14): 7}


def debug_offsets_size(minor: tuple[int, int]) -> int:
    return 24 + 8 * sum(len(f) for _, f in DEBUG_GROUPS[minor])


def parse_debug_offsets(raw: bytes, minor: tuple[int, int]) -> dict[str, int]:
    """``group.field -> value`` from the bytes at _PyRuntime; raises
    Unsupported when the cookie, the version or the build do not fit."""
    if minor not in DEBUG_GROUPS:
        raise Unsupported(f"Python {minor[0]}.{minor[1]}: no _Py_DebugOffsets layout known for this version")
    need = debug_offsets_size(minor)
    if len(raw) < need:
        raise Unsupported("_Py_DebugOffsets could not be read")
    if raw[:8] != DEBUG_COOKIE:
        raise Unsupported(f"_PyRuntime does not start with the {DEBUG_COOKIE.decode()} cookie")
    version, free_threaded = struct.unpack_from("<QQ", raw, 8)
    if (version >> 24, (version >> 16) & 0xFF) != minor:
        raise Unsupported(f"_Py_DebugOffsets says version 0x{version:x}, the binary is {minor[0]}.{minor[1]}")
    if free_threaded:
        raise Unsupported("free-threaded (no-GIL) build: its frames are not supported")
    names = [f"{g}.{f}" for g, fields in DEBUG_GROUPS[minor] for f in fields]
    values = struct.unpack_from(f"<{len(names)}Q", raw, 24)
    return {"version": version, **dict(zip(names, values))}


def layout_from_debug_offsets(d: dict[str, int], minor: tuple[int, int]) -> PyLayout:
    return PyLayout(
        runtime_interp_head=d["runtime_state.interpreters_head"],
        interp_next=d["interpreter_state.next"],
        interp_threads_head=d["interpreter_state.threads_head"],
        tstate_next=d["thread_state.next"],
        tstate_native_tid=d["thread_state.native_thread_id"],
        tstate_frame=d["thread_state.current_frame"],
        cframe_frame=schema.PY_NO_OFFSET,
        frame_code=d["interpreter_frame.executable"],
        frame_previous=d["interpreter_frame.previous"],
        frame_instr=d["interpreter_frame.instr_ptr"],
        frame_owner=d["interpreter_frame.owner"],
        code_tag=_CODE_TAG[minor],
        shim_owner=_SHIM_OWNER[minor],
        code_filename=d["code_object.filename"],
        code_name=d["code_object.name"],
        code_qualname=d["code_object.qualname"],
        code_firstlineno=d["code_object.firstlineno"],
        code_linetable=d["code_object.linetable"],
        code_adaptive=d["code_object.co_code_adaptive"],
        ob_type=d["pyobject.ob_type"],
        bytes_size=d["bytes_object.ob_size"],
        bytes_sval=d["bytes_object.ob_sval"],
        unicode_length=d["unicode_object.length"],
        unicode_state=d["unicode_object.state"],
        ascii_size=d["unicode_object.asciiobject_size"],
        compact_size=d["unicode_object.asciiobject_size"] + 16,
    )


def check_bpf_range(layout: PyLayout) -> PyLayout:
    """The BPF walker reads 80 bytes per frame and keeps offsets in u16."""
    frame = (layout.frame_code, layout.frame_previous, layout.frame_instr)
    if max(frame) > 72 or layout.frame_owner > 79 or any(v % 8 for v in frame):
        raise Unsupported(f"frame layout outside what the walker reads ({frame}, owner {layout.frame_owner})")
    walk = (layout.runtime_interp_head, layout.interp_next, layout.interp_threads_head, layout.tstate_next,
            layout.tstate_native_tid, layout.tstate_frame)
    if max(walk) >= schema.PY_NO_OFFSET:
        raise Unsupported("interpreter state offsets too large for the walker")
    return layout


def layout_for(minor: tuple[int, int], debug_raw: bytes | None = None) -> PyLayout:
    """The layout of CPython ``minor``; 3.13+ needs the bytes at _PyRuntime."""
    if minor in TABLE:
        return check_bpf_range(TABLE[minor])
    if minor < (3, 11):
        raise Unsupported(f"Python {minor[0]}.{minor[1]}: stacks need CPython 3.11 or later")
    if debug_raw is None:
        raise Unsupported("_Py_DebugOffsets could not be read")
    return check_bpf_range(layout_from_debug_offsets(parse_debug_offsets(debug_raw, minor), minor))

