"""What the Sanitizer injection library's set-up calls returned (TOOL_STATUS, device format 1.1), in words.

The library writes a TOOL_STATUS record after its subscribe, after each module it patches and at exit; the
last one of a process is its final word.  A run whose counters are all zero is then told apart: not
subscribed, no module patched, patches that got no buffer, or patches that never ran.  `report` shows
these lines in its header and scripts/gpu_check prints them under each row.
"""

from __future__ import annotations

import polars as pl

from .. import schema
from ..schema import InjectionMode, LoadingMode, ToolStage

#: SanitizerResult (sanitizer_result.h, CUDA 13.0) -> its name without the SANITIZER_ prefix
SANITIZER_RESULTS: dict[int, str] = {
    0: "SUCCESS", 1: "ERROR_INVALID_PARAMETER", 2: "ERROR_INVALID_DEVICE", 3: "ERROR_INVALID_CONTEXT",
    4: "ERROR_INVALID_DOMAIN_ID", 5: "ERROR_INVALID_CALLBACK_ID", 6: "ERROR_INVALID_OPERATION",
    7: "ERROR_OUT_OF_MEMORY", 8: "ERROR_PARAMETER_SIZE_NOT_SUFFICIENT", 9: "ERROR_API_NOT_IMPLEMENTED",
    10: "ERROR_MAX_LIMIT_REACHED", 11: "ERROR_NOT_READY", 12: "ERROR_NOT_COMPATIBLE", 13: "ERROR_NOT_INITIALIZED",
    14: "ERROR_NOT_SUPPORTED", 15: "ERROR_ADDRESS_NOT_IN_DEVICE_MEMORY", 999: "ERROR_UNKNOWN",
}

#: the calls of a TOOL_STATUS record, in the order the library makes them: (field, what the line calls it)
CALLS: tuple[tuple[str, str], ...] = (
    ("rc_subscribe", "subscribe"),
    ("rc_add_patches", "add-patches"),
    ("rc_patch_instructions", "patch-instructions"),
    ("rc_patch_module", "patch-module"),
    ("rc_loaded_status", "loaded-status"),
    ("rc_set_callback_data", "set-callback-data"),
    ("rc_set_launch_data", "set-launch-data"),
    ("rc_fallback_read", "fallback-read"),
)


def rc_text(rc: int) -> str:
    if rc == schema.TOOL_STATUS_NOT_CALLED:
        return "not called"
    if rc == 0:
        return "ok"
    return f"{SANITIZER_RESULTS.get(rc, 'ERROR')} ({rc})"


def _enum_name(e, v: int) -> str:
    try:
        return e(v).name
    except ValueError:
        return f"? ({v})"


def final_status(tool_status: pl.DataFrame | pl.LazyFrame) -> pl.DataFrame:
    """One row per process: its last TOOL_STATUS record (the latest host_mono; the later record on a tie)."""
    f = tool_status.lazy() if isinstance(tool_status, pl.DataFrame) else tool_status
    return (f.with_row_index("_i").sort("pid", "host_mono", "_i").group_by("pid", maintain_order=True).last()
            .drop("_i").sort("pid").collect())


def verdict(row: dict) -> str:
    """What the status says about the instrumentation, in one clause."""
    if row["rc_subscribe"] != 0:
        return f"not subscribed ({rc_text(row['rc_subscribe'])}): no callback, no patch"
    if row["modules_patched"] == 0:
        failed = next((name for field, name in CALLS[1:4] if row[field] not in (0, schema.TOOL_STATUS_NOT_CALLED)), None)
        return f"no module patched ({failed} failed)" if failed else "no module patched (none was loaded or launched)"
    if row["patch_null_calls"] and not row["patch_data_calls"]:
        return "the patches ran but never got their buffer (NULL userdata)"
    if row["patch_null_calls"]:
        return "the patches ran; some calls got no buffer (NULL userdata)"
    if row["patch_data_calls"]:
        return "the patches ran with their buffer"
    if row["launches"] == 0:
        return "modules patched, no launch seen"
    if row["launches_with_data"] == 0:
        return "no launch was given its buffer"
    return "no patch call reported back: the patches never ran, or ran with no buffer in every launch"


def status_lines(tool_status: pl.DataFrame | pl.LazyFrame) -> list[str]:
    """One line per process with a TOOL_STATUS record (none without): mode, every call's result, counts, verdict."""
    lines = []
    for r in final_status(tool_status).iter_rows(named=True):
        mode = _enum_name(InjectionMode, r["injection_mode"])
        mode = {"preload": "LD_PRELOAD", "injection": "CUDA_INJECTION64_PATH"}.get(mode, mode)
        loading = _enum_name(LoadingMode, r["loading_mode"])
        calls = ", ".join(f"{name} {rc_text(r[field])}" for field, name in CALLS)
        stage = "" if r["stage"] == ToolStage.final else f"; ended before its final status ({_enum_name(ToolStage, r['stage'])})"
        lines.append(
            f"pid {r['pid']}: sanitizer via {mode}, CUDA_MODULE_LOADING {loading}: {calls}; "
            f"modules patched {r['modules_patched']}, failed {r['modules_failed']}; "
            f"launches {r['launches']}, given their buffer {r['launches_with_data']}, "
            f"function not loaded {r['functions_not_loaded']}; patch calls with buffer {r['patch_data_calls']}, "
            f"without {r['patch_null_calls']}: {verdict(r)}{stage}"
        )
    return lines
