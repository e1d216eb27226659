"""Native stacks without a tracer: the unwinder against the program's own
backtrace() on stacks it copied itself (tests/fixtures/native_chain.c
--snapshot: at the entry of a function, as a uprobe sees it), the table
cache, the background parse, the interleaving rule, and the generated C."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from pasta_trace import schema
from pasta_trace.stacks import native, unwind_table as ut
from pasta_trace.stacks.native import Frame, NativeFrame

LIBC_DEBUG = "/usr/lib/debug/.build-id"


@pytest.fixture(scope="module")
def snapshot(tmp_path_factory) -> dict:
    import build  # tests/fixtures/build.py (conftest puts it on the path)

    try:
        exe = build.native_chain()
    except build.Unavailable as e:
        pytest.skip(f"cannot build native_chain: {e}")
    out = tmp_path_factory.mktemp("native") / "report.json"
    subprocess.run([str(exe), "--report", str(out), "--snapshot"], check=True, timeout=60)
    return json.loads(out.read_text())


def _unwind(report: dict, call: dict, modules: native.ModuleCache):
    space = native.AddressSpace(report["pid"], modules, proc=Path("/nonexistent"),
                                saved_maps=lambda pid: report["maps"])  # the process has exited: its saved maps
    return native.Unwinder(space).unwind(ip=0, sp=call["sp"], bp=call["bp"], stack=bytes.fromhex(call["stack"]),
                                         at_entry=True)


def test_unwinds_frame_for_frame_as_backtrace(snapshot, tmp_path):
    """Every call chain, main thread and worker thread, through code without frame pointers:
    the same return addresses as backtrace(), the same names where dladdr has one, to _start/clone."""
    modules = native.ModuleCache(tmp_path)
    assert len(snapshot["calls"]) == 9
    for call in snapshot["calls"]:
        frames, truncated = _unwind(snapshot, call, modules)
        want = call["frames"][1:]  # [0] is nc_record_impl, which recorded it
        assert not truncated
        assert [f.addr for f in frames] == [w["addr"] for w in want], call["api"]
        assert [f.function for f, w in zip(frames, want) if w["function"]] == [
            w["function"] for w in want if w["function"]]
        assert [Path(f.module).resolve() for f in frames] == [Path(w["module"]).resolve() for w in want]
    assert modules.problems == {}
    names = [f.function for f in _unwind(snapshot, snapshot["calls"][0], modules)[0]]
    assert names[:5] == ["nc_alloc_inner", "nc_alloc_mid", "nc_alloc_outer", "run_alloc", "main"]
    worker = [f.function for f in _unwind(snapshot, snapshot["calls"][-1], modules)[0]]
    assert worker[:4] == ["nc_free_inner", "nc_free_outer", "run_free", "worker"]  # worker is static: .symtab


def source_line(text: str) -> tuple[str, int]:
    """(file name, line) of the one line of the fixture sources that holds ``text``."""
    fixtures = Path(__file__).resolve().parents[1] / "fixtures"
    hits = [(p.name, i) for p in (fixtures / "native_chain.c", fixtures / "native_chain_lib.c")
            for i, line in enumerate(p.read_text().splitlines(), 1) if text in line]
    assert len(hits) == 1, (text, hits)
    return hits[0]


def test_source_lines_from_dwarf(snapshot, tmp_path):
    """The fixtures are built with -g: each frame's line is that of its call."""
    space = native.AddressSpace(snapshot["pid"], native.ModuleCache(tmp_path), proc=Path("/nonexistent"),
                                saved_maps=lambda pid: snapshot["maps"])
    frames, _ = native.Unwinder(space).unwind(ip=0, sp=snapshot["calls"][0]["sp"], bp=snapshot["calls"][0]["bp"],
                                              stack=bytes.fromhex(snapshot["calls"][0]["stack"]), at_entry=True)
    got = [space.with_source(f) for f in frames[:5]]
    assert [(Path(f.file).name, f.line) for f in got] == [source_line(t) for t in (
        'nc_record("cuMemAlloc_v2")', "nc_alloc_inner(size) +", "nc_alloc_mid(size * 2)",
        "= nc_alloc_outer(size)", "run_alloc(1000)")]


