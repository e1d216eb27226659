"""Runtime-API launch handles (host stub addresses) -> kernel names, on a REAL
nvcc-built shared library loaded into this process."""

from __future__ import annotations

import ctypes
import os
import time
from pathlib import Path

import polars as pl
import pytest

from pasta_trace.capture.naming.build_ids import BuildIds
from pasta_trace.capture.naming.symbolize import name_capture, name_handles, parse_maps
from pasta_trace.elf_tables import ElfImage

from nvcc_build import compile_cu

#: order of pasta_stub_addresses() in tests/fixtures/kernels.cu
STUB_ORDER = ["_Z6vecAddPKfS0_Pfi", "_Z5scaleIfEvPT_S0_i", "_Z5scaleIdEvPT_S0_i", "plain_c_kernel", "_ZN2ns5innerEPd"]


@pytest.fixture(scope="module")
def kernels_lib(tmp_path_factory):
    path = compile_cu(tmp_path_factory.mktemp("sym") / "libkernels.so", "-shared", "-Xcompiler", "-fPIC")
    lib = ctypes.CDLL(str(path))
    stubs = (ctypes.c_void_p * 5)()
    lib.pasta_stub_addresses(stubs)
    host_fn = ctypes.cast(lib.pasta_stub_addresses, ctypes.c_void_p).value
    return path, list(stubs), host_fn


def test_host_stubs_resolve_to_kernel_names(kernels_lib):
    path, stubs, _ = kernels_lib
    got = name_handles(Path("/proc/self/maps").read_text(), "", stubs)
    assert got.sort("handle").to_dicts() == sorted(
        ({"handle": h, "name": n, "source": "elf_stub", "reason": None} for h, n in zip(stubs, STUB_ORDER)),
        key=lambda r: r["handle"],
    )


def test_unresolvable_handles_say_why(kernels_lib):
    path, _, host_fn = kernels_lib
    got = {r["handle"]: r for r in name_handles(Path("/proc/self/maps").read_text(), "", [host_fn, 0x10]).to_dicts()}
    assert got[host_fn] == {"handle": host_fn, "name": f"unknown@0x{host_fn:x}", "source": "unknown",
                            "reason": f"symbol pasta_stub_addresses is not a kernel in {path}'s fatbin"}
    assert got[0x10] == {"handle": 0x10, "name": "unknown@0x10", "source": "unknown",
                         "reason": "address is not in a file-backed mapping"}


def test_paths_are_read_under_root(kernels_lib, tmp_path):
    """A process in another mount namespace: its maps paths are read below `root`."""
    path, stubs, _ = kernels_lib
    maps = Path("/proc/self/maps").read_text()
    (tmp_path / path.relative_to("/")).parent.mkdir(parents=True)
    (tmp_path / path.relative_to("/")).hardlink_to(path)  # the same file, at that path below root
    got = name_handles(maps, str(tmp_path), stubs[:1])
    assert got["name"].to_list() == [STUB_ORDER[0]]
    missing = name_handles(maps, str(tmp_path / "elsewhere"), stubs[:1])
    assert missing["source"].to_list() == ["unknown"]
    assert missing["reason"][0].startswith(f"cannot read {path}:")


def test_a_file_that_is_not_the_one_mapped_names_nothing(kernels_lib, tmp_path):
    """An exited process is named from the host's paths: a file now at its
    path (here a copy: the same bytes, another inode) is not the one it
    mapped, and is not read."""
    path, stubs, _ = kernels_lib
    maps = Path("/proc/self/maps").read_text()
    mapped = parse_maps(maps).filter(pl.col("path") == str(path))
    dev, inode = mapped["dev"][0], mapped["inode"][0]
    copy = tmp_path / path.relative_to("/")
    copy.parent.mkdir(parents=True)
    copy.write_bytes(path.read_bytes())
    st = copy.stat()
    got = name_handles(maps, str(tmp_path), stubs[:2])
    now = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x} inode {st.st_ino}"
    assert got.sort("handle").to_dicts() == sorted(
        ({"handle": h, "name": f"unknown@0x{h:x}", "source": "unknown",
          "reason": f"{path} is not the file the process mapped (device {dev} inode {inode}; device {now} there "
                    "now): replaced since"} for h in stubs[:2]),
        key=lambda r: r["handle"])
    assert (dev, inode) == (f"{os.major(path.stat().st_dev):02x}:{os.minor(path.stat().st_dev):02x}",
                            path.stat().st_ino)


