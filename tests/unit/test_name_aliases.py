"""decode.resolve_aliases: a name record whose string could not be read, and
that aliases nothing, is dropped, never named after a handle-0 record."""

from __future__ import annotations

import polars as pl

from pasta_trace import schema
from pasta_trace.capture.output.decode import resolve_aliases


def _frame(rows: list[tuple]) -> pl.DataFrame:
    return pl.DataFrame(rows, schema={"pid": pl.UInt32, "handle": pl.UInt64, "alias": pl.UInt64, "name": pl.String,
                                      "source": pl.String, "ts_ns": pl.Int64, "api": pl.String, "reason": pl.String},
                        orient="row").cast({"source": schema.NAMES_SCHEMA["source"],
                                            "api": schema.NAMES_SCHEMA["api"]})


def test_unread_name_without_alias_is_dropped():
    frame = _frame([
        (7, 0, 0, "cuLogsDumpToMemory", "get_proc_address", 1, "cuGetProcAddress_v2", None),  # a miss: handle 0
        (7, 0x5000, 0, "", "register_function", 2, "__cudaRegisterFunction", None),  # string not readable
        (7, 0x6000, 0, "_Z1kv", "register_function", 3, "__cudaRegisterFunction", None),
        (7, 0x7000, 0x9000, "", "kernel_get_function", 4, "cuKernelGetFunction", None),
        (7, 0x9000, 0, "_Z1gv", "library_get_kernel", 5, "cuLibraryGetKernel", None),
    ])
    assert resolve_aliases(frame).select("handle", "name", "source").rows() == [
        (0, "cuLogsDumpToMemory", "get_proc_address"),
        (0x6000, "_Z1kv", "register_function"),
        (0x7000, "_Z1gv", "kernel_get_function"),
        (0x9000, "_Z1gv", "library_get_kernel"),
    ]
