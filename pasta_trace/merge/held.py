"""The merged frames of a capture worked out once and held in memory, for a
reader that runs many analyses over them (a report): the caller merges, the
tools only read."""

from __future__ import annotations

import dataclasses

from ..read import Capture
from .allocations import allocations
from .kernels import kernel_executions
from .pages import attributed_pages


def with_merged(cap: Capture) -> Capture:
    """`cap` with its merged frames (kernel executions, allocation instances,
    attributed pages) computed once and held in memory, so the tools read them
    instead of each redoing the merge.  A merged timeline already has them on
    disk and is returned as it is: for captures too big for this, merge first."""
    if cap.merged:
        return cap
    # the kernel executions' rows are in memory already (collected, a host-only
    # capture's null device columns would be too); the attributed pages read them
    # (kernel names) from the held frame, not from a second merge of every launch
    held = {"kernels": kernel_executions(cap)}
    partial = dataclasses.replace(cap, merged=held)
    for name, fn in (("allocations", allocations), ("pages", attributed_pages)):
        held[name] = fn(partial).collect(engine="streaming").lazy()
    return dataclasses.replace(cap, merged=held)
