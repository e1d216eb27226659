"""Run by an interpreter with pasta_trace: what the capture (argv[1]) of vecadd of argv[2] floats holds,
as one JSON line.

Run by scripts/gpu_check."""
import json, sys, polars as pl
from pasta_trace import merge
from pasta_trace.read import open_capture
cap = open_capture(sys.argv[1])
e = cap.events.collect()
n = int(sys.argv[2])
launch = e.filter(pl.col("kind") == "launch")
names = merge.kernel_executions(cap).collect()["name"].to_list()
print(json.dumps({"launches": launch.height, "allocs": e.filter((pl.col("kind") == "alloc") & (pl.col("size") == 4 * n)).height,
                  "layer": ",".join(map(str, launch["layer"].cast(pl.String).to_list())), "name": ",".join(map(str, names)),
                  "nested": e.filter((pl.col("kind") == "nested") & pl.col("api").cast(pl.String).str.starts_with("cuLaunch")).height}))
