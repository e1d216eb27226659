"""daemon.pacing: how long the daemon's loop sleeps, and when its watcher runs, on real descriptors."""

from __future__ import annotations

import os
import time
from types import SimpleNamespace

import pytest

from pasta_trace import schema
from pasta_trace.capture.output.drain import POLL_INTERVAL_S
from pasta_trace.daemon.pacing import FLOOD_RATE, IDLE_POLL_MAX_S, WATCH_S, Pacer, idle_poll_s

STRIDE = 176  # a HOST_EVENT of 168 bytes and its 8-byte ring header


def ring(size: int) -> SimpleNamespace:
    """What idle_poll_s reads of a RingBuffer: its data size and record dtype."""
    return SimpleNamespace(size=size, dtype=schema.HOST_EVENT.dtype)


def test_the_idle_sleep_is_what_the_events_ring_holds_at_the_flood_rate():
    assert schema.HOST_EVENT.dtype.itemsize + 8 == STRIDE
    assert idle_poll_s(ring(16 << 20)) == (16 << 20) // STRIDE / FLOOD_RATE  # the default ring: 95,325 events
    assert round(idle_poll_s(ring(16 << 20)), 4) == 0.0477
    assert idle_poll_s(ring(4 << 20)) == (4 << 20) // STRIDE / FLOOD_RATE
    assert idle_poll_s(ring(1 << 30)) == IDLE_POLL_MAX_S  # a big ring: the daemon still looks 10 times a second
    assert idle_poll_s(ring(1 << 20)) == POLL_INTERVAL_S  # a small one: never less than a busy drain's pace


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


def test_the_drain_pace_is_fast_while_events_come_and_slow_once_none_did():
    p = Pacer(None, idle_s=0.047)
    assert p.tick(0) == POLL_INTERVAL_S  # the first turn: nothing known yet
    assert p.tick(0) == 0.047  # a drain with no event
    assert p.tick(0) == 0.047
    assert p.tick(1000) == POLL_INTERVAL_S  # events came: every POLL_INTERVAL_S
    assert p.tick(2500) == POLL_INTERVAL_S
    assert p.tick(2500) == 0.047
