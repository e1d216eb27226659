"""Analyses.  Each tool is a function of a Capture returning a frame, plus an
optional text renderer, registered in one table (`REGISTRY`) so `report`,
`report --html` and `export --format csv` pick every tool up.  Tools import no
BCC and never touch the kernel; they read only what `pasta_trace.read` /
`pasta_trace.merge` give them.

Each module lists its tools in `TOOLS`; they are registered here, in the order
reports show them.
"""

from . import (api_errors, call_sites, gpu_time, hotness, kernels, leaks, memory, overview, prefetch, sync, tensors,
               transfers)
from .registry import REGISTRY, Tool, register

for _module in (overview, api_errors, kernels, memory, leaks, tensors, transfers, sync, call_sites, gpu_time, hotness,
                prefetch):
    for _tool in _module.TOOLS:
        register(_tool)

__all__ = ["REGISTRY", "Tool", "register"]
