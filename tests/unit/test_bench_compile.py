"""scripts/bench_compile.py compiles what a capture of each variant compiles."""

import importlib.util
import re
from pathlib import Path

from pasta_trace.probes import catalog

_SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_compile.py"


def _bench():
    spec = importlib.util.spec_from_file_location("bench_compile", _SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _entries(text: str) -> int:
    return len(re.findall(r"^PT_\w+\(\w+, \d+, \d+, ", text, re.M))


def test_variants_are_the_captures_programs():
    b = _bench()
    texts = {v: b.text_of(v) for v in b.VARIANTS}
    assert _entries(texts["floor"]) == 0
    for v in ("default", "system", "stacks", "native", "aggregate"):
        assert _entries(texts[v]) == len(catalog.APIS), v
    assert "#define PT_FILTER_PIDS 1" in texts["default"]
    assert "#define PT_FILTER_PIDS 1" not in texts["system"]
    assert "#define PT_PYSTACKS 1" in texts["stacks"] and "#define PT_NATIVESTACKS 1" not in texts["stacks"]
    assert "#define PT_PYSTACKS 1" in texts["native"] and "#define PT_NATIVESTACKS 1" in texts["native"]
    assert "#define PT_AGGREGATE 1" in texts["aggregate"]
    assert "#define PT_PYSTACKS" not in texts["default"] and "#define PT_AGGREGATE" not in texts["default"]
    # every variant carries the discover program, as a capture's does
    assert all("RAW_TRACEPOINT_PROBE(sched_process_exec)" in t for t in texts.values())
