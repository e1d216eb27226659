"""capture.naming.attach_names: launches seen in drained records make a process due
for a scan of its driver objects; names found get source `driver_object`,
and every launched handle left unnamed gets a row with the reason.

The "process" is this one, seen through a /proc-like directory whose maps
add a file with the kernels' fatbin: its driver objects are ctypes arrays
holding the name pointer at +0x58."""

from __future__ import annotations

import ctypes
import os
import time
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from conftest import _built
from pasta_trace import schema
from pasta_trace.capture.naming import attach_names, name_scan
from pasta_trace.capture.naming.attach_names import AttachNamer
from pasta_trace.probes.catalog import API_NAMES

API = list(API_NAMES)
GONE_PID = 4_000_000  # above pid_max: never a live process


def fake_proc(tmp_path: Path, fatbin_file: Path) -> Path:
    """tmp/PID/{maps, mem, root}: this process, plus a mapping of ``fatbin_file``."""
    d = tmp_path / "proc" / str(os.getpid())
    d.mkdir(parents=True)
    # this process's memory without its files: in a whole test run it has
    # loaded libraries with large fatbins (NCCL, PyTorch), whose parse is not
    # what these tests time
    maps = [ln for ln in Path("/proc/self/maps").read_text().splitlines() if "/" not in ln]
    (d / "maps").write_text("\n".join([*maps, f"7ff000000000-7ff000001000 r--p 00000000 00:00 1 {fatbin_file}"]) + "\n")
    os.symlink(f"/proc/{os.getpid()}/mem", d / "mem")
    os.symlink("/", d / "root")
    return tmp_path / "proc"


def launches(pid: int, handles: list[int]) -> np.ndarray:
    ev = np.zeros(len(handles), dtype=schema.HOST_EVENT.dtype)
    ev["pid"], ev["func"], ev["api"] = pid, handles, API.index("cuLaunchKernel")
    ev["kind"], ev["ts_ns"] = int(schema.Kind.launch), np.arange(100, 100 + len(handles))
    return ev


def lookup(pid: int, handle: int, name: str) -> np.ndarray:
    nm = np.zeros(1, dtype=schema.HOST_NAME.dtype)
    nm["pid"], nm["handle"], nm["source"], nm["name"] = pid, handle, int(schema.NameSource.module_get_function), \
        name.encode()
    nm["api"] = API.index("cuModuleGetFunction")
    return nm


def driver_objects(names: list[bytes], keep: list, decoy: bool = False) -> list[int]:
    """Stand-ins for driver objects, one per name: 32 u64 slots holding the
    name's address at slot 11 (+0x58) and, with ``decoy``, another string's
    at slot 1.  Their buffers go in ``keep``, alive as long as it is."""
    out = []
    for name in names:
        o, s = (ctypes.c_uint64 * 32)(), ctypes.create_string_buffer(name)
        o[11] = ctypes.addressof(s)
        keep += [o, s]
        if decoy:
            d = ctypes.create_string_buffer(b"sm_80")
            o[1] = ctypes.addressof(d)
            keep.append(d)
        out.append(ctypes.addressof(o))
    return out


