"""The on-GPU aggregation code (gpu_probes/include/gpu_probes/agg.cuh), compiled
for the CPU and run on synthetic access streams, agrees exactly with a plain
Python reference: counters, page histogram (including which pages overflow a
small hash with bounded probing), per-allocation touches, working-set bitmaps
and sampled raw accesses."""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
GP = ROOT / "gpu_probes"
MASK64 = (1 << 64) - 1
HASH_MULT = 0x9E3779B97F4A7C15
MAX_PROBES = 8
GLOBAL, SHARED, LOCAL = 0, 1, 2
READ, WRITE, ATOMIC = 1, 2, 4

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++ to compile the harness")


@pytest.fixture(scope="module")
def harness(tmp_path_factory: pytest.TempPathFactory) -> Path:
    exe = tmp_path_factory.mktemp("agg") / "agg_harness"
    subprocess.run(
        ["g++", "-std=c++17", "-O2", "-Wall", "-Wextra", "-Werror", f"-I{GP / 'include'}", f"-I{GP / 'host'}",
         str(GP / "tests/agg_harness.cpp"), str(GP / "host/slot.cpp"), str(GP / "host/writer.cpp"),
         "-pthread", "-o", str(exe)],
        check=True,
    )
    return exe


@dataclass
class Access:
    space: int
    flags: int
    size: int
    block: int
    warp: int
    time: int
    mask: int
    addrs: list[int]

    def line(self) -> str:
        return (f"access {self.space} {self.flags} {self.size} {self.block} {self.warp} {self.time} {self.mask} "
                + " ".join(map(str, self.addrs)))


@dataclass
class Stream:
    page_shift: int = 16
    capacity: int = 4096
    sample_mode: int = 0
    sample_every: int = 0
    sample_cap: int = 0
    allocs: list[tuple[int, int]] = field(default_factory=list)
    reservations: list[tuple[int, int]] = field(default_factory=list)  # the model ignores them
    events: list[object] = field(default_factory=list)  # Access | ("enter"|"exit"|"instr", int)

    def text(self) -> str:
        out = [f"config {self.page_shift} {self.capacity} {self.sample_mode} {self.sample_every} {self.sample_cap}"]
        out += [f"alloc {b} {s}" for b, s in self.allocs]
        out += [f"reserve {b} {s}" for b, s in self.reservations]
        for e in self.events:
            out.append(e.line() if isinstance(e, Access) else f"{e[0]} {e[1]}")
        return "\n".join(out) + "\n"


def run(harness: Path, stream: Stream, tmp_path: Path) -> dict:
    p = tmp_path / "stream.txt"
    p.write_text(stream.text())
    return json.loads(subprocess.run([str(harness), str(p)], check=True, capture_output=True, text=True).stdout)


