"""Golden device record file written by the C++ writer (gpu_probes/host/writer.cpp
and slot.cpp) in a host-only program: every record type, deterministic content.

The program is rebuilt and rerun here: its output must be byte-identical to
the committed file, and the values it reports (field names as the C++ compiler
sees record.h) must be what a schema-driven decode of the bytes finds, and
what pasta_trace.device reads.  Regenerate after an intended format change:

    GPU_PROBES_REGEN_GOLDEN=1 .venv/bin/python -m pytest tests/unit/test_gpu_probes_golden.py
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from pasta_trace import schema
from pasta_trace.schema import DeviceRecordType as RT

ROOT = Path(__file__).resolve().parents[2]
GP = ROOT / "gpu_probes"
GOLDEN = ROOT / "tests/fixtures/golden"
BIN, JSON = GOLDEN / "device_all_records.bin", GOLDEN / "device_all_records.json"

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++ to build the golden writer")


@pytest.fixture(scope="module")
def regenerated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("golden")
    exe = d / "golden_writer"
    subprocess.run(
        ["g++", "-std=c++17", "-O2", "-Wall", "-Wextra", "-Werror", f"-I{GP / 'include'}", f"-I{GP / 'host'}",
         str(GP / "tests/golden_writer.cpp"), str(GP / "host/slot.cpp"), str(GP / "host/writer.cpp"), "-pthread",
         "-o", str(exe)],
        check=True,
    )
    out_bin, out_json = d / "golden.bin", d / "golden.json"
    subprocess.run([str(exe), str(out_bin), str(out_json)], check=True)
    if os.environ.get("GPU_PROBES_REGEN_GOLDEN") == "1":
        GOLDEN.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(out_bin, BIN)
        shutil.copyfile(out_json, JSON)
    return out_bin, out_json


def test_writer_output_is_byte_identical_to_the_golden_file(regenerated: tuple[Path, Path]) -> None:
    out_bin, out_json = regenerated
    assert out_bin.read_bytes() == BIN.read_bytes()
    assert json.loads(out_json.read_text()) == json.loads(JSON.read_text())


def test_golden_file_holds_every_record_type() -> None:
    types = {r["type"] for r in json.loads(JSON.read_text())["records"]}
    assert types == {t.name for t in RT}


def decode(raw: bytes) -> tuple[dict, list[dict]]:
    """A schema-driven decode, independent of pasta_trace.device: header, then
    records one by one with each type's numpy dtype."""
    def rec(r: schema.Record, off: int) -> dict:
        v = np.frombuffer(raw, dtype=r.dtype, count=1, offset=off)[0]
        return {k: int(v[k]) for k in r.dtype.names if k != "pad"}

    header = rec(schema.DEV_FILE_HEADER, 0)
    header.pop("reserved")
    out, off = [], header["header_size"]
    while off < len(raw):
        h = rec(schema.DEV_RECORD_HEADER, off)
        assert h["total_len"] % 8 == 0 and h["total_len"] >= 16
        t = RT(h["type"])
        p = off + schema.DEV_RECORD_HEADER.size
        hrec = schema.DEVICE_PAYLOADS[t]
        r = {"type": t.name, "launch_id": h["launch_id"], "payload": rec(hrec, p)}
        if t in schema.DEVICE_ENTRIES:
            e = schema.DEVICE_ENTRIES[t]
            r["entries"] = [rec(e, p + hrec.size + i * e.size) for i in range(r["payload"]["n"])]
        elif t is RT.STRING:
            s = p + hrec.size
            r["text"] = raw[s:s + r["payload"]["len"]].decode()
        elif t is RT.WS_BITMAP:
            nw = (r["payload"]["nbits"] + 63) // 64
            r["words"] = np.frombuffer(raw, "<u8", nw, p + hrec.size).tolist()
        out.append(r)
        off += h["total_len"]
    assert off == len(raw)
    return header, out


def test_schema_decode_finds_the_values_the_cpp_side_wrote() -> None:
    header, records = decode(BIN.read_bytes())
    want = json.loads(JSON.read_text())
    assert header == want["header"]
    assert records == want["records"]


