"""-a and containers: processes in a private mount namespace (`unshare -m`)
whose libcuda.so.1 is a bind-mounted COPY (a different inode, visible only
inside that namespace, at a path that is an empty directory on the host), in
their own cgroup named like a container runtime's.  One runs before the
tracer starts, one starts after; both must be traced with the right pid and
comm, and processes.parquet must say which cgroup/container each is in."""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
from pathlib import Path

import polars as pl
import pytest

import expect
from pasta_run import copy_library, read_report, wait_for_file
from pasta_trace.read import open_capture

pytestmark = [pytest.mark.live, pytest.mark.usefixtures("require_bpf")]


def cgroup2_root() -> Path | None:
    for line in Path("/proc/self/mounts").read_text().splitlines():
        fields = line.split()
        if fields[2] == "cgroup2" and os.access(fields[1], os.W_OK):
            return Path(fields[1])
    return None


@pytest.fixture
def container_cgroup():
    """A cgroup v2 directory named like a Docker scope; removed afterwards."""
    root = cgroup2_root()
    if root is None:
        pytest.skip("no writable cgroup v2 hierarchy to put the 'container' in")
    cid = secrets.token_hex(32)
    path = root / f"docker-{cid}.scope"
    path.mkdir()
    yield path, cid
    path.rmdir()


def in_container(workload: Path, lib_dir: Path, mountpoint: Path, soname: str, cgroup: Path, report: Path,
                 *extra: str) -> subprocess.Popen:
    script = (f'echo $$ > {cgroup}/cgroup.procs && mount --bind {lib_dir} {mountpoint} && '
              f'exec {workload} --lib {mountpoint}/{soname} --report {report} --threads 2 --iters 1 {" ".join(extra)}')
    return subprocess.Popen(["unshare", "-m", "--propagation", "private", "sh", "-c", script])


@pytest.mark.machine_wide
def test_container_processes_traced_system_wide(families, tmp_path, tracer, container_cgroup):
    if shutil.which("unshare") is None:
        pytest.skip("unshare (util-linux) not installed")
    cuda = families[0]
    cgroup, cid = container_cgroup
    image_lib = copy_library(cuda.stub, tmp_path / "image" / "usr" / "lib", cuda.soname)
    mountpoint = tmp_path / "rootfs-lib"  # empty on the host; the library appears there only inside
    mountpoint.mkdir()
    out = tmp_path / "cap"
    early_report, late_report = tmp_path / "early.json", tmp_path / "late.json"

    early = in_container(cuda.workload, image_lib.parent, mountpoint, cuda.soname, cgroup, early_report, "--wait")
    try:
        pid = int(wait_for_file(early_report.with_name(early_report.name + ".ready"), proc=early))
        cgroup_line = next(ln for ln in Path(f"/proc/{pid}/cgroup").read_text().splitlines() if ln.startswith("0::"))
        mnt_ns = os.stat(f"/proc/{pid}/ns/mnt").st_ino
        assert mnt_ns != os.stat("/proc/self/ns/mnt").st_ino
        assert list(mountpoint.iterdir()) == []  # the host does not see the library
        t = tracer(["-a", "-o", str(out), "--buffer-pages", "16384"])
        t.wait_ready()
        late = in_container(cuda.workload, image_lib.parent, mountpoint, cuda.soname, cgroup, late_report)
        assert late.wait(timeout=120) == 0
        os.kill(pid, signal.SIGUSR1)
        assert early.wait(timeout=120) == 0
    finally:
        early.kill()
    assert t.stop() == 0, t.stderr()

    cap = open_capture(out)
    reports = [(read_report(early_report), {"run"}), (read_report(late_report), {"setup", "run"})]
    for report, phases in reports:
        assert expect.mismatches(cap, [report], phases) == []
    events = cap.events.filter(pl.col("pid").is_in([r["pid"] for r, _ in reports])).collect()
    assert events["comm"].cast(pl.String).unique().to_list() == [cuda.workload.name]
    procs = cap.processes.filter(pl.col("pid").is_in([r["pid"] for r, _ in reports])).collect()
    assert sorted(procs.select("pid", "cgroup", "container_id").iter_rows()) == sorted(
        (r["pid"], cgroup_line.split(":", 2)[2], cid) for r, _ in reports)
    assert procs.filter(pl.col("pid") == pid)["mnt_ns"].to_list() == [mnt_ns]
    host_ns = os.stat("/proc/self/ns/mnt").st_ino
    assert procs.filter(pl.col("mnt_ns") == host_ns).height == 0
    inode = image_lib.stat().st_ino
    libs = [lib for lib in cap.manifest["libraries"] if lib["inode"] == inode]
    assert len(libs) == 1 and libs[0]["path"] == f"{mountpoint}/{cuda.soname}"
    assert libs[0]["attach_path"].startswith("/proc/")
