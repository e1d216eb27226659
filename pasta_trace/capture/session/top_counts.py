"""What `top` shows, counted from the drained events: per process, the calls
of each kind in the last interval and since the start, and the memory each
process holds now.

Held memory is kept as the set of live allocations top has seen, keyed by
(pid, pool, address): a free takes its address out whatever its size (a
driver free and a CPU tensor's Delete carry none), so only what was allocated
since top started counts.  Driver memory and tensors are separate pools: a
tensor lies inside memory the driver allocated, and the two are never summed
(schema.Kind.tensor_alloc).

The drain copies a few columns of each batch (cheap, numpy); the counting
runs once per refresh over the interval's batches (Polars)."""

from __future__ import annotations

import numpy as np
import polars as pl

from ... import schema
from ...lifetimes import kind_from_api, memory

#: the per-interval counts, in the order `top` shows them
COUNTS = ("launches", "allocs", "frees", "copies", "copy_bytes", "syncs", "tensor_allocs", "tensor_frees",
          "nccl_calls", "nccl_bytes", "failed")
#: bytes held now, by pool
HELD = ("device_bytes", "pinned_bytes", "tensor_bytes")

_FIELDS = ("pid", "api", "kind", "flags", "ret", "ptr", "size", "valid")
_K = schema.Kind
#: what holds memory: 1 device, 2 pinned host (driver allocations), 3 tensors
_DEVICE, _PINNED, _TENSOR = 1, 2, 3
_SIZE_BIT = 1 << schema.PAYLOAD_BITS["size"]


def _pool_of_api(api_names: list[str]) -> np.ndarray:
    """Per API index: the pool a successful allocation by it holds (0: none)."""
    mem = pl.select(memory(kind_from_api(pl.Series(api_names, dtype=pl.String))).cast(pl.String)).to_series()
    return np.array([_PINNED if m == "pinned host" else _DEVICE for m in mem.to_list()], dtype=np.uint8)


