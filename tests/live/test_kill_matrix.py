"""Nothing stopped, ever; every loss counted: SIGKILL of the tracer, of a
guardian, of the events writer, and of pairs of them, at the moments that
matter.  Real tracers on the real stub libraries and workloads.

- held: a process is stopped at a late library open (the tracer attaches to
  the new file meanwhile) when the kill comes.  It must be resumed within
  1 s of the kill, measured on its own clock: the guardians watch the start of
  the tracer's exit (PF_EXITING), not only its end, and the tracer replaces a
  guardian that died.
- flood: the events writer dies while it holds a backlog: the tracer ends the
  capture, counts every event not on disk, completes the manifest and exits 1
  with one line; events on disk + counted losses == the workload's own count.
  The tracer dies (alone or with a guardian): the events writer writes its
  backlog and the events left in the kernel's ring, and completes the manifest
  with the kernel's loss counts: the same sum holds.  The tracer and the
  writer die together (or the writer during its takeover): a guardian
  completes the manifest from the files on disk and the ledger, and the same
  sum holds.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest

import expect
from pasta_run import descendants, read_report, wait_for_file
from pasta_trace.read import open_capture
from pasta_trace.schema import STOP_RECORD

pytestmark = [pytest.mark.live, pytest.mark.usefixtures("require_bpf")]

#: a library open held stopped must be resumed this soon after the kill
RESUME_S = 1.0


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def helpers(tracer_pid: int, module: str) -> list[int]:
    """The tracer's helper processes running ``pasta_trace.capture.<module>``."""
    return sorted(p for p in descendants(tracer_pid) if f"pasta_trace.capture.{module}" in _cmdline(p))


