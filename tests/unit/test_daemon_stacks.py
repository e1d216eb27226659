"""The daemon's window with Python stacks (pasta_trace.daemon.stacks), on
records made here and a clock the test moves: a stack is kept while an event
held refers to it, retired (out of BPF's py_seen) when none does, brought back
by an event drained during its grace, forgotten after it; the byte budget
counts the stacks; a snapshot has the stacks of its events, of one process
with --pid."""

from __future__ import annotations

import numpy as np

from pasta_trace import schema
from pasta_trace.daemon import stacks as st
from pasta_trace.daemon import window
from pasta_trace.stacks.native import Frame
from test_daemon_window import S, Clock


def records(pid: int, ts: int, stack_ids: list[int]) -> np.ndarray:
    recs = np.zeros(len(stack_ids), schema.HOST_EVENT.dtype)
    recs["pid"] = pid
    recs["ts_ns"] = ts
    recs["stack_id"] = stack_ids
    return recs


def frames(name: str, n: int = 2) -> list[Frame]:
    return [Frame("python", f"{name}{i}", "/w.py", 10 + i, None, 0x1000 + i) for i in range(n)]


class Store:
    """A StackStore whose retire/forget calls are recorded (as StackCollector.forget_stacks gets them),
    and a window of ``seconds`` and ``budget`` bytes that holds it, on a clock of the test's."""

    def __init__(self, seconds: float, budget: int = 1 << 30) -> None:
        self.clock = Clock()
        self.retired: list[tuple[int, int]] = []
        self.forgotten: list[tuple[int, int]] = []
        self.store = st.StackStore(self.retired.extend, self.forgotten.extend, clock=self.clock)
        self.window = window.Window(seconds, budget, schema.HOST_NAME.dtype, clock=self.clock, stacks=self.store)


def test_a_stack_leaves_with_its_last_event_after_a_grace() -> None:
    s = Store(2.0)
    clock, w = s.clock, s.window
    s.store.add(7, 0xA, frames("a"), False)
    s.store.add(7, 0xB, frames("b"), True)
    w.add(records(7, clock.now, [0xA, 0xB, 0]))
    for _ in range(12):  # 3 s of B alone, drained each quarter second
        clock.now += S // 4
        w.add(records(7, clock.now, [0xB]))
    # the segment of A's event left at 102.25 s: A was retired then, and forgotten once its grace passed
    assert (s.retired, s.forgotten) == ([(7, 0xA)], [(7, 0xA)])
    assert len(s.store) == 1
    snap = w.snapshot()
    assert snap.stacks.frame().rows() == [
        (7, 0xB, 0, "python", "b0", "/w.py", 10, None, 0x1000, True),
        (7, 0xB, 1, "python", "b1", "/w.py", 11, None, 0x1001, True)]
    # BPF sends A again with its next event: a new stack, kept again
    s.store.add(7, 0xA, frames("a"), False)
    clock.now += S // 4
    w.add(records(7, clock.now, [0xA]))
    clock.now += S
    w.age()
    assert sorted(k for k in w.snapshot().stacks.stacks) == [(7, 0xA), (7, 0xB)]
    assert s.forgotten == [(7, 0xA)]


def test_an_event_drained_during_the_grace_brings_its_stack_back() -> None:
    s = Store(1.0)
    clock, w = s.clock, s.window
    s.store.add(7, 0xA, frames("a"), False)
    w.add(records(7, clock.now, [0xA]))
    clock.now += S // 4
    w.add(records(7, clock.now, [0]))
    clock.now += S + S // 8  # A's segment leaves: A retired
    w.age()
    assert s.retired == [(7, 0xA)] and s.forgotten == []
    # an event written before the retirement, drained after it, refers to A: it stays
    clock.now += int(st.GRACE_S * S) // 2
    w.add(records(7, clock.now - S // 2, [0xA]))
    clock.now += int(st.GRACE_S * S)
    w.age()
    assert s.forgotten == [] and [k for k in w.snapshot().stacks.stacks] == [(7, 0xA)]


def test_the_byte_budget_counts_the_stacks() -> None:
    size = schema.HOST_EVENT.dtype.itemsize
    budget = 1000 * size
    s = Store(60.0, budget)
    clock, w = s.clock, s.window
    for i in range(40):
        s.store.add(7, i + 1, frames(f"f{i}_" + "x" * 200, 10), False)
    # per frame: FRAME_BYTES, "/w.py", and the function: "f<i>_", 200 x and the frame's digit
    assert s.store.bytes == 40 * 10 * (st.FRAME_BYTES + 5 + 200 + 1) + 10 * (10 * 3 + 30 * 4) == 131_900
    for i in range(400):  # 100 events a drain, each of the 40 stacks
        clock.now += S // 400
        w.add(records(7, clock.now, [1 + (j % 40) for j in range(100)]))
    snap = w.snapshot()
    assert snap.held * size + s.store.bytes <= budget
    assert snap.held * size > budget - s.store.bytes - budget // window.SEGMENTS_PER_BUDGET - 100 * size


def test_a_one_process_snapshot_has_its_stacks_only() -> None:
    s = Store(60.0)
    clock, w = s.clock, s.window
    s.store.add(7, 0xA, frames("a"), False)
    s.store.add(8, 0xC, frames("c"), False)
    w.add(np.concatenate([records(7, clock.now, [0xA]), records(8, clock.now, [0xC])]))
    assert list(w.snapshot(8).stacks.stacks) == [(8, 0xC)]
    assert sorted(w.snapshot().stacks.stacks) == [(7, 0xA), (8, 0xC)]
    # without stacks the window keeps none and a snapshot says so
    plain = window.Window(60.0, 1 << 30, schema.HOST_NAME.dtype, clock=clock)
    plain.add(records(7, clock.now, [0xA]))
    assert plain.snapshot().stacks is None