def test_parse_maps_keeps_file_mappings():
    text = ("55d0c0a00000-55d0c0a01000 r--p 00001000 fe:00 123   /usr/bin/x\n"
            "7ffd0000-7ffd1000 rw-p 00000000 00:00 0   [stack]\n"
            "7f0000000000-7f0000002000 r-xp 00002000 fe:00 9 /lib/y.so (deleted)\n")
    assert parse_maps(text).to_dicts() == [
        {"start": 0x55D0C0A00000, "end": 0x55D0C0A01000, "offset": 0x1000, "path": "/usr/bin/x", "dev": "fe:00",
         "inode": 123},
        {"start": 0x7F0000000000, "end": 0x7F0000002000, "offset": 0x2000, "path": "/lib/y.so", "dev": "fe:00",
         "inode": 9},
    ]



def test_name_capture_names_runtime_launches(kernels_lib, tmp_path):
    """A capture directory whose runtime-style launches carry this process's host
    stubs: those are named; a driver-API launch handle is left to the run-time lookups."""
    import os

    import polars as pl

    from pasta_trace import schema
    from pasta_trace.capture.naming.symbolize import name_capture

    _, stubs, _ = kernels_lib
    given = {"ts_ns": [10, 20, 30, 40], "pid": [os.getpid()] * 4, "tid": [1] * 4,
             "api": ["hipLaunchKernel", "hipLaunchKernel_spt", "hipLaunchKernel", "cuLaunchKernel"],
             "kind": ["launch"] * 4, "func": [stubs[0], stubs[1], stubs[0], 0x1234]}
    events = pl.DataFrame(given).with_columns(
        [pl.lit(None).alias(c) for c in schema.EVENTS_SCHEMA if c not in given]
    ).select(list(schema.EVENTS_SCHEMA)).cast(schema.EVENTS_SCHEMA)
    events.write_parquet(tmp_path / "events-00000.parquet")
    got = name_capture(tmp_path).sort("ts_ns")
    assert got.select("pid", "handle", "name", pl.col("source").cast(pl.String), "ts_ns",
                      pl.col("api").cast(pl.String)).rows() == [
        (os.getpid(), stubs[0], "_Z6vecAddPKfS0_Pfi", "elf_stub", 10, "hipLaunchKernel"),
        (os.getpid(), stubs[1], "_Z5scaleIfEvPT_S0_i", "elf_stub", 20, "hipLaunchKernel_spt"),
    ]
    assert got["reason"].to_list() == [None, None]  # named: no reason
    # a process whose maps cannot be read any more: unknown@0x..., and the reason is kept
    gone = tmp_path / "gone"
    gone.mkdir()
    events.with_columns(pl.lit(2**22 + 7, dtype=pl.UInt32).alias("pid")).head(1).write_parquet(
        gone / "events-00000.parquet")
    lost = name_capture(gone, proc=tmp_path / "no-proc")
    assert lost.select("name", pl.col("source").cast(pl.String), "reason").rows() == [
        (f"unknown@0x{stubs[0]:x}", "unknown", f"the maps of PID {2**22 + 7} could not be read (the process exited)"),
    ]
    assert name_capture(tmp_path / "empty").is_empty()


def test_kernel_of_symbol_reads_device_stubs():
    from pasta_trace.capture.naming.symbolize import kernel_of_symbol

    kernels = frozenset({"_Z6vecAddPKfS0_Pfi", "plain_c_kernel", "_ZN2ns5innerEPd", "_Z5scaleIfEvPT_S0_i"})
    cases = {
        "_Z6vecAddPKfS0_Pfi": "_Z6vecAddPKfS0_Pfi",  # the host stub is named after the kernel
        "_Z32__device_stub__Z6vecAddPKfS0_PfiPKfS0_Pfi": "_Z6vecAddPKfS0_Pfi",
        "_ZL33__device_stub__Z5scaleIfEvPT_S0_iPffi": "_Z5scaleIfEvPT_S0_i",  # a template: a local symbol
        "_Z34__device_stub__Z14plain_c_kernelPiPi": "plain_c_kernel",  # extern "C": mangled in the stub's name
        "_Z29__device_stub__ZN2ns5innerEPdPd": "_ZN2ns5innerEPd",
        "_Z28__wrapper__device_stub_scaleIfEvRPT_RS0_Ri": None,
        "_ZL25__cudaLaunchKernel_helperP9CUkern_st4dim3S1_PPvmP11CUstream_st": None,
        "_Z32__device_stub__Z6otherPKfS0_PfiPKfS0_Pfi": None,  # not a kernel of this fatbin
        "main": None,
    }
    assert {s: kernel_of_symbol(s, kernels) for s in cases} == cases


