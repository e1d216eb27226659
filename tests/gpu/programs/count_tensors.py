"""Run by an interpreter with pasta_trace: the CUDA tensor events in the capture argv[1] of the process
and window that torch_tensors.py wrote to argv[2], counted, as one JSON line.

Run by scripts/gpu_check."""
import json, sys, polars as pl
from pasta_trace.read import open_capture
w = json.load(open(sys.argv[2]))
e = (open_capture(sys.argv[1]).events
     .filter((pl.col("pid") == w["pid"]) & pl.col("ts_ns").is_between(w["t0"], w["t1"])
             & (pl.col("api").cast(pl.String) == "c10::reportMemoryUsageToProfiler")
             & pl.col("device").cast(pl.String).str.starts_with("cuda"))
     .sort("ts_ns").collect())
alloc, free = e.filter(pl.col("kind") == "tensor_alloc"), e.filter(pl.col("kind") == "tensor_free")
print(json.dumps({"allocs": alloc.height, "frees": free.height, "alloc_bytes": int(alloc["size"].sum()),
                  "free_bytes": int(free["size"].sum()),
                  "allocated": e["allocated_bytes"][-1] if e.height else None,
                  "reserved": e["reserved_bytes"][-1] if e.height else None}))