def _state(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def _wait(cond, timeout: float, step: float = 0.002) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(step)
    return False


# --------------------------------------------------------------------------- held at a library load

VICTIM = """
import json, os, sys, time
lib, go, out = sys.argv[1:4]
while not os.path.exists(go):
    time.sleep(0.002)
t0 = time.monotonic()
open(lib, "rb").close()  # stopped here until the tracer (or a guardian) resumes it
t1 = time.monotonic()
with open(out, "w") as f:
    json.dump({"opened_at": t0, "resumed_at": t1}, f)
"""

#: who is SIGKILLed (together, in this order) while the victim is held stopped by a tracer frozen mid-attach
HELD_KILLS = {
    "tracer": ["tracer"],
    "guardian-then-tracer": ["guardian", "tracer"],
    "tracer-and-guardian": ["tracer", "guardian"],
    "writer-and-tracer": ["writer", "tracer"],
    "tracer-and-both-guardians": ["tracer", "guardian", "guardian2"],  # the events writer resumes it
}


def _holds_stops(pid: int) -> bool:
    """Whether ``pid`` holds the tracer's pt_stops map (the only hash map of STOP_RECORD values)."""
    want = {"map_type": "1", "value_size": str(STOP_RECORD.dtype.itemsize)}
    for fd in Path(f"/proc/{pid}/fdinfo").iterdir():
        try:
            info = dict(line.split(":", 1) for line in fd.read_text().splitlines() if ":" in line)
        except OSError:
            continue
        if all(info.get(k, "").strip() == v for k, v in want.items()):
            return True
    return False


def _hold(cuda, tmp_path: Path, tracer, name: str, tries: int = 10):
    """A victim stopped at the open of a new copy of the stub library, and
    its tracer frozen (SIGSTOP) while it holds it, as a tracer busy attaching
    is: (tracer, victim, its result file).  The tracer handles the stop within
    a second or so; a try that finds the victim already resumed starts again."""
    for attempt in range(tries):
        d = tmp_path / f"{name}{attempt}"
        (d / "lib").mkdir(parents=True)
        lib = d / "lib" / "libcuda.so.1"
        shutil.copy(cuda.stub, lib)
        go, result = d / "go", d / "victim.json"
        victim = subprocess.Popen([sys.executable, "-c", VICTIM, str(lib), str(go), str(result)])
        try:
            t = tracer(["-p", str(victim.pid), "-o", str(d / "cap")], name=f"{name}{attempt}")
            t.wait_ready(timeout=300)  # the compile: a minute or more on a loaded machine
            # the events writer guards the stops once it holds them (guardian.watch_in_thread)
            assert _wait(lambda: (w := helpers(t.proc.pid, "output.event_writer")) and _holds_stops(w[0]), 60)
        except BaseException:
            victim.kill()
            raise
        go.touch()
        if not _wait(lambda: _state(victim.pid) == "T" or result.exists(), 30):
            pytest.fail("the victim's open was never stopped")
        t.proc.send_signal(signal.SIGSTOP)
        if _state(victim.pid) == "T" and not result.exists():
            return t, victim, result
        t.proc.send_signal(signal.SIGCONT)  # missed it: the tracer resumed the victim first
        assert victim.wait(timeout=60) == 0
        t.stop()
    pytest.fail(f"the victim was never held stopped while the tracer was frozen, in {tries} tries")


@pytest.mark.parametrize("kills", list(HELD_KILLS))
def test_a_process_held_at_a_library_load_is_resumed_within_a_second(families, tmp_path, tracer, kills):
    cuda = families[0]
    t, victim, result = _hold(cuda, tmp_path, tracer, kills)
    try:
        guardians = helpers(t.proc.pid, "procs.guardian")
        pids = {"tracer": [t.proc.pid], "guardian": guardians[:1], "guardian2": guardians[1:],
                "writer": helpers(t.proc.pid, "output.event_writer")}
        assert all(pids.values()), pids
        targets = [p for who in HELD_KILLS[kills] for p in pids[who]]
        killed_at = time.monotonic()
        for pid in targets:
            os.kill(pid, signal.SIGKILL)
        assert victim.wait(timeout=30) == 0
        times = json.loads(result.read_text())
        assert times["resumed_at"] - killed_at < RESUME_S, (times, killed_at)
    finally:
        victim.kill()
        t.kill()


def test_guardians_that_die_are_replaced(families, tmp_path, tracer):
    """Both guardians SIGKILLed while the tracer lives: it starts two new ones,
    and a tracer SIGKILLed after still leaves its held process resumed at once."""
    cuda = families[0]
    t, victim, result = _hold(cuda, tmp_path, tracer, "replaced")
    try:
        first = helpers(t.proc.pid, "procs.guardian")
        assert len(first) == 2
        for pid in first:
            os.kill(pid, signal.SIGKILL)
        t.proc.send_signal(signal.SIGCONT)
        assert _wait(lambda: len(set(helpers(t.proc.pid, "procs.guardian")) - set(first)) == 2, 5, 0.01), \
            helpers(t.proc.pid, "procs.guardian")
        assert victim.wait(timeout=30) == 0  # resumed by the tracer itself
    finally:
        victim.kill()
    # a second held stop, with only the replacements watching
    t2, victim2, result2 = _hold(cuda, tmp_path, tracer, "after")
    try:
        killed_at = time.monotonic()
        os.kill(t2.proc.pid, signal.SIGKILL)
        assert victim2.wait(timeout=30) == 0
        assert json.loads(result2.read_text())["resumed_at"] - killed_at < RESUME_S
    finally:
        victim2.kill()
        t.kill()


# --------------------------------------------------------------------------- the writer dies in a flood

FLOOD = 2_000_000  # per thread, two threads: the writer holds a backlog when it is killed
#: the kills that leave the writer alive need no backlog of the writer's, only events in flight
SHORT_FLOOD = 500_000
#: a writer killed after the tracer is killed this long after it: in its takeover, or just done
TAKEOVER_S = 0.1
#: every loss counter that can hold an event of the flood
FLOOD_LOSSES = ("lost_events", "lost_inflight", "lost_writer_behind", "lost_unwritten", "lost_writer_died",
                "lost_tracer_died")


@pytest.fixture
def sleeper():
    """A process to point -p at beside the workload, idle for longer than a loaded machine's compile."""
    p = subprocess.Popen(["sleep", "600"])
    yield p
    p.kill()
    p.wait()


def _frozen(pid: int) -> bool:
    """Whether every thread of ``pid`` is stopped."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return False
    states = []
    for tid in tids:
        try:
            states.append(Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()[0])
        except OSError:
            pass  # a thread that ended
    return bool(states) and all(st == "T" for st in states)


def _flood_then_kill(cuda, tmp_path: Path, tracer, sleeper, who: list[str], flood: int = FLOOD):
    """A capture of a flood whose events writer is SIGKILLed (with ``who``
    else) once its first file is on disk: (tracer, out dir, the calls the
    workloads made, the writer's PID, the guardians' PIDs).  A writer killed
    after the tracer is killed TAKEOVER_S later.  A tracer to be killed is
    frozen (SIGSTOP) there instead, as a tracer that does not get the CPU is,
    and a second workload floods then: the kernel's ring fills (and then
    counts lost_events) while nothing drains it, whenever the first flood
    ends.  The kill comes once the workloads have ended."""
    names = ["first", "second"] if "tracer" in who else ["first"]
    reports = {n: tmp_path / f"{n}.json" for n in names}
    procs = {n: subprocess.Popen([str(cuda.workload), "--lib", str(cuda.stub), "--report", str(r), "--threads", "2",
                                  "--iters", "0", "--flood", str(flood if n == "first" else SHORT_FLOOD), "--wait"])
             for n, r in reports.items()}
    try:
        pids = [int(wait_for_file(r.with_name(r.name + ".ready"), proc=procs[n])) for n, r in reports.items()]
        out = tmp_path / "cap"
        # the sleeper keeps the capture going after the workloads' end: the writer still has its backlog
        t = tracer(["-p", ",".join(map(str, [*pids, sleeper.pid])), "-o", str(out)])
        t.wait_ready(timeout=300)
        assert _wait(lambda: len(helpers(t.proc.pid, "output.event_writer")) == 1, 60, 0.01)  # started after the banner
        writer = helpers(t.proc.pid, "output.event_writer")
        os.kill(pids[0], signal.SIGUSR1)
        assert _wait(lambda: any(out.glob("events-*.parquet")), 120, 0.01)
        if "tracer" in who:
            t.proc.send_signal(signal.SIGSTOP)
            assert _wait(lambda: _frozen(t.proc.pid), 30, 0.01)
            os.kill(pids[1], signal.SIGUSR1)
        for p in procs.values():
            assert p.wait(timeout=300) == 0
        guardians = helpers(t.proc.pid, "procs.guardian")
        targets = {"writer": writer, "tracer": [t.proc.pid], "guardian": guardians[:1]}
        for i, w in enumerate(who):
            if w == "writer" and "tracer" in who[:i]:
                time.sleep(TAKEOVER_S)
            os.kill(targets[w][0], signal.SIGKILL)
    finally:
        for p in procs.values():
            p.kill()
    calls = 0
    for r in reports.values():
        rep = read_report(r)
        calls += len(expect.expected_calls(rep, {"run"})) + rep["flood"]["calls"]
    return t, out, calls, writer[0], guardians


def test_a_writer_killed_in_a_flood_is_a_counted_loss(families, tmp_path, tracer, sleeper):
    cuda = families[0]
    t, out, calls, writer, _ = _flood_then_kill(cuda, tmp_path, tracer, sleeper, ["writer"])
    assert t.finish() == 1
    err = t.stderr()
    assert "Traceback" not in err, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("pasta-trace: error: ") and "the events writer process was killed by SIGKILL" in last, err
    cap = open_capture(out)
    assert cap.complete, cap.problems
    counts = cap.manifest["counts"]
    on_disk = cap.events.select(pl.len()).collect().item()
    assert on_disk == counts["events"]
    lost = sum(counts[k] for k in ("lost_events", "lost_inflight", "lost_writer_died", "lost_writer_behind"))
    assert on_disk + lost == calls, (on_disk, counts)
    assert counts["lost_writer_died"] > 0 and counts["lost_unwritten"] == 0  # killed with a backlog: counted
    assert f"LOST: {counts['lost_writer_died']:,} events: the events writer process died before it wrote them" \
        in err
    assert any("the events writer process was killed by SIGKILL" in n for n in cap.manifest["notes"])
    assert not [p.name for p in out.iterdir() if p.name.startswith(".")]  # its half-written file is gone
    assert not Path(f"/proc/{writer}").exists()


@pytest.mark.parametrize("who", [["writer", "guardian"], ["writer", "tracer"], ["tracer"], ["guardian"],
                                 ["tracer", "guardian"], ["tracer", "writer"]])
def test_kills_in_a_flood_leave_nothing_stopped(families, tmp_path, tracer, sleeper, who):
    """The other kills in a flood: a tracer that lives ends as it should (1
    with the writer dead, 0 at Ctrl-C after a guardian died and was replaced);
    a writer whose tracer died writes its backlog and ends; a guardian whose
    tracer and writer died completes the capture; nothing is left stopped."""
    cuda = families[0]
    t, out, calls, writer, guardians = _flood_then_kill(cuda, tmp_path, tracer, sleeper, who,
                                                        FLOOD if "writer" in who else SHORT_FLOOD)
    if "tracer" in who:
        assert t.finish() == -signal.SIGKILL
        if "writer" in who:
            # the guardians resume, wait for the writer's end, and one of them completes the manifest
            assert _wait(lambda: all(_state(g) in (None, "Z") for g in guardians), 120, 0.05), t.stderr()
            cap = open_capture(out)
            assert cap.complete, (cap.problems, t.stderr())
            counts = cap.manifest["counts"]
            on_disk = cap.events.select(pl.len()).collect().item()
            assert on_disk == counts["events"]
            assert on_disk + sum(counts[k] for k in FLOOD_LOSSES) == calls, (on_disk, counts)
            assert counts["lost_tracer_died"] == 0  # without native stacks the tracer holds nothing back
            assert not [p.name for p in out.iterdir() if p.name.startswith(".")]  # no half-written file
            assert "Traceback" not in t.stderr(), t.stderr()
            if who[0] == "writer":  # killed with a backlog, before any takeover: the guardian counted it
                assert counts["lost_writer_died"] > 0
                assert any("a guardian completed it" in n for n in cap.manifest["notes"])
                assert "a guardian completed the capture's manifest" in t.stderr()
        else:
            # the tracer's end is its end of input: it writes what it holds, drains the events
            # left in the kernel's ring until the tracer is gone, and completes the manifest
            # ended: a zombie until the dying tracer, its parent, has released its uprobes (seconds)
            assert _wait(lambda: _state(writer) in (None, "Z"), 120, 0.05)
            cap = open_capture(out)
            assert cap.complete, cap.problems
            counts = cap.manifest["counts"]
            on_disk = cap.events.select(pl.len()).collect().item()
            assert on_disk == counts["events"]
            lost = sum(counts[k] for k in ("lost_events", "lost_inflight", "lost_writer_behind", "lost_tracer_died"))
            assert on_disk + lost == calls, (on_disk, counts)
            assert counts["lost_tracer_died"] == 0  # without native stacks the tracer holds nothing back
            note = next(n for n in cap.manifest["notes"] if "died during the capture" in n)
            taken = int(re.search(r"the ([\d,]+) events left in the kernel's ring", note)[1].replace(",", ""))
            assert taken > 0  # what the frozen tracer left in the kernel's ring is on disk
    elif "writer" in who:
        assert t.finish() == 1, t.stderr()
        assert open_capture(out).complete
    else:
        assert _wait(lambda: len(helpers(t.proc.pid, "procs.guardian")) == 2, 5, 0.01)
        assert t.stop() == 0, t.stderr()
        cap = open_capture(out)
        assert cap.complete, cap.problems
        counts = cap.manifest["counts"]
        on_disk = cap.events.select(pl.len()).collect().item()
        assert on_disk + counts["lost_events"] + counts["lost_inflight"] + counts["lost_writer_behind"] == calls
    assert _state(sleeper.pid) == "S"  # alive and not stopped