def test_runtime_launches_named_through_their_call_site(kernels_lib):
    """A CUDA 13 launch passes a handle that is no address of the file: the
    name comes from the return address (in the device stub when it inlines
    nvcc's helper) or the one a frame up (the helper, not inlined at -O0, is
    shared by every kernel, so its own address names none)."""
    from elftools.elf.elffile import ELFFile

    from pasta_trace.capture.naming.symbolize import name_launches

    path, stubs, _ = kernels_lib
    maps = Path("/proc/self/maps").read_text()
    base = next(int(line.split("-")[0], 16) for line in maps.splitlines()
                if line.endswith(str(path)) and line.split()[2] == "00000000")
    with open(path, "rb") as f:
        syms = {s.name: s["st_value"] for s in ELFFile(f).get_section_by_name(".symtab").iter_symbols()}
    at = lambda name: base + syms[name] + 5  # noqa: E731 - an address inside the function
    helper = at("_ZL25__cudaLaunchKernel_helperP9CUkern_st4dim3S1_PPvmP11CUstream_st")
    launches = pl.DataFrame(
        {"func": [0x5A0000001010, 0x5A0000001030, stubs[3], 0x5A0000001050, 0x5A0000001050],
         "caller": [helper, at("_Z34__device_stub__Z14plain_c_kernelPiPi"), 0x77, helper, helper],
         "caller_fp": [at("_Z32__device_stub__Z6vecAddPKfS0_PfiPKfS0_Pfi"), None, None, 0x99, 0x99]},
        schema={"func": pl.UInt64, "caller": pl.UInt64, "caller_fp": pl.UInt64})
    got = name_launches(maps, "", launches).sort("handle")
    assert got.select("handle", "name", pl.col("source").cast(pl.String)).rows() == sorted([
        (0x5A0000001010, "_Z6vecAddPKfS0_Pfi", "elf_stub"),
        (0x5A0000001030, "plain_c_kernel", "elf_stub"),
        (stubs[3], "plain_c_kernel", "elf_stub"),  # a CUDA 12 launch: the handle is the host stub
        (0x5A0000001050, "unknown@0x5a0000001050", "unknown"),  # nothing names it: the handle's own reason
    ], key=lambda r: r[0])
    assert got.filter(pl.col("source") == "unknown")["reason"].to_list() == [
        "address is not in a file-backed mapping"]


def _exited_capture(tmp_path: Path, maps: str, stub: int) -> tuple[Path, Path]:
    """A capture with one runtime launch of `stub` by a process that has exited: its maps
    as saved while it ran, its root the host's `/` (capture.session.finish._offline_names)."""
    cap = tmp_path / "cap"
    cap.mkdir(parents=True)
    pl.DataFrame({"ts_ns": [1], "pid": [4242], "api": ["cudaLaunchKernel"], "func": [stub]},
                 schema={"ts_ns": pl.Int64, "pid": pl.UInt32, "api": pl.String, "func": pl.UInt64}
                 ).write_parquet(cap / "events-00000.parquet")
    proc = tmp_path / "proc"
    (proc / "4242").mkdir(parents=True)
    (proc / "4242" / "maps").write_text(maps)
    (proc / "4242" / "root").symlink_to("/")
    return cap, proc


