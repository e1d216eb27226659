"""Reading the probes program's small BPF maps: loss counters and the
in-kernel aggregation."""

from __future__ import annotations

import numpy as np

from ... import schema


def read_lost(bpf) -> dict[str, int]:
    """Every BPF loss counter of schema.LOSSES so far, by name, summed over
    CPUs; counters of a map the program does not have (py_stats without
    stacks) are left out."""
    out: dict[str, int] = {}
    for counter in dict.fromkeys(loss.counter for loss in schema.LOSSES if loss.counter):
        try:
            table = bpf[counter]
        except KeyError:
            continue
        for loss in schema.loss_counters(counter):
            out[loss.name] = int(sum(table[table.Key(loss.index)]))
    return out


def read_tallies(bpf) -> dict[str, int]:
    """Every tally of schema.TALLIES so far, by name, summed over CPUs (0
    each when the program has no such array)."""
    try:
        table = bpf["tally"]
    except KeyError:
        return {t.name: 0 for t in schema.TALLIES}
    return {t.name: int(sum(table[table.Key(t.index)])) for t in schema.TALLIES}


def read_aggregate(bpf) -> tuple[np.ndarray, np.ndarray]:
    """The aggregation map's keys and values (schema.AGG_KEY, schema.AGG_VAL):
    one row per (pid, api, kernel, shape, return code), at most --aggregate-max."""
    items = list(bpf["agg"].items())
    keys = np.frombuffer(b"".join(bytes(k) for k, _ in items), schema.AGG_KEY.dtype)
    vals = np.frombuffer(b"".join(bytes(v) for _, v in items), schema.AGG_VAL.dtype)
    return keys, vals
