"""API errors: the calls that returned an error code, by process, API and
code, with the code's name from the vendor headers."""

from __future__ import annotations

import polars as pl

from ..call_result import api_errors as _api_errors
from ..read import Capture
from .calls import capture_calls
from .registry import PID, columns, tool

API_ERRORS = columns(
    PID, ("api", pl.String, "", "the API"),
    ("error", pl.String, "", "the code's name from the vendor headers, e.g. CUDA_ERROR_NOT_INITIALIZED"),
    ("ret", pl.Int32, "", "the return code"),
    ("failed", pl.UInt64, "count", "calls of api that returned it"),
    ("calls", pl.UInt64, "count", "every call of api by the process"),
    ("first_ts_ns", pl.Int64, "ts", "first such failure (--aggregate: of the counted group)"),
    ("last_ts_ns", pl.Int64, "ts", "last such failure"),
)


@tool("api_errors", "API errors (failed calls)", API_ERRORS, reads_aggregate=True,
      description="calls that returned an error, per process, API and return code, out of all calls of that API",
      terminal_columns=("pid", "api", "error", "failed", "calls", "first_ts_ns", "last_ts_ns"))
def api_errors(cap: Capture) -> pl.DataFrame:
    """The calls that returned an error, per process, API and code: every
    call whose return code the probes read (all but the events of a capture
    made before launches, copies, memsets and frees had return probes)."""
    return _api_errors(capture_calls(cap)).collect(engine="streaming")
