"""Fuzz the device file reader: truncation at every byte, bit flips, random bytes.

The promise under test: no exception ever escapes ``read_device_files``; every
record that lies wholly before the damage is read exactly; where the reader
stopped is said in ``problems``.  Seeded, so a failure names its case.
"""

from __future__ import annotations

import bisect
import time

import numpy as np
import polars as pl
import pytest
from test_device_roundtrip import write_sample

from pasta_trace import schema
from pasta_trace.device import read_device_file, read_device_files
from pasta_trace.errors import FormatError

HEADER = schema.DEV_FILE_HEADER.size


@pytest.fixture(scope="module")
def sample(tmp_path_factory):
    s = write_sample(tmp_path_factory.mktemp("fuzz") / "ref.bin", per_type=1)
    return s, s.path.read_bytes()


@pytest.fixture(scope="module")
def prefixes(sample):
    """Frames read from the file cut cleanly after each record: what must survive damage further on."""
    s, data = sample
    out = {}
    for b in s.boundaries:
        p = s.path.with_name(f"prefix-{b}.bin")
        p.write_bytes(data[:b])
        d = read_device_file(p)
        assert d.problems == []
        out[b] = d.frames
    return out


def _clean_prefix(boundaries: list[int], offset: int) -> int:
    """The last record boundary at or before ``offset``."""
    return boundaries[bisect.bisect_right(boundaries, offset) - 1]


def _assert_starts_with(got: dict[str, pl.DataFrame], prefix: dict[str, pl.DataFrame], case: str) -> None:
    for k, want in prefix.items():
        assert got[k].schema == want.schema, (case, k)
        assert got[k].head(want.height).equals(want), f"{case}: {k}\n{got[k]}\n{want}"


def test_prefix_frames_grow_record_by_record(sample, prefixes):
    s, _ = sample
    total = [sum(f.height for f in prefixes[b].values()) for b in s.boundaries]
    # strings add no rows; every other record adds at least one
    assert total[:4] == [0, 0, 0, 0] and all(b > a for a, b in zip(total[4:], total[5:]))
    for k, e in s.expected.items():
        assert prefixes[s.boundaries[-1]][k].equals(e)


def test_truncation_at_every_byte(sample, prefixes, tmp_path):
    s, data = sample
    p = tmp_path / "cut.bin"
    for cut in range(len(data) + 1):
        p.write_bytes(data[:cut])
        d = read_device_files([p])
        if cut < HEADER:
            assert len(d.problems) == 1 and d.problems[0].startswith(f"{p}: "), cut
            assert all(f.height == 0 for f in d.frames.values())
            continue
        b = _clean_prefix(s.boundaries, cut)
        for k, want in prefixes[b].items():
            assert d.frames[k].equals(want), (cut, k)
        if cut == b:
            assert d.problems == [], cut
        else:
            assert d.problems == [f"{p}: stopped at byte {b} of {cut}: " + d.problems[0].split(": ", 2)[2]], cut
            assert d.problems[0].split(f"of {cut}: ")[1].startswith(
                ("truncated record header", "record of ")
            ), (cut, d.problems)


def _damaged_cases(data: bytes, seed: int, n: int, mode: str):
    rng = np.random.default_rng(seed)
    for i in range(n):
        buf = bytearray(data)
        if mode == "flip":
            pos = int(rng.integers(HEADER, len(buf)))
            buf[pos] ^= 1 << int(rng.integers(0, 8))
            first = pos
        else:
            pos = int(rng.integers(HEADER, len(buf)))
            k = int(rng.integers(1, 40))
            buf[pos : pos + k] = rng.bytes(k)
            first = pos
        yield f"{mode} seed={seed} case={i} at {first}", bytes(buf[: len(data)]), first


@pytest.mark.parametrize("mode, seed, n", [("flip", 1, 2000), ("bytes", 2, 2000)])
def test_corruption_keeps_every_record_before_the_damage(sample, prefixes, tmp_path, mode, seed, n):
    s, data = sample
    p = tmp_path / "bad.bin"
    t0 = time.perf_counter()
    changed = 0
    for case, buf, first in _damaged_cases(data, seed, n, mode):
        if buf == data:
            continue
        changed += 1
        p.write_bytes(buf)
        d = read_device_files([p])
        assert set(d.frames) == set(schema.DEVICE_FRAMES), case
        _assert_starts_with(d.frames, prefixes[_clean_prefix(s.boundaries, first)], case)
        assert all(line.startswith(f"{p}: ") for line in d.problems), case
    assert changed >= n * 0.99
    assert time.perf_counter() - t0 < 120  # bounded: a loop in the reader would blow this


def test_file_header_corruption_never_raises_from_read_device_files(sample, tmp_path):
    s, data = sample
    p = tmp_path / "hdr.bin"
    refused = 0
    hs = schema.DEV_FILE_HEADER.offsets()["header_size"]
    for pos in range(HEADER):
        for bit in range(8):
            buf = bytearray(data)
            buf[pos] ^= 1 << bit
            p.write_bytes(bytes(buf))
            d = read_device_files([p])
            try:
                read_device_file(p)
            except FormatError as e:
                refused += 1
                assert d.problems == [e.one_line()] and all(f.height == 0 for f in d.frames.values())
                continue
            rows = sum(f.height for f in d.frames.values())
            if hs <= pos < hs + 4 and d.problems:
                continue  # a plausible header_size that starts the walk mid-record: damage, said
            if hs <= pos < hs + 4 and (64 ^ (1 << (8 * (pos - hs) + bit))) in s.boundaries:
                continue  # one that lands on a record boundary reads as a longer header (a later minor's): no damage
            # other fields change values (pid, clocks, backend), never what is read
            assert rows == sum(f.height for f in s.expected.values()) and d.problems == [], (pos, bit)
    # every magic bit, the high bits of ver_major, header_size out of range, pid beyond 32 bits
    assert refused >= 32 + 15