def test_an_exited_process_is_named_from_its_file_only_while_that_file_is_the_one_it_mapped(kernels_lib, tmp_path):
    path, stubs, _ = kernels_lib
    maps = Path("/proc/self/maps").read_text()
    cap, proc = _exited_capture(tmp_path / "same", maps, stubs[0])
    assert name_capture(cap, proc=proc).select("pid", "handle", "name", "source", "reason").to_dicts() == [
        {"pid": 4242, "handle": stubs[0], "name": STUB_ORDER[0], "source": "elf_stub", "reason": None}]

    # recorded at capture: another inode than the file at that path now (it was replaced since)
    ino = path.stat().st_ino
    dev = parse_maps(maps).filter(pl.col("path") == str(path))["dev"][0]
    replaced = "\n".join(line.replace(f" {ino} ", f" {ino + 1} ") if line.endswith(str(path)) else line
                         for line in maps.splitlines())
    cap, proc = _exited_capture(tmp_path / "replaced", replaced, stubs[0])
    st = path.stat()
    now = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x} inode {ino}"
    assert name_capture(cap, proc=proc).select("pid", "handle", "name", "source", "reason").to_dicts() == [
        {"pid": 4242, "handle": stubs[0], "name": f"unknown@0x{stubs[0]:x}", "source": "unknown",
         "reason": f"{path} is not the file the process mapped (device {dev} inode {ino + 1}; device {now} there "
                   "now): replaced since"}]


# ----------------------------------------------------------------------- build-ids (capture.naming.build_ids)
# Offline naming also checks the build-id the file had while the process ran: a file at its path later with the
# same device and inode (an inode given again after a delete, a rewrite in place) but another build-id names nothing.

COLUMNS = ("pid", "handle", "name", "source", "reason")


def _mapped(path: Path) -> tuple[str, int, str]:
    """(device as maps writes it, inode, build-id) of ``path`` as this process maps it."""
    row = parse_maps(Path("/proc/self/maps").read_text()).filter(pl.col("path") == str(path)).row(0, named=True)
    with open(path, "rb") as f:
        build_id = ElfImage(f, path).build_id()
    assert build_id is not None and len(build_id) == 40  # a GNU build-id (SHA-1), as the linker writes it
    return row["dev"], row["inode"], build_id


def test_recorded_build_ids_are_those_of_the_files_mapped_executable(kernels_lib):
    path, _, _ = kernels_lib
    dev, inode, build_id = _mapped(path)
    ids = BuildIds()
    maps = Path("/proc/self/maps").read_text()
    ids.record(4242, maps)  # the maps of another pid: its map_files are not there, nothing is recorded
    ids.record(pid := os.getpid(), maps)
    assert ids.of_pid[4242] == {}
    assert ids.of_pid[pid][(dev, inode)] == build_id
    executable = {(r["dev"], r["inode"]) for r in parse_maps(maps).iter_rows(named=True)}
    assert set(ids.of_pid[pid]) <= executable
    # maps without the library (it was unmapped, or the process exec'd): its entry goes
    ids.record(pid, "\n".join(line for line in maps.splitlines() if not line.endswith(str(path))))
    assert (dev, inode) not in ids.of_pid[pid]


def test_a_file_with_the_inode_mapped_but_another_build_id_names_nothing(kernels_lib, tmp_path):
    path, stubs, _ = kernels_lib
    dev, inode, build_id = _mapped(path)
    maps = Path("/proc/self/maps").read_text()
    cap, proc = _exited_capture(tmp_path / "same", maps, stubs[0])
    named = [{"pid": 4242, "handle": stubs[0], "name": STUB_ORDER[0], "source": "elf_stub", "reason": None}]
    # the build-id recorded while it ran is the file's, or the file had none: named as before
    for recorded in (build_id, None):
        got = name_capture(cap, proc=proc, build_ids={4242: {(dev, inode): recorded}})
        assert got.select(COLUMNS).to_dicts() == named

    # the same device and inode, another build-id: what the process mapped was another file
    other = "ab" * 20
    got = name_capture(cap, proc=proc, build_ids={4242: {(dev, inode): other}})
    assert got.select(COLUMNS).to_dicts() == [
        {"pid": 4242, "handle": stubs[0], "name": f"unknown@0x{stubs[0]:x}", "source": "unknown",
         "reason": f"{path} is not the file the process mapped (build-id {other}; build-id {build_id} there now): "
                   "replaced since"}]


def test_recording_a_process_that_maps_many_libraries_costs_little():
    """This interpreter maps tens of libraries (numpy, polars, ...): their
    build-ids are read once, and a re-read of the same maps costs no I/O."""
    maps = Path("/proc/self/maps").read_text()
    ids = BuildIds()
    t0 = time.perf_counter()
    ids.record(os.getpid(), maps)
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    ids.record(os.getpid(), maps)
    again = time.perf_counter() - t0
    assert len(ids.of_pid[os.getpid()]) >= 10
    assert again < first and again < 0.05, (first, again)
