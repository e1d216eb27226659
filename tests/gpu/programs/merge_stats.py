"""Run by an interpreter with pasta_trace: merge.stats of the capture argv[1] (host launches, device
executions, matches, pages no allocation holds), as one JSON line.

Run by scripts/gpu_check."""
import json, sys
from pasta_trace import merge
print(json.dumps(merge.stats(merge.load(sys.argv[1])).as_dict()))
