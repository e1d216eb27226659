"""Analyses.  Each tool is a function of a Capture returning a frame, plus an
optional text renderer, declared once with `@tool(...)` (tools.registry) and
listed in one table (`REGISTRY`) so `report`, `report --html` and
`export --format csv` pick every tool up.  Tools import no BCC and never
touch the kernel; they read only what `pasta_trace.read` /
`pasta_trace.merge` give them.
"""

from . import call_sites, gpu, kernels, memory, nccl, overview, sync, tensors, transfers
from .registry import Tool, in_order

#: the order reports show the tools in
REPORT_ORDER = (
    "processes", "api_errors",
    "kernels", "kernel_call_sites",
    "memory", "memory_totals", "memory_peaks", "peak_call_sites", "leaks", "leak_call_sites",
    "tensor_memory", "tensor_peaks", "tensor_peak_call_sites", "tensor_fragmentation", "tensor_leaks",
    "tensors_never_freed",
    "transfers", "transfer_call_sites", "copy_storms", "repeated_copies", "repeated_copy_call_sites",
    "sync", "sync_call_sites",
    "collectives", "collective_bandwidth", "stragglers", "straggler_ranks", "hangs",
    "call_sites",
    "launch_gaps", "gpu_idle", "working_set", "alloc_hotness", "page_hotness", "prefetch",
)
REGISTRY: dict[str, Tool] = in_order(REPORT_ORDER)

# the modules are imported for the tools they declare
__all__ = ["REGISTRY", "REPORT_ORDER", "Tool", "call_sites", "gpu", "kernels", "memory", "nccl", "overview", "sync",
           "tensors", "transfers"]
