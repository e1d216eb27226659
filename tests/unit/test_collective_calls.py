"""merge.collective_calls: each call gets the communicator alive when it was
made, whether its handle was made once (one join) or reused after a destroy."""

from __future__ import annotations

from test_tools_nccl import call, frame

from pasta_trace import merge, schema


def comm(pid: int, handle: int, comm_id: int, made: int, end: int | None) -> dict:
    return {"host": "h", "pid": pid, "communicator": handle, "comm_id": comm_id, "rank": 0, "nranks": 2,
            "api": "ncclCommInitRank", "ts_ns": made, "end_ts_ns": end}


def calls(comms: list[dict]) -> list[tuple]:
    events = frame([call(1, 100, seq=0), call(1, 250, seq=1), call(1, 400, seq=0), call(2, 100, seq=0)],
                   schema.EVENTS_SCHEMA).with_columns(communicator=0xA)
    got = merge.calls_on_communicators(events, frame(comms, schema.COMMUNICATORS_SCHEMA))
    return got.select("pid", "ts_ns", "comm_id").sort("pid", "ts_ns").collect().rows()


def test_made_once():
    # pid 1's communicator destroyed at 300: its later call has none; pid 2 made none
    assert calls([comm(1, 0xA, 7, 50, 300)]) == [(1, 100, 7), (1, 250, 7), (1, 400, None), (2, 100, None)]


def test_handle_reused_after_destroy():
    # the same handle made again at 350 for another communicator
    assert calls([comm(1, 0xA, 7, 50, 200), comm(1, 0xA, 8, 350, None)]) == [
        (1, 100, 7), (1, 250, None), (1, 400, 8), (2, 100, None)]


def test_ranks_in_at_the_same_ns_name_the_highest():
    """Whatever the row order (Dask partitions differ from one Polars frame), the same last rank."""
    from test_tools_nccl import PIDS, capture

    from pasta_trace.tools.nccl import stragglers

    r0, r1, r2 = PIDS
    for order in ([call(r0, 1000, seq=0), call(r2, 1300, seq=0), call(r1, 1300, seq=0)],
                  [call(r1, 1300, seq=0), call(r2, 1300, seq=0), call(r0, 1000, seq=0)]):
        assert stragglers(capture(order)).select("last_rank", "last_pid", "late_ns").rows() == [(2, r2, 0)]
