"""Reading the probes program's small BPF maps: loss counters and the
in-kernel aggregation."""

from __future__ import annotations

import numpy as np

from .. import schema


def read_lost(bpf) -> tuple[int, int, int]:
    """(events, names, calls without their return) lost so far, summed over CPUs."""
    t = bpf["lost"]
    return tuple(int(sum(t[t.Key(i)])) for i in range(3))  # type: ignore[return-value]


def read_aggregate(bpf) -> tuple[np.ndarray, np.ndarray]:
    """The aggregation map's keys and values (schema.AGG_KEY, schema.AGG_VAL):
    one row per (pid, api, kernel, shape), at most PT_AGG_MAX."""
    items = list(bpf["agg"].items())
    keys = np.frombuffer(b"".join(bytes(k) for k, _ in items), schema.AGG_KEY.dtype)
    vals = np.frombuffer(b"".join(bytes(v) for _, v in items), schema.AGG_VAL.dtype)
    return keys, vals
