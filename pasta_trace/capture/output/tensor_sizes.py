"""The size of each tensor a free names only by its pointer
(ProfiledCPUMemoryReporter::Delete passes no size): the size of the
allocation of that pointer the capture saw last, kept across the writer's
batches.  Done here rather than in a BPF map, where an update at every
allocation and a lookup and delete at every free cost more than the events
themselves.  Ring records of one tensor keep their causal order (its free
is submitted after its allocation returned), so "last seen" is exact; a free
whose allocation came before the capture keeps a null size."""

from __future__ import annotations

import polars as pl

_KEY = ["pid", "_dev", "ptr"]
_TENSOR = ("tensor_alloc", "tensor_free")


class TensorSizes:
    def __init__(self) -> None:
        #: tensors allocated and not freed so far: pid, _dev, ptr, size
        self._live = pl.DataFrame(schema={"pid": pl.UInt32, "_dev": pl.String, "ptr": pl.UInt64, "size": pl.UInt64})

    def fill(self, events: pl.DataFrame) -> pl.DataFrame:
        """`events` (schema.EVENTS_SCHEMA, in ring order) with the size of
        each tensor free that had none, where the capture saw its allocation."""
        if not events["kind"].is_in(_TENSOR).any():  # most batches: a scan of the kind codes only
            return events
        kind = pl.col("kind").cast(pl.String)
        tensors = events.with_row_index("_row").filter(kind.is_in(_TENSOR) & pl.col("ptr").is_not_null()).select(
            "_row", "pid", pl.col("device").cast(pl.String).alias("_dev"), "ptr", "ts_ns",
            (kind == "tensor_alloc").alias("_alloc"), "size")
        if tensors.height == 0:
            return events
        # every tensor event, the live ones of earlier batches first: the one before each free says its size
        seen = pl.concat([
            self._live.with_columns(pl.lit(-1, pl.Int64).alias("_row"), pl.lit(True).alias("_alloc")),
            tensors.select("_row", *_KEY, "_alloc", "size"),
        ], how="diagonal_relaxed").with_columns(pl.col("_row").cast(pl.Int64))
        before = seen.sort("_row").with_columns(
            pl.when(pl.col("_alloc")).then(pl.col("size")).shift(1).over(_KEY).alias("_prev_size"),
            pl.col("_alloc").shift(1).over(_KEY).alias("_prev_alloc"),
        )
        found = before.filter((pl.col("_row") >= 0) & ~pl.col("_alloc") & pl.col("size").is_null()
                              & pl.col("_prev_alloc").fill_null(False)).select(
            pl.col("_row").cast(pl.UInt32), pl.col("_prev_size").alias("_found"))
        self._live = (before.group_by(_KEY, maintain_order=True).agg(pl.all().sort_by("_row").last())
                      .filter(pl.col("_alloc")).select(*_KEY, "size"))
        return (events.with_row_index("_row").join(found, on="_row", how="left", maintain_order="left")
                .with_columns(pl.coalesce("size", "_found").alias("size")).drop("_row", "_found"))
