"""Run by an interpreter with pasta_trace: what the capture (argv[1]) of the graph program holds for
the kernel named argv[2], as one JSON line.

Run by scripts/gpu_check."""
import json, sys, polars as pl
from pasta_trace import merge
from pasta_trace.read import open_capture
cap = open_capture(sys.argv[1])
e = cap.events.collect()
ex = merge.kernel_executions(cap).collect()
print(json.dumps({"captured": e.filter(pl.col("kind") == "captured").height,
                  "graph_launches": merge.graph_launches(cap).filter(pl.col("inst_ts").is_not_null()).height,
                  "via_graph": ex.filter(pl.col("via_graph") & (pl.col("name") == sys.argv[2])).height,
                  "direct": ex.filter(~pl.col("via_graph") & (pl.col("name") == sys.argv[2])).height}))
