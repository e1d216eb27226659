"""Analyses.  Each tool is a function of a Capture returning a frame, plus an
optional text renderer, registered in one table (`REGISTRY`) so `report`,
`report --html` and `export --format csv` pick every tool up.  Tools import no
BCC and never touch the kernel; they read only what `pasta_trace.read` /
`pasta_trace.merge` give them.  Importing this package registers every tool, in
the order reports show them.
"""

from .registry import REGISTRY, Tool, register  # noqa: F401
from . import overview, kernels, memory, leaks, transfers, sync, gpu_time, hotness, prefetch  # noqa: F401,E402
