"""The stack walker's view of CPython, checked against the interpreters on
this machine: our 3.11/3.12 table against offsetof() in each build's internal
headers; 3.13+ read from a live interpreter's _Py_DebugOffsets against the
same; the location-table decoder against code.co_lines()."""

from __future__ import annotations

import json
import struct
import shutil
import subprocess
from pathlib import Path

import pytest

from pasta_trace import schema
from pasta_trace.stacks import interpreter, offsets
from pasta_trace.stacks.pycode import Code, parse_locations

SRC = Path(__file__).resolve().parents[1] / "fixtures" / "py_offsets.c"
PYENV = Path.home() / ".pyenv" / "versions"


def _builds() -> list:
    out = []
    for minor in (11, 12, 13, 14):
        found = sorted(PYENV.glob(f"3.{minor}.*/include/python3.{minor}/internal"))
        if found:
            out.append(pytest.param(found[-1].parents[2], minor, id=found[-1].parts[-4]))
        else:
            out.append(pytest.param(None, minor, id=f"3.{minor}", marks=pytest.mark.skip(
                reason=f"no CPython 3.{minor} with internal headers under {PYENV}")))
    return out


def _offsetof(prefix: Path, minor: int, tmp_path: Path) -> dict[str, int]:
    if shutil.which("gcc") is None:
        pytest.skip("gcc not found: apt-get install gcc")
    exe = tmp_path / f"off{minor}"
    subprocess.run(["gcc", f"-I{prefix}/include/python3.{minor}", str(SRC), "-o", str(exe)], check=True)
    return json.loads(subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout)


def _expected(layout: offsets.PyLayout, c: dict[str, int]) -> None:
    frame = c.get("tstate_current_frame", c.get("tstate_cframe"))
    cframe = c.get("cframe_current_frame", schema.PY_NO_OFFSET) if "tstate_cframe" in c else schema.PY_NO_OFFSET
    got = dict(runtime_interp_head=layout.runtime_interp_head, interp_next=layout.interp_next,
               interp_threads_head=layout.interp_threads_head, tstate_next=layout.tstate_next,
               tstate_native_thread_id=layout.tstate_native_tid, frame=layout.tstate_frame,
               cframe=layout.cframe_frame, frame_code=layout.frame_code, frame_previous=layout.frame_previous,
               frame_instr=layout.frame_instr, frame_owner=layout.frame_owner, code_filename=layout.code_filename,
               code_name=layout.code_name, code_qualname=layout.code_qualname,
               code_firstlineno=layout.code_firstlineno, code_linetable=layout.code_linetable,
               code_adaptive=layout.code_adaptive, ascii_size=layout.ascii_size, bytes_sval=layout.bytes_sval)
    want = {k: c[k] for k in got if k in c}
    want.update(frame=frame, cframe=cframe)
    assert got == want


@pytest.mark.parametrize("prefix,minor", _builds())
def test_layout_matches_the_headers(prefix: Path, minor: int, tmp_path: Path) -> None:
    c = _offsetof(prefix, minor, tmp_path)
    if (3, minor) in offsets.TABLE:
        _expected(offsets.layout_for((3, minor)), c)
        return
    # 3.13+: what the running interpreter says about itself (cookie and version checked)
    proc = subprocess.Popen([str(prefix / "bin" / "python3"), "-c", "import time; print(1, flush=True); time.sleep(30)"],
                            stdout=subprocess.PIPE)
    try:
        proc.stdout.readline()
        found = interpreter.Finder().find(proc.pid)
    finally:
        proc.kill()
        proc.wait()
    assert found.version >> 16 == 0x300 | minor
    _expected(found.layout, c)


def test_debug_offsets_are_validated() -> None:
    raw = bytearray(offsets.debug_offsets_size((3, 13)))
    with pytest.raises(offsets.Unsupported, match="cookie"):
        offsets.parse_debug_offsets(bytes(raw), (3, 13))
    raw[:8] = offsets.DEBUG_COOKIE
    raw[8:16] = (0x030C01F0).to_bytes(8, "little")
    with pytest.raises(offsets.Unsupported, match="version 0x30c01f0"):
        offsets.parse_debug_offsets(bytes(raw), (3, 13))
    raw[8:16] = (0x030D00F0).to_bytes(8, "little")
    raw[16:24] = (1).to_bytes(8, "little")
    with pytest.raises(offsets.Unsupported, match="free-threaded"):
        offsets.parse_debug_offsets(bytes(raw), (3, 13))
    with pytest.raises(offsets.Unsupported, match="3.15"):
        offsets.parse_debug_offsets(bytes(raw), (3, 15))
    with pytest.raises(offsets.Unsupported, match="3.11 or later"):
        offsets.layout_for((3, 10))


def test_python_310_is_refused_with_the_reason() -> None:
    builds = sorted(PYENV.glob("3.10.*/bin/python3"))
    if not builds:
        pytest.skip(f"no CPython 3.10 under {PYENV}")
    proc = subprocess.Popen([str(builds[-1]), "-c", "import time; print(1, flush=True); time.sleep(30)"],
                            stdout=subprocess.PIPE)
    try:
        proc.stdout.readline()
        with pytest.raises(offsets.Unsupported, match="stacks need CPython 3.11"):
            interpreter.Finder().find(proc.pid)
    finally:
        proc.kill()
        proc.wait()


