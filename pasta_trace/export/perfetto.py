"""Perfetto `.pftrace` writer: TracePacket protobufs encoded here, no perfetto
dependency at run time (the `perfetto` package only checks our output in tests).

Layout of the file (field numbers from perfetto/protos/perfetto/trace):
  1. a clock snapshot declaring CLOCK_MONOTONIC the trace's primary clock;
  2. the first packet of sequence 1: incremental state cleared, packet
     defaults (timestamps in BUILTIN_CLOCK_MONOTONIC) and every interned string
     (event names, categories, argument names, string argument values);
  3. one TrackDescriptor per process, thread, GPU stream (child of its process)
     and live-memory counter (child of its process);
  4. the events: slice begin/end pairs (API calls on thread tracks, kernels
     and memcpy/memset on stream tracks), instants for calls without a
     duration and launches without device timing, counter values, and flows
     from each launch to its kernel.

The strings are interned once for the whole trace.  The events are then made
one window of time at a time (`_Window`: the rows that begin or end in it,
string columns as interned ids, tracks and stack ids joined on key columns,
put in order, a part and a row per event), encoded column-wise CHUNK_ROWS
events at a time on several threads while the next window is made, and
written in order: the memory the events take is one window's.
"""

from __future__ import annotations

import os
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import BinaryIO, Callable

import numpy as np
import polars as pl

from . import protowire as pw
from .trace_model import API_ARGS, TraceModel

CHUNK_ROWS = 200_000
#: threads encoding windows at once (each holds a window's matrices, ~100 MB)
MAX_WORKERS = 4
SEQUENCE_ID = 1

# TracePacket
_P_TIMESTAMP, _P_TRACK_EVENT, _P_SEQ_ID, _P_INTERNED, _P_SEQ_FLAGS = 8, 11, 10, 12, 13
_P_CLOCK_SNAPSHOT, _P_DEFAULTS, _P_TRACK_DESCRIPTOR = 6, 59, 60
_SEQ_INCREMENTAL_STATE_CLEARED, _SEQ_NEEDS_INCREMENTAL_STATE = 1, 2
BUILTIN_CLOCK_MONOTONIC = 3
# TrackEvent
_E_CATEGORY_IIDS, _E_ANNOTATIONS, _E_TYPE, _E_NAME_IID, _E_TRACK_UUID = 3, 4, 9, 10, 11
_E_COUNTER_VALUE, _E_FLOW_IDS, _E_TERMINATING_FLOW_IDS = 30, 47, 48
SLICE_BEGIN, SLICE_END, INSTANT, COUNTER = 1, 2, 3, 4
#: sequence id and "needs incremental state" (interned strings), on every event
_SEQUENCE_FIELDS = pw.field_varint(_P_SEQ_ID, SEQUENCE_ID) + pw.field_varint(_P_SEQ_FLAGS, _SEQ_NEEDS_INCREMENTAL_STATE)
# DebugAnnotation value fields, by the kind of value
_A_NAME_IID = 1
_A_VALUE_FIELD = {"bool": 2, "uint": 3, "int": 4, "ptr": 7, "str": 17}
# CounterDescriptor.Unit
_UNIT_SIZE_BYTES = 3

#: Arguments shown on events: (name, kind of value).  Columns of the same name
#: feed them; "str" columns are interned.
ARGS: tuple[tuple[str, str], ...] = (
    ("kind", "str"), ("ret", "int"),
    *((c, "ptr" if c in ("stream", "func", "ptr", "dst", "src") else "str" if c == "copy_kind" else "uint")
      for c in API_ARGS),
    ("correlation", "uint"), ("cupti_correlation", "uint"), ("device_timing", "bool"), ("overlap_ns", "uint"),
    ("bytes", "uint"), ("cupti_copy_kind", "uint"), ("stream_id", "uint"), ("device", "uint"),
    ("stack", "str"),  # the caller's stack, one "function file:line" per line, innermost first
    ("tensor_device", "str"), ("allocated_bytes", "uint"), ("reserved_bytes", "uint"),
    ("graph_id", "uint"), ("graph_node_id", "uint"),  # CUPTI's, of a kernel a graph launch ran
)


def _interned(field: int, strings: list[str]) -> bytes:
    """InternedData entries (iid = position + 1); every kind uses (iid=1, name=2)."""
    return b"".join(pw.field_bytes(field, pw.field_varint(1, i + 1) + pw.field_bytes(2, s))
                    for i, s in enumerate(strings))