def test_local_libc_functions_are_named_from_the_debug_file(snapshot, tmp_path):
    """__libc_start_call_main is local to libc: only its build-id debug file (libc6-dbg) names it."""
    frames, _ = _unwind(snapshot, snapshot["calls"][0], native.ModuleCache(tmp_path))
    libc = next(f for f in frames if f.module and "libc.so" in f.module)
    with open(Path(libc.module).resolve(), "rb") as f:
        from elftools.elf.elffile import ELFFile

        debug = ut.debug_file_for(ut.build_id_of(ELFFile(f)))
    if debug is None:
        pytest.skip("no libc debug file under /usr/lib/debug/.build-id (apt-get install libc6-dbg)")
    assert [f.function for f in frames][-3:] == ["__libc_start_call_main", "__libc_start_main", "_start"]


def test_tables_are_cached_per_content(snapshot, tmp_path, monkeypatch):
    lib = next(Path(f["module"]) for f in snapshot["calls"][0]["frames"] if "libnativechain" in f["module"])
    with open(lib, "rb") as f:
        first = ut.tables_for(f, cache=tmp_path)
    files = list(tmp_path.glob("*.npz"))
    assert [p.name for p in files] == [f"{hashlib.sha256(lib.read_bytes()).hexdigest()}.npz"]
    monkeypatch.setattr(ut, "build", lambda *a: pytest.fail("parsed again despite the cache"))
    with open(lib, "rb") as f:
        again = ut.tables_for(f, cache=tmp_path)
    for name in ("pc", "cfa_reg", "cfa_off", "ra_off", "rbp_off", "sym_addr", "sym_end", "sym_name"):
        assert np.array_equal(getattr(first, name), getattr(again, name)), name
    assert again.symbol(int(again.sym_addr[again.sym_name.tolist().index("nc_alloc_mid")]) + 1) == "nc_alloc_mid"


def test_background_parse_answers_pending_then_the_tables(snapshot, tmp_path):
    lib = next(f["module"] for f in snapshot["calls"][0]["frames"] if "libnativechain" in f["module"])
    modules = native.ModuleCache(tmp_path, background=True)
    try:
        first = modules.tables(lambda: open(lib, "rb"), lib, ("/",))
        assert first is native.PENDING
        modules.wait(60)
        assert not modules.building
        got = modules.tables(lambda: open(lib, "rb"), lib, ("/",))
        assert isinstance(got, ut.Tables) and "nc_alloc_inner" in got.sym_name.tolist()
    finally:
        modules.close()


def test_unreadable_file_is_a_named_problem(tmp_path):
    bad = tmp_path / "libbad.so"
    bad.write_bytes(b"not an ELF file at all")
    modules = native.ModuleCache(tmp_path)
    assert modules.tables(lambda: open(bad, "rb"), str(bad), ("/",)) is None
    assert modules.problems[str(bad)].startswith("not readable as ELF")
    assert modules.tables(lambda: open(tmp_path / "gone.so", "rb"), "/gone.so", ("/",)) is None
    assert modules.problems["/gone.so"] == "cannot open: No such file or directory"


def _n(name: str | None, addr: int = 0) -> NativeFrame:
    return NativeFrame(addr, "/lib/x.so", name)


def _p(name: str) -> Frame:
    return Frame("python", name, "w.py", 1, None, 0)


