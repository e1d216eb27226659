"""The CUDA runtime without BPF: the runtime linked into an executable found
in its .symtab, what would attach to it, and the names a runtime launch gives
the driver handle launched inside it."""

from __future__ import annotations

import polars as pl
import pytest

import build
from pasta_trace import schema
from pasta_trace.capture.procs import discovery
from pasta_trace.capture.session.dry_run import probe_plan
from pasta_trace.capture.naming.pairing import nested_launch_names
from pasta_trace.probes import catalog, elf

FORWARDERS = {"__cudaLaunchKernel": "cudaLaunchKernel", "__cudaLaunchKernel_ptsz": "cudaLaunchKernel_ptsz"}


@pytest.fixture(scope="module")
def launchers() -> dict[str, str]:
    try:
        return {c: str(build.cudart_launcher(build.DEFAULT_OUT, c)) for c in ("shared", "static")}
    except build.Unavailable as e:
        pytest.skip(str(e))


def test_runtime_linked_into_an_executable_is_found_in_its_symtab(launchers):
    static = discovery.executable_library(launchers["static"])
    assert (static.family, static.path) == ("cudart", launchers["static"])
    assert discovery.executable_library(launchers["shared"]) is None  # it calls libcudart.so.13's
    wanted = {a.symbol for a in catalog.for_family("cudart")}
    assert sorted(wanted - elf.probe_symbols(launchers["static"], wanted).keys()) == []
    assert elf.exported_symbols(launchers["static"]).keys() & wanted == set()  # all local: .symtab only
    plan = probe_plan(launchers["static"], "cudart")
    assert (plan.missing, plan.aliases, len(plan.attach)) == ([], FORWARDERS, len(wanted) - 2)
    assert plan.line() == (f"would attach {len(wanted) - 2} functions (2 more reported under the functions they "
                           "jump to), 0 missing")


def _events(rows: list[dict]) -> pl.DataFrame:
    return pl.DataFrame(rows).with_columns(
        [pl.lit(None).alias(c) for c in schema.EVENTS_SCHEMA if c not in rows[0]]
    ).select(list(schema.EVENTS_SCHEMA)).cast(schema.EVENTS_SCHEMA)


def test_driver_handles_take_the_name_of_the_runtime_launch_around_them(tmp_path):
    rt = {"pid": 7, "tid": 1, "kind": "launch", "layer": "runtime", "outer_ts_ns": None}
    drv = {"pid": 7, "tid": 1, "kind": "nested", "layer": "driver"}
    _events([
        {**rt, "ts_ns": 100, "api": "cudaLaunchKernel", "func": 0x5000},
        {**drv, "ts_ns": 105, "api": "cuLaunchKernel", "func": 0xF1, "outer_ts_ns": 100},
        {**rt, "ts_ns": 200, "api": "cudaLaunchKernel", "func": 0x5000},
        {**drv, "ts_ns": 205, "api": "cuLaunchKernel", "func": 0xF1, "outer_ts_ns": 200},
        {**rt, "ts_ns": 300, "api": "cudaLaunchKernel", "func": 0x6000},  # its stub has no name
        {**drv, "ts_ns": 305, "api": "cuLaunchKernel_ptsz", "func": 0xF2, "outer_ts_ns": 300},
        {**drv, "tid": 2, "ts_ns": 306, "api": "cuLaunchKernel", "func": 0xF3, "outer_ts_ns": 100},  # another thread
        {**drv, "ts_ns": 400, "api": "cuMemAlloc_v2", "func": None, "outer_ts_ns": 100},  # not a launch
    ]).write_parquet(tmp_path / "events-00000.parquet")
    names = pl.DataFrame({"pid": [7, 7], "handle": [0x5000, 0x6000], "name": ["_Z1kv", "unknown@0x6000"],
                          "source": ["elf_stub", "unknown"], "ts_ns": [100, 300], "api": ["cudaLaunchKernel"] * 2,
                          "reason": [None, "no symbol at this address"]}).cast(schema.NAMES_SCHEMA)
    got = nested_launch_names(tmp_path, names)
    assert got.schema == schema.empty_frame(schema.NAMES_SCHEMA).schema
    assert got.select("pid", "handle", "name", pl.col("source").cast(pl.String), "ts_ns",
                      pl.col("api").cast(pl.String), "reason").rows() == [
        (7, 0xF1, "_Z1kv", "runtime_launch", 105, "cuLaunchKernel", None)]


def test_captures_without_pairing_give_no_names(tmp_path):
    pl.DataFrame({"ts_ns": [1], "pid": [7], "tid": [1], "api": ["cuLaunchKernel"], "kind": ["launch"],
                  "func": [1]}).write_parquet(tmp_path / "events-00000.parquet")  # format 1.1: no outer_ts_ns
    assert nested_launch_names(tmp_path, schema.empty_frame(schema.NAMES_SCHEMA)).is_empty()
    assert nested_launch_names(tmp_path / "none", schema.empty_frame(schema.NAMES_SCHEMA)).is_empty()