def _lines_equal(co) -> int:
    starts, lines = parse_locations(co.co_linetable, co.co_firstlineno)
    code = Code("", "", co.co_firstlineno, 0, starts, lines)
    n = 0
    for start, end, line in co.co_lines():
        for off in range(start, end, 2):
            assert code.line_at(off) == line, (co.co_qualname, off)
            n += 1
    return n


def test_location_table_gives_the_lines_python_gives() -> None:
    """Every code unit of a few long functions (all entry forms of the table occur in them)."""
    import json.decoder
    import threading

    funcs = (threading.Thread._bootstrap_inner, json.decoder.JSONDecoder.raw_decode, subprocess.Popen.__init__,
             _lines_equal, _offsetof)
    assert sum(_lines_equal(f.__code__) for f in funcs) > 300


#: CPython 3.14.0's _Py_DebugOffsets after cookie, version and free_threaded, field by field in
#: declaration order (Include/internal/pycore_debug_offsets.h), written out here independently of
#: offsets.DEBUG_GROUPS.  No 3.14 interpreter runs on our machines: this is what checks the parser.
FIELDS_314 = """
runtime_state: size finalizing interpreters_head
interpreter_state: size id next threads_head threads_main gc imports_modules sysdict builtins ceval_gil
    gil_runtime_state gil_runtime_state_enabled gil_runtime_state_locked gil_runtime_state_holder
    code_object_generation tlbc_generation
thread_state: size prev next interp current_frame thread_id native_thread_id datastack_chunk status
interpreter_frame: size previous executable instr_ptr localsplus owner stackpointer tlbc_index
code_object: size filename name qualname linetable firstlineno argcount localsplusnames localspluskinds
    co_code_adaptive co_tlbc
pyobject: size ob_type
type_object: size tp_name tp_repr tp_flags
tuple_object: size ob_item ob_size
list_object: size ob_item ob_size
set_object: size used table mask
dict_object: size ma_keys ma_values
float_object: size ob_fval
long_object: size lv_tag ob_digit
bytes_object: size ob_size ob_sval
unicode_object: size state length asciiobject_size
gc: size collecting
gen_object: size gi_name gi_iframe gi_frame_state
llist_node: next prev
debugger_support: eval_breaker remote_debugger_support remote_debugging_enabled debugger_pending_call
    debugger_script_path debugger_script_path_size
"""


def _fields_314() -> list[str]:
    out, group = [], None
    for word in FIELDS_314.split():
        if word.endswith(":"):
            group = word[:-1]
        else:
            out.append(f"{group}.{word}")
    return out


def test_a_314_blob_in_the_real_field_order_gives_its_offsets() -> None:
    """Every field of a default (GIL) 3.14.0 build gets its own value: a field missing from our
    list would shift every later one, and the walker would read the wrong slots."""
    fields = _fields_314()
    values = {f: 0x1000 + 8 * i for i, f in enumerate(fields)}  # distinct, so a shift shows
    values.update({  # the frame as the walker needs it (3.14 default build), the TLBC fields 0 outside free-threading
        "interpreter_frame.executable": 0, "interpreter_frame.previous": 8, "interpreter_frame.instr_ptr": 56,
        "interpreter_frame.stackpointer": 64, "interpreter_frame.owner": 74, "interpreter_frame.localsplus": 80,
        "interpreter_frame.tlbc_index": 0, "code_object.co_tlbc": 0, "interpreter_state.tlbc_generation": 0,
        "llist_node.next": 0, "llist_node.prev": 8,
    })
    raw = offsets.DEBUG_COOKIE + struct.pack("<QQ", 0x030E00F0, 0) + struct.pack(
        f"<{len(fields)}Q", *(values[f] for f in fields))
    assert len(raw) == offsets.debug_offsets_size((3, 14)) == 24 + 8 * 92
    parsed = offsets.parse_debug_offsets(raw + bytes(64), (3, 14))  # the read may run past the struct
    assert parsed == {"version": 0x030E00F0, **values}
    layout = offsets.layout_for((3, 14), raw)
    v = values
    assert (layout.runtime_interp_head, layout.interp_next, layout.interp_threads_head, layout.tstate_next,
            layout.tstate_native_tid, layout.tstate_frame, layout.cframe_frame) == (
        v["runtime_state.interpreters_head"], v["interpreter_state.next"], v["interpreter_state.threads_head"],
        v["thread_state.next"], v["thread_state.native_thread_id"], v["thread_state.current_frame"],
        schema.PY_NO_OFFSET)
    assert (layout.frame_code, layout.frame_previous, layout.frame_instr, layout.frame_owner) == (0, 8, 56, 74)
    assert (layout.code_tag, layout.shim_owner) == (7, 3)
    assert (layout.code_filename, layout.code_name, layout.code_qualname, layout.code_firstlineno,
            layout.code_linetable, layout.code_adaptive) == (
        v["code_object.filename"], v["code_object.name"], v["code_object.qualname"], v["code_object.firstlineno"],
        v["code_object.linetable"], v["code_object.co_code_adaptive"])
    assert (layout.ob_type, layout.bytes_size, layout.bytes_sval, layout.unicode_length, layout.unicode_state,
            layout.ascii_size, layout.compact_size) == (
        v["pyobject.ob_type"], v["bytes_object.ob_size"], v["bytes_object.ob_sval"], v["unicode_object.length"],
        v["unicode_object.state"], v["unicode_object.asciiobject_size"], v["unicode_object.asciiobject_size"] + 16)
