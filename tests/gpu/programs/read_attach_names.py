"""Run by an interpreter with pasta_trace: the names rows of the capture argv[1] and its manifest's
attach_names, as one JSON line.

Run by scripts/gpu_check."""
import json, sys, polars as pl
from pasta_trace.read import open_capture
cap = open_capture(sys.argv[1])
n = cap.names.select('pid', 'handle', 'name', pl.col('source').cast(pl.String), 'reason').collect()
print(json.dumps({"names": n.to_dicts(), "attach_names": cap.manifest.get("attach_names") or {}}))
