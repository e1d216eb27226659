"""daemon.metrics on records made here: the kernel cap per process (the first
KERNELS_PER_PROCESS names keep their series, later ones are summed under
"(other)"), names that arrive in another update than their alias, the
series of an exited process removed EXITED_KEEP_S after its exit is seen (a
/proc made in the test, a clock of the test's), a PID reused, triggers, the
container and pod labels, and /metrics served over HTTP with an address in
use refused in one line."""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from pasta_trace import schema
from pasta_trace.daemon.metrics import (CHECK_EXITED_S, KERNELS_PER_PROCESS, OTHER_KERNELS, Metrics, Server,
                                        parse_address)
from pasta_trace.errors import PastaError
from pasta_trace.probes.catalog import API_NAMES

API = list(API_NAMES)
LAUNCH = API.index("cuLaunchKernel")
GET_FUNCTION, GET_KERNEL = API.index("cuModuleGetFunction"), API.index("cuKernelGetFunction")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def fake_process(proc: Path, pid: int, start: int, cgroup: str = "0::/user.slice\n") -> None:
    d = proc / str(pid)
    d.mkdir(parents=True, exist_ok=True)
    # /proc/PID/stat: the start time is the 20th field after the comm's ')'
    (d / "stat").write_text(f"{pid} (w) S " + " ".join(["0"] * 18) + f" {start} 0 0\n")
    (d / "cgroup").write_text(cgroup)
    (d / "comm").write_text("w\n")


def launches(pid: int, funcs: list[int], comm: bytes = b"worker") -> np.ndarray:
    recs = np.zeros(len(funcs), schema.HOST_EVENT.dtype)
    recs["pid"], recs["comm"], recs["kind"], recs["api"] = pid, comm, int(schema.Kind.launch), LAUNCH
    recs["flags"], recs["func"] = schema.FLAG_HAS_RET, funcs
    return recs


def names(pid: int, rows: list[tuple[int, str, int]]) -> np.ndarray:
    """(handle, name, alias) rows: a name of "" with an alias is cuKernelGetFunction's."""
    recs = np.zeros(len(rows), schema.HOST_NAME.dtype)
    recs["pid"] = pid
    for i, (handle, name, alias) in enumerate(rows):
        recs[i]["handle"], recs[i]["name"], recs[i]["alias"] = handle, name.encode(), alias
        recs[i]["api"] = GET_KERNEL if alias else GET_FUNCTION
        recs[i]["source"] = int(schema.NameSource.kernel_get_function if alias else
                                schema.NameSource.module_get_function)
    return recs


def series(m: Metrics, metric: str, pid: int) -> dict[str, float]:
    t = m.published.totals
    rows = t.filter((t["metric"] == metric) & (t["pid"] == pid))
    return dict(zip(rows["a"].to_list(), rows["value"].to_list()))


@pytest.fixture
def proc(tmp_path: Path) -> Path:
    return tmp_path / "proc"


def test_kernels_past_the_cap_are_summed_under_other(proc):
    fake_process(proc, 7, start=50)
    m = Metrics(API, proc=proc)
    # 25 kernels, kernel k launched k + 1 times; all but the first two named
    m.add_names(names(7, [(0x100 + k, f"k{k:02d}", 0) for k in range(2, 25)]))
    m.add(launches(7, [0x100 + k for k in range(25) for _ in range(k + 1)]))
    m.update({})
    got = series(m, "kernel_launches", 7)
    # the busiest 20 of the first update keep a series each (named, or the handle in hex)
    assert got == {**{f"k{k:02d}": k + 1 for k in range(5, 25)}, OTHER_KERNELS: 1 + 2 + 3 + 4 + 5}
    assert len(got) == KERNELS_PER_PROCESS + 1
    # later: a kernel with a series keeps it, a new one joins "(other)", however busy
    m.add_names(names(7, [(0x999, "new_busy_kernel", 0)]))
    m.add(launches(7, [0x999] * 1000 + [0x100 + 9]))
    m.update({})
    got = series(m, "kernel_launches", 7)
    assert got["k09"] == 11 and got[OTHER_KERNELS] == 15 + 1000 and "new_busy_kernel" not in got
    assert series(m, "launches", 7) == {"": sum(range(1, 26)) + 1001}


