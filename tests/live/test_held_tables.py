"""The probes' per-process tables hold nothing of a process once it is gone,
and a full table is a counted loss: streams under capture (bpf/pasta.h,
`capturing` and its live count `capture_n`, and `capture_events`, the events
recorded under capture) and NCCL communicators' comm_ids
(bpf/nccl.bpf.c, `pt_nccl_ids`), both cleared by discover.bpf.c at the
process's exit.  Real uprobes on the stub libcuda.so.1 and libnccl.so.2, a
real program (tests/fixtures/held_tables.c) that begins captures and makes
communicators and exits without ending or destroying any."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import build
import numpy as np
import pytest

from pasta_run import run_pasta, wait_for_file
from pasta_trace import schema
from pasta_trace.capture.bpf.ringbuf import open_table
from pasta_trace.probes import attach, catalog, program
from pasta_trace.read import open_capture

pytestmark = pytest.mark.live

APIS = ("cuStreamBeginCapture_v2", "cuLaunchKernel", "cuEventRecord", "ncclGetUniqueId", "ncclCommInitRank", "ncclCommSplit",
        "ncclCommFinalize", "ncclCommDestroy", "ncclCommAbort")
SLOTS, COMMS = 8, 32  # PT_CAPTURE_SLOTS, PT_NCCL_COMMS: what one process may hold
FIRST, OTHER = 0x1000, 0x9000  # held_tables.c: the first stream it captures, and one it never captures
EVENT = 0x5000  # held_tables.c: the event it records on FIRST


@pytest.fixture(scope="module")
def held_tables(build_dir: Path) -> Path:
    here = Path(build.__file__).parent
    return build._compile(build_dir / "held_tables", [here / "held_tables.c"], [f"-I{here}", "-ldl"],
                          deps=[here / "ready_file.h"])


class Held:
    """One run of held_tables, in the pid filter of ``b`` before its first call."""

    def __init__(self, b, exe: Path, libs: tuple[Path, Path], streams: int, comms: int, d: Path, freed: int = 0):
        d.mkdir()
        self.dir = d
        self.proc = subprocess.Popen([str(exe), *map(str, libs), str(streams), str(comms), str(d), str(freed)])
        wait_for_file(d / "ready", timeout=30, proc=self.proc)
        self.pid = self.proc.pid
        b["pid_filter"][b["pid_filter"].Key(self.pid)] = b["pid_filter"].Leaf(1)
        (d / "go").touch()
        wait_for_file(d / "held", timeout=30, proc=self.proc)
        self.unique_id = bytes.fromhex((d / "held").read_text())

    def exit(self) -> None:
        (self.dir / "exit").touch()
        assert self.proc.wait(timeout=30) == 0


def _lost(b) -> dict[str, int]:
    t = b["lost"]
    return {loss.name: int(sum(t[t.Key(loss.index)])) for loss in schema.loss_counters("lost")
            if loss.name in ("lost_captures", "lost_comm_ids")}


def _held(b) -> tuple[dict[int, list[tuple[int, int]]], int, dict[int, int]]:
    """pid -> its (stream, capture id) held, capture_n, pid -> communicators held."""
    caps = {k.value: sorted((s, i) for s, i in zip(v.stream, v.id) if i) for k, v in b["capturing"].items()}
    n = b["capture_n"][b["capture_n"].Key(0)].value
    comms = {k.value: sum(1 for i in v.id if i) for k, v in b["pt_nccl_ids"].items()}
    return caps, n, comms


def _events(b) -> dict[int, list[tuple[int, int]]]:
    """pid -> its (event, capture id) held: events recorded under capture."""
    return {k.value: sorted((e, i) for e, i in zip(v.event, v.id) if i) for k, v in b["capture_events"].items()}


def test_exited_processes_leave_nothing_held_and_a_full_table_counts_what_it_could_not_hold(
        in_process, held_tables, cuda_stub, tmp_path, monkeypatch):
    from build import nccl_stub

    nccl = nccl_stub(build.DEFAULT_OUT)
    # one process at a time in each table: the second process's begins and communicators find them full
    monkeypatch.setenv(program.CAPTURE_MAX_ENV, "1")
    monkeypatch.setenv(program.NCCL_IDS_MAX_ENV, "1")
    apis = tuple(a for a in catalog.APIS if a.symbol in APIS)
    b = in_process.bpf(program.build(program.Spec(apis=apis, filter_pids=True)))
    ring = in_process.closing(open_table(b, "events", schema.HOST_EVENT.dtype))
    for lib, family in ((cuda_stub, "cuda"), (nccl, "nccl")):
        r = attach.attach_library(b, str(lib), family, apis)
        assert not r.errors and not r.missing, (r.errors, r.missing)
    libs = (cuda_stub, nccl)

    # A: 10 captures (8 held, 2 counted), 33 communicators (32 held, 1 counted) and a split, counted twice:
    # the stub's ncclCommSplit makes its communicator through its own ncclCommInitRank, probed too
    a = Held(b, held_tables, libs, SLOTS + 2, COMMS + 1, tmp_path / "a")
    # B, while A holds the only entry of each table: every begin and communicator counted (its split's
    # inner ncclCommInitRank too); the split finds no parent and has no comm_id, which is no loss
    bb = Held(b, held_tables, libs, 2, 2, tmp_path / "b")
    caps, n, comms = _held(b)
    begins = 0x1000 + 0x100 * np.arange(SLOTS)
    assert (list(caps), [s for s, _ in caps[a.pid]], n, comms) == ([a.pid], begins.tolist(), SLOTS, {a.pid: COMMS})
    assert _lost(b) == {"lost_captures": 2 + 2, "lost_comm_ids": 3 + 3}

    ev = ring.drain()
    api_id = {s: catalog.API_ID[s] for s in APIS}
    launches = ev[ev["api"] == api_id["cuLaunchKernel"]]
    kinds = {(int(e["pid"]), int(e["stream"])): (int(e["kind"]), int(e["dst"])) for e in launches}
    first_begin = ev[(ev["api"] == api_id["cuStreamBeginCapture_v2"]) & (ev["pid"] == a.pid)
                     & (ev["stream"] == FIRST)]
    # the event recorded on A's capturing stream holds its capture id; B's capture was not held, nor its event
    assert _events(b) == {a.pid: [(EVENT, int(first_begin["ts_ns"][0]))]}
    assert kinds == {(a.pid, FIRST): (schema.Kind.captured, int(first_begin["ts_ns"][0])),
                     (a.pid, OTHER): (schema.Kind.launch, 0),
                     (bb.pid, FIRST): (schema.Kind.launch, 0), (bb.pid, OTHER): (schema.Kind.launch, 0)}
    comm_id = schema.NCCL_SLOTS["comm_id"]
    splits = ev[ev["api"] == api_id["ncclCommSplit"]]
    parent = schema.nccl_comm_id(a.unique_id)
    split_ids = {int(e["pid"]): int(e[comm_id]) for e in splits}
    assert split_ids == {a.pid: ((parent ^ 3) * 0x100000001B3) & (2**64 - 1), bb.pid: 0}

    # gone with their processes: nothing held, capture_n back at 0
    a.exit()
    bb.exit()
    assert (_held(b), _events(b)) == (({}, 0, {}), {})
    # and the room is there again: C's capture and communicator are held, then gone with it
    c = Held(b, held_tables, libs, 1, 1, tmp_path / "c")
    caps, n, comms = _held(b)
    assert ([s for s, _ in caps[c.pid]], n, comms) == ([FIRST], 1, {c.pid: 2})  # its communicator, and its split's (one handle)
    assert list(_events(b)) == [c.pid]
    c.exit()
    assert (_held(b), _events(b)) == (({}, 0, {}), {})
    # ncclCommDestroy and ncclCommAbort free their communicator's slot (its handle may be another's next),
    # ncclCommFinalize does not: of 3 communicators and a split, the 2 destroyed go
    d = Held(b, held_tables, libs, 0, 3, tmp_path / "d", freed=2)
    assert _held(b)[2] == {d.pid: 3 + 1 - 2}
    d.exit()
    assert _held(b) == ({}, 0, {})
    assert _lost(b) == {"lost_captures": 4, "lost_comm_ids": 6}


def test_the_captures_and_communicators_a_process_could_not_hold_are_counted_in_the_manifest(
        require_bpf, held_tables, cuda_stub, tmp_path):
    from build import nccl_stub

    d, cap = tmp_path / "run", tmp_path / "cap"
    d.mkdir()
    (d / "go").touch()
    (d / "exit").touch()
    # one process: 10 captures (2 more than it may hold), 33 communicators and a split (3 more)
    r = run_pasta(["-o", str(cap), "--", str(held_tables), str(cuda_stub), str(nccl_stub(build.DEFAULT_OUT)),
                   str(SLOTS + 2), str(COMMS + 1), str(d)], timeout=300)
    assert r.returncode == 0, r.stderr
    counts = json.loads((cap / "manifest.json").read_text())["counts"]
    assert (counts["lost_captures"], counts["lost_comm_ids"]) == (2, 3)
    assert open_capture(cap).losses == {"lost_captures": 2, "lost_comm_ids": 3}
    assert ("LOST: 2 stream captures: more streams or events were under capture at once than the probes' tables "
            "hold") in r.stderr
    assert "LOST: 3 communicator ids: more communicators were alive at once than the probes' table holds" in r.stderr