def _packet(body: bytes) -> bytes:
    return pw.field_bytes(1, body + pw.field_varint(_P_SEQ_ID, SEQUENCE_ID))


def _tracks(model: TraceModel) -> tuple[list[bytes], pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """Track descriptor packets, and the uuid of each thread, stream and counter track."""
    packets: list[bytes] = []
    uuid = 0

    def descriptor(body: bytes) -> int:
        nonlocal uuid
        uuid += 1
        packets.append(_packet(pw.field_bytes(_P_TRACK_DESCRIPTOR, pw.field_varint(1, uuid) + body)))
        return uuid

    proc_uuid: dict[int, int] = {}
    for pid, name, cmdline in model.processes.select("pid", "name", "cmdline").iter_rows():
        body = pw.field_varint(1, pid) + pw.field_bytes(6, name)
        if cmdline:
            body += pw.field_bytes(2, cmdline)
        proc_uuid[pid] = descriptor(pw.field_bytes(3, body))

    def children(frame: pl.DataFrame, make) -> pl.DataFrame:
        uuids = [make(*row) for row in frame.iter_rows()]
        return frame.with_columns(track=pl.Series(uuids, dtype=pl.UInt64))

    threads = children(model.threads.select("pid", "tid", "name"), lambda pid, tid, name: descriptor(
        pw.field_bytes(4, pw.field_varint(1, pid) + pw.field_varint(2, tid) + pw.field_bytes(5, name))))
    streams = children(model.streams.select("pid", "label"), lambda pid, label: descriptor(
        pw.field_varint(5, proc_uuid[pid]) + pw.field_bytes(2, label)))
    counters = children(model.memory.select("pid", "label").unique(maintain_order=True), lambda pid, label: descriptor(
        pw.field_varint(5, proc_uuid[pid]) + pw.field_bytes(2, label)
        + pw.field_bytes(8, pw.field_varint(3, _UNIT_SIZE_BYTES))))
    return packets, threads, streams, counters


def _stack_texts(model: TraceModel) -> pl.DataFrame:
    """pid, stack_id, stack: each stack as one string (interned: there are few)."""
    return (
        model.stacks.sort("pid", "stack_id", "depth")
        .group_by("pid", "stack_id", maintain_order=True)
        .agg(pl.format("{} {}:{}", pl.col("function").fill_null("?"), pl.col("file").fill_null("?"),
                       pl.col("line").cast(pl.String).fill_null("?")).str.join("\n").alias("stack"))
    )


_HAS_DUR = pl.col("dur_ns").is_not_null() & (pl.col("dur_ns") > 0)
_KERNEL = "kernel"  # the category of kernel executions
_STR_ARGS = tuple(name for name, kind in ARGS if kind == "str")


def _dressed(k: int, frame: pl.DataFrame, tracks: pl.DataFrame) -> pl.DataFrame:
    """Rows of slice frame `k` (0 API calls, 1 kernels, 2 copies) with the
    columns the encoder reads.  Tracks are joined on the key columns alone and
    put beside the rows: a join of the frame itself would copy its widest columns."""
    frame = _tracked(k, frame, tracks)
    if k == 0:
        return frame.with_columns(name=pl.col("api"), correlation=pl.col("corr"),
                                  flow_out=pl.coalesce("corr", "coll_out"), flow_in=pl.col("coll_in"))
    if k == 1:
        return frame.with_columns(correlation=pl.col("corr"), flow_in=pl.col("corr"),
                                  device_timing=pl.col("dur_ns").is_not_null())
    return frame.with_columns(
        cupti_copy_kind=pl.when(pl.col("cat") == "gpu_memcpy").then(pl.col("copy_kind"))).drop("copy_kind")


def _tracked(k: int, frame: pl.DataFrame, tracks: pl.DataFrame) -> pl.DataFrame:
    """Rows of slice frame `k` with the uuid of their track (a thread's, or a GPU stream's)."""
    on = ["pid", "tid"] if k == 0 else ["pid", "label"]
    return frame.with_columns(frame.select(on).join(tracks.select(*on, "track"), on=on, how="left",
                                                    maintain_order="left")["track"])


def _texts(k: int, frame: pl.DataFrame) -> pl.DataFrame:
    """The string columns `_dressed` gives slice frame `k`, without dressing every row."""
    if k == 0:
        frame = frame.with_columns(name=pl.col("api"))
    elif k == 2:
        frame = frame.drop("copy_kind")
    return frame.select(c for c in ("name", "cat", *_STR_ARGS) if c in frame.columns)


def _strings(slices: list[pl.DataFrame]) -> dict[str, list[str]]:
    def uniq(col: str) -> set[str]:
        return set().union(*(f[col].drop_nulls().unique().cast(pl.String).to_list() for f in slices if col in f.columns))

    return {
        "names": sorted(uniq("name")),
        "categories": sorted(uniq("cat") | ({_KERNEL} if slices[1].height else set())),
        "values": sorted(set().union(*(uniq(name) for name in _STR_ARGS))),
    }


def _iids(s: pl.Series, table: list[str]) -> pl.Series:
    """The 1-based position in `table` of each string of `s` (null where
    null).  A categorical's distinct values are looked up once and its codes
    mapped through a table: millions of calls share a few names."""
    if s.dtype != pl.Categorical:
        return s.cast(pl.String).cast(pl.Enum(table)).to_physical().cast(pl.UInt32) + 1
    distinct = s.unique().drop_nulls()
    codes = distinct.to_physical().to_numpy()
    lut = np.zeros(int(codes.max()) + 1 if len(codes) else 1, dtype=np.uint32)
    lut[codes] = (distinct.cast(pl.String).cast(pl.Enum(table)).to_physical().cast(pl.UInt32) + 1).to_numpy()
    physical = s.to_physical()
    ids = pl.Series(s.name, lut[physical.fill_null(0).to_numpy()])
    return ids.set(physical.is_null(), None) if physical.null_count() else ids


def _coded(frame: pl.DataFrame, strings: dict[str, list[str]]) -> pl.DataFrame:
    """String columns as their interned ids (1-based, null where absent), and
    `layout`: what the fields a begin event carries depend on (its type,
    category and kind), one number per row."""
    text = {"name": "names", "cat": "categories", **{c: "values" for c in _STR_ARGS}}
    frame = frame.with_columns(_iids(frame[c], strings[t]) for c, t in text.items() if c in frame.columns)
    if "dur_ns" not in frame.columns:
        return frame
    layout = pl.lit(0, dtype=pl.UInt64)
    for c in ("kind", "cat"):  # ids are under 2^21
        if c in frame.columns:
            layout = layout * (1 << 21) + pl.col(c).cast(pl.UInt64).fill_null(0)
    return frame.with_columns(layout=layout * 2 + _HAS_DUR.cast(pl.UInt64))


class _Slices:
    """One slice frame (API calls, kernels or copies), its rows with a time,
    and where its events fall in time: the begins (or instants) in time order
    (the rows `idx`, or the rows as they are when `idx` is None: the frame is
    not copied to sort it), the ends of the rows with a duration in the order
    of their end times (stable: a frame's ends of one instant keep its order)."""

    def __init__(self, frame: pl.DataFrame) -> None:
        if frame["ts_ns"].null_count():
            frame = frame.filter(pl.col("ts_ns").is_not_null())  # never drawn
        self.frame = frame
        ts = frame["ts_ns"].cast(pl.Int64).to_numpy()
        self.idx = None if frame["ts_ns"].is_sorted() else np.argsort(ts, kind="stable")
        self.ts = ts if self.idx is None else ts[self.idx]
        has = frame.select(_HAS_DUR)["dur_ns"].to_numpy()
        timed = np.flatnonzero(has if self.idx is None else has[self.idx])
        if self.idx is not None:
            timed = self.idx[timed]
        end = ts[timed] + frame["dur_ns"].cast(pl.Int64).fill_null(0).to_numpy()[timed]
        by_end = np.argsort(end, kind="stable")
        self.end, self.end_rows = end[by_end], timed[by_end]

    def begins(self, lo: int | None, hi: int | None) -> tuple[pl.DataFrame, np.ndarray]:
        """The rows that begin in [lo, hi), in time order, and their times."""
        i0, i1 = _span(self.ts, lo, hi)
        rows = self.frame.slice(i0, i1 - i0) if self.idx is None else self.frame[self.idx[i0:i1]]
        return rows, self.ts[i0:i1]

    def ends(self, lo: int | None, hi: int | None) -> tuple[pl.DataFrame, np.ndarray]:
        """track keys, ts_ns and dur_ns of the rows that end in [lo, hi), in end order, and their ends."""
        j0, j1 = _span(self.end, lo, hi)
        keys = [c for c in ("pid", "tid", "label") if c in self.frame.columns]
        return self.frame.select(*keys, "ts_ns", "dur_ns")[self.end_rows[j0:j1]], self.end[j0:j1]


def _span(times: np.ndarray, lo: int | None, hi: int | None) -> tuple[int, int]:
    """The positions of sorted `times` in [lo, hi) (None: no bound)."""
    return (0 if lo is None else int(np.searchsorted(times, lo)),
            len(times) if hi is None else int(np.searchsorted(times, hi)))


class _Window:
    """The events of one span of time [lo, hi) in their place in the file:
    sorted by time, and at one instant ends first (the inner slice's first),
    then begins (the outer slice's first), then instants, then counters.
    Events are parts (begins and ends of each slice frame, then the counter
    samples), concatenated in that order, and the sort is stable.  A stable
    sort by time alone puts most events in place (the parts are runs already
    in time order); only the events that share their time with another are
    sorted further.  Every event of one instant falls in one window, so the
    windows end to end give the order of the whole trace.  `parts` are the
    rows each part's events are encoded from."""

    def __init__(self, parts: list[pl.DataFrame], times: list[np.ndarray], order: list[np.ndarray],
                 subs: list[np.ndarray]) -> None:
        self.parts = parts
        t = np.concatenate(times)
        perm = np.argsort(t, kind="stable")
        t.sort(kind="stable")
        self.n = len(t)
        part = np.repeat(np.arange(len(times), dtype=np.int8), [len(x) for x in times])
        rows = np.concatenate([np.arange(len(x), dtype=np.uint32) for x in times])
        o, sub = np.concatenate(order), np.concatenate(subs)
        _break_ties(perm, t, lambda at: (o[at], sub[at]))
        self.part, self.rows = part[perm], rows[perm]


def _break_ties(perm: np.ndarray, t: np.ndarray, keys: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]) -> None:
    """Sort the runs of `perm` whose times `t` are equal by `keys` (of the
    events at those indices: (o, s), compared in that order), stably, in
    place.  Most runs are pairs (a launch and its kernel, when the kernel has
    no device time of its own): those are compared and swapped as columns;
    only longer runs are sorted.  The keys are computed for tied events only."""
    same = t[1:] == t[:-1]
    if not same.any():
        return
    starts = np.flatnonzero(same & ~np.concatenate(([False], same[:-1])))
    size = np.flatnonzero(same & ~np.concatenate((same[1:], [False]))) + 2 - starts
    pair = starts[size == 2]
    a, b = perm[pair], perm[pair + 1]
    (oa, sa), (ob, sb) = keys(a), keys(b)
    swap = (ob < oa) | ((ob == oa) & (sb < sa))
    perm[pair[swap]], perm[pair[swap] + 1] = b[swap], a[swap]
    long = size > 2
    if long.any():
        lens = size[long]
        at = np.arange(lens.sum()) + np.repeat(starts[long] - np.cumsum(lens) + lens, lens)
        tied = perm[at]
        o, s = keys(tied)
        perm[at] = tied[np.lexsort((s, o, t[at]))]


