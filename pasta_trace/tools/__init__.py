"""Analyses: the tables a report shows.  Each tool is a function of a Capture
(a capture directory or a merged timeline, pasta_trace.read) returning a
Polars frame, plus an optional text renderer, declared once with `@tool(...)`
(registry.py) and listed in one table, `REGISTRY`, in the order of
`REPORT_ORDER`, so `report`, `report --html` and `export --format csv` pick
every tool up.  Tools import no BCC, never touch the kernel and only read:
what `pasta_trace.read` and `pasta_trace.merge` give them (a report hands
them a capture merged once, merge.held).

The tools, by concern:
  overview.py     processes, api_errors: what ran and what failed, per process
  kernels.py      kernels, kernel_call_sites: launches per kernel and per line
  memory.py       memory, memory_totals, memory_peaks, peak_call_sites, leaks,
                  leak_call_sites: driver memory
  tensors.py      tensor_*: PyTorch's allocators (libc10), apart from the driver's
  transfers.py    transfers, copy_storms, repeated_copies and their call sites
  sync.py         sync, sync_call_sites: time blocked
  nccl.py         collectives, collective_bandwidth, stragglers, straggler_ranks,
                  hangs
  call_sites.py   call_sites, and the top stacks of `report --stacks`
  gpu.py          device data: launch_gaps, gpu_idle, working_set, alloc_hotness,
                  page_hotness, prefetch

What they share, and what reads their tables:
  registry.py     Tool, Column, `@tool`, the units
  common.py       a capture's calls, its time span, measured_sum
  sites.py        the call site of each call (the user's line, or the innermost)
  run.py          running the tools; the facts every report heads with
  findings.py     the key findings a report opens with, read from the tables
  render.py       how a column reads to a person (units, times, hex)
  flame.py        the flame graphs of the HTML report
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
