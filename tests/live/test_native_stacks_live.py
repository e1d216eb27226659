"""--native-stacks with real uprobes: the native frames of each event equal,
frame for frame, the program's own backtrace() at that call
(tests/fixtures/native_chain.c, through a library built without frame
pointers), and in Python programs calling that library through ctypes the
Python frames sit where their eval-loop activation was
(tests/fixtures/native_py_workload.py), under Debian's python3 (and each
pyenv CPython 3.11-3.13 present with PASTA_NATIVE_ALL_PYTHONS=1: about 5 s
more per interpreter, which the default run spares; the Python stack
walker itself is tested under each of them by test_python_stacks.py).

Two tracers: -p attached to the C program with the default classes (its
launch has no native stack), and -- CMD with =all running the C program and
the interpreters (the launch has one)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import polars as pl
import pytest

from pasta_run import read_report, run_pasta, wait_for_file
from pasta_trace.read import open_capture

pytestmark = [pytest.mark.live, pytest.mark.usefixtures("require_bpf")]

WORKLOAD = Path(__file__).resolve().parents[1] / "fixtures" / "native_py_workload.py"
PYENV = Path.home() / ".pyenv" / "versions"
EVAL = "_PyEval_EvalFrameDefault"


def interpreters() -> list[str]:
    found = ["/usr/bin/python3"] if Path("/usr/bin/python3").exists() else []
    if os.environ.get("PASTA_NATIVE_ALL_PYTHONS") != "1":
        return found
    for minor in (11, 12, 13):
        builds = sorted(PYENV.glob(f"3.{minor}.*/bin/python3"), key=lambda p: p.parts[-3])
        found += [str(builds[-1])] if builds else []
    return found


def captured(cap, pid: int) -> list[tuple[str, int | None, list[dict]]]:
    """(api, stack_id, frames innermost first) of each event of ``pid``, in call order."""
    frames = (cap.stacks.filter(pl.col("pid") == pid).sort("stack_id", "depth")
              .group_by("stack_id", maintain_order=True)
              .agg(pl.struct("kind", "function", "file", "line", "module", "addr", "truncated").alias("frames")))
    ev = (cap.events.filter(pl.col("pid") == pid).join(frames, on="stack_id", how="left").sort("ts_ns")
          .select(pl.col("api").cast(pl.String), "stack_id", "frames").collect())
    return [(api, sid, fs or []) for api, sid, fs in ev.iter_rows()]


def _path(module: str | None) -> str | None:
    return str(Path(module).resolve()) if module else None


def _native(f: dict, addr: bool) -> tuple:
    """A backtrace() frame as comparable: the name only where dladdr found one (exported symbols)."""
    return ("native", f["addr"] if addr else None, _path(f["module"]), f["function"])


def _got(f: dict, depth: int, named: bool) -> tuple:
    if f["kind"] == "python":
        return ("python", f["file"], f["function"], f["line"])
    # frame 0's return address is that of the API call, backtrace()'s that of nc_record: only its name is compared
    return ("native", f["addr"] if depth else None, _path(f["module"]), f["function"] if named else None)


def expected(lib_call: dict, py_call: dict | None) -> list[tuple]:
    """The backtrace() frames with each _PyEval_EvalFrameDefault replaced by the Python frames of that
    activation: cut after each frame the program marked as called from C."""
    groups, cur = [], []
    for frame, entry in zip(py_call["stack"], py_call["entry"]) if py_call else ():
        cur.append(("python", *frame))
        if entry:
            groups.append(cur)
            cur = []
    out = []
    for depth, f in enumerate(lib_call["frames"][1:]):  # [0] is nc_record_impl
        if f["function"] == EVAL and groups:
            out += groups.pop(0)
        else:
            out.append(_native(f, addr=depth > 0))
    return out


def check_calls(cap, lib: dict, py: dict | None, *, launch_stack: bool) -> None:
    got = captured(cap, lib["pid"])
    assert [api for api, _, _ in got] == [c["api"] for c in lib["calls"]]
    for i, ((api, sid, frames), call) in enumerate(zip(got, lib["calls"])):
        if api == "cuLaunchKernel" and not launch_stack:
            assert sid is None  # no Python, no native stack by default
            continue
        want = expected(call, py["calls"][i] if py else None)
        named = [w[0] == "python" or w[3] is not None for w in want]
        assert [_got(f, d, n) for d, (f, n) in enumerate(zip(frames, named))] == want, f"call {i} ({api})"
        assert not frames[0]["truncated"]


def _line(name: str, text: str) -> int:
    lines = (WORKLOAD.parent / name).read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if text in line)


def _counts(cap) -> dict:
    c = cap.manifest["counts"]["stacks"]
    assert c["lost_native_stacks"] == c["unreadable_native_stacks"] == c["unresolved_native_stacks"] == 0
    assert c["truncated_native_stacks"] == 0
    return c


def test_attached_c_program_default_classes(tmp_path, native_chain, tracer, monkeypatch):
    """-p while the program waits; allocations, frees, the copy, the sync and the failed allocation
    carry their native stack, the launch none; the library has no frame pointers.  An empty table
    cache: every library is parsed in the background while its samples and events wait."""
    out, report = tmp_path / "cap", tmp_path / "r.json"
    monkeypatch.setenv("PASTA_TRACE_CACHE", str(tmp_path / "cache"))
    prog = subprocess.Popen([str(native_chain), "--report", str(report), "--wait"])
    try:
        pid = int(wait_for_file(report.with_name(report.name + ".ready"), proc=prog))
        t = tracer(["-p", str(pid), "-o", str(out), "--native-stacks"])
        t.wait_ready(timeout=120)
        report.with_name(report.name + ".go").touch()
        assert prog.wait(timeout=60) == 0
    finally:
        prog.kill()
    assert t.finish() == 0, t.stderr()
    cap = open_capture(out)
    assert cap.complete, cap.problems
    lib = read_report(report)
    assert [c["ret"] != 0 for c in lib["calls"]].count(True) == 1  # the failed cuMemAlloc_v2(0)
    check_calls(cap, lib, None, launch_stack=False)
    assert cap.manifest["stacks"]["native"] is True
    counts = _counts(cap)
    assert counts["native_samples"] == len(lib["calls"]) - 1 == 8
    assert counts["native_stacks"] == 7  # the two syncs from one place share theirs
    first = captured(cap, lib["pid"])[0][2]  # the first allocation: lines of the calls, from DWARF (-g)
    assert [(Path(f["file"]).name, f["line"]) for f in first[:5]] == [
        ("native_chain_lib.c", _line("native_chain_lib.c", "cuMemAlloc_v2(&p, size)")),
        ("native_chain_lib.c", _line("native_chain_lib.c", "nc_alloc_inner(size) +")),
        ("native_chain_lib.c", _line("native_chain_lib.c", "nc_alloc_mid(size * 2)")),
        ("native_chain.c", _line("native_chain.c", "= nc_alloc_outer(size)")),
        ("native_chain.c", _line("native_chain.c", "run_alloc(1000)"))]
    events = cap.events.collect()
    assert events["stack_id"].null_count() == 1
    # the program, its library, libc: in this user's directory of the cache
    assert len(list((tmp_path / "cache" / "unwind" / f"uid-{os.geteuid()}").glob("*.npz"))) >= 3


def test_launched_python_and_c_all_events(tmp_path, native_chain, cuda_stub):
    """-- CMD with =all: the C program (its launch has a native stack too) and the mixed Python
    workload under each interpreter of interpreters(): native frames, then each activation's Python frames in place."""
    out = tmp_path / "cap"
    libpath = native_chain.parent / "libnativechain.so"
    c_report = tmp_path / "c.json"
    pys = interpreters()
    reports = [tmp_path / f"py{i}.json" for i in range(len(pys))]
    cmds = [f"{native_chain} --report {c_report}"]
    # --settle: an interpreter that opens no new traced library is registered from its exec
    # notification, tens of milliseconds after it starts; its first calls come later
    # --linger 2: the tracer reads each process's maps (the ctypes-loaded library is not in the
    # maps saved at its exec) and code objects while it runs; a CI machine at load 35 once
    # unwound the first sample after the 0.5 s default had run out
    cmds += [f"{py} {WORKLOAD} --lib {libpath} --report {r} --settle 0.3 --linger 2" for py, r in zip(pys, reports)]
    r = run_pasta(["-o", str(out), "--native-stacks=all", "--", "sh", "-c", " && ".join(cmds)], timeout=300)
    assert r.returncode == 0, r.stderr
    cap = open_capture(out)
    assert cap.complete, cap.problems
    check_calls(cap, read_report(c_report), None, launch_stack=True)
    for report in reports:
        py = read_report(report.with_name(report.name + ".py.json"))
        status = cap.manifest["stacks"]["processes"][str(py["pid"])]
        assert status["stacks"] and status["python"] == py["python"], status
        check_calls(cap, read_report(report), py, launch_stack=True)
    assert cap.manifest["stacks"]["native"] == "all"
    counts = _counts(cap)
    assert counts["unsymbolized_frames"] == 0
    assert counts["native_samples"] == 9 + 5 * len(pys)
