"""Run by an interpreter with pasta_trace: the target's (argv[2]) host launches, the capture's (argv[1])
device records and file headers (mono_open: the collector's start, on the host clock), the capture's
span, as one JSON line.

Run by scripts/gpu_check."""
import json, sys, polars as pl
from pasta_trace.device import read_device_files
from pasta_trace.read import open_capture
cap = open_capture(sys.argv[1])
pid = int(sys.argv[2])
e = cap.events.filter((pl.col("pid") == pid) & (pl.col("kind") == "launch")).select("ts_ns").collect()
files = [str(cap.path / f) for f in cap.manifest.get("device_files") or []]
d = read_device_files(files) if files else None
rec = lambda k: d.frames[k].select("start", "end").to_dicts() if d else []
print(json.dumps({"launch_ts": e["ts_ns"].to_list(), "kernels": rec("cupti_kernels"),
                  "copies": rec("cupti_memcpy") + rec("cupti_memset"),
                  "mono_open": d.files["mono_open"].to_list() if d else [],
                  "start_ns": cap.manifest["clock"]["start_ns"], "end_ns": cap.manifest["clock"]["end_ns"],
                  "notes": cap.manifest.get("notes") or [], "problems": d.problems if d else []}))
