"""The size of a tensor free that names only its pointer (CPU Delete): that
pointer's last allocation, across the writer's batches; null where the
allocation came before the capture or the pointer's last event was a free."""

from __future__ import annotations

import polars as pl

from pasta_trace import schema
from pasta_trace.capture.output.tensor_sizes import TensorSizes


def _events(rows: list[tuple]) -> pl.DataFrame:
    """(ts, kind, ptr, size, device) rows -> schema.EVENTS_SCHEMA, pid 7."""
    full = [{c: None for c in schema.EVENTS_SCHEMA} | {"pid": 7, "tid": 7, "ts_ns": t, "kind": k, "ptr": p, "size": s,
                                                       "device": d, "api": "x"} for t, k, p, s, d in rows]
    return pl.DataFrame(full, schema=schema.EVENTS_SCHEMA)


def test_sizes_come_from_the_last_allocation_of_the_pointer_across_batches() -> None:
    sizes = TensorSizes()
    first = sizes.fill(_events([
        (1, "tensor_alloc", 0xA, 100, "cpu"),
        (2, "tensor_alloc", 0xB, 200, "cpu"),
        (3, "launch", None, None, None),
        (4, "tensor_alloc", 0xA, 64, "cuda:0"),  # the same address on another device
    ]))
    assert first["size"].to_list() == [100, 200, None, 64]
    second = sizes.fill(_events([
        (5, "tensor_free", 0xA, None, "cpu"),
        (6, "tensor_free", 0xC, None, "cpu"),  # allocated before the capture
        (7, "tensor_alloc", 0xA, 300, "cpu"),  # the address again
        (8, "tensor_free", 0xA, None, "cpu"),
        (9, "tensor_free", 0xA, None, "cpu"),  # its last event was a free: not 300 again
        (10, "tensor_free", 0xA, 64, "cuda:0"),  # a size of its own is kept
    ]))
    assert second["size"].to_list() == [100, None, 300, 300, None, 64]
    third = sizes.fill(_events([(11, "tensor_free", 0xB, None, "cpu"), (12, "tensor_free", 0xA, None, "cuda:0")]))
    assert third["size"].to_list() == [200, None]
    assert third.columns == list(schema.EVENTS_SCHEMA)
