"""Chrome trace export carries the caller stacks: `sf` on each API call that
has one, `stackFrames` nodes whose parent chain is the stack, innermost first."""

from __future__ import annotations

import io
import json
from pathlib import Path

from pasta_trace.export import chrome, trace_model
from pasta_trace.read import open_capture
from test_call_sites import _capture


def test_chrome_stack_frames(tmp_path: Path) -> None:
    buf = io.BytesIO()
    chrome.write(trace_model.build(open_capture(_capture(tmp_path / "cap"))), buf)
    trace = json.loads(buf.getvalue())
    calls = [e for e in trace["traceEvents"] if e.get("ph") in ("X", "i") and e.get("cat") == "cuda_driver"]
    stacks = {}
    for e in calls:
        chain, node = [], e.get("sf")
        while node:
            chain.append(trace["stackFrames"][node]["name"])
            node = trace["stackFrames"][node].get("parent")
        stacks.setdefault(e["name"], []).append(chain)
    assert stacks == {
        "cuMemAlloc_v2": [["make_buffer train.py:12", "main train.py:80"]] * 2,
        "cuCtxSynchronize": [["Model.step train.py:40", "main train.py:90"]] * 2,
        "cuMemFree_v2": [[]],
        "cuLaunchKernel": [[]],
    }
    assert len(trace["stackFrames"]) == 4


def test_perfetto_stack_argument(tmp_path: Path) -> None:
    from pasta_trace.cli import main
    from test_export_perfetto import Parsed

    cap = _capture(tmp_path / "cap")
    out = tmp_path / "cap.pftrace"
    assert main(["export", str(cap), "--format", "perfetto", "-o", str(out)]) == 0
    parsed = Parsed(out.read_bytes())
    stacks = sorted({(name, parsed.args[(track, t)].get("stack"))
                     for track, slices in parsed.slices.items() for t, _, name, _ in slices})
    assert stacks == [
        ("cuCtxSynchronize", "Model.step train.py:40\nmain train.py:90"),
        ("cuLaunchKernel", None),
        ("cuMemAlloc_v2", "make_buffer train.py:12\nmain train.py:80"),
        ("cuMemFree_v2", None),
        ("unknown@0x77", None),  # the launch's kernel, on its stream track: no caller stack there
    ]
