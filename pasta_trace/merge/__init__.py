"""Host <-> device merge on one clock (docs/merge.md), written as a timeline
directory (timeline.py), and the cluster timeline of many captures on one
clock (cluster.py, clock_align.py; docs/cluster.md).

Every function takes a pasta_trace.read.Capture (a capture directory, or a
merged timeline from `load`) and returns a lazy frame shaped like
schema.TIMELINE_FRAMES[...].  Nothing is dropped silently: rows that find no
partner keep null partner columns, and `stats` counts them.  A report merges
a capture directory once, in memory, before its tools read it (held.py).
"""

from __future__ import annotations

from .allocations import allocations
from .attribution import Segments, segments
from .cluster import load_cluster, write_cluster
from .collective_calls import calls_on_communicators, collective_calls, collective_entries, entered
from .executions import TOLERANCE_NS, device_executions
from .graphs import (device_graph_kernels, graph_kernel_launches, graph_launch_counts, graph_launches,
                     unknown_graph_names)
from .kernels import aggregate_launches, kernel_executions, kernel_names
from .launches import host_launches, launch_order, order_position
from .pages import PAGE_SHIFT, WS_PAGE_SHIFT, alloc_touches, attributed_pages, hotness, working_set
from .stats import MergeStats, stats
from .timeline import is_timeline, load, timeline_output, write_timeline

__all__ = [
    "PAGE_SHIFT", "WS_PAGE_SHIFT", "TOLERANCE_NS", "MergeStats", "Segments", "aggregate_launches", "alloc_touches",
    "allocations", "calls_on_communicators", "collective_calls", "collective_entries", "entered",
    "attributed_pages", "device_graph_kernels", "graph_kernel_launches", "graph_launch_counts", "graph_launches",
    "unknown_graph_names", "device_executions", "host_launches", "hotness", "is_timeline", "kernel_executions",
    "kernel_names", "launch_order", "load", "load_cluster", "order_position", "segments", "stats", "timeline_output",
    "working_set", "write_cluster", "write_timeline",
]
