"""What a call's return code says: whether it failed, and the code's name.

`ret` is null where no uretprobe ran (the calls still probed at entry only, such
as a VMM range or a graph launch, and every launch, copy, memset and free of a
capture made before those had return probes): such a call is not known to have
failed, and counts as done.
Every API family returns 0 for success.  The family is read from the API's
name, NVIDIA's and AMD's naming being strict: `hip*` (and `__hip*`) are HIP,
`cuda*` (and `__cuda*`) the CUDA runtime, `nccl*` NCCL, any other `cu*` the
CUDA driver."""

from __future__ import annotations

import polars as pl

from . import schema
from .schema import RETURN_CODES

#: family -> the C type's name, for codes no header of ours names
_TYPE = {"cuda": "CUresult", "cudart": "cudaError_t", "hip": "hipError_t", "nccl": "ncclResult_t"}


def failed(ret: pl.Expr = pl.col("ret")) -> pl.Expr:
    """True for calls that returned an error; false where no code was read."""
    return ret.is_not_null() & (ret != 0)


def done(ret: pl.Expr = pl.col("ret")) -> pl.Expr:
    """Calls that did what they were asked, as far as the probes know."""
    return ~failed(ret)


def family(api: pl.Expr = pl.col("api")) -> pl.Expr:
    a = api.cast(pl.String).str.strip_chars_start("_")
    return (
        pl.when(a.str.starts_with("hip")).then(pl.lit("hip"))
        .when(a.str.starts_with("cuda")).then(pl.lit("cudart"))
        .when(a.str.starts_with("nccl")).then(pl.lit("nccl"))
        .when(a.str.starts_with("cu")).then(pl.lit("cuda"))
    )


def error_name(api: pl.Expr = pl.col("api"), ret: pl.Expr = pl.col("ret")) -> pl.Expr:
    """Name of a failed call's return code (`CUDA_ERROR_NOT_INITIALIZED`,
    `hipErrorInvalidDevice`, ...); null for calls that did not fail.  A code
    the headers do not name reads `CUresult 12345` (a newer driver)."""
    fam = family(api)
    code = ret.cast(pl.Int64)
    named = pl.lit(None, pl.String)
    for name, table in RETURN_CODES.items():
        named = pl.when(fam == name).then(code.replace_strict(table, default=None, return_dtype=pl.String)).otherwise(named)
    unnamed = pl.concat_str([fam.replace_strict(_TYPE, default="error", return_dtype=pl.String), pl.lit(" "),
                             code.cast(pl.String)])
    return pl.when(failed(ret)).then(pl.coalesce(named, unnamed))


#: calls() columns: one row per call (events) or per counted group (--aggregate)
CALLS_SCHEMA: dict[str, pl.DataType] = {
    "pid": pl.UInt32,
    "api": pl.Categorical,
    "kind": pl.Enum(schema.KIND_NAMES),
    "func": pl.UInt64,
    "ret": pl.Int32,
    "count": pl.UInt64,  # calls in the row
    "bytes": pl.UInt64,  # their size sum (null where the API has no size)
    "first_ts_ns": pl.Int64,
    "last_ts_ns": pl.Int64,
}


def calls(frame: pl.LazyFrame) -> pl.LazyFrame:
    """Events (schema.EVENTS_SCHEMA) or an --aggregate table
    (schema.AGGREGATE_SCHEMA) as CALLS_SCHEMA rows, so counts and byte sums
    read the same from both: sum `count`, never count rows."""
    if "ts_ns" not in frame.collect_schema().names():  # an --aggregate table (events have a `count` too: NCCL's)
        return frame.select([pl.col(k).cast(v) for k, v in CALLS_SCHEMA.items()])
    return frame.select(
        "pid", "api", "kind", "func", "ret", pl.lit(1, pl.UInt64).alias("count"), pl.col("size").alias("bytes"),
        pl.col("ts_ns").alias("first_ts_ns"), pl.col("ts_ns").alias("last_ts_ns"),
    ).cast(CALLS_SCHEMA)


#: api_errors() columns
ERRORS_SCHEMA: dict[str, pl.DataType] = {
    "pid": pl.UInt32,
    "api": pl.String,
    "error": pl.String,
    "ret": pl.Int32,
    "failed": pl.UInt64,  # calls of `api` that returned `error`
    "calls": pl.UInt64,  # every call of `api` by this process
    "first_ts_ns": pl.Int64,
    "last_ts_ns": pl.Int64,
}


def api_errors(calls_frame: pl.LazyFrame) -> pl.LazyFrame:
    """Per process, API and return code of the failed calls: how many, out of
    how many calls of that API, and the first and last time (calls() rows)."""
    per_api = calls_frame.group_by("pid", "api").agg(pl.col("count").sum().alias("calls"))
    return (
        calls_frame.filter(failed())
        .group_by("pid", "api", "ret")
        .agg(
            pl.col("count").sum().alias("failed"),
            pl.col("first_ts_ns").min(),
            pl.col("last_ts_ns").max(),
        )
        .join(per_api, on=["pid", "api"], how="left")
        .with_columns(error_name().alias("error"), pl.col("api").cast(pl.String))
        .select([pl.col(k).cast(v) for k, v in ERRORS_SCHEMA.items()])
        .sort(["failed", "pid", "api", "ret"], descending=[True, False, False, False])
    )
