"""Python runs this at start-up when pasta-trace put this folder on PYTHONPATH.

It first runs the sitecustomize it shadows (Debian's, a venv's, a user's), then
starts the pasta-trace CUPTI collector for this process.  Whatever fails here,
the program goes on: the worst outcome is one ``CUPTI unavailable: ...`` line.
"""

import importlib.machinery
import importlib.util
import os
import sys


def _run_shadowed_sitecustomize() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)


def _start_collector() -> None:
    try:
        from pasta_trace.device.cupti_collector import start_from_env
    except ImportError:
        # the traced interpreter may not have pasta-trace installed: fall back on
        # the copy that launched it, appended so the program's own packages win
        extra = os.environ.get("PASTA_TRACE_PYTHONPATH")
        if not extra:
            raise
        sys.path.append(extra)
        from pasta_trace.device.cupti_collector import start_from_env
    start_from_env()


try:
    _run_shadowed_sitecustomize()
except Exception as e:  # noqa: BLE001 - someone else's start-up code; report and go on
    print(f"pasta-trace: the shadowed sitecustomize failed: {e}", file=sys.stderr)
try:
    _start_collector()
except Exception as e:  # noqa: BLE001 - the traced program must run whatever happens here
    print(f"CUPTI unavailable: cannot load the pasta-trace collector ({type(e).__name__}: {e})", file=sys.stderr)
