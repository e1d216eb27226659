"""`pasta-trace daemon --metrics`, scraped by a real Prometheus server (Debian's
`prometheus`, started here on a free loopback port, scrape interval 1 s, its
own storage directory): while stand-in workloads run with known calls (the
CUDA workload in a cgroup named like a Kubernetes pod's container, NCCL ranks
in none), the values Prometheus's HTTP API returns equal the workloads' own
counts: launches, kernels (capped per process), bytes allocated and live,
copies by direction, syncs and the time blocked, failed calls by API and
error, NCCL calls and their latency histogram; the loss counters, the
window and the daemon's own CPU and memory are there.  An address in use is
a one-line error before anything is loaded."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest

from pasta_run import Tracer, read_report, run_pasta
from pasta_trace.capture.procs.processes import cgroup2_root
from pasta_trace.daemon.metrics import KERNELS_PER_PROCESS, OTHER_KERNELS
from pasta_trace.probes.catalog import APIS
from pasta_trace.return_codes import CUDA_DRIVER
from pasta_trace.schema import Kind

pytestmark = [pytest.mark.live]

THREADS, ITERS = 2, 15  # 2 kernels named per thread and round: 60 names, past the cap of 20
RANKS, NCCL_ITERS, NCCL_COUNT = 2, 5, 1024  # float32: 4096 bytes an AllReduce
POD = "0f1e2d3c-4b5a-4697-8877-665544332211"
CONTAINER = "ab" * 32
KIND = {a.symbol: a.kind for a in APIS}
PINNED = {"cuMemAllocHost_v2", "cuMemHostAlloc"}  # the driver's pinned host memory; every other allocation: device


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=5) as r:
        return r.read()


@dataclass
class Scraped:
    prometheus: str  # http://127.0.0.1:PORT
    cuda: dict  # the CUDA workload's report
    ranks: dict | None  # nccl_ranks' output (pids), None where the NCCL fixtures cannot be built
    daemon: Tracer
    in_pod: bool  # the CUDA workload ran in the pod's cgroup (False: no writable cgroup v2 hierarchy)
    sock: Path  # the daemon's control socket

    def query(self, expr: str) -> list[tuple[dict[str, str], float]]:
        body = json.loads(_get(f"{self.prometheus}/api/v1/query?" + urllib.parse.urlencode({"query": expr})))
        assert body["status"] == "success", body
        return [(r["metric"], float(r["value"][1])) for r in body["data"]["result"]]

    def settled(self, expr: str, by: str | tuple[str, ...] | None, want: dict, timeout: float = 60) -> None:
        """Wait until ``expr``'s series, keyed by label ``by`` (a tuple: by those; None: the one value), equal
        ``want``: the daemon folds its counts every second, Prometheus scrapes it every second."""
        deadline = time.monotonic() + timeout
        while True:
            rows = self.query(expr)
            got = {(tuple(m.get(b, "") for b in by) if isinstance(by, tuple) else m.get(by, "") if by else None): v
                   for m, v in rows}
            if got == want or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert got == want, f"{expr}: {got} != {want}\n{self.daemon.stderr()[-2000:]}"


@pytest.fixture(scope="module")
def scraped(_bpf_status, cuda_stub, cuda_workload, build_dir, tmp_path_factory):
    if _bpf_status:
        pytest.skip(_bpf_status)
    prometheus = shutil.which("prometheus")
    if prometheus is None:
        pytest.skip("Debian's prometheus package is not installed (scripts/setup.sh installs it)")
    tmp = tmp_path_factory.mktemp("metrics")
    sock_dir = Path(tempfile.mkdtemp(prefix="pasta-metrics-", dir="/tmp"))
    sock_dir.chmod(0o755)
    port, prom_port = _free_port(), _free_port()
    daemon = Tracer(["daemon", "-o", str(tmp / "dumps"), "--socket", str(sock_dir / "daemon.sock"),
                     "--metrics", f"127.0.0.1:{port}"], tmp / "daemon.log")
    (tmp / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s, scrape_timeout: 1s, evaluation_interval: 1s}\n"
        f"scrape_configs: [{{job_name: pasta, static_configs: [{{targets: ['127.0.0.1:{port}']}}]}}]\n")
    server = None
    # the workload's cgroup: a Kubernetes pod's container, as the cgroupfs driver names them
    leaf = cgroup2_root() / "kubepods" / "burstable" / f"pod{POD}" / CONTAINER
    made: list[Path] = []  # the cgroup directories made here, removed at the end
    try:
        daemon.wait_ready(timeout=180)  # the first start of a configuration compiles the BPF program
        with open(tmp / "prometheus.log", "w") as log:
            server = subprocess.Popen([prometheus, f"--config.file={tmp / 'prometheus.yml'}",
                                       f"--storage.tsdb.path={tmp / 'tsdb'}",
                                       f"--web.listen-address=127.0.0.1:{prom_port}"],
                                      stdout=log, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{prom_port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                _get(f"{url}/-/ready")
                break
            except OSError:
                assert server.poll() is None and time.monotonic() < deadline, (tmp / "prometheus.log").read_text()
                time.sleep(0.2)
        in_pod = _made(leaf, made)
        report = tmp / "cuda.json"
        # the shell joins the cgroup, then becomes the workload: every call of it is made there
        join = f'echo $$ > {leaf / "cgroup.procs"} && ' if in_pod else ""
        subprocess.run(["sh", "-c", join + 'exec "$@"', "sh", str(cuda_workload),
                        "--lib", str(cuda_stub), "--report", str(report), "--threads", str(THREADS),
                        "--iters", str(ITERS)], check=True, timeout=120)
        ranks = _nccl_ranks(build_dir)
        yield Scraped(url, read_report(report), ranks, daemon, in_pod, sock_dir / "daemon.sock")
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=60)
        daemon.stop()
        daemon.kill()
        for d in reversed(made):
            d.rmdir()
        shutil.rmtree(sock_dir, ignore_errors=True)


def _made(leaf: Path, made: list[Path]) -> bool:
    """Make the cgroup directory ``leaf`` and those above it that are missing (listed in ``made``);
    False where the cgroup v2 hierarchy may not be written."""
    try:
        for d in [*reversed(leaf.parents[:4]), leaf]:
            if not d.exists():
                d.mkdir()
                made.append(d)
    except OSError:
        return False
    return True


def _nccl_ranks(build_dir: Path) -> dict | None:
    import build

    try:
        stub, ranks = build.nccl_stub(build_dir), build.nccl_ranks(build_dir)
    except build.Unavailable:
        return None
    r = subprocess.run([str(ranks), str(stub), "--ranks", str(RANKS), "--iters", str(NCCL_ITERS),
                        "--count", str(NCCL_COUNT)], capture_output=True, text=True, check=True, timeout=120)
    return json.loads(r.stdout)


def _calls(report: dict) -> list[dict]:
    return [c for c in report["calls"] if c["api"] in KIND]


def _of(s: Scraped, metric: str, labels: str = "") -> str:
    """A selector of the CUDA workload's series of ``metric`` (``labels``: more matchers, `,a="b"`)."""
    return f'{metric}{{pid="{s.cuda["pid"]}"{labels}}}'