def test_golden_numbers_are_the_expected_ones() -> None:
    """The content is known independently of both sides: n = 4096 vecadd with 4 KiB pages."""
    want = json.loads(JSON.read_text())["records"]
    ks = next(r["payload"] for r in want if r["type"] == "KERNEL_SUMMARY")
    n = 4096
    assert (ks["gld"], ks["gst"], ks["gatom"], ks["shared"], ks["local"]) == (2 * n, n, 1, n, 3)
    assert (ks["gld_warp"], ks["gst_warp"], ks["bytes"]) == (2 * n // 32, n // 32, 12 * n + 8)
    assert (ks["blocks_in"], ks["blocks_out"], ks["warp_instrs"], ks["thread_instrs"]) == (16, 16, 3 * n // 32, 3 * n)
    hist = next(r for r in want if r["type"] == "PAGE_HIST")
    dropped = next(r["payload"] for r in want if r["type"] == "DROPPED" and r["launch_id"] == 1)
    assert hist["payload"]["n"] == 8  # 13 pages touched, 8 slots
    assert sum(e["count"] for e in hist["entries"]) + dropped["page_overflow"] == 3 * n
    assert [e["unique_pages"] for e in next(r for r in want if r["type"] == "ALLOC_TOUCH")["entries"]] == [4, 4, 5]
    samples = next(r for r in want if r["type"] == "ACCESS_SAMPLES")["payload"]
    assert (samples["n"], samples["dropped"]) == (16, 3 * n // 32 // 8 - 16)
    assert ks["dropped"] == dropped["page_overflow"] + samples["dropped"]
    assert want[-1] == {"type": "DROPPED", "launch_id": 0, "payload": {"records": 3, "accesses": 0,
                                                                       "page_overflow": 0}}


def test_pasta_trace_device_reader_reads_the_golden_file() -> None:
    device = pytest.importorskip("pasta_trace.device")
    if not hasattr(device, "read_device_files"):
        pytest.skip("pasta_trace.device.read_device_files has not landed yet")
    data = device.read_device_files([BIN])
    assert data.problems == []
    want = json.loads(JSON.read_text())["records"]
    f = data.frames
    for name, frame in f.items():
        assert dict(frame.schema) == schema.DEVICE_FRAMES[name], name

    def rows(t: str) -> list[dict]:
        return [r for r in want if r["type"] == t]

    ks = f["kernel_summaries"].drop("pid").to_dicts()
    assert ks == [{"launch_id": 1, **rows("KERNEL_SUMMARY")[0]["payload"]}]
    launches = f["launches"].to_dicts()
    assert len(launches) == 1 and launches[0]["name"] == "_Z6vecaddPKfS0_Pfi" and launches[0]["pid"] == 4242
    assert {k: launches[0][k] for k in rows("LAUNCH")[0]["payload"]} == rows("LAUNCH")[0]["payload"]
    hist = rows("PAGE_HIST")[0]
    assert f["page_hist"].select("page", "count").to_dicts() == hist["entries"]
    assert f["page_hist"]["page_shift"].unique().to_list() == [12]
    assert f["alloc_touch"].select("alloc_base", "touches", "bytes", "unique_pages").to_dicts() == \
        rows("ALLOC_TOUCH")[0]["entries"]
    ws = f["ws_bitmaps"].sort("alloc_base")
    assert [np.frombuffer(b, "<u8").tolist() for b in ws["bits"]] == [r["words"] for r in rows("WS_BITMAP")]
    assert f["access_samples"].drop("pid", "launch_id").to_dicts() == rows("ACCESS_SAMPLES")[0]["entries"]
    assert f["opcode_hist"].select("opcode", "count").to_dicts() == [
        {"opcode": o, "count": c} for o, c in zip(["LDG.E", "STG.E", "FADD"], [256, 128, 128])]
    assert f["clock_sync"].drop("pid").to_dicts() == [r["payload"] for r in rows("CLOCK_SYNC")]
    assert f["allocs"].height == 3 and f["frees"].height == 3
    assert f["cupti_kernels"]["name"].to_list() == ["_Z6vecaddPKfS0_Pfi"]
    assert f["cupti_memcpy"].height == 1 and f["cupti_memset"].height == 1
    assert f["dropped"].select("launch_id", "records", "accesses", "page_overflow").sort("launch_id").to_dicts() == [
        {"launch_id": 0, "records": 3, "accesses": 0, "page_overflow": 0},
        {"launch_id": 1, **rows("DROPPED")[0]["payload"]}]
    assert f["launches"]["tid"].to_list() == [4243]
