"""The NCCL tools on hand-made captures, every expected number derived by hand:
three ranks on one communicator, a straggler at each collective, the third
collective never entered by rank 2; and a rank whose grouped and single
collectives launched kernels with device timing."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from pasta_trace import schema
from pasta_trace.read import Capture
from pasta_trace.tools import REGISTRY

COMM, COMM_ID, END = 0xA, 0x77, 10_000
PIDS = (10, 11, 12)  # ranks 0, 1, 2


def frame(rows: list[dict], sch: dict) -> pl.LazyFrame:
    return pl.DataFrame([{c: r.get(c) for c in sch} for r in rows], schema={
        c: (pl.String if isinstance(t, (pl.Enum, pl.Categorical)) else t) for c, t in sch.items()}).cast(sch).lazy()


def call(pid: int, ts: int, api: str = "ncclAllReduce", *, seq: int | None = None, ret: int = 0, dur: int = 50,
         size: int = 4096, kind: str = "collective", **cols) -> dict:
    return {"pid": pid, "tid": pid, "ts_ns": ts, "dur_ns": dur, "api": api, "kind": kind, "layer": "nccl", "ret": ret,
            "communicator": COMM if kind in ("collective", "p2p") else None, "seq": seq,
            "size": size if kind in ("collective", "p2p") else None, "count": size // 4, "datatype": "float32", **cols}


def capture(events: list[dict], kernels: list[dict] | None = None, nranks: int = 3) -> Capture:
    comms = [{"host": "h", "pid": p, "communicator": COMM, "comm_id": COMM_ID, "rank": r, "nranks": nranks,
              "api": "ncclCommInitRank", "ts_ns": 1, "end_ts_ns": None} for r, p in enumerate(PIDS)]
    empty = lambda name: schema.empty_frame(name).lazy()  # noqa: E731
    merged = {"kernels": frame(kernels or [], schema.TIMELINE_FRAMES["kernels"])}
    return Capture(Path("/nonexistent"), {"clock": {"start_ns": 0, "end_ns": END}},
                   frame(events, schema.EVENTS_SCHEMA), empty(schema.NAMES_SCHEMA), empty(schema.PROCESSES_SCHEMA),
                   empty(schema.LIBRARIES_SCHEMA), None, merged=merged,
                   communicators=frame(comms, schema.COMMUNICATORS_SCHEMA))


@pytest.fixture(scope="module")
def ranks() -> Capture:
    r0, r1, r2 = PIDS
    return capture([
        call(r0, 1000, seq=0), call(r1, 1100, seq=0), call(r2, 1300, seq=0),
        call(r1, 2000, seq=1, dur=70), call(r2, 2050, seq=1), call(r0, 5000, seq=1),
        call(r0, 5500, "ncclBroadcast", ret=4),  # failed: no number, no bytes
        call(r0, 6000, seq=2), call(r1, 6100, seq=2),  # rank 2 never enters seq 2
        call(r1, 7000, "ncclSend", kind="p2p", size=64),
        call(r2, 7000, "ncclAllReduce", seq=0) | {"communicator": 0xDEAD},  # a communicator made before the capture
    ])


def rows(name: str, cap: Capture, cols: list[str] | None = None) -> list[tuple]:
    df = REGISTRY[name].compute(cap)
    return df.select(cols or df.columns).rows()


def test_collectives_per_rank(ranks: Capture) -> None:
    cols = ["comm_id", "rank", "nranks", "pid", "api", "calls", "failed", "bytes", "call_ns", "max_call_ns",
            "first_ts_ns", "last_ts_ns"]
    assert rows("collectives", ranks, cols) == [
        (COMM_ID, 0, 3, 10, "ncclAllReduce", 3, 0, 3 * 4096, 150, 50, 1000, 6000),
        (COMM_ID, 0, 3, 10, "ncclBroadcast", 1, 1, 0, 50, 50, 5500, 5500),
        (COMM_ID, 1, 3, 11, "ncclAllReduce", 3, 0, 3 * 4096, 170, 70, 1100, 6100),
        (COMM_ID, 1, 3, 11, "ncclSend", 1, 0, 64, 50, 50, 7000, 7000),
        (COMM_ID, 2, 3, 12, "ncclAllReduce", 2, 0, 2 * 4096, 100, 50, 1300, 2050),
        (None, None, None, 12, "ncclAllReduce", 1, 0, 4096, 50, 50, 7000, 7000),
    ]


def test_stragglers_name_the_last_rank_of_each_collective(ranks: Capture) -> None:
    assert rows("stragglers", ranks) == [
        # comm_id, seq, api, ranks, first entry, last rank, its pid, late (vs the one before), spread
        (COMM_ID, 0, "ncclAllReduce", 3, 1000, 2, 12, 200, 300),
        (COMM_ID, 1, "ncclAllReduce", 3, 2000, 0, 10, 2950, 3000),
        (COMM_ID, 2, "ncclAllReduce", 2, 6000, 1, 11, 100, 100),
    ]


def test_straggler_ranks_sum_the_waits_each_rank_caused(ranks: Capture) -> None:
    assert rows("straggler_ranks", ranks) == [
        (COMM_ID, 0, 10, 3, 1, 2950, 2950, 1),
        (COMM_ID, 2, 12, 3, 1, 200, 200, 0),
        (COMM_ID, 1, 11, 3, 1, 100, 100, 2),
    ]


def test_hangs_name_the_ranks_that_never_entered(ranks: Capture) -> None:
    assert rows("hangs", ranks) == [(COMM_ID, 2, "ncclAllReduce", 3, 2, 1, "2", "12", 6000, END - 6000)]


def test_bandwidth_of_single_and_grouped_collectives() -> None:
    pid = PIDS[0]
    kernels = [
        # (launch ts, gpu start, gpu end): one kernel for the group, one for the single AllReduce,
        # and one launched after the single call returned (not its own)
        {"pid": pid, "tid": pid, "ts_ns": 150, "gpu_start_ns": 1000, "gpu_end_ns": 1500, "launch_seq": 0},
        {"pid": pid, "tid": pid, "ts_ns": 310, "gpu_start_ns": 2000, "gpu_end_ns": 2100, "launch_seq": 1},
        {"pid": pid, "tid": pid, "ts_ns": 390, "gpu_start_ns": 2200, "gpu_end_ns": 9000, "launch_seq": 2},
    ]
    cap = capture([
        call(pid, 100, "ncclGroupStart", kind="group", dur=5),
        call(pid, 110, "ncclAllGather", seq=0, size=1024),
        call(pid, 120, "ncclAllReduce", seq=1, size=2048, op="sum"),
        call(pid, 130, "ncclGroupEnd", kind="group", dur=50),
        call(pid, 300, "ncclAllReduce", seq=2, size=2048, dur=40),
        call(pid, 500, "ncclBroadcast", seq=3, size=2048),  # no kernel with device timing: no row
    ], kernels, nranks=4)
    got = rows("collective_bandwidth", cap, ["seq", "api", "bytes", "gpu_ns", "kernels", "group_ops", "algbw",
                                              "busbw"])
    assert got == [
        # AllGather: 1024 B x 4 ranks over the group's 500 ns; bus factor 3/4
        (0, "ncclAllGather", 4096, 500, 1, 2, 4096 / 500, 4096 / 500 * 3 / 4),
        # AllReduce: 2048 B; bus factor 2 x 3/4
        (1, "ncclAllReduce", 2048, 500, 1, 2, 2048 / 500, 2048 / 500 * 1.5),
        (2, "ncclAllReduce", 2048, 100, 1, 1, 2048 / 100, 2048 / 100 * 1.5),
    ]


def test_key_findings_name_the_hang_and_the_straggler(ranks: Capture) -> None:
    from pasta_trace.tools.findings import key_findings
    from pasta_trace.tools.run import ToolResult

    results = [ToolResult(REGISTRY[n], REGISTRY[n].compute(ranks)) for n in ("hangs", "straggler_ranks")]
    assert [(f.topic, f.line()) for f in key_findings(results, 0)] == [
        ("hangs", "1 collective not entered by every rank; first: ncclAllReduce #2 of communicator 0x77, "
                  "rank 2 (pid 12) never came, the others waited 4 µs"),
        ("straggler", "rank 0 (pid 10) entered 1 of 3 collectives last, 2.95 µs of waiting caused; worst #1 (2.95 µs)"),
    ]
    empty = [ToolResult(REGISTRY[n], REGISTRY[n].compute(ranks).clear()) for n in ("hangs", "straggler_ranks")]
    assert key_findings(empty, 0) == []  # captures without NCCL say nothing about it