def test_scan_names_unnamed_launches_and_gives_reasons(build_dir, tmp_path):
    proc = fake_proc(tmp_path, _built("attach_names_workload", build_dir))
    keep: list = []
    vec, scale, plain = driver_objects([b"_Z6vecAddPKfS0_Pfi", b"_Z5scaleIfEvPT_S0_i", b"plain_c_kernel"], keep,
                                       decoy=True)
    me = os.getpid()
    namer = AttachNamer(API, proc=proc)
    namer.observe(launches(me, [vec, scale, vec, plain]), lookup(me, plain, "plain_c_kernel"))
    namer.observe(launches(GONE_PID, [0x5A0000001000]), np.zeros(0, dtype=schema.HOST_NAME.dtype))
    namer.poll()
    deadline = time.monotonic() + 30
    while namer._running is not None and time.monotonic() < deadline:  # noqa: SLF001 - wait for the worker
        time.sleep(0.01)
        namer.poll()
    found = namer.finish()
    assert sorted(found.select("pid", "handle", "name", pl.col("source").cast(pl.String), "ts_ns").iter_rows()) == \
        sorted([(me, vec, "_Z6vecAddPKfS0_Pfi", "driver_object", 100),
                (me, scale, "_Z5scaleIfEvPT_S0_i", "driver_object", 101)])
    known = pl.DataFrame({"pid": [me], "handle": [plain], "name": ["plain_c_kernel"], "source": ["module_get_function"],
                          "ts_ns": [1], "api": ["cuModuleGetFunction"], "reason": [None]}).cast(schema.NAMES_SCHEMA)
    rows = namer.unnamed_rows(pl.concat([known, found]), API)
    assert rows.select("pid", "handle", "name", pl.col("source").cast(pl.String), "api", "reason").rows() == [
        (GONE_PID, 0x5A0000001000, "unknown@0x5a0000001000", "unknown", "cuLaunchKernel",
         f"{attach_names.NOT_LOOKED_UP}; {attach_names.EXITED}")]
    assert namer.manifest() == {
        str(me): {"handles_read": 3, "named": 2, "path": [0x58], "reason": None, "unnamed_handles": 2},
        str(GONE_PID): {"handles_read": 0, "named": 0, "path": None, "reason": attach_names.EXITED,
                        "unnamed_handles": 1}}


def test_a_refusal_is_every_unnamed_handles_reason(build_dir, tmp_path):
    """One unnamed handle and nothing known: no offset can be checked."""
    proc = fake_proc(tmp_path, _built("attach_names_workload", build_dir))
    keep: list = []
    handles = driver_objects([b"plain_c_kernel"], keep)
    namer = AttachNamer(API, proc=proc)
    namer.observe(launches(os.getpid(), handles), np.zeros(0, dtype=schema.HOST_NAME.dtype))
    assert namer.finish().is_empty()
    rows = namer.unnamed_rows(schema.empty_frame(schema.NAMES_SCHEMA), API)
    assert rows["reason"].to_list() == [f"{attach_names.NOT_LOOKED_UP}; {name_scan.ONE_HANDLE}"]


def test_summary_says_why_handles_have_no_name():
    from pasta_trace.capture.session.summary import unnamed_lines

    why = f"{attach_names.NOT_LOOKED_UP}; {name_scan.DISAGREE}"
    names = pl.DataFrame({"pid": [1, 1, 2, 2], "handle": [0x10, 0x20, 0x10, 0x30],
                          "name": ["unknown@0x10", "unknown@0x20", "k", "unknown@0x30"],
                          "source": ["unknown", "unknown", "module_get_function", "unknown"],
                          "ts_ns": [1, 2, 3, 4], "api": ["cuLaunchKernel"] * 4,
                          "reason": [why, why, None, "address is not in a file-backed mapping"]})
    assert unnamed_lines(names) == [
        "2 kernel handles have no name: looked up before the attach; the driver objects",
        "  hold kernel names at different offsets",
        "1 kernel handle has no name: address is not in a file-backed mapping"]


def test_a_handle_named_through_its_runtime_launch_checks_the_offset(build_dir, tmp_path):
    """At the end, driver handles named through their runtime launch
    (`runtime_launch`) are known names: with one of them, one unnamed handle
    is enough."""
    proc = fake_proc(tmp_path, _built("attach_names_workload", build_dir))
    keep: list = []
    handles = driver_objects([b"plain_c_kernel", b"_ZN2ns5innerEPd"], keep)
    me = os.getpid()
    namer = AttachNamer(API, proc=proc)
    namer.observe(launches(me, handles), np.zeros(0, dtype=schema.HOST_NAME.dtype))
    runtime = pl.DataFrame({"pid": [me], "handle": [handles[1]], "name": ["_ZN2ns5innerEPd"],
                            "source": ["runtime_launch"], "ts_ns": [5], "api": ["cuLaunchKernel"],
                            "reason": [None]}).cast(schema.NAMES_SCHEMA)
    found = namer.finish(runtime)
    assert found.select("handle", "name", pl.col("source").cast(pl.String)).rows() == [
        (handles[0], "plain_c_kernel", "driver_object")]
    assert namer.unnamed_rows(pl.concat([runtime, found]), API).is_empty()
    assert namer.manifest() == {str(me): {"handles_read": 2, "named": 1, "path": [0x58], "reason": None,
                                          "unnamed_handles": 1}}


