"""Analyses.  Each tool is a function of frames returning a frame, plus renderers,
registered in one table (`REGISTRY`) so `report`, `report --html` and
`export --format csv` pick every tool up.  Tools import no BCC and never touch
the kernel; they read only what `pasta_trace.read` / `pasta_trace.merge` give them.
"""

from .registry import REGISTRY, Tool, register  # noqa: F401
