"""Device record files (argv) read by pasta_trace.device, printed as one JSON object: the frames
gpu_check checks, as lists of rows, the reader's problems, each process's last TOOL_STATUS, its status
lines and verdicts.  Run by an interpreter with pasta_trace (PYTHONPATH: the repository root).

Run by scripts/gpu_check."""
import json, sys
from pasta_trace.device import read_device_files
from pasta_trace.device.status import final_status, status_lines, verdict
d = read_device_files(sys.argv[1:])
out = {k: f.to_dicts() for k, f in d.frames.items()
       if k in ("launches", "kernel_summaries", "page_hist", "alloc_touch", "allocs", "clock_sync", "dropped",
                "cupti_kernels", "cupti_memcpy", "tool_status")}
out["problems"] = d.problems
final = final_status(d.frames["tool_status"])
out["final_status"] = final.to_dicts()
out["status_lines"] = status_lines(d.frames["tool_status"])
out["verdicts"] = [verdict(r) for r in final.iter_rows(named=True)]
print(json.dumps(out, default=str))