@pytest.mark.parametrize("live", [True, False])
def test_a_handle_launched_after_a_scan(build_dir, tmp_path, live):
    """A handle launched after a scan is named by the next one, which the
    names found earlier check.  If the process has gone by then, the names
    found stay and the new handle says it was never read (not that the
    offset failed)."""
    import shutil

    proc = fake_proc(tmp_path, _built("attach_names_workload", build_dir))
    keep: list = []
    handles = driver_objects([b"plain_c_kernel", b"_ZN2ns5innerEPd", b"_Z6vecAddPKfS0_Pfi"], keep)
    me = os.getpid()
    namer = AttachNamer(API, proc=proc)
    namer.observe(launches(me, handles[:2]), np.zeros(0, dtype=schema.HOST_NAME.dtype))
    namer.poll()
    deadline = time.monotonic() + 30
    while namer._running is not None and time.monotonic() < deadline:  # noqa: SLF001 - wait for the worker
        time.sleep(0.01)
        namer.poll()
    namer.observe(launches(me, handles[2:]), np.zeros(0, dtype=schema.HOST_NAME.dtype))
    if live:  # one new handle is enough: the earlier names check the offset
        assert namer.finish()["name"].sort().to_list() == ["_Z6vecAddPKfS0_Pfi", "_ZN2ns5innerEPd", "plain_c_kernel"]
        return
    shutil.rmtree(proc / str(me))  # "exited"
    found = namer.finish()
    assert sorted(found["name"].to_list()) == ["_ZN2ns5innerEPd", "plain_c_kernel"]
    rows = namer.unnamed_rows(found, API)
    assert rows.select("handle", "reason").rows() == [
        (handles[2], f"{attach_names.NOT_LOOKED_UP}; {attach_names.EXITED}")]


def test_a_failing_scan_is_a_reason_not_a_crash(tmp_path, monkeypatch):
    namer = AttachNamer(API, proc=tmp_path)

    def broken(*_args, **_kw):
        raise ValueError("bad fatbin")

    monkeypatch.setattr(namer._fatbins, "of_process", broken)  # noqa: SLF001
    namer.observe(launches(7, [0x10]), np.zeros(0, dtype=schema.HOST_NAME.dtype))
    assert namer.finish().is_empty()
    assert namer.unnamed_rows(schema.empty_frame(schema.NAMES_SCHEMA), API)["reason"].to_list() == [
        f"{attach_names.NOT_LOOKED_UP}; the scan of the driver objects failed: ValueError: bad fatbin"]


def test_a_lookup_that_succeeds_with_no_name_names_nothing():
    """The 550 driver's cuFuncGetName on a zeroed function object returns
    success and an empty name: observed as the drain gives it (an empty
    numpy bytes field), it names nothing and stops nothing (an -a tracer
    died of it with an IndexError)."""
    me = os.getpid()
    nameless = lookup(me, 0x7A0000002000, "")
    nameless["source"] = int(schema.NameSource.func_get_name)
    named = lookup(me, 0x7A0000003000, "_Z1kv")
    namer = AttachNamer(API, proc=Path("/proc"))
    namer.observe(np.zeros(0, dtype=schema.HOST_EVENT.dtype), np.concatenate([nameless, named]))
    assert namer._procs[me].known == {0x7A0000003000: "_Z1kv"}  # noqa: SLF001 - what observe noted
    namer.finish()
