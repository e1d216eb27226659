"""Perfetto `.pftrace` writer: TracePacket protobufs encoded here, no perfetto
dependency at run time (the `perfetto` package only checks our output in tests).

Layout of the file (field numbers from perfetto/protos/perfetto/trace):
  1. a clock snapshot declaring CLOCK_MONOTONIC the trace's primary clock;
  2. the first packet of sequence 1: incremental state cleared, packet
     defaults (timestamps in BUILTIN_CLOCK_MONOTONIC) and every interned string
     (event names, categories, argument names, string argument values);
  3. one TrackDescriptor per process, thread, GPU stream (child of its process)
     and live-memory counter (child of its process);
  4. the events, sorted by time, prepared and encoded column-wise one time
     window (about CHUNK_ROWS events) at a time and streamed to the file: slice begin/end pairs (API calls on thread tracks, kernels and
     memcpy/memset on stream tracks), instants for calls without a duration and
     launches without device timing, counter values, and flows from each
     launch to its kernel.
"""

from __future__ import annotations

from pathlib import Path
from typing import BinaryIO, Callable

import numpy as np
import polars as pl

from . import protowire as pw
from .trace_model import API_ARGS, TraceModel

CHUNK_ROWS = 200_000
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


def _sources(model: TraceModel, threads: pl.DataFrame, streams: pl.DataFrame,
             counters: pl.DataFrame) -> tuple[list[tuple[pl.DataFrame, Dress]], pl.DataFrame]:
    """The slices (API calls, kernels, copies), each with what gives a window
    of its rows their track, name, category and argument columns (dressed a
    window at a time: on every row at once, each join would copy the model's
    widest frames), and the counter samples with their track."""
    def api(f: pl.DataFrame) -> pl.DataFrame:
        # a launch's arrow runs to its kernel; a collective's (never a launch) to the next rank's entry
        return f.join(threads.select("pid", "tid", "track"), on=["pid", "tid"], how="left",
                      maintain_order="left").with_columns(
            name=pl.col("api"), correlation=pl.col("corr"), flow_out=pl.coalesce("corr", "coll_out"),
            flow_in=pl.col("coll_in"))

    def kernels(f: pl.DataFrame) -> pl.DataFrame:
        return f.join(streams, on=["pid", "label"], how="left", maintain_order="left").with_columns(
            cat=pl.lit("kernel"), correlation=pl.col("corr"), flow_in=pl.col("corr"),
            device_timing=pl.col("dur_ns").is_not_null())

    def memops(f: pl.DataFrame) -> pl.DataFrame:
        return f.join(streams, on=["pid", "label"], how="left", maintain_order="left").with_columns(
            cupti_copy_kind=pl.when(pl.col("cat") == "gpu_memcpy").then(pl.col("copy_kind")),
        ).drop("copy_kind")

    counts = model.memory.join(counters, on=["pid", "label"], maintain_order="left").select(
        "track", "ts_ns", counter_value="live_bytes")
    return [(model.api, api), (model.kernels, kernels), (model.memops, memops)], counts


def _stack_texts(model: TraceModel) -> pl.DataFrame:
    """pid, stack_id, stack: each stack as one string (interned: there are few)."""
    return (
        model.stacks.sort("pid", "stack_id", "depth")
        .group_by("pid", "stack_id", maintain_order=True)
        .agg(pl.format("{} {}:{}", pl.col("function").fill_null("?"), pl.col("file").fill_null("?"),
                       pl.col("line").cast(pl.String).fill_null("?")).str.join("\n").alias("stack"))
    )


#: a window of a source's rows -> the same rows with the columns the encoder reads
Dress = Callable[[pl.DataFrame], pl.DataFrame]
_HAS_DUR = pl.col("dur_ns").is_not_null() & (pl.col("dur_ns") > 0)
_END = pl.col("ts_ns") + pl.col("dur_ns")


