"""The schema module is the single source of truth: the generated C agrees with
the numpy/Python layout as the C compiler sees it, and the checked-in device
header is up to date."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from pasta_trace import schema

ROOT = Path(__file__).resolve().parents[2]


def _c_layout(header_text: str, records, tmp_path: Path, compiler: str) -> dict[str, tuple[int, dict[str, int]]]:
    """Compile a program that prints sizeof/offsetof of every field, as the compiler sees them."""
    lines = ["#include <stdio.h>", "#include <stddef.h>", header_text, "int main(void){"]
    for r in records:
        lines.append(f'printf("%s %zu\\n", "{r.name}", sizeof(struct {r.name}));')
        for f in r.fields:
            lines.append(f'printf("%s.%s %zu\\n", "{r.name}", "{f.name}", offsetof(struct {r.name}, {f.name}));')
    lines.append("return 0;}")
    src = tmp_path / "layout.c"
    src.write_text("\n".join(lines))
    exe = tmp_path / "layout"
    subprocess.run([compiler, "-x", "c" if compiler == "gcc" else "c++", str(src), "-o", str(exe)], check=True)
    out: dict[str, tuple[int, dict[str, int]]] = {}
    for line in subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.splitlines():
        key, val = line.split()
        if "." in key:
            rec, field = key.split(".")
            out[rec][1][field] = int(val)
        else:
            out[key] = (int(val), {})
    return out


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
def test_bpf_structs_match_python_layout(tmp_path: Path) -> None:
    prelude = "typedef unsigned char __u8; typedef unsigned short __u16; typedef unsigned int __u32;" \
              "typedef unsigned long long __u64; typedef int __s32; typedef long long __s64;\n"
    got = _c_layout(prelude + schema.bpf_c_header(), schema.HOST_RECORDS, tmp_path, "gcc")
    for r in schema.HOST_RECORDS:
        assert got[r.name] == (r.size, r.offsets()), r.name
        assert r.dtype.itemsize == r.size


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_device_structs_match_python_layout(tmp_path: Path) -> None:
    got = _c_layout(schema.device_c_header(), schema.DEVICE_RECORDS, tmp_path, "g++")
    for r in schema.DEVICE_RECORDS:
        assert got[r.name] == (r.size, r.offsets()), r.name
        assert r.dtype.itemsize == r.size


def test_checked_in_device_header_is_generated_from_schema() -> None:
    on_disk = (ROOT / schema.DEVICE_HEADER_PATH).read_text()
    assert on_disk == schema.device_c_header(), "run: python -m pasta_trace.schema --write"


def test_header_sizes_from_the_design() -> None:
    # the C++ writer in gpu_probes/ and docs/device.md fix these two sizes; the rest is ours.
    assert schema.DEV_FILE_HEADER.size == 64
    assert schema.DEV_RECORD_HEADER.size == 16
    assert schema.DEV_FILE_HEADER.offsets()["backend"] == 48


def test_numpy_dtype_decodes_bytes_written_in_c_order() -> None:
    rec = np.zeros(1, dtype=schema.HOST_EVENT.dtype)
    rec["ts_ns"] = 123456789
    rec["grid_z"] = 7
    rec["comm"] = b"python"
    raw = rec.tobytes()
    off = schema.HOST_EVENT.offsets()
    assert int.from_bytes(raw[off["ts_ns"]:off["ts_ns"] + 8], "little") == 123456789
    assert int.from_bytes(raw[off["grid_z"]:off["grid_z"] + 4], "little") == 7
    assert raw[off["comm"]:off["comm"] + 6] == b"python"


def test_device_frames_cover_every_payload_field() -> None:
    launches = schema.DEVICE_FRAMES["launches"]
    for f in schema.DEV_LAUNCH.fields:
        assert f.name in launches
    assert schema.DEVICE_FRAMES["page_hist"]["page"] == pl.UInt64


def test_misaligned_record_is_refused() -> None:
    with pytest.raises(ValueError, match="aligned"):
        schema.Record("bad", (schema.Field("a", "u32"), schema.Field("b", "u64")))
    with pytest.raises(ValueError, match="multiple of 8"):
        schema.Record("bad", (schema.Field("a", "u32"),))
