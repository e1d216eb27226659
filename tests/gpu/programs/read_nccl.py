"""Run by an interpreter with pasta_trace: the ncclAllReduce events and communicators rows of the
capture argv[1], as one JSON line.

Run by scripts/gpu_check."""
import json, sys, polars as pl
from pasta_trace.read import open_capture
cap = open_capture(sys.argv[1])
calls = cap.events.filter(pl.col('api').cast(pl.String) == 'ncclAllReduce').sort('ts_ns').select(
    'count', 'size', 'ret', 'seq', pl.col('datatype').cast(pl.String)).collect().to_dicts()
comms = cap.communicators.select('rank', 'nranks', 'comm_id').collect().to_dicts()
print(json.dumps({"calls": calls, "comms": comms}))