class _Timed:
    """One source of events (a slice frame, or the counter samples) ordered
    once by begin and by end time, so that each window is a slice and a
    gather of it, not a filter of every row: a filter per window costs
    windows x rows, 100 x 2*10^7 on a 10^7-event capture.  Stable orders keep
    rows of one instant in the source's order, as a filter would."""

    def __init__(self, frame: pl.DataFrame, ends: bool, dress: Dress = lambda f: f) -> None:
        self.dress = dress
        if frame["ts_ns"].null_count():
            frame = frame.filter(pl.col("ts_ns").is_not_null())  # in no window
        ts = frame["ts_ns"].to_numpy()
        by_begin = np.argsort(ts, kind="stable")
        self.frame = frame if np.all(by_begin == np.arange(len(ts))) else frame[by_begin]
        self.begins = ts[by_begin]
        self.ends: np.ndarray | None = None
        if ends:
            timed = self.frame.select(pl.arg_where(_HAS_DUR).alias("row"))["row"].to_numpy()
            end = self.frame.select(_END.gather(timed))["ts_ns"].to_numpy()
            order = np.argsort(end, kind="stable")
            self.end_rows, self.ends = timed[order], end[order]

    def begun(self, lo: int, hi: int) -> pl.DataFrame:
        a, b = np.searchsorted(self.begins, [lo, hi])
        return self.dress(self.frame.slice(int(a), int(b - a)))

    def ended(self, lo: int, hi: int) -> pl.DataFrame:
        a, b = np.searchsorted(self.ends, [lo, hi])
        return self.dress(self.frame[self.end_rows[a:b]])

    def strings(self) -> pl.DataFrame:
        """A row for each combination of string values (what the interned
        string tables are made of), dressed."""
        text = [c for c, t in self.frame.schema.items() if t in (pl.String, pl.Categorical) or isinstance(t, pl.Enum)]
        return self.dress(self.frame.unique(text, keep="any") if text else self.frame.head(1))


def _windows(slices: list[_Timed], counts: _Timed, rows: int) -> list[tuple[int, int]]:
    """[lo, hi) time ranges holding about `rows` events each."""
    ts = pl.Series("ts_ns", np.concatenate([*(f.begins for f in slices), *(f.ends for f in slices), counts.begins]))
    ts = ts.sort()
    if ts.len() == 0:
        return []
    bounds = ts.gather_every(rows).unique(maintain_order=True).to_list() + [int(ts[-1]) + 1]
    return list(zip(bounds[:-1], bounds[1:]))


def _event_rows(slices: list[_Timed], counts: _Timed, stacks: pl.DataFrame, lo: int, hi: int) -> pl.DataFrame:
    """One row per TrackEvent in [lo, hi), sorted so that nesting replays
    correctly: at one instant ends come first (the inner slice's first), then
    begins (the outer slice's first), then instants and counters.  Stack
    texts are joined here, on the window's rows: on every call at once they
    would be a string per call."""
    parts = []
    for f in slices:
        begun = f.begun(lo, hi)
        if "stack_id" in begun.columns:
            begun = begun.join(stacks, on=["pid", "stack_id"], how="left", maintain_order="left")
        parts.append(begun.with_columns(
            ph=pl.when(_HAS_DUR).then(pl.lit(SLICE_BEGIN)).otherwise(pl.lit(INSTANT)),
            order=pl.when(_HAS_DUR).then(pl.lit(1)).otherwise(pl.lit(2)),
            sub=-pl.col("dur_ns").fill_null(0),
        ))
        parts.append(f.ended(lo, hi).select(
            "track", ts_ns=_END, ph=pl.lit(SLICE_END), order=pl.lit(0), sub=-pl.col("ts_ns")))
    parts.append(counts.begun(lo, hi).with_columns(
        ph=pl.lit(COUNTER), order=pl.lit(3), sub=pl.lit(0)))
    return pl.concat(parts, how="diagonal_relaxed").sort("ts_ns", "order", "sub", maintain_order=True)