def test_a_name_and_its_alias_in_different_updates(proc):
    fake_process(proc, 7, start=50)
    m = Metrics(API, proc=proc)
    m.add_names(names(7, [(0xA0, "lib_kernel", 0)]))
    m.update({})
    m.add_names(names(7, [(0xB0, "", 0xA0)]))  # cuKernelGetFunction: 0xB0 is the CUfunction of kernel 0xA0
    m.add(launches(7, [0xB0, 0xB0, 0xC0]))
    m.update({})
    assert series(m, "kernel_launches", 7) == {"lib_kernel": 2, "0xc0": 1}


def test_exited_processes_lose_their_series_after_the_delay(proc):
    clock = Clock()
    fake_process(proc, 7, start=50)
    fake_process(proc, 8, start=60, cgroup="0::/kubepods/besteffort/pod0f1e2d3c_4b5a_4697_8877_665544332211/"
                                           "cri-containerd-" + "cd" * 32 + ".scope\n")
    m = Metrics(API, proc=proc, clock=clock, keep_exited_s=300)
    m.add(launches(7, [1, 2]))
    m.add(launches(8, [1], comm=b"trainer"))
    m.triggered("nccl_hang", 8)
    m.triggered("demand", None)
    m.update({"lost_events": 3})
    pub = m.published
    assert pub.processes == {7: ("7", "worker", "", ""),
                             8: ("8", "trainer", "cd" * 32, "0f1e2d3c-4b5a-4697-8877-665544332211")}
    assert series(m, "triggers", 8) == {"nccl_hang": 1} and series(m, "triggers", 0) == {"demand": 1}
    assert pub.daemon[("lost", "lost_events")] == 3
    (proc / "8" / "stat").unlink()  # 8 exits
    clock.now += CHECK_EXITED_S
    m.update({})
    assert set(m.published.processes) == {7, 8}  # still there: its last values may not have been scraped
    clock.now += 299
    m.update({})
    assert set(m.published.processes) == {7, 8}
    clock.now += CHECK_EXITED_S  # 300 s and more after its exit was seen
    m.update({})
    assert set(m.published.processes) == {7}
    assert m.published.totals.filter(m.published.totals["pid"] == 8).is_empty()
    assert series(m, "launches", 7) == {"": 2}


def test_a_pid_reused_starts_new_series(proc):
    clock = Clock()
    fake_process(proc, 7, start=50)
    m = Metrics(API, proc=proc, clock=clock)
    m.add(launches(7, [1, 2, 3]))
    m.update({})
    fake_process(proc, 7, start=99)  # another process now has PID 7
    clock.now += CHECK_EXITED_S
    m.update({})
    m.add(launches(7, [1], comm=b"second"))
    m.update({})
    assert m.published.processes[7] == ("7", "second", "", "")
    assert series(m, "launches", 7) == {"": 1}


def test_served_over_http_and_an_address_in_use(proc):
    fake_process(proc, 7, start=50)
    m = Metrics(API, proc=proc)
    m.add(launches(7, [0x10]))
    m.update({"lost_events": 0})
    server = Server(m, "127.0.0.1", 0)
    try:
        with urllib.request.urlopen(f"http://{server.address}/metrics", timeout=10) as r:
            text = r.read().decode()
        assert 'pasta_launches_total{comm="worker",container="",pid="7",pod=""} 1.0' in text
        assert 'pasta_kernel_launches_total{comm="worker",container="",kernel="0x10",pid="7",pod=""} 1.0' in text
        assert "\nprocess_cpu_seconds_total " in text and "\nprocess_resident_memory_bytes " in text
        port = int(server.address.rsplit(":", 1)[1])
        with pytest.raises(PastaError) as e:
            Server(m, "127.0.0.1", port)
        assert e.value.one_line() == (f"--metrics 127.0.0.1:{port} is in use (give another with --metrics "
                                      "HOST:PORT, or --metrics off)")
    finally:
        server.close()
    with socket.socket() as s:  # closed: no one listens there (the scrape's connection may linger in TIME_WAIT)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))


