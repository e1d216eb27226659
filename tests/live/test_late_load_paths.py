"""Late loads are keyed on the file, never on its name, and no opener runs
ahead of the probes.

One workload, traced launched (`-- CMD`) and system-wide (`-a`):
- a host process loads a copy of the stub at path P; then two processes, each
  in a private mount namespace (`unshare -m`), bind-mount ANOTHER copy over
  the same P and load it (three files at one path: the second and third are
  new to the tracer although their path is not);
- 200 processes at once each load their own hard link of a fourth copy (200
  paths, one inode): the first openers wait for the probes; all the others,
  however they interleave with that attach, run only after it.
Every call of every process is captured, and nothing is lost."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import polars as pl
import pytest

from pasta_run import copy_library
from pasta_trace.probes.catalog import APIS
from pasta_trace.read import open_capture

pytestmark = [pytest.mark.live, pytest.mark.usefixtures("require_bpf")]

PROBED = {a.symbol for a in APIS}
SHADOW_REPEAT = 100  # rounds of real_libs_calls per process at the shadowed path: 1,000 probed calls each
#: probed calls in one round of `real_libs_calls cuda` (tests/fixtures/real_libs_calls.c): cuInit, device count,
#: device, alloc, copy, memset, launch, stream and context syncs, free
PER_ROUND = 10
LINKED = 200


class Workload:
    """Files and shell text of the workload; each process writes its PID (pids/NAME) and its
    calls as real_libs_calls prints them (out/NAME.json)."""

    def __init__(self, tmp: Path, stub: Path, program: Path):
        self.tmp = tmp
        self.program = program
        self.path = copy_library(stub, tmp / "lib")  # P: the host's copy
        self.shadows = [copy_library(stub, tmp / f"shadow{i}") for i in range(2)]
        linked = copy_library(stub, tmp / "linked")
        for i in range(LINKED):
            (tmp / "links" / str(i)).mkdir(parents=True)
            (tmp / "links" / str(i) / stub.name).hardlink_to(linked)
        (tmp / "pids").mkdir()
        (tmp / "out").mkdir()

    def run(self, name: str, lib: Path | str, *extra: str, redirect: bool = True) -> str:
        """sh text: the process `name` records its PID, then becomes real_libs_calls."""
        out = f" > {self.tmp}/out/{name}.json" if redirect else ""
        return f"echo $$ > {self.tmp}/pids/{name} && exec {self.program} cuda {lib} {' '.join(extra)}{out}"

    def shadowed(self, i: int) -> str:
        inner = (f"mount --bind {self.shadows[i]} {self.path} && "
                 f"{self.run(f'ns{i}', self.path, '--repeat', str(SHADOW_REPEAT))}")
        return f"unshare -m --propagation private sh -c '{inner}'"

    def script(self, *, host: bool) -> Path:
        """A shell script: [the host process,] the shadowing processes, then the linked ones all at once."""
        link = f"{self.tmp}/links/$1/{self.path.name}"
        lines = [
            "set -e",
            *([f"sh -c '{self.run('host', self.path, '--repeat', str(SHADOW_REPEAT))}'"] if host else []),
            self.shadowed(0),
            self.shadowed(1),
            f"for i in $(seq 0 {LINKED - 1}); do",
            f"    sh -c '{self.run('l$1', link)}' sh $i &",
            "done",
            "wait",
        ]
        path = self.tmp / ("launched.sh" if host else "after_host.sh")
        path.write_text("\n".join(lines) + "\n")
        return path

    def names(self) -> list[str]:
        return ["host", "ns0", "ns1", *(f"l{i}" for i in range(LINKED))]

    def expected(self) -> dict[int, Counter]:
        """PID -> probed calls it made, by API."""
        out = {}
        for name in self.names():
            pid = int((self.tmp / "pids" / name).read_text())
            calls = json.loads((self.tmp / "out" / f"{name}.json").read_text())
            out[pid] = Counter(c["api"] for c in calls if c["api"] in PROBED)
        return out


def check(cap_dir: Path, w: Workload) -> None:
    want = w.expected()
    assert sum(sum(c.values()) for c in want.values()) == 3 * PER_ROUND * SHADOW_REPEAT + PER_ROUND * LINKED
    cap = open_capture(cap_dir)
    assert cap.complete, cap.problems
    assert cap.losses == {}  # events, names, notifications, unpaused opens: every loss counter is 0
    assert cap.manifest["notes"] == []
    events = cap.events.filter(pl.col("pid").is_in(list(want))).select("pid", pl.col("api").cast(pl.String)).collect()
    got = {pid: Counter() for pid in want}
    for pid, api, n in events.group_by("pid", "api").len().iter_rows():
        got[pid][api] = n
    missing = [name for name, pid in zip(w.names(), want) if got[pid] != want[pid]]
    assert missing == [], f"{len(missing)} processes lack calls: {missing[:20]}"
    inodes = {lib["inode"] for lib in cap.manifest["libraries"]}
    files = [w.path, *w.shadows, w.tmp / "linked" / w.path.name]
    assert {f.stat().st_ino for f in files} <= inodes


@pytest.fixture
def workload(families, real_libs_program, tmp_path) -> Workload:
    if shutil.which("unshare") is None:
        pytest.skip("unshare (util-linux) not installed")
    return Workload(tmp_path, families[0].stub, real_libs_program)


def test_launched_shadowed_path_and_per_child_links_every_call(workload, tmp_path, tracer):
    w = workload
    t = tracer(["-o", str(tmp_path / "cap"), "--", "sh", str(w.script(host=True))])
    assert t.finish(timeout=300) == 0, t.stderr()
    assert open_capture(tmp_path / "cap").manifest["launched"]["exit_code"] == 0
    check(tmp_path / "cap", w)


@pytest.mark.machine_wide
def test_system_wide_shadowed_path_and_per_child_links_every_call(workload, tmp_path, tracer):
    w = workload
    # the host process has loaded P before the tracer starts (found by the first scan, not by an open)
    host = subprocess.Popen(
        ["sh", "-c", w.run("host", w.path, "--wait", "--repeat", str(SHADOW_REPEAT), redirect=False)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert host.stdout.readline() == "ready\n"
        t = tracer(["-a", "-o", str(tmp_path / "cap"), "--buffer-pages", "16384"])
        t.wait_ready(timeout=300)
        calls, _ = host.communicate("go\n", timeout=120)
        assert host.returncode == 0
        (tmp_path / "out" / "host.json").write_text(calls)
        assert subprocess.run(["sh", str(w.script(host=False))], timeout=300).returncode == 0
    finally:
        host.kill()
    assert t.stop() == 0, t.stderr()
    check(tmp_path / "cap", w)