def _iids(col: pl.Series, table: list[str]) -> np.ndarray:
    """1-based position of each string in `table` (0 for null)."""
    return (col.cast(pl.Enum(table)).to_physical().cast(pl.UInt64) + 1).fill_null(0).to_numpy()


def _encode_group(rows: pl.DataFrame, strings: dict[str, list[str]]) -> tuple[np.ndarray, np.ndarray]:
    """Packets of rows that share one layout (columns null in all of them
    are absent), as protowire.layout's (bytes, used) matrices."""
    n = rows.height
    every = np.ones(n, dtype=bool)

    def col(name: str) -> tuple[np.ndarray, np.ndarray]:
        if name not in rows.columns:
            return np.zeros(n, dtype=np.uint64), np.zeros(n, dtype=bool)
        s = rows[name]
        present = s.is_not_null().to_numpy()
        if s.dtype == pl.Boolean:
            return s.fill_null(False).cast(pl.UInt64).to_numpy(), present
        if s.dtype == pl.String:
            return _iids(s, strings["values"]), present
        # signed values keep their two's complement bits, which is how int64 varints are written
        return s.fill_null(0).cast(pl.Int64).to_numpy().view(np.uint64), present

    ph, _ = col("ph")
    named = (ph == SLICE_BEGIN) | (ph == INSTANT)
    event = [pw.varint_field(_E_TYPE, ph, every), pw.varint_field(_E_TRACK_UUID, col("track")[0], every)]
    if "name" in rows.columns:
        event.append(pw.varint_field(_E_NAME_IID, _iids(rows["name"], strings["names"]), named))
        event.append(pw.varint_field(_E_CATEGORY_IIDS, _iids(rows["cat"], strings["categories"]), named))
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


def _encode(rows: pl.DataFrame, strings: dict[str, list[str]]) -> np.ndarray:
    """Packets of `rows`, in order.  Rows are encoded in groups of one layout
    (event type, category, kind), so that each group carries only its own
    fields, then interleaved back into time order."""
    rows = rows.with_row_index("_pos")
    groups = rows.partition_by([c for c in ("ph", "cat", "kind") if c in rows.columns], maintain_order=False)
    parts, positions = [], []
    for g in groups:
        g = g.select(c for c in g.columns if g[c].null_count() < g.height)
        parts.append(_encode_group(g.drop("_pos"), strings))
        positions.append(g["_pos"].to_numpy())
    return pw.interleave(parts, positions)


def _strings(slices: list[pl.DataFrame]) -> dict[str, list[str]]:
    def uniq(col: str) -> list[str]:
        return sorted(set().union(*(f[col].drop_nulls().unique().cast(pl.String).to_list()
                                    for f in slices if col in f.columns)))

    return {
        "names": uniq("name"),
        "categories": uniq("cat"),
        "values": sorted(set().union(*(uniq(name) for name, kind in ARGS if kind == "str"))),
    }


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


def write(model: TraceModel, out: BinaryIO, chunk_rows: int = CHUNK_ROWS) -> int:
    """Write the trace to `out`, one time window of about `chunk_rows` events
    at a time; returns the number of TrackEvents written."""
    descriptors, threads, streams, counters = _tracks(model)
    sources, samples = _sources(model, threads, streams, counters)
    slices, counts = [_Timed(f, True, dress) for f, dress in sources], _Timed(samples, ends=False)
    stacks = _stack_texts(model).join(model.api.select("pid", "stack_id").unique(), on=["pid", "stack_id"],
                                      how="semi", maintain_order="left")
    strings = _strings([*(f.strings() for f in slices), stacks])
    windows = _windows(slices, counts, chunk_rows)
    out.write(_header(strings, windows[0][0] if windows else 0))
    out.write(b"".join(descriptors))
    n = 0
    for lo, hi in windows:
        rows = _event_rows(slices, counts, stacks, lo, hi)
        out.write(_encode(rows, strings))  # the bytes as they are: no copy
        n += rows.height
    return n


def write_file(model: TraceModel, path: Path) -> int:
    with open(path, "wb") as f:
        return write(model, f)
