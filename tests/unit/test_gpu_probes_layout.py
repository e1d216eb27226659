"""The checked-in gpu_probes/include/gpu_probes/record.h, as the host compiler
(g++) and the device compiler (nvcc, for sm_80 and sm_90) see it, has exactly
the sizes and field offsets of pasta_trace.schema."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from pasta_trace import schema

ROOT = Path(__file__).resolve().parents[2]
INCLUDE = ROOT / "gpu_probes/include"


def _nvcc() -> str | None:
    return shutil.which("nvcc") or next((str(p) for p in sorted(Path("/usr/local").glob("cuda*/bin/nvcc"))), None)


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_host_compiler_sees_the_schema_layout(tmp_path: Path) -> None:
    lines = ["#include <cstdio>", "#include <cstddef>", "#include \"gpu_probes/record.h\"", "int main() {"]
    for r in schema.DEVICE_RECORDS:
        lines.append(f'std::printf("%s %zu\\n", "{r.name}", sizeof(struct {r.name}));')
        for f in r.fields:
            lines.append(f'std::printf("%s.%s %zu\\n", "{r.name}", "{f.name}", offsetof(struct {r.name}, {f.name}));')
    lines.append("}")
    src, exe = tmp_path / "layout.cpp", tmp_path / "layout"
    src.write_text("\n".join(lines))
    subprocess.run(["g++", "-std=c++17", f"-I{INCLUDE}", str(src), "-o", str(exe)], check=True)
    got = dict(line.split() for line in subprocess.run([str(exe)], capture_output=True, text=True,
                                                       check=True).stdout.splitlines())
    want = {}
    for r in schema.DEVICE_RECORDS:
        want[r.name] = str(r.size)
        want.update({f"{r.name}.{k}": str(v) for k, v in r.offsets().items()})
    assert got == want


@pytest.mark.skipif(_nvcc() is None, reason="needs nvcc")
def test_device_compiler_sees_the_schema_layout(tmp_path: Path) -> None:
    """static_asserts evaluated by nvcc's device passes (and its host pass)."""
    lines = ["#include <cstddef>", "#include \"gpu_probes/record.h\"", "#include \"gpu_probes/agg.cuh\""]
    for r in schema.DEVICE_RECORDS:
        lines.append(f"static_assert(sizeof(struct {r.name}) == {r.size}, \"{r.name}\");")
        lines += [f"static_assert(offsetof(struct {r.name}, {k}) == {v}, \"{r.name}.{k}\");"
                  for k, v in r.offsets().items()]
    # The slot embeds the summary that is written out as is: it must start the slot.
    lines.append("static_assert(offsetof(struct gp_slot, sum) == 0, \"gp_slot.sum\");")
    lines.append("__global__ void k(gp_kernel_summary *p) { p->gld = sizeof(gp_launch); }")
    src = tmp_path / "layout.cu"
    src.write_text("\n".join(lines) + "\n")
    r = subprocess.run([_nvcc(), "-c", "-gencode", "arch=compute_80,code=sm_80", "-gencode",
                        "arch=compute_90,code=sm_90", f"-I{INCLUDE}", str(src), "-o", str(tmp_path / "layout.o")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
