"""Failed calls: return codes decoded to their names from the vendor headers,
the API errors tool, the record summary's failure lines, and no byte total
that counts a failed call.  Hand-written captures; times are ns after T0."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from pasta_trace import cli
from pasta_trace.capture.session import summary
from pasta_trace.read import open_capture
from pasta_trace.tools import REGISTRY
from test_tools_capture import T0, write_capture

ROOT = Path(__file__).resolve().parents[2]
GEN = ROOT / "scripts" / "gen_return_codes.py"
MiB = 1 << 20

# (t, dur, pid, tid, api, kind, payload): one CUDA and one HIP process whose
# allocations fail in known numbers; failed calls carry a size but got no pointer
ROWS: list[tuple] = [
    (1000, 10, 100, 101, "cuInit", "other", {"ret": 0}),
    *[(2000 + i, 10, 100, 101, "cuMemAlloc_v2", "alloc", {"size": MiB, "ret": 3}) for i in range(209)],
    (3000, 10, 100, 101, "cuMemAlloc_v2", "alloc", {"size": 4096, "ptr": 0xA000}),
    (3100, 10, 100, 101, "cuMemAllocHost_v2", "alloc", {"size": 512, "ptr": 0xF000}),
    (3200, 10, 100, 101, "cuMemAllocHost_v2", "alloc", {"size": 2 * MiB, "ret": 2}),
    (3300, 10, 100, 101, "cuMemcpyHtoD_v2", "memcpy", {"size": 256, "dst": 0xA000, "src": 0xF000, "copy_kind": "h2d",
                                                      "ret": None}),
    (4000, 10, 200, 201, "hipMalloc", "alloc", {"size": MiB, "ret": 101}),
    (4100, 10, 200, 201, "hipMalloc", "alloc", {"size": MiB, "ret": 101}),
    (4200, 10, 200, 201, "hipMalloc", "alloc", {"size": 2048, "ptr": 0xB000}),
    (4300, 10, 200, 201, "hipMalloc", "alloc", {"size": MiB, "ret": 2}),
    (4400, 10, 200, 201, "hipStreamSynchronize", "sync", {"ret": 0x7FFF_0001}),
]


@pytest.fixture()
def cap_dir(tmp_path: Path) -> Path:
    return write_capture(tmp_path / "cap", rows=ROWS, names=[])


def rows(df: pl.DataFrame) -> list[tuple]:
    return [tuple(r) for r in df.iter_rows()]


def test_return_code_table_matches_the_vendor_headers() -> None:
    """pasta_trace/return_codes.py is what the generator writes from the headers installed here."""
    if not Path("/usr/include/hip/hip_runtime_api.h").exists():
        pytest.skip("no HIP headers: apt-get install libamdhip64-dev")
    r = subprocess.run([sys.executable, str(GEN), "--check"], capture_output=True, text=True, timeout=120)
    if "no cuda.h" in r.stderr or "no nccl.h" in r.stderr:
        pytest.skip(r.stderr.strip())
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr


def test_enum_parser_follows_c_rules() -> None:
    sys.path.insert(0, str(GEN.parent))
    import gen_return_codes

    text = """
    typedef enum __HIP_NODISCARD hipError_t {
        hipSuccess = 0,  ///< ok, see hipErrorFake = 7
        hipErrorOutOfMemory = 2,
        // Deprecated
        hipErrorMemoryAllocation = 2,
        hipErrorNext,   /* = 3 */
        hipErrorHex = 0x10,
        hipErrorTbd
    } hipError_t;"""
    got = gen_return_codes.parse_enum(text, r"typedef\s+enum\s+(?:__HIP_NODISCARD\s+)?hipError_t\s*\{")
    assert got == {0: "hipSuccess", 2: "hipErrorOutOfMemory", 3: "hipErrorNext", 16: "hipErrorHex",
                   17: "hipErrorTbd"}


def test_error_names_per_family() -> None:
    from pasta_trace.call_result import error_name, failed
    from pasta_trace.schema import RETURN_CODES

    df = pl.DataFrame(
        {"api": ["cuMemAlloc_v2", "hipMalloc", "cudaMalloc", "cuInit", "cuInit", "hipFree", "ncclAllReduce",
                 "ncclCommInitRank"],
         "ret": [3, 101, 2, None, 0, 0x7FFF_0001, 4, 77]},
        schema={"api": pl.Categorical, "ret": pl.Int32},
    )
    got = df.select(error_name().alias("name"), failed().alias("failed"))
    assert got["name"].to_list() == ["CUDA_ERROR_NOT_INITIALIZED", "hipErrorInvalidDevice",
                                     "cudaErrorMemoryAllocation", None, None, "hipError_t 2147418113",
                                     "ncclInvalidArgument", "ncclResult_t 77"]
    assert got["failed"].to_list() == [True, True, True, False, False, True, True, True]
    # the headers' own spelling, first name of a value (HIP's deprecated aliases come after)
    assert RETURN_CODES["hip"][2] == "hipErrorOutOfMemory"
    assert RETURN_CODES["cuda"][100] == "CUDA_ERROR_NO_DEVICE"
    assert RETURN_CODES["nccl"][1] == "ncclUnhandledCudaError"


def test_api_errors_tool(cap_dir: Path) -> None:
    df = REGISTRY["api_errors"].compute(open_capture(cap_dir))
    assert df.columns == ["pid", "api", "error", "ret", "failed", "calls", "first_ts_ns", "last_ts_ns"]
    assert rows(df) == [
        (100, "cuMemAlloc_v2", "CUDA_ERROR_NOT_INITIALIZED", 3, 209, 210, T0 + 2000, T0 + 2208),
        (200, "hipMalloc", "hipErrorInvalidDevice", 101, 2, 4, T0 + 4000, T0 + 4100),
        (100, "cuMemAllocHost_v2", "CUDA_ERROR_OUT_OF_MEMORY", 2, 1, 2, T0 + 3200, T0 + 3200),
        (200, "hipMalloc", "hipErrorOutOfMemory", 2, 1, 4, T0 + 4300, T0 + 4300),
        (200, "hipStreamSynchronize", "hipError_t 2147418113", 0x7FFF_0001, 1, 1, T0 + 4400, T0 + 4400),
    ]


def test_report_json_and_html_show_api_errors(cap_dir: Path, tmp_path: Path, capsys) -> None:
    import json

    assert cli.main(["report", str(cap_dir), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    tool = doc["tools"]["api_errors"]
    assert tool["title"] == "API errors (failed calls)"
    assert [(r["api"], r["error"], r["failed"]) for r in tool["rows"]][:2] == [
        ("cuMemAlloc_v2", "CUDA_ERROR_NOT_INITIALIZED", 209), ("hipMalloc", "hipErrorInvalidDevice", 2)]
    page = tmp_path / "r.html"
    assert cli.main(["report", str(cap_dir), "--html", str(page)]) == 0
    html = page.read_text()
    assert "API errors (failed calls)" in html and html.count("CUDA_ERROR_NOT_INITIALIZED") >= 1


def test_summary_names_failures_and_counts_no_failed_bytes(cap_dir: Path) -> None:
    text = summary.render(cap_dir, {"alloc": 217}, pl.DataFrame(schema={"pid": pl.UInt32, "handle": pl.UInt64,
                                                                        "name": pl.String}), {}, {})
    assert text.splitlines() == [
        "217 events: alloc 217",
        "209 of 210 cuMemAlloc_v2 calls failed: CUDA_ERROR_NOT_INITIALIZED",
        "3 of 4 hipMalloc calls failed: hipErrorInvalidDevice 2, hipErrorOutOfMemory 1",
        "1 of 2 cuMemAllocHost_v2 calls failed: CUDA_ERROR_OUT_OF_MEMORY",
        "1 of 1 hipStreamSynchronize calls failed: hipError_t 2147418113",
        # only the successful allocations: 4096 + 2048 on the device, 512 pinned on the host
        "device memory: allocated 6.0 KiB in 2 allocations, freed 0 B, held at the end 6.0 KiB",
        "pinned host memory: allocated 512 B in 1 allocation, freed 0 B, held at the end 512 B",
        "copied: 256 B",
        "lost: 0",
    ]


def test_no_tool_counts_failed_bytes(cap_dir: Path) -> None:
    cap = open_capture(cap_dir)
    procs = REGISTRY["processes"].compute(cap).select("pid", "api_calls", "failed_calls", "device_alloc_bytes")
    assert rows(procs) == [(100, 214, 210, 4096), (200, 5, 4, 2048)]
    totals = REGISTRY["memory_totals"].compute(cap)
    assert rows(totals) == [
        (100, "device", 1, 4096, 0, 0, 4096),
        (100, "pinned host", 1, 512, 0, 0, 512),
        (200, "device", 1, 2048, 0, 0, 2048),
    ]
    peaks = REGISTRY["memory_peaks"].compute(cap).filter(pl.col("api") == "all")
    assert peaks.select("pid", "peak_bytes", "device_alloc_bytes").rows() == [(100, 4096, 4096), (200, 2048, 2048)]
    assert REGISTRY["leaks"].compute(cap)["size"].to_list() == [4096, 2048, 512]


def test_failed_copies_move_no_bytes(tmp_path: Path) -> None:
    copies = [
        (1000, 10, 7, 7, "cuMemcpyHtoD_v2", "memcpy", {"size": 100, "copy_kind": "h2d", "ret": None}),
        (2000, 10, 7, 7, "cuMemcpyHtoD_v2", "memcpy", {"size": 5000, "copy_kind": "h2d", "ret": 1}),
    ]
    cap = open_capture(write_capture(tmp_path / "c", rows=copies, names=[], processes=[]))
    assert REGISTRY["transfers"].compute(cap).select("direction", "copies", "bytes").rows() == [("h2d", 1, 100)]
    assert REGISTRY["processes"].compute(cap)["copy_bytes"].to_list() == [100]