def test_launches_and_kernels_capped_per_process(scraped):
    calls = _calls(scraped.cuda)
    launches = [c for c in calls if KIND[c["api"]] == Kind.launch and c["ret"] == 0]
    scraped.settled(_of(scraped, "pasta_launches_total"), None, {None: len(launches)})
    names = {n["handle"]: n["name"] for n in scraped.cuda["names"]}
    # cuLaunchKernelEx launches the CUfunction of the CUkernel the thread launched just before
    # (cuKernelGetFunction: the daemon names it after that kernel); a host function has no name: its address
    kernel: Counter[str] = Counter()
    last: dict[int, int] = {}
    for c in launches:
        func = c["cols"]["func"]
        if c["api"] == "cuLaunchKernelEx":
            func = last[c["tid"]]
        last[c["tid"]] = func
        kernel[names.get(func, hex(func))] += 1
    assert len(kernel) > KERNELS_PER_PROCESS
    scraped.settled(f'sum({_of(scraped, "pasta_kernel_launches_total")})', None, {None: len(launches)})
    got = {m["kernel"]: v for m, v in scraped.query(_of(scraped, "pasta_kernel_launches_total"))}
    own = {k: v for k, v in got.items() if k != OTHER_KERNELS}
    assert len(own) == KERNELS_PER_PROCESS
    assert own == {k: kernel[k] for k in own}
    assert got[OTHER_KERNELS] == len(launches) - sum(own.values())
    # the process's labels: comm, and the pod and container its cgroup path names
    [(labels, _)] = scraped.query(_of(scraped, "pasta_launches_total"))
    assert labels["comm"] == "cuda_workload"
    if scraped.in_pod:
        assert (labels["container"], labels["pod"]) == (CONTAINER, POD)


def test_memory_by_layer(scraped):
    allocs = [c for c in _calls(scraped.cuda) if KIND[c["api"]] == Kind.alloc and c["ret"] == 0]
    memory = Counter("pinned" if c["api"] in PINNED else "device" for c in allocs)
    size: Counter[str] = Counter()
    for c in allocs:
        size["pinned" if c["api"] in PINNED else "device"] += c["cols"]["size"]
    scraped.settled(_of(scraped, "pasta_allocations_total", ',layer="driver"'), "memory", dict(memory))
    scraped.settled(_of(scraped, "pasta_allocated_bytes_total", ',layer="driver"'), "memory", dict(size))
    # every round frees all it allocated
    scraped.settled(_of(scraped, "pasta_live_bytes"), "memory", {"device": 0, "pinned": 0})


