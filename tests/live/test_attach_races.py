"""Races at attach time must never fail a capture: a library whose only
user dies mid-attach."""

from __future__ import annotations

import json
import shutil

import pytest

from pasta_run import run_pasta
from pasta_trace.read import open_capture

pytestmark = [pytest.mark.live, pytest.mark.usefixtures("require_bpf")]


def test_a_library_whose_process_dies_mid_attach(families, tmp_path):
    """The opener is stopped at its open, then SIGKILLed while we attach
    through its /proc/PID/root: each try ends complete, exit 0, the failure
    (if the attach saw it) noted for that library."""
    cuda = next(f for f in families if f.name == "cuda")
    copy = tmp_path / "lib"
    copy.mkdir()
    shutil.copy(cuda.stub, copy / "libcuda.so.1")
    for i in range(5):
        out = tmp_path / f"cap{i}"
        r = run_pasta(["-o", str(out), "--", "sh", "-c",
                       f"cat {copy}/libcuda.so.1 >/dev/null & sleep 0.05; kill -9 $!"], timeout=120)
        assert r.returncode == 0, r.stderr
        assert "internal error" not in r.stderr and "Traceback" not in r.stderr, r.stderr
        cap = open_capture(out)
        assert cap.complete, cap.problems
        manifest = json.loads((out / "manifest.json").read_text())
        for lib in manifest["libraries"]:
            assert lib["symbols_attached"] or lib["errors"], lib
