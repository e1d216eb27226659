"""One launch seen at two layers: a CUDA runtime launch and the driver launch
made inside it, on the same thread.

The probes mark the driver call as the runtime call's nested part (kind
`nested`, `outer_ts_ns` = the runtime call's `ts_ns`; bpf/pasta.h, pt_nest),
so the launch counts once.  The runtime launch is named through its host stub
(capture.naming.symbolize); here its driver launch's handle (a CUfunction or
CUkernel) gets the same name (source `runtime_launch`), which names every
later launch of that handle made through the driver alone.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from ... import schema
from ...parquet_scan import scan_events
from ...probes.catalog import APIS


def launch_apis(layer: schema.Layer) -> list[str]:
    """Launch APIs of a layer whose `func` is a kernel handle (not a host function or graph)."""
    return [a.symbol for a in APIS if a.kind == schema.Kind.launch and a.layer == layer
            and a.shape not in ("host_func",) and a.family in ("cuda", "cudart")]


def nested_launch_names(capture_dir: Path, names: pl.DataFrame) -> pl.DataFrame:
    """Names (schema.NAMES_SCHEMA) for the handles of driver launches nested
    in runtime launches whose handle ``names`` names."""
    files = sorted(Path(capture_dir).glob("events*.parquet"))
    empty = schema.empty_frame(schema.NAMES_SCHEMA)
    if not files:
        return empty
    events = scan_events(files)  # a file written before format 1.2 has no outer_ts_ns: null, no pairing
    api = pl.col("api").cast(pl.String)
    inner = events.filter(
        (pl.col("kind").cast(pl.String) == "nested") & api.is_in(launch_apis(schema.Layer.driver))
        & pl.col("func").is_not_null() & pl.col("outer_ts_ns").is_not_null()
    ).select("pid", "tid", "outer_ts_ns", "func", "ts_ns", api.alias("api"))
    outer = events.filter(api.is_in(launch_apis(schema.Layer.runtime)) & pl.col("func").is_not_null()).select(
        "pid", "tid", pl.col("ts_ns").alias("outer_ts_ns"), pl.col("func").alias("outer_func"))
    known = (
        names.lazy().filter(pl.col("reason").is_null() & pl.col("name").is_not_null())
        .group_by("pid", "handle").agg(pl.col("name").sort_by("ts_ns", nulls_last=False).last())
        .rename({"handle": "outer_func"})
    )
    return (
        inner.join(outer, on=["pid", "tid", "outer_ts_ns"])
        .join(known, on=["pid", "outer_func"])
        .group_by("pid", "func", "name")
        .agg(pl.col("ts_ns").min(), pl.col("api").sort_by("ts_ns").first())
        .select("pid", pl.col("func").alias("handle"), "name", pl.lit("runtime_launch").alias("source"), "ts_ns",
                "api", pl.lit(None, pl.String).alias("reason"))
        .sort("pid", "ts_ns")
        .collect()
        .cast(schema.NAMES_SCHEMA)
    )
