"""daemon.pacing: how long the daemon's loop sleeps, and when its watcher runs, on real descriptors."""

from __future__ import annotations

import os
import time
from types import SimpleNamespace

import pytest

from pasta_trace import schema
from pasta_trace.capture.output.drain import POLL_INTERVAL_S
from pasta_trace.daemon.pacing import FLOOD_RATE, IDLE_POLL_MAX_S, RATE_MARGIN, WATCH_S, Pacer, ring_records

STRIDE = 176  # a HOST_EVENT of 168 bytes and its 8-byte ring header


def ring(size: int) -> SimpleNamespace:
    """What ring_records reads of a RingBuffer: its data size and record dtype."""
    return SimpleNamespace(size=size, dtype=schema.HOST_EVENT.dtype)


def test_the_ring_holds_its_size_in_strides():
    assert schema.HOST_EVENT.dtype.itemsize + 8 == STRIDE
    assert ring_records(ring(16 << 20)) == 95_325  # the default ring
    assert ring_records(ring(4 << 20)) == 23_831


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def pipes():
    made = [os.pipe() for _ in range(2)]
    yield made
    for r, w in made:
        os.close(r)
        os.close(w)


def test_the_watcher_runs_when_its_ring_is_readable_or_every_watch_s(pipes):
    (watch, watch_w), (control, control_w) = pipes
    clock = Clock()
    p = Pacer(watch, control, clock=clock)
    assert p.watch_due()  # the first turn looks
    assert p.wait(0) == set()
    assert not p.watch_due()
    clock.t += WATCH_S - 0.001
    assert not p.watch_due()
    clock.t += 0.001
    assert p.watch_due()  # WATCH_S since it last ran
    assert not p.watch_due()
    os.write(watch_w, b"x")  # a discover record waiting
    assert p.wait(1.0) == {watch}
    assert p.watch_due()
    os.write(control_w, b"x")  # a peer: the watcher need not run for it
    assert p.wait(1.0) == {watch, control}
    os.read(watch, 1)
    assert p.wait(1.0) == {control}
    assert not p.watch_due()


def test_a_wait_ends_at_its_timeout_or_at_once_when_a_descriptor_is_readable(pipes):
    (watch, _), (control, control_w) = pipes
    p = Pacer(watch, control)
    t = time.monotonic()
    assert p.wait(0.05) == set()
    assert time.monotonic() - t >= 0.045
    os.write(control_w, b"x")
    t = time.monotonic()
    assert p.wait(10.0) == {control}
    assert time.monotonic() - t < 5.0  # at once, not after 10 s
    assert p.ready == {control}


def test_the_next_drain_comes_before_the_ring_can_fill():
    clock = Clock()
    held = ring_records(ring(16 << 20))
    p = Pacer(None, held=held, clock=clock)
    idle = held / FLOOD_RATE
    assert round(idle, 4) == 0.0477
    assert p.tick(0) == idle  # the first turn: no rate known, the ring must last at FLOOD_RATE
    clock.t += idle
    assert p.tick(0) == idle  # idle
    clock.t += idle
    assert p.tick(4_766) == idle  # 100,000 events/s: FLOOD_RATE is the faster
    clock.t += 0.02
    # 1 M/s: a quarter of the ring a drain (the clock's sums are floats)
    assert p.tick(4_766 + 20_000) == pytest.approx(held / (RATE_MARGIN * 1_000_000), rel=1e-9)
    clock.t += 0.01
    assert p.tick(4_766 + 20_000 + 50_000) == POLL_INTERVAL_S  # 5 M/s: never faster than a capture's drain
    clock.t += 0.001  # a turn woken early (a peer, a stop): its rate over POLL_INTERVAL_S at least
    assert p.tick(4_766 + 70_000 + 1_000) == idle
    clock.t += idle
    assert p.tick(4_766 + 71_000) == idle


def test_a_big_ring_is_still_drained_ten_times_a_second_and_a_small_one_at_a_captures_pace():
    assert Pacer(None, held=ring_records(ring(1 << 30))).tick(0) == IDLE_POLL_MAX_S
    assert Pacer(None, held=ring_records(ring(1 << 20))).tick(0) == POLL_INTERVAL_S