def test_interleave_replaces_each_eval_activation_by_its_python_frames():
    nat = [_n("leaf", 1), _n("_PyEval_EvalFrameDefault", 2), _n("map_next", 3),
           _n("_PyEval_EvalFrameDefault.cold", 4), _n("main", 5)]
    got = native.interleave(nat, [[_p("g"), _p("f")], [_p("<module>")]])
    assert [(f.kind, f.function) for f in got] == [
        ("native", "leaf"), ("python", "g"), ("python", "f"), ("native", "map_next"), ("python", "<module>"),
        ("native", "main")]
    # a copy cut short: the outer Python frames follow the last native frame
    got = native.interleave(nat[:2], [[_p("g")], [_p("<module>")]])
    assert [f.function for f in got] == ["leaf", "g", "<module>"]
    # a Python stack cut at --stack-depth: the outer activation stays a native frame
    got = native.interleave(nat, [[_p("g")]])
    assert [f.function for f in got] == ["leaf", "g", "map_next", "_PyEval_EvalFrameDefault.cold", "main"]
    assert [f.function for f in native.interleave(nat[:1], None)] == ["leaf"]


def test_activations_from_shims_and_entry_marks():
    # 3.12+: owner 3 (C stack) where an activation begins; the outermost shim starts nothing
    assert native.activations([0, 0, 3, 0, 3, 3, 0, 3], shim=3, entry_marks=False) == [
        0, 0, None, 1, None, None, 3, None]
    # 3.11: the owner byte holds is_entry, set on the first frame an activation ran
    assert native.activations([0, 1, 0, 1], shim=None, entry_marks=True) == [0, 0, 1, 1]
    assert native.activations([0, 1, 0], shim=None, entry_marks=False) == [0, 0, 0]


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
def test_native_record_matches_its_c_layout(tmp_path):
    from test_schema import _c_layout

    prelude = "typedef unsigned char __u8; typedef unsigned short __u16; typedef unsigned int __u32;" \
              "typedef unsigned long long __u64; typedef int __s32; typedef long long __s64;\n"
    got = _c_layout(prelude + schema.native_stacks_c_header(), [schema.NATIVE_SAMPLE], tmp_path, "gcc")
    assert got["pt_native"] == (schema.NATIVE_SAMPLE.size, schema.NATIVE_SAMPLE.offsets())
    assert schema.NATIVE_SAMPLE.offsets()["stack"] % 8 == 0
    header = schema.native_stacks_c_header()
    assert "#define PT_NATIVE_KINDS 0x2eu" in header  # alloc 1, free 2, memcpy 3, sync 5
    assert "#define PT_NATIVE_KINDS 0xffffffffu" in schema.native_stacks_c_header(None)


def test_maps_read_before_the_process_exited_outlive_it(tmp_path):
    """A library mapped after the exec (dlopen), read while the process ran, is still
    located after it exited, when its maps read empty and the tracker's copy predates the
    library; a mapping read later at an overlapping range replaces it."""
    exe = "00400000-00401000 r-xp 00000000 08:01 1 /usr/bin/prog\n"
    lib = "7f0000000000-7f0000002000 r-xp 00001000 08:01 2 /opt/libdlopened.so\n"
    other = "7f0000001000-7f0000003000 r-xp 00000000 08:01 3 /opt/libreused.so\n"
    maps = tmp_path / "42" / "maps"
    maps.parent.mkdir()
    maps.write_text(exe + lib)
    space = native.AddressSpace(42, native.ModuleCache(tmp_path), proc=tmp_path, saved_maps=lambda pid: exe)
    maps.write_text("")  # exited: its memory released, not yet reaped
    space.refresh()
    assert [m.path for m in space._maps] == ["/usr/bin/prog", "/opt/libdlopened.so"]
    assert space._mapping(0x7F0000000010).path == "/opt/libdlopened.so"
    maps.write_text(exe + other)  # (a live process) the range unmapped and another library mapped over it
    space.refresh()
    assert [m.path for m in space._maps] == ["/usr/bin/prog", "/opt/libreused.so"]
    assert space._mapping(0x7F0000000010) is None