def reference(st: Stream) -> dict:
    """Plain Python model of agg.cuh, one warp-level access at a time."""
    allocs = sorted(st.allocs)
    words, first_word = 0, []
    for b, s in allocs:
        first_word.append(words)
        words += (((b + s - 1) >> st.page_shift) - (b >> st.page_shift) + 1 + 63) // 64
    keys = [0] * st.capacity
    counts = [0] * st.capacity
    touch = [[0, 0] for _ in allocs]
    bitmap = [0] * words
    summ = dict.fromkeys(["gld", "gst", "gatom", "gld_warp", "gst_warp", "gatom_warp", "bytes", "shared", "local",
                          "blocks_in", "blocks_out", "gpu_t_first", "gpu_t_last", "warp_instrs",
                          "thread_instrs"], 0)
    summ["gpu_t_first"] = MASK64
    overflow, ticket, samples, taken = 0, 0, [], 0

    def find(a: int) -> int:
        for i, (b, s) in enumerate(allocs):
            if b <= a < b + s:
                return i
        return -1

    def page_add(page: int, n: int) -> None:
        nonlocal overflow
        h = (((page * HASH_MULT) & MASK64) >> 32) & (st.capacity - 1)
        for probe in range(min(MAX_PROBES, st.capacity)):
            i = (h + probe) & (st.capacity - 1)
            if keys[i] in (0, page + 1):
                keys[i] = page + 1
                counts[i] += n
                return
        overflow += n

    for e in st.events:
        if not isinstance(e, Access):
            kind, v = e
            if kind == "enter":
                summ["blocks_in"] += 1
                summ["gpu_t_first"] = min(summ["gpu_t_first"], v)
            elif kind == "exit":
                summ["blocks_out"] += 1
                summ["gpu_t_last"] = max(summ["gpu_t_last"], v)
            else:
                summ["warp_instrs"] += 1
                summ["thread_instrs"] += v
            continue
        n = len(e.addrs)
        if e.space == SHARED:
            summ["shared"] += n
        elif e.space == LOCAL:
            summ["local"] += n
        else:
            k = "gatom" if e.flags & ATOMIC else "gst" if e.flags & WRITE else "gld"
            summ[k] += n
            summ[k + "_warp"] += 1
            summ["bytes"] += e.size * n
        sampled = (st.sample_mode == 1 and st.sample_every and ticket % st.sample_every == 0) or (
            st.sample_mode == 2 and st.sample_every and e.block % st.sample_every == 0)
        if st.sample_mode == 1 and st.sample_every:
            ticket += 1
        if sampled:
            if taken < st.sample_cap:
                f = (1 if e.flags & WRITE else 0) | (2 if e.flags & ATOMIC else 0) | \
                    (4 if e.space == SHARED else 0) | (8 if e.space == LOCAL else 0)
                samples.append([e.addrs[0], e.time, e.block, e.warp, e.size, f, e.mask])
            taken += 1
        if e.space != GLOBAL:
            continue
        groups: dict[tuple[int, int], list[int]] = {}
        for a in e.addrs:  # dicts keep first-seen order = lowest lane first
            groups.setdefault((a >> st.page_shift, find(a)), []).append(a)
        for (page, idx), lanes in groups.items():
            page_add(page, len(lanes))
            if idx >= 0:
                touch[idx][0] += len(lanes)
                touch[idx][1] += e.size * len(lanes)
                bit = page - (allocs[idx][0] >> st.page_shift)
                bitmap[first_word[idx] + bit // 64] |= 1 << (bit % 64)
    return {
        "summary": summ,
        "page_overflow": overflow,
        "samples_dropped": max(0, taken - st.sample_cap),
        "hash": [[k, c] for k, c in zip(keys, counts)],
        "touch": [[b, t, by] for (b, _), (t, by) in zip(allocs, touch)],
        "bitmap": bitmap,
        "samples": samples,
    }


def random_stream(seed: int, n: int = 3000, **cfg) -> Stream:
    rng = np.random.default_rng(seed)
    st = Stream(**cfg)
    # Unaligned bases, sizes from a few bytes to several MiB; a gap between allocations.
    base = 0x7F00_0000_0000 + 12345
    for size in [100, 70_000, 3 << 20, 1 << 22, 5_000_000]:
        st.allocs.append((base, size))
        base += size + int(rng.integers(1, 1 << 20))
    end = base
    for blk in range(4):
        st.events.append(("enter", 1_000 + 17 * blk))
    for i in range(n):
        mask = int(rng.integers(1, 1 << 32)) if rng.random() < 0.3 else 0xFFFFFFFF
        lanes = [b for b in range(32) if mask >> b & 1]
        size = int(rng.choice([1, 2, 4, 8, 16]))
        r = rng.random()
        if r < 0.6:  # coalesced: consecutive lanes, consecutive elements
            b, s = st.allocs[int(rng.integers(len(st.allocs)))]
            start = b + int(rng.integers(0, max(1, s - 32 * size)))
            addrs = [start + lane * size for lane in lanes]
        elif r < 0.85:  # scattered over the whole range, some outside every allocation
            addrs = [int(x) for x in rng.integers(st.allocs[0][0] - 4096, end + 4096, len(lanes))]
        else:
            addrs = [int(x) for x in rng.integers(0, 1 << 16, len(lanes))]
        space = GLOBAL if r < 0.85 else int(rng.choice([SHARED, LOCAL]))
        flags = int(rng.choice([READ, WRITE, READ | ATOMIC, READ | WRITE | ATOMIC]))
        st.events.append(Access(space, flags, size, int(rng.integers(0, 64)), int(rng.integers(0, 8)),
                                5_000 + i, mask, addrs))
        if i % 7 == 0:
            st.events.append(("instr", len(lanes)))
    for blk in range(3):
        st.events.append(("exit", 900_000 + 3 * blk))
    return st


def assert_same(got: dict, want: dict) -> None:
    for k in ["summary", "page_overflow", "samples_dropped", "hash", "touch", "bitmap", "samples"]:
        assert got[k] == want[k], k


def test_random_stream_matches_reference(harness: Path, tmp_path: Path) -> None:
    st = random_stream(1)
    got = run(harness, st, tmp_path)
    assert_same(got, reference(st))
    s = got["summary"]
    hist_total = sum(c for _, c in got["hash"])
    assert hist_total + got["page_overflow"] == s["gld"] + s["gst"] + s["gatom"]
    assert got["page_overflow"] == 0  # 4096 slots hold every page of this stream
    assert s["blocks_in"] == 4 and s["blocks_out"] == 3
    assert (s["gpu_t_first"], s["gpu_t_last"]) == (1_000, 900_006)


@pytest.mark.parametrize("page_shift", [12, 21])
def test_page_size_is_configurable(harness: Path, tmp_path: Path, page_shift: int) -> None:
    st = random_stream(2, n=1500, page_shift=page_shift)
    assert_same(run(harness, st, tmp_path), reference(st))


def test_tiny_hash_overflow_is_exact(harness: Path, tmp_path: Path) -> None:
    # 8 slots, 40 distinct pages touched in order: the first 8 distinct pages
    # claim the slots, every access to any other page is counted as overflow.
    st = Stream(page_shift=16, capacity=8, allocs=[(0x10_0000_0000, 40 << 16)])
    for rep in range(3):
        for p in range(40):
            a = 0x10_0000_0000 + (p << 16) + 64 * rep
            st.events.append(Access(GLOBAL, READ, 4, 0, 0, p, 0xF, [a, a + 4, a + 8, a + 12]))
    got = run(harness, st, tmp_path)
    assert_same(got, reference(st))
    assert sorted(k - 1 - (0x10_0000_0000 >> 16) for k, _ in got["hash"]) == list(range(8))
    assert got["page_overflow"] == 32 * 3 * 4
    assert sum(c for _, c in got["hash"]) == 8 * 3 * 4
    # Overflow reaches the summary's drop count and a DROPPED record.
    types = [t for t, _ in got["records"]]
    assert types == [3, 4, 5, 6, 11]


def test_bounded_probing_overflows_before_the_table_is_full(harness: Path, tmp_path: Path) -> None:
    # 12 pages that all hash to one bucket: 8 probes place the first 8, the
    # other 4 overflow although 56 of the 64 slots stay free.
    def bucket(p: int) -> int:
        return (((p * HASH_MULT) & MASK64) >> 32) & 63

    pages = [p for p in range(200_000) if bucket(p) == 5][:12]
    st = Stream(page_shift=16, capacity=64)
    st.events = [Access(GLOBAL, WRITE, 8, 0, 0, i, 1, [p << 16]) for i, p in enumerate(pages)]
    got = run(harness, st, tmp_path)
    assert_same(got, reference(st))
    assert [k - 1 for k, _ in got["hash"][5:13]] == pages[:8]
    assert sum(1 for k, _ in got["hash"] if k) == 8
    assert got["page_overflow"] == 4


def test_sampling_one_warp_access_in_n(harness: Path, tmp_path: Path) -> None:
    st = random_stream(3, n=200, sample_mode=1, sample_every=7, sample_cap=10)
    got = run(harness, st, tmp_path)
    assert_same(got, reference(st))
    assert len(got["samples"]) == 10
    assert got["samples_dropped"] == (200 + 6) // 7 - 10
    assert [t for t, _ in got["records"]][-2:] == [12, 11]


def test_sampling_one_cta_in_k(harness: Path, tmp_path: Path) -> None:
    st = random_stream(4, n=300, sample_mode=2, sample_every=16, sample_cap=1000)
    got = run(harness, st, tmp_path)
    want = reference(st)
    assert_same(got, want)
    assert got["samples_dropped"] == 0
    assert {s[2] % 16 for s in got["samples"]} == {0}
    assert len(got["samples"]) == sum(1 for e in st.events if isinstance(e, Access) and e.block % 16 == 0)


def test_vecadd_shape_gives_the_gpu_check_numbers(harness: Path, tmp_path: Path) -> None:
    """The counts scripts/gpu_check expects of vecadd, at n = 2^16 so it runs in a blink:
    2n loads, n stores, n*4/64 KiB distinct pages per array."""
    n = 1 << 16
    a, b, c = 0x7000_0000_0000, 0x7000_1000_0000, 0x7000_2000_0000
    st = Stream(allocs=[(a, 4 * n), (b, 4 * n), (c, 4 * n)])
    for w in range(n // 32):
        idx = [w * 32 + lane for lane in range(32)]
        for base, flags in [(a, READ), (b, READ), (c, WRITE)]:
            st.events.append(Access(GLOBAL, flags, 4, w // 8, w % 8, w, 0xFFFFFFFF, [base + 4 * i for i in idx]))
    got = run(harness, st, tmp_path)
    s = got["summary"]
    assert (s["gld"], s["gst"], s["gld_warp"], s["bytes"]) == (2 * n, n, 2 * n // 32, 12 * n)
    assert [t[1] for t in got["touch"]] == [n, n, n]
    assert sum(1 for k, _ in got["hash"] if k) == 3 * (4 * n >> 16)
    assert got["bitmap"] == [0xF, 0xF, 0xF]


def test_allocations_win_over_the_reservations_around_them(harness: Path, tmp_path: Path) -> None:
    """The layout driver 580 gave vecadd on an H200 (2026-12-04, addresses as recorded): the
    driver reported virtual-address reservations first, and each cudaMalloc'd array lies inside
    one, b at the very base of its reservation.  Every access to a, b and c is the array's; a
    reservation is kept only where no allocation lies (here the 64 MiB one), and an access in a
    reservation outside its allocations belongs to no allocation."""
    a, b, c = 139701839200256, 139701293940736, 139701310717952
    n = 4 << 20  # 16 MiB arrays
    lone = 1099511627776
    st = Stream(allocs=[(a, n), (b, n), (c, n)],
                reservations=[(139701763702784, 100663296), (b, 33554432), (lone, 67108864)])
    for i, addr in enumerate([a, b + n - 4, c, lone + 8, b - 4, a + n]):
        st.events.append(Access(GLOBAL, READ, 4, 0, i, i, 1, [addr]))
    got = run(harness, st, tmp_path)
    touches = {base: t for base, t, _ in got["touch"]}
    assert touches == {a: 1, b: 1, c: 1, lone: 1}
    assert got["summary"]["gld"] == 6