def test_parse_address():
    assert parse_address("off") is None
    assert parse_address("9464") == ("127.0.0.1", 9464)
    assert parse_address("0.0.0.0:80") == ("0.0.0.0", 80)
    assert parse_address("[::1]:9464") == ("::1", 9464)
    for bad in ("", "host", "1.2.3.4:0", "1.2.3.4:70000", "a:b"):
        with pytest.raises(ValueError, match="not an address"):
            parse_address(bad)


DASHBOARD = Path(__file__).resolve().parents[2] / "contrib" / "grafana-pasta-trace.json"


def _every_kind_of_call(pid: int) -> np.ndarray:
    """One call of each kind a metric counts: a launch, an allocation, a copy, a sync, a failed call, an NCCL call."""
    recs = np.zeros(6, schema.HOST_EVENT.dtype)
    recs["pid"], recs["comm"] = pid, b"worker"
    apis = ["cuLaunchKernel", "cuMemAlloc_v2", "cuMemcpyHtoD_v2", "cuCtxSynchronize", "cuMemAlloc_v2", "ncclAllReduce"]
    kinds = [schema.Kind.launch, schema.Kind.alloc, schema.Kind.memcpy, schema.Kind.sync, schema.Kind.alloc,
             schema.Kind.collective]
    recs["api"], recs["kind"] = [API.index(a) for a in apis], [int(k) for k in kinds]
    recs["flags"], recs["dur_ns"] = schema.FLAG_HAS_RET | schema.FLAG_HAS_DUR, 2000
    recs["ret"] = [0, 0, 0, 0, 2, 0]  # the second allocation fails: CUDA_ERROR_OUT_OF_MEMORY
    recs["valid"] = (1 << schema.PAYLOAD_BITS["size"]) | (1 << schema.PAYLOAD_BITS["copy_kind"])
    recs["ptr"], recs["size"], recs["copy_kind"] = [0, 0x1000, 0, 0, 0, 0], 4096, int(schema.CopyKind.h2d)
    return recs


def test_the_grafana_dashboard_names_only_metrics_the_daemon_exports(proc):
    from pasta_trace.daemon.window import Window

    fake_process(proc, 7, start=50)
    m = Metrics(API, proc=proc)
    m.add(_every_kind_of_call(7))
    m.triggered("nccl_hang", 7)
    window = Window(60, 1 << 20, schema.HOST_NAME.dtype)
    m.update({"lost_events": 0}, window)
    server = Server(m, "127.0.0.1", 0)
    try:
        with urllib.request.urlopen(f"http://{server.address}/metrics", timeout=10) as r:
            text = r.read().decode()
    finally:
        server.close()
    exported = {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and not line.startswith("#")}
    assert 'pasta_failed_calls_total{api="cuMemAlloc_v2",comm="worker",container="",error="CUDA_ERROR_OUT_OF_MEMORY"' \
           in text
    assert 'pasta_nccl_call_seconds_bucket{comm="worker",container="",le="1e-05",op="ncclAllReduce",pid="7",pod=""} ' \
           '1.0' in text
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    exprs += [v["definition"] for v in dashboard["templating"]["list"] if v["type"] == "query"]
    assert len(exprs) > 15
    for expr in exprs:
        named = set(re.findall(r"\b((?:pasta|process)_[a-z_]+)\b", expr))
        assert named and named <= exported, f"{expr}: {named - exported or 'no metric'} not exported"
    # every metric of the daemon is on the dashboard
    on_board = {n for e in exprs for n in re.findall(r"\bpasta_[a-z_]+\b", e)}
    families = {re.sub(r"_(bucket|sum|count)$", "", n) for n in exported if n.startswith("pasta_")}
    assert families - {re.sub(r"_bucket$", "", n) for n in on_board} == set()


@pytest.mark.skipif(shutil.which("promtool") is None,
                    reason="Debian's prometheus package (promtool) is not installed (scripts/setup.sh installs it)")
def test_the_grafana_dashboard_queries_parse(tmp_path):
    """Prometheus's own parser (promtool check rules) reads every query, Grafana's variables given a value."""
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:query{i}", "expr": e.replace("$instance", ".*").replace("$job", ".*")}
        for i, e in enumerate(exprs)]}]}
    (tmp_path / "rules.yml").write_text(json.dumps(rules))  # JSON is YAML
    r = subprocess.run(["promtool", "check", "rules", str(tmp_path / "rules.yml")], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"SUCCESS: {len(exprs)} rules found" in r.stdout
