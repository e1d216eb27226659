"""Distinct values of a column whose values come in runs, as drained events'
do: a loop launches one kernel from one call site of one process, so a batch
of a thousand launches holds a handful of runs.  Folding each run to one
value before the sort makes the sort one of a few values: at 100,000 events
a second, a sort (or a hash) of every value cost more than the rest of a
drain."""

from __future__ import annotations

import numpy as np


def distinct(values: np.ndarray) -> np.ndarray:
    """The distinct ``values``, sorted (np.unique's answer)."""
    if values.size > 1:
        values = values[np.concatenate(([True], values[1:] != values[:-1]))]
    return np.unique(values)
