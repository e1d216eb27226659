"""Run by an interpreter with pasta_trace: the device kernels with graph ids of a capture (argv[1]) for
the kernel named argv[2], and how they joined, as one JSON line.

Run by scripts/gpu_check."""
import json, sys, polars as pl
from pasta_trace import merge
from pasta_trace.read import open_capture
cap = open_capture(sys.argv[1])
name = sys.argv[2]
dev = merge.device_executions(cap).collect()
ex = merge.kernel_executions(cap).collect()
counts = merge.graph_launch_counts(cap)
mine = dev.filter((pl.col("graph_id").fill_null(0) != 0) & (pl.col("dev_name") == name))
joined = ex.filter(pl.col("via_graph") & (pl.col("name") == name) & pl.col("gpu_start_ns").is_not_null()
                   & (pl.col("match").cast(pl.String) == "exact"))
print(json.dumps({"device_graph_kernels": mine.height, "correlation_ids": mine["correlation_id"].n_unique(),
                  "joined": joined.height, "direct": ex.filter(~pl.col("via_graph") & (pl.col("name") == name)).height,
                  "device_counts": counts["device_kernels"].to_list(), "host_counts": counts["host_kernels"].to_list()}))