def _values(s: pl.Series) -> tuple[np.ndarray, np.ndarray]:
    """An integer or boolean column as uint64 values (0 where null) and where
    it is not null, read from its Arrow buffers: through Polars, each of
    fill_null, cast and to_numpy is a query of its own, thousands a trace."""
    if s.dtype == pl.Boolean:
        return s.fill_null(False).cast(pl.UInt64).to_numpy(), s.is_not_null().to_numpy()
    a = s.rechunk().to_arrow()
    validity, data = a.buffers()[:2]
    at = slice(a.offset, a.offset + len(a))
    # signed values keep their two's complement bits, which is how int64 varints are written
    values = np.frombuffer(data, dtype=a.type.to_pandas_dtype())[at].astype(np.int64).view(np.uint64)
    if validity is None or a.null_count == 0:
        return values, np.ones(len(a), dtype=bool)
    present = np.unpackbits(np.frombuffer(validity, dtype=np.uint8), bitorder="little")[at].view(bool)
    return np.where(present, values, np.uint64(0)), present


def _encode_group(rows: pl.DataFrame, ph: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Packets of rows that share one layout (every row an event of type
    `ph`), as protowire.layout's (bytes, lengths, order).  String arguments
    and names are interned ids already."""
    n = rows.height
    every = np.ones(n, dtype=bool)
    nothing = np.zeros(n, dtype=bool)

    def col(name: str) -> tuple[np.ndarray, np.ndarray]:
        return _values(rows[name]) if name in rows.columns else (np.zeros(n, dtype=np.uint64), nothing)

    named = every if ph in (SLICE_BEGIN, INSTANT) else nothing
    event = [pw.varint_field(_E_TYPE, np.full(n, ph, dtype=np.uint64), every),
             pw.varint_field(_E_TRACK_UUID, col("track")[0], every)]
    if "name" in rows.columns and rows["name"].null_count() < n:
        event.append(pw.varint_field(_E_NAME_IID, col("name")[0], named))
        event.append(pw.varint_field(_E_CATEGORY_IIDS, col("cat")[0], named))
    for i, (name, kind) in enumerate(ARGS):
        values, present = col(name)
        present &= named
        if present.any():
            head = pw.field_varint(_A_NAME_IID, i + 1) + pw.tag(_A_VALUE_FIELD[kind], pw.VARINT)
            event.append(pw.small_message(_E_ANNOTATIONS, head, values, present))
    values, present = col("counter_value")
    event.append(pw.varint_field(_E_COUNTER_VALUE, values, present))
    values, present = col("flow_out")
    event.append(pw.fixed64_field(_E_FLOW_IDS, values, present & named))
    values, present = col("flow_in")
    event.append(pw.fixed64_field(_E_TERMINATING_FLOW_IDS, values, present & named))

    packet = [
        pw.varint_field(_P_TIMESTAMP, col("ts_ns")[0], every),
        *pw.message_field(_P_TRACK_EVENT, event, every),
        pw.const(_SEQUENCE_FIELDS, every),
    ]
    return pw.layout(pw.message_field(1, packet, every))


def _encode(parts: list[pl.DataFrame], order: _Window, lo: int, hi: int) -> np.ndarray:
    """Packets of events [lo, hi) of `order`.  Each part's events are
    encoded in groups of one layout, so that each group carries only its own
    fields, then interleaved back into order."""
    part, rows = order.part[lo:hi], order.rows[lo:hi]
    groups, positions = [], []
    for k, frame in enumerate(parts):
        pos = np.flatnonzero(part == k)
        if len(pos) == 0:
            continue
        if k == len(parts) - 1:
            groups.append(_encode_group(frame[rows[pos]], COUNTER))
            positions.append(pos)
        elif k % 2:
            g = frame.select("track", "ts_ns", "dur_ns")[rows[pos]]
            groups.append(_encode_group(g.select("track", ts_ns=pl.col("ts_ns") + pl.col("dur_ns")), SLICE_END))
            positions.append(pos)
        else:
            layout = frame["layout"].gather(rows[pos]).to_numpy()
            codes, which = np.unique(layout, return_inverse=True)
            for i, code in enumerate(codes):
                at = pos[which == i]
                g = frame[rows[at]]
                groups.append(_encode_group(g, SLICE_BEGIN if code & 1 else INSTANT))
                positions.append(at)
    return pw.interleave(groups, positions)


def _header(strings: dict[str, list[str]], first_ts: int) -> bytes:
    clock = pw.field_bytes(1, pw.field_varint(1, BUILTIN_CLOCK_MONOTONIC) + pw.field_varint(2, first_ts))
    # no packet timestamp: it would be read on the default clock (BOOTTIME), which the trace does not use
    snapshot = _packet(pw.field_bytes(_P_CLOCK_SNAPSHOT, clock + pw.field_varint(2, BUILTIN_CLOCK_MONOTONIC)))
    interned = (_interned(1, strings["categories"]) + _interned(2, strings["names"])
                + _interned(3, [name for name, _ in ARGS]) + _interned(29, strings["values"]))
    first = _packet(
        pw.field_varint(_P_SEQ_FLAGS, _SEQ_INCREMENTAL_STATE_CLEARED)
        + pw.field_bytes(_P_DEFAULTS, pw.field_varint(58, BUILTIN_CLOCK_MONOTONIC))
        + pw.field_bytes(_P_INTERNED, interned)
    )
    return snapshot + first


#: the columns `_encode_group` reads
_ENCODED = ("track", "ts_ns", "name", "cat", *(name for name, _ in ARGS), "counter_value", "flow_out", "flow_in")
#: begins of slices (of every frame) a window of the trace holds, about: its events are put in
#: order and their columns made one window at a time, so that the memory they take is one
#: window's, and the encoder's threads encode a window while the next one is made
WINDOW_ROWS = 2_000_000


def _cuts(slices: list[_Slices], counts: np.ndarray, window_rows: int) -> list[int]:
    """Times that part the trace into windows of about `window_rows` begins."""
    step = max(1, window_rows // 16)
    sample = np.sort(np.concatenate([s.ts[::step] for s in slices] + [counts[::step]]))
    return np.unique(sample[16::16]).tolist()


def write(model: TraceModel, out: BinaryIO, chunk_rows: int = CHUNK_ROWS, window_rows: int = WINDOW_ROWS) -> int:
    """Write the trace to `out`, about `chunk_rows` events at a time; returns
    the number of TrackEvents written."""
    descriptors, threads, streams, counters = _tracks(model)
    used = model.api.select("pid", "stack_id").unique() if "stack_id" in model.api.columns else None
    stacks = (_stack_texts(model).join(used, on=["pid", "stack_id"], how="semi", maintain_order="left")
              if used is not None else None)
    slices = [_Slices(f) for f in (model.api, model.kernels, model.memops)]
    tracks = [threads, streams, streams]
    counts = model.memory.join(counters, on=["pid", "label"], maintain_order="left").select(
        "track", "ts_ns", counter_value="live_bytes")
    if counts["ts_ns"].null_count():
        counts = counts.filter(pl.col("ts_ns").is_not_null())  # never drawn
    counts = counts if counts["ts_ns"].is_sorted() else counts.sort("ts_ns", maintain_order=True)
    count_ts = counts["ts_ns"].cast(pl.Int64).to_numpy()
    strings = _strings([*(_texts(k, s.frame) for k, s in enumerate(slices)), *([stacks] if stacks is not None else [])])
    kernel_cat = strings["categories"].index(_KERNEL) + 1 if slices[1].frame.height else 0
    stack_ids = _coded(stacks, strings) if stacks is not None else None
    firsts = [int(a[0]) for s in slices for a in (s.ts, s.end) if len(a)] + [int(x) for x in count_ts[:1]]
    out.write(_header(strings, min(firsts, default=0)))
    out.write(b"".join(descriptors))

    def window(lo: int | None, hi: int | None) -> _Window:
        parts, times, order, subs = [], [], [], []
        for k, s in enumerate(slices):
            rows, t = s.begins(lo, hi)
            f = _coded(_dressed(k, rows, tracks[k]), strings)
            if k == 1 and f.height:  # the kernels' one category, as its id: not a string per kernel
                f = f.with_columns(cat=pl.lit(kernel_cat, dtype=pl.UInt32))
            if k == 0 and stack_ids is not None:  # the stack's id beside each call, not its text
                f = f.with_columns(f.select("pid", "stack_id").join(stack_ids, on=["pid", "stack_id"], how="left",
                                                                     maintain_order="left")["stack"])
            has = f.select(_HAS_DUR)["dur_ns"].to_numpy()
            parts.append(f.select(*(c for c in _ENCODED if c in f.columns), "layout"))
            times.append(t)
            order.append(np.where(has, 1, 2).astype(np.int8))
            subs.append(-f["dur_ns"].cast(pl.Int64).fill_null(0).to_numpy())  # the longer slice first
            ends, t = s.ends(lo, hi)
            parts.append(_tracked(k, ends, tracks[k]).select("track", "ts_ns", "dur_ns"))
            times.append(t)
            order.append(np.zeros(len(t), dtype=np.int8))
            subs.append(-ends["ts_ns"].cast(pl.Int64).to_numpy())  # the later-begun (inner) slice first
        c0, c1 = _span(count_ts, lo, hi)
        parts.append(counts.slice(c0, c1 - c0))
        times.append(count_ts[c0:c1])
        order.append(np.full(c1 - c0, 3, dtype=np.int8))
        subs.append(np.zeros(c1 - c0, dtype=np.int64))
        return _Window(parts, times, order, subs)

    bounds = [None, *_cuts(slices, count_ts, window_rows), None]
    n = 0
    # windows are encoded on several threads (numpy and Polars let go of the GIL) and written in order
    workers = min(MAX_WORKERS, len(os.sched_getaffinity(0)))
    with ThreadPoolExecutor(workers) as pool:
        pending: deque[Future] = deque()
        for lo, hi in zip(bounds[:-1], bounds[1:]):
            w = window(lo, hi)
            n += w.n
            for at in range(0, w.n, chunk_rows):
                pending.append(pool.submit(_encode, w.parts, w, at, min(w.n, at + chunk_rows)))
                if len(pending) > workers:
                    out.write(pending.popleft().result())  # the bytes as they are: no copy
        while pending:
            out.write(pending.popleft().result())
    return n


def write_file(model: TraceModel, path: Path) -> int:
    with open(path, "wb") as f:
        return write(model, f)
