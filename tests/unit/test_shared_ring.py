"""The ring shared by the tracer and its events writer process
(capture.output.shared_ring): whole records, wrapping at the end, bounded by what
the writer released."""

from __future__ import annotations

import os

import numpy as np
import pytest

from pasta_trace import schema
from pasta_trace.capture.output.shared_ring import HEAD_BYTES, MAX_BYTES, MIN_BYTES, SharedRing, ring_bytes

REC = schema.HOST_EVENT.dtype


def _recs(first: int, n: int) -> np.ndarray:
    r = np.zeros(n, REC)
    r["ts_ns"] = np.arange(first, first + n)
    return r


def _ts(ring: SharedRing, parts) -> list[int]:
    return [t for pos, nbytes in parts for t in ring.view(pos, nbytes, REC)["ts_ns"].tolist()]


def test_records_wrap_whole_and_the_bytes_skipped_hold_nothing():
    size = REC.itemsize
    ring = SharedRing.create(5 * size + size // 2)  # 5 records fit, and half of one more at the end
    assert ring.put(_recs(0, 4)) == (4, [(0, 4 * size)])
    ring.release(4 * size)
    n, parts = ring.put(_recs(4, 3))
    # one record before the end, the half record's bytes skipped, two from the start
    assert n == 3 and parts == [(4 * size, size), (ring.capacity, 2 * size)]
    assert _ts(ring, parts) == [4, 5, 6]
    assert ring.used == 3 * size


def test_what_does_not_fit_is_not_put_and_release_makes_room():
    size = REC.itemsize
    ring = SharedRing.create(4 * size)
    assert ring.put(_recs(0, 6))[0] == 4  # the oldest 4
    assert ring.put(_recs(6, 1)) == (0, [])
    ring.release(2 * size)
    n, parts = ring.put(_recs(6, 3))
    assert n == 2 and _ts(ring, parts) == [6, 7]
    ring.release(size)  # an older position than released already: nothing changes
    assert ring.used == 4 * size


def test_a_second_mapping_sees_the_records_and_the_release(tmp_path):
    """As the writer process does: the same memfd, mapped again."""
    size = REC.itemsize
    tracer = SharedRing.create(8 * size)
    writer = SharedRing(os.dup(tracer.fd))
    n, parts = tracer.put(_recs(10, 5))
    assert _ts(writer, parts) == list(range(10, 15))
    writer.release(parts[-1][0] + parts[-1][1])
    assert tracer.used == 0
    assert os.fstat(tracer.fd).st_size == HEAD_BYTES + 8 * size


@pytest.mark.parametrize("avail_kib, expected", [
    (64 << 10, MIN_BYTES),  # 64 MiB available: an eighth is below the floor
    (4 << 20, 512 << 20),
    (64 << 20, MAX_BYTES),  # 64 GiB available: the cap
])
def test_the_default_size_is_an_eighth_of_the_memory_available(tmp_path, avail_kib, expected):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text(f"MemTotal: {avail_kib * 2} kB\nMemAvailable: {avail_kib} kB\n")
    assert ring_bytes(str(meminfo)) == expected
    assert ring_bytes(str(tmp_path / "missing")) == MIN_BYTES


@pytest.mark.parametrize("populate", [True, False], ids=["madvise", "read each page"])
def test_prefault_makes_the_pages_ahead_resident_without_changing_them(populate):
    from pasta_trace.capture.output import shared_ring

    size = REC.itemsize
    tracer = SharedRing.create(4 * shared_ring.PREFAULT_AHEAD_BYTES)
    writer = SharedRing(os.dup(tracer.fd))
    writer._populate = populate  # False: as on a kernel without MADV_POPULATE_WRITE
    n, parts = tracer.put(_recs(0, 100))
    before = _shmem_resident()
    writer.prefault(0)
    assert writer._ready == shared_ring.PREFAULT_AHEAD_BYTES
    # the writer's mapping now holds the first 64 MiB (less the pages the tracer's put made already)
    assert _shmem_resident() - before >= shared_ring.PREFAULT_AHEAD_BYTES - 100 * size - 4096
    assert _ts(writer, parts) == list(range(100))  # read, not overwritten
    writer.prefault(3 * shared_ring.PREFAULT_AHEAD_BYTES + size)  # past the end: the pages from the start again
    assert writer._ready == 4 * shared_ring.PREFAULT_AHEAD_BYTES + size
    kernel = tuple(int(x) for x in os.uname().release.split("-")[0].split(".")[:2])
    assert writer._populate is (populate and kernel >= (5, 14))  # 5.14+: the one madvise call did it
    assert _ts(writer, parts) == list(range(100))


def _shmem_resident() -> int:
    for line in open("/proc/self/status"):
        if line.startswith("RssShmem:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no RssShmem in /proc/self/status")


@pytest.fixture
def small_region(monkeypatch):
    from pasta_trace.capture.output import shared_ring

    monkeypatch.setattr(shared_ring, "REGION_BYTES", 64 << 10)
    monkeypatch.setattr(shared_ring, "PREFAULT_AHEAD_BYTES", 16 << 10)
    return shared_ring


def test_a_flow_the_writer_keeps_up_with_restarts_at_the_rings_start(small_region):
    size = REC.itemsize
    ring = SharedRing.create(1 << 20)
    batch = 100  # 17,600 bytes
    first = 0
    while ring._end % ring.capacity < small_region.REGION_BYTES:
        n, parts = ring.put(_recs(first, batch))
        assert n == batch and all(nbytes for _, nbytes in parts)
        ring.release(parts[-1][0] + parts[-1][1])  # the writer keeps up
        first += batch
    end = ring._end
    n, parts = ring.put(_recs(first, batch))
    # from the ring's next start (offset 0); the bytes skipped are not in use
    assert parts == [(ring.capacity, batch * size)] and end < ring.capacity
    assert _ts(ring, parts) == list(range(first, first + batch))
    assert ring.used == batch * size


def test_no_restart_while_records_wait():
    size = REC.itemsize
    ring = SharedRing.create(1 << 20)
    from pasta_trace.capture.output import shared_ring

    n, parts = ring.put(_recs(0, 10))
    assert ring.trim() == 0  # unwritten records: nothing moves, nothing is given back
    assert ring.put(_recs(10, 1))[1] == [(10 * size, size)]
    assert shared_ring.REGION_BYTES == 256 << 20


def _allocated(ring: SharedRing) -> int:
    return os.fstat(ring.fd).st_blocks * 512


def test_trim_gives_back_the_pages_a_flood_used_once_all_is_written(small_region):
    size = REC.itemsize
    ring = SharedRing.create(1 << 20)
    n, parts = ring.put(_recs(0, 5000))  # 840,000 bytes: a flood far past the region
    assert n == 5000 and _allocated(ring) >= 5000 * size
    assert ring.trim() == 0  # not yet written
    ring.release(parts[-1][0] + parts[-1][1])
    keep = small_region.REGION_BYTES + small_region.PREFAULT_AHEAD_BYTES
    assert ring.trim() == ring.capacity - keep
    assert _allocated(ring) <= HEAD_BYTES + keep
    assert ring.trim() == 0  # nothing more to give back
    n, parts = ring.put(_recs(5000, 3))
    assert parts == [(ring.capacity, 3 * size)] and _ts(ring, parts) == [5000, 5001, 5002]


def test_a_flood_the_writer_lags_goes_back_to_the_start_and_past_what_waits(small_region):
    """Behind by a few batches, the writer releases the ring's start: the
    tracer puts there again (pages that exist), and where it reaches records
    still waiting, goes on past them; every record is read back as it was put."""
    size = REC.itemsize
    tracer = SharedRing.create(4 << 20)
    writer = SharedRing(os.dup(tracer.fd))
    batch, lag = 50, 6  # 8,400 bytes a batch; the writer 6 batches behind
    waiting, first = [], 0
    for _ in range(400):  # 3.4 MB in all: 52 times the region
        n, parts = tracer.put(_recs(first, batch))
        assert n == batch
        waiting.append((first, parts))
        first += batch
        if len(waiting) > lag:
            at, done = waiting.pop(0)
            assert _ts(writer, done) == list(range(at, at + batch))  # none overwritten
            writer.release(done[-1][0] + done[-1][1])
        assert tracer.used == sum(nbytes for _, p in waiting for _, nbytes in p)
    # the pages used: about the region and what waits, not the 3.4 MB put
    assert tracer._high <= small_region.REGION_BYTES + (lag + 2) * batch * size
    assert os.fstat(tracer.fd).st_blocks * 512 <= HEAD_BYTES + tracer._high + 4096


def test_what_waits_is_never_overwritten_whatever_the_writer_releases():
    """Batches of random sizes, a writer that releases at random, in order:
    every part the writer reads holds the records put there, and a batch is
    cut only when no gap in the ring holds its next record."""
    rng = np.random.default_rng(7)
    size = REC.itemsize
    tracer = SharedRing.create(400 * size + 100)
    writer = SharedRing(os.dup(tracer.fd))
    waiting, first, cut = [], 0, 0
    for _ in range(3000):
        want = int(rng.integers(1, 60))
        n, parts = tracer.put(_recs(first, want))
        if n < want:
            cut += 1
            # every gap (one after each run of waiting records, one at the ring's end) is under a record
            assert tracer.capacity - tracer.used < (len(tracer._runs) + 1) * size
        waiting.extend((first + sum(b for _, b in parts[:i]) // size, p) for i, p in enumerate(parts))
        first += want
        for _ in range(int(rng.integers(0, 3))):  # a part a batch on average: behind at times
            if not waiting:
                break
            at, (pos, nbytes) = waiting.pop(0)
            assert writer.view(pos, nbytes, REC)["ts_ns"].tolist() == list(range(at, at + nbytes // size))
            writer.release(pos + nbytes)
    assert cut > 0  # the writer fell behind at times: the test reached a full ring
