"""API errors: the calls that returned an error code, by process, API and
code, with the code's name from the vendor headers."""

from __future__ import annotations

import polars as pl

from ..call_result import api_errors as _api_errors
from ..read import Capture
from .calls import capture_calls
from .registry import Tool


def api_errors(cap: Capture) -> pl.DataFrame:
    """Columns: pid; api; error (the code's name, e.g. CUDA_ERROR_NOT_INITIALIZED);
    ret (the code); failed (calls of api that returned it); calls (every call of
    api by the process); first_ts_ns, last_ts_ns (ns CLOCK_MONOTONIC, first and
    last such failure; with --aggregate, of the counted group).  Only calls whose
    return code the probes read can fail here: launches, copies, memsets and
    frees are entry-only."""
    return _api_errors(capture_calls(cap)).collect(engine="streaming")


TOOLS = [
    Tool(
        name="api_errors",
        reads_aggregate=True,
        title="API errors (failed calls)",
        compute=api_errors,
        description="calls that returned an error, per process, API and return code, out of all calls of that API",
        terminal_columns=("pid", "api", "error", "failed", "calls", "first_ts_ns", "last_ts_ns"),
    ),
]