def test_copies_syncs_and_failed_calls(scraped):
    calls = _calls(scraped.cuda)
    copies = [c for c in calls if KIND[c["api"]] == Kind.memcpy and c["ret"] == 0]
    scraped.settled(_of(scraped, "pasta_copies_total"), "direction",
                    dict(Counter(c["cols"]["copy_kind"] for c in copies)))
    moved: Counter[str] = Counter()
    for c in copies:
        moved[c["cols"]["copy_kind"]] += c["cols"]["size"]
    scraped.settled(_of(scraped, "pasta_copied_bytes_total"), "direction", dict(moved))
    syncs = sum(KIND[c["api"]] == Kind.sync and c["ret"] == 0 for c in calls)
    scraped.settled(_of(scraped, "pasta_syncs_total"), None, {None: syncs})
    [(_, blocked)] = scraped.query(_of(scraped, "pasta_sync_seconds_total"))
    # each sync of the stand-in driver blocks sync_ns (the probes time a little more: the machine may be loaded)
    assert syncs * scraped.cuda["sync_ns"] / 1e9 <= blocked < syncs * scraped.cuda["sync_ns"] / 1e9 + 10
    failed = Counter((c["api"], CUDA_DRIVER[c["ret"]]) for c in calls if c["ret"] != 0)
    assert failed == {("cuMemAlloc_v2", "CUDA_ERROR_INVALID_VALUE"): THREADS * ITERS}
    scraped.settled(_of(scraped, "pasta_failed_calls_total"), ("api", "error"), dict(failed))


def test_nccl_calls_and_latency_histogram(scraped):
    if scraped.ranks is None:
        pytest.skip("cannot build the NCCL fixtures (nccl.h and the CUDA headers)")
    want = {str(pid): NCCL_ITERS for pid in scraped.ranks["pids"]}
    # the ranks' series only: a daemon sees every process of the machine, other tests' NCCL ranks too
    of = f'op="ncclAllReduce",pid=~"{"|".join(want)}"'
    scraped.settled(f"pasta_nccl_calls_total{{{of}}}", "pid", want)
    scraped.settled(f"pasta_nccl_bytes_total{{{of}}}", "pid", {p: n * NCCL_COUNT * 4 for p, n in want.items()})
    scraped.settled(f"pasta_nccl_call_seconds_count{{{of}}}", "pid", want)
    scraped.settled(f'pasta_nccl_call_seconds_bucket{{{of},le="+Inf"}}', "pid", want)
    for labels, v in scraped.query(f"pasta_nccl_call_seconds_sum{{{of}}}"):
        assert 0 < v < NCCL_ITERS * 1.0, labels  # the stand-in returns at once
    assert {m["comm"] for m, _ in scraped.query(f"pasta_nccl_calls_total{{{of}}}")} == {"nccl_ranks"}


def test_a_dump_asked_for_is_counted(scraped):
    r = run_pasta(["dump", "--socket", str(scraped.sock), "--pid", str(scraped.cuda["pid"])], timeout=120)
    assert r.returncode == 0, r.stderr
    scraped.settled(_of(scraped, "pasta_triggers_total"), "kind", {"demand": 1})


def test_the_daemon_itself(scraped):
    lost = {m["counter"] for m, _ in scraped.query("pasta_lost_total")}
    assert {"lost_events", "lost_names", "lost_inflight"} <= lost
    [(_, events)] = scraped.query("pasta_events_total")
    assert events >= len(_calls(scraped.cuda))
    assert len(scraped.query("pasta_window_dropped_events_total")) == 1
    [(_, held)] = scraped.query("pasta_window_events")
    assert 0 < held <= events
    # prometheus_client's process collector: the daemon's own CPU and memory
    [(_, cpu)] = scraped.query('process_cpu_seconds_total{job="pasta"}')
    [(_, rss)] = scraped.query('process_resident_memory_bytes{job="pasta"}')
    assert cpu > 0 and rss > 50 << 20  # BCC and its compiler alone take more


def test_an_address_in_use_is_a_one_line_error(require_bpf, tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        began = time.monotonic()
        r = run_pasta(["daemon", "-o", str(tmp_path / "dumps"), "--socket", str(tmp_path / "daemon.sock"),
                       "--metrics", f"127.0.0.1:{port}"], timeout=120)
    assert r.returncode == 1, r.stderr
    assert r.stderr == (f"pasta-trace: error: --metrics 127.0.0.1:{port} is in use (give "
                        "another with --metrics HOST:PORT, or --metrics off)\n")
    assert time.monotonic() - began < 60  # before the BPF program is compiled or loaded
    assert not (tmp_path / "daemon.sock").exists() and not (tmp_path / "dumps").exists()
