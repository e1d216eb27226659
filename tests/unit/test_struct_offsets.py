"""The struct offsets the BPF handlers read equal the vendor headers' offsetof,
and the generated BPF structs have the layout schema/ declares."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from pasta_trace import schema
from pasta_trace.probes import offsets

CUDA_INCLUDE = Path("/usr/local/cuda-13.0/include")
HIP_HEADER = Path("/usr/include/hip/hip_runtime_api.h")


def _run_c(tmp_path: Path, name: str, source: str, flags: list[str]) -> dict[str, int]:
    if shutil.which("gcc") is None:
        pytest.skip("gcc is not installed")
    src = tmp_path / f"{name}.c"
    exe = tmp_path / name
    src.write_text(source)
    subprocess.run(["gcc", *flags, str(src), "-o", str(exe)], check=True, capture_output=True, text=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    return {k: int(v) for k, v in (line.split() for line in out.splitlines())}


def _program(includes: list[str], items: list[tuple[str, str]]) -> str:
    lines = ["#include <stdio.h>", "#include <stddef.h>", *[f"#include <{i}>" for i in includes], "int main(void) {"]
    lines += [f'    printf("%s %zu\\n", "{key}", (size_t)({expr}));' for key, expr in items]
    lines += ["    return 0;", "}"]
    return "\n".join(lines) + "\n"


def _offset_items(header: str) -> list[tuple[str, str]]:
    return [
        (f"{o.c_type}.{o.field}", f"offsetof({o.c_type}, {o.field})")
        for o in offsets.CHECKED_OFFSETS
        if o.header == header
    ]


def _expected(header: str) -> dict[str, int]:
    exp = {f"{o.c_type}.{o.field}": o.value for o in offsets.CHECKED_OFFSETS if o.header == header}
    return exp


def test_cuda_struct_offsets_match_cuda_h(tmp_path):
    if not (CUDA_INCLUDE / "cuda.h").exists():
        pytest.skip(f"no CUDA toolkit headers at {CUDA_INCLUDE}")
    sizes = [(f"sizeof.{t}", f"sizeof({t})") for t in offsets.SIZES if t != "hipMemcpy3DParms"]
    got = _run_c(
        tmp_path,
        "cuda_offsets",
        _program(["cuda.h", "cuda_runtime_api.h"], _offset_items("cuda") + sizes),
        [f"-I{CUDA_INCLUDE}"],
    )
    expected = _expected("cuda") | {f"sizeof.{t}": v for t, v in offsets.SIZES.items() if t != "hipMemcpy3DParms"}
    assert got == expected


def test_memorytype_values_match_cuda_h(tmp_path):
    if not (CUDA_INCLUDE / "cuda.h").exists():
        pytest.skip(f"no CUDA toolkit headers at {CUDA_INCLUDE}")
    items = [(k, f"CU_MEMORYTYPE_{k}") for k in offsets.CU_MEMORYTYPE]
    got = _run_c(tmp_path, "memtype", _program(["cuda.h"], items), [f"-I{CUDA_INCLUDE}"])
    assert got == offsets.CU_MEMORYTYPE


def test_hip_struct_offsets_match_hip_headers(tmp_path):
    if not HIP_HEADER.exists():
        pytest.skip(f"no HIP headers at {HIP_HEADER} (Debian libamdhip64-dev)")
    items = _offset_items("hip") + [("sizeof.hipMemcpy3DParms", "sizeof(hipMemcpy3DParms)")]
    items += [(f"kind.{k}", f"hipMemcpy{k}") for k in ("HostToHost", "HostToDevice", "DeviceToHost",
                                                        "DeviceToDevice", "Default")]
    got = _run_c(tmp_path, "hip_offsets", _program(["hip/hip_runtime_api.h"], items), ["-D__HIP_PLATFORM_AMD__"])
    expected = _expected("hip") | {"sizeof.hipMemcpy3DParms": offsets.SIZES["hipMemcpy3DParms"]}
    # hipMemcpyKind is numbered like CopyKind h2h..default, which the BPF relies on.
    expected |= {
        "kind.HostToHost": schema.CopyKind.h2h,
        "kind.HostToDevice": schema.CopyKind.h2d,
        "kind.DeviceToHost": schema.CopyKind.d2h,
        "kind.DeviceToDevice": schema.CopyKind.d2d,
        "kind.Default": schema.CopyKind.default,
    }
    assert got == expected


def test_hip_5_2_lacks_launch_config_structs():
    """HIP_LAUNCH_CONFIG and hipLaunchConfig_t (ROCm 6.5+) are absent from
    Debian's HIP 5.2 headers; their handlers use the byte-identical
    CUlaunchConfig / cudaLaunchConfig_t constants checked above."""
    if not HIP_HEADER.exists():
        pytest.skip(f"no HIP headers at {HIP_HEADER}")
    text = "".join(p.read_text(errors="replace") for p in HIP_HEADER.parent.rglob("*.h"))
    assert ("HIP_LAUNCH_CONFIG" in text, "hipLaunchConfig_t" in text) == (False, False)


def test_generated_bpf_structs_match_schema(tmp_path):
    items = []
    expected = {}
    for rec in schema.HOST_RECORDS:
        items.append((f"sizeof.{rec.name}", f"sizeof(struct {rec.name})"))
        expected[f"sizeof.{rec.name}"] = rec.size
        for fname, off in rec.offsets().items():
            items.append((f"{rec.name}.{fname}", f"offsetof(struct {rec.name}, {fname})"))
            expected[f"{rec.name}.{fname}"] = off
    source = "#include <linux/types.h>\n" + schema.bpf_c_header() + _program([], items)
    assert _run_c(tmp_path, "schema_structs", source, []) == expected
