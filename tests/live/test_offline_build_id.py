"""Offline naming of a process that exited reads the host's path of each file
it mapped: a program rebuilt in place there (the same device and inode,
other bytes) is not the one it ran, and its launches come out unknown@...
with the reason, never named from the new build (capture.naming.build_ids,
capture.naming.symbolize)."""

from __future__ import annotations

import os
import shutil
import subprocess

import polars as pl
import pytest

from pasta_run import wait_for_file
from pasta_trace.elf_tables import ElfImage
from pasta_trace.read import open_capture

pytestmark = pytest.mark.live


def _build_id(path) -> str:
    with open(path, "rb") as f:
        return ElfImage(f, path).build_id()


def test_a_program_rebuilt_in_place_after_it_exited_names_none_of_its_launches(
        require_bpf, cudart_launcher, cudart_stub, cuda_stub, tracer, tmp_path):
    exe, report, go = tmp_path / "launcher", tmp_path / "report.json", tmp_path / "go"
    shutil.copy2(cudart_launcher("shared"), exe)
    ran, rebuilt = _build_id(exe), _build_id(cudart_launcher("static"))
    assert ran and rebuilt and ran != rebuilt
    env = {**os.environ, "LD_LIBRARY_PATH": f"{cudart_stub.parent}:{cuda_stub.parent}"}
    proc = subprocess.Popen([str(exe), "--report", str(report), "--rounds", "2", "--go-file", str(go)], env=env)
    # a second traced process keeps the capture going once the launcher has exited
    waiter = subprocess.Popen(["sleep", "300"])
    try:
        wait_for_file(report.with_name(report.name + ".ready"), timeout=60, proc=proc)
        t = tracer(["-o", str(tmp_path / "cap"), "-p", f"{proc.pid},{waiter.pid}"])
        t.wait_ready(timeout=180)
        go.touch()
        assert proc.wait(timeout=60) == 0
        inode = exe.stat().st_ino
        with open(exe, "r+b") as f:  # rebuilt in place: the same inode, another program
            f.truncate(0)
            f.write(cudart_launcher("static").read_bytes())
        assert exe.stat().st_ino == inode and _build_id(exe) == rebuilt
        assert t.stop(timeout=180) == 0, t.stderr()
    finally:
        go.touch()
        for p in (proc, waiter):
            if p.poll() is None:
                p.kill()
                p.wait()
    names = open_capture(tmp_path / "cap").names.filter(pl.col("pid") == proc.pid).collect()
    offline = names.filter(pl.col("reason").str.contains(str(exe), literal=True))
    assert offline.height > 0
    assert offline.select(pl.col("name").str.starts_with("unknown@").all(),
                          pl.col("source").cast(pl.String).unique().implode()).row(0) == (True, ["unknown"])
    assert offline["reason"].unique().to_list() == [
        f"{exe} is not the file the process mapped (build-id {ran}; build-id {rebuilt} there now): replaced since"]
    # nothing was named from the file (source elf_stub: read offline from a mapped binary)
    assert names.filter(pl.col("source").cast(pl.String) == "elf_stub").height == 0