class TopCounts:
    """Feed it every drained batch (``add``); ``take`` the interval's counts."""

    def __init__(self, api_names: list[str]):
        self._pool = _pool_of_api(api_names)
        self._batches: list[dict[str, np.ndarray]] = []
        self._live = pl.DataFrame(schema={"pid": pl.UInt32, "pool": pl.UInt8, "ptr": pl.UInt64, "size": pl.UInt64})
        self._totals = pl.DataFrame(schema={"pid": pl.UInt32, **{c: pl.UInt64 for c in COUNTS}})
        self.comms: dict[int, str] = {}  # pid -> the comm of its latest event (for a process that exited)

    def add(self, recs: np.ndarray) -> None:
        """A drained batch (records of schema.HOST_EVENT's fields, in ring order)."""
        if not recs.size:
            return
        cols = {f: np.array(recs[f]) for f in _FIELDS}
        tensor = np.isin(cols["kind"], (int(_K.tensor_alloc), int(_K.tensor_free)))
        api = np.minimum(cols["api"], len(self._pool) - 1)  # an index past the table: never from our program
        cols["pool"] = np.where(tensor, np.uint8(_TENSOR), self._pool[api])
        self._batches.append(cols)
        # each process's latest comm: one per process, never a loop over the events
        pids, back = np.unique(cols["pid"][::-1], return_index=True)
        for pid, i in zip(pids.tolist(), (len(recs) - 1 - back).tolist()):
            self.comms[pid] = bytes(recs["comm"][i]).split(b"\0", 1)[0].decode(errors="replace")

    def take(self) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
        """(counts of the interval, counts since the start, bytes held now):
        one row per process, with COUNTS (the first two) or HELD columns.
        A process with nothing counted and nothing held has no row."""
        ev = self._interval()
        self._batches = []
        done = ~(((pl.col("flags") & schema.FLAG_HAS_RET) != 0) & (pl.col("ret") != 0))
        size = pl.when((pl.col("valid") & _SIZE_BIT) != 0).then(pl.col("size")).otherwise(0)
        kind = pl.col("kind")

        def n(cond: pl.Expr, name: str) -> pl.Expr:
            return cond.sum().cast(pl.UInt64).alias(name)

        def b(cond: pl.Expr, name: str) -> pl.Expr:
            return size.filter(cond).sum().cast(pl.UInt64).alias(name)

        nccl = kind.is_in([int(_K.collective), int(_K.p2p)])
        interval = ev.group_by("pid").agg(
            n((kind == int(_K.launch)) & done, "launches"),
            n((kind == int(_K.alloc)) & done, "allocs"),
            n((kind == int(_K.free)) & done, "frees"),
            n((kind == int(_K.memcpy)) & done, "copies"),
            b((kind == int(_K.memcpy)) & done, "copy_bytes"),
            n((kind == int(_K.sync)) & done, "syncs"),
            n(kind == int(_K.tensor_alloc), "tensor_allocs"),
            n(kind == int(_K.tensor_free), "tensor_frees"),
            n(nccl & done, "nccl_calls"),
            b(nccl & done, "nccl_bytes"),
            n(~done, "failed"),
        )
        self._totals = (
            pl.concat([self._totals, interval]).group_by("pid").agg(pl.col(c).sum() for c in COUNTS)
        )
        self._update_live(ev, done)
        held = (
            self._live.group_by("pid")
            .agg(pl.col("size").filter(pl.col("pool") == p).sum().cast(pl.UInt64).alias(name)
                 for p, name in zip((_DEVICE, _PINNED, _TENSOR), HELD))
        )
        return interval, self._totals.clone(), held

    def holding(self) -> list[int]:
        """The processes that hold memory top saw allocated."""
        return self._live["pid"].unique().to_list()

    def forget(self, pids: list[int]) -> None:
        """Processes that exited: they hold nothing any more (their totals stay)."""
        if pids:
            self._live = self._live.filter(~pl.col("pid").is_in(pids))

    def _interval(self) -> pl.DataFrame:
        """The interval's events that count: a call nested in a traced call
        of a higher layer is that call's, a launch captured into a graph ran
        nothing."""
        cols = {f: np.concatenate([b[f] for b in self._batches]) if self._batches else np.empty(0, dtype)
                for f, dtype in zip((*_FIELDS, "pool"), (np.uint32, np.uint16, np.uint8, np.uint8, np.int32,
                                                         np.uint64, np.uint64, np.uint32, np.uint8))}
        ev = pl.DataFrame(cols).with_row_index("seq")
        return ev.filter(~pl.col("kind").is_in([int(_K.nested), int(_K.captured)]))

    def _update_live(self, ev: pl.DataFrame, done: pl.Expr) -> None:
        """Each (pid, pool, address)'s last allocation or free of the
        interval decides whether it is held, and how many bytes."""
        kind = pl.col("kind")
        mem = ev.filter(kind.is_in([int(_K.alloc), int(_K.free), int(_K.tensor_alloc), int(_K.tensor_free)])
                        & done & (pl.col("ptr") != 0))
        if mem.is_empty():
            return
        # keyed by pool family, not pool: a driver free names no memory kind, so it frees either
        mem = mem.with_columns(kind.is_in([int(_K.alloc), int(_K.tensor_alloc)]).alias("alloc"),
                               (pl.col("pool") == _TENSOR).alias("tensor"))
        last = mem.sort("seq").group_by("pid", "tensor", "ptr").agg(
            pl.col("alloc").last(), pl.col("pool").last(), pl.col("size").last())
        live = self._live.with_columns((pl.col("pool") == _TENSOR).alias("tensor"))
        kept = live.join(last.select("pid", "tensor", "ptr"), on=["pid", "tensor", "ptr"], how="anti")
        new = last.filter(pl.col("alloc")).select("pid", "pool", "ptr", "size")
        self._live = pl.concat([kept.select("pid", "pool", "ptr", "size"), new])
