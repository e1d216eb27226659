"""Kernel launches of programs built the way real CUDA software is
(tests/fixtures/shapes/, nvcc 13): a template over a functor and an int,
nested namespaces, an anonymous namespace, `extern "C"`, `static`, a lambda
(`--extended-lambda`), kernels in a `nvcc -shared` library linked at start and
in two opened with dlopen after the start, three libraries with a kernel of
the same name; the CUDA runtime shared, and linked (libcudart_static) into the
executable and into each shared library (those opened with dlopen are probed
when they are mapped, before their first launch).  Launched (`--`), attached
(`-p`) and system-wide (`-a`), over NVIDIA's real 535 libcuda.so.1: there is
no GPU, so every launch fails, but each <<<>>> still enters cudaLaunchKernel.
Each capture's launch count per displayed name must equal the program's own
log, with no `unknown@` name, also for a program that exits as soon as its
last launch returns."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import polars as pl
import pytest

from pasta_run import run_pasta, wait_for_file
from pasta_trace import merge
from pasta_trace.demangle import display_names
from pasta_trace.read import open_capture
from shapes_build import build_shapes

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
from test_probe_catalog import vendor_libcuda  # noqa: E402

ROUNDS = 3
#: per round: what each module launches (its log lines)
PER_ROUND = {
    "main": {"ns::scale<float>": 1, "each<main::{lambda(int)#1}>": 1},
    "a": {"apply<Twice, 4>": 1, "outer::inner::fill": 2, "(anonymous namespace)::hidden": 1, "c_kernel": 1,
          "local_kernel": 1, "same_name": 1},
    "b": {"same_name": 1, "b_only::step<3>": 1},
    "c": {"same_name": 1, "c_only::twice<int>": 1},
}
MODULES = set(PER_ROUND)
#: the files the runtime is linked into, in the static build
LINKED_IN = {"shapes_main", "libshapes_a.so", "libshapes_b.so", "libshapes_c.so"}


@pytest.fixture(scope="module")
def shapes():
    """cudart linkage -> the directory of the built programs (built once per source content)."""
    try:
        return {c: build_shapes(c) for c in ("shared", "static")}
    except Exception as e:  # noqa: BLE001 - no toolkit: skip saying why
        pytest.skip(f"cannot build the shapes programs: {e}")


@pytest.fixture(scope="module")
def driver_env() -> dict[str, str]:
    return {"LD_LIBRARY_PATH": str(Path(vendor_libcuda()[0]).parent)}


def _logged(log: Path, modules: set[str]) -> Counter:
    rows = [line.split("\t") for line in log.read_text().splitlines()]
    return Counter(name for mod, name in rows if mod in modules)


def _captured(cap, pid: int) -> Counter:
    names = merge.kernel_executions(cap).filter(pl.col("pid") == pid).select("name").collect()["name"].to_list()
    assert not [n for n in names if n is None or n.startswith("unknown@")]
    shown = display_names(names)
    return Counter(shown[n] for n in names)


def _expected(modules: set[str]) -> Counter:
    out: Counter = Counter()
    for m in modules:
        out.update({n: ROUNDS * k for n, k in PER_ROUND[m].items()})
    return out


def _dlopened(d: Path) -> str:
    """The shapes program's LIBS argument: the libraries it opens with dlopen after its start."""
    return f"{d / 'libshapes_b.so'}:{d / 'libshapes_c.so'}"


def _linked_in(cap) -> set[str]:
    """The files other than libcudart.so* whose linked-in runtime the capture probed."""
    return {Path(e["path"]).name for e in cap.manifest["libraries"]
            if e["family"] == "cudart" and not Path(e["path"]).name.startswith("libcudart.so")}


def _start(shapes, cudart: str, tmp_path: Path, env: dict[str, str]) -> tuple[subprocess.Popen, Path, Path]:
    d = shapes[cudart]
    log, go = tmp_path / f"{cudart}.log", tmp_path / f"{cudart}.go"
    p = subprocess.Popen([str(d / "shapes_main"), _dlopened(d), str(ROUNDS), str(go)],
                         env={**os.environ, **env, "SHAPES_LOG": str(log)})
    wait_for_file(go.with_name(go.name + ".ready"), timeout=60, proc=p)
    return p, log, go


@pytest.mark.live
@pytest.mark.parametrize("cudart", ["shared", "static"])
def test_launched(require_bpf, shapes, driver_env, cudart, tmp_path):
    d = shapes[cudart]
    log, out, go = tmp_path / "log", tmp_path / "cap", tmp_path / "go"
    go.touch()  # no wait; the program lives on 0.3 s after its launches
    r = run_pasta(["-o", str(out), "--", str(d / "shapes_main"), _dlopened(d), str(ROUNDS), str(go)],
                  timeout=180, env={**driver_env, "SHAPES_LOG": str(log)})
    assert r.returncode == 0, r.stderr
    cap = open_capture(out)
    (pid,) = cap.processes.select("pid").collect()["pid"].unique().to_list()
    assert _logged(log, MODULES) == _expected(MODULES)
    assert _captured(cap, pid) == _logged(log, MODULES)
    # the runtime in the executable and in each library, probed in each (libshapes_a.so at the
    # start, the two opened with dlopen when they were mapped)
    assert _linked_in(cap) == (LINKED_IN if cudart == "static" else set())


@pytest.mark.live
@pytest.mark.parametrize("cudart", ["shared", "static"])
def test_exits_at_its_last_launch(require_bpf, shapes, driver_env, cudart, tmp_path):
    """One round, no go file: the program loads its libraries, launches each
    kernel once and exits as soon as the last launch returns, well within one
    drain; the mappings the kernel reported name every launch offline."""
    d = shapes[cudart]
    log, out = tmp_path / "log", tmp_path / "cap"
    r = run_pasta(["-o", str(out), "--", str(d / "shapes_main"), _dlopened(d), "1"],
                  timeout=180, env={**driver_env, "SHAPES_LOG": str(log)})
    assert r.returncode == 0, r.stderr
    cap = open_capture(out)
    (pid,) = cap.processes.select("pid").collect()["pid"].unique().to_list()
    once: Counter = Counter()
    for m in MODULES:
        once.update(PER_ROUND[m])
    assert _logged(log, MODULES) == once
    assert _captured(cap, pid) == once


@pytest.mark.live
@pytest.mark.parametrize("mode", ["-p", pytest.param("-a", marks=pytest.mark.machine_wide)])
def test_attached(require_bpf, shapes, driver_env, tracer, mode, tmp_path):
    """Both linkages at once, attached before their first launch (libshapes_b.so and libshapes_c.so are
    opened after)."""
    procs, logs, gos = {}, {}, {}
    try:
        for cudart in ("shared", "static"):
            procs[cudart], logs[cudart], gos[cudart] = _start(shapes, cudart, tmp_path, driver_env)
        pids = ",".join(str(p.pid) for p in procs.values())
        t = tracer(["-o", str(tmp_path / "cap"), *(["-p", pids] if mode == "-p" else ["-a"])])
        t.wait_ready(timeout=120)
        for go in gos.values():
            go.touch()
        assert [p.wait(timeout=60) for p in procs.values()] == [0, 0]
        assert t.stop(timeout=120) == 0, t.stderr()
    finally:
        for cudart, p in procs.items():
            gos[cudart].touch()
            if p.poll() is None:
                p.kill()
    cap = open_capture(tmp_path / "cap")
    for cudart, p in procs.items():
        assert _logged(logs[cudart], MODULES) == _expected(MODULES)
        assert _captured(cap, p.pid) == _logged(logs[cudart], MODULES), cudart
    assert _linked_in(cap) == LINKED_IN


@pytest.mark.live
def test_dry_run_and_doctor_say_where_cudart_lives(require_bpf, shapes, driver_env, tmp_path):
    procs, gos = {}, []
    try:
        for cudart in ("shared", "static"):
            procs[cudart], _, go = _start(shapes, cudart, tmp_path, driver_env)
            gos.append(go)
        static, shared = shapes["static"], procs["shared"].pid
        libcudart = next(line.split()[5] for line in Path(f"/proc/{shared}/maps").read_text().splitlines()
                         if "libcudart.so" in line)
        lines = {
            procs["static"].pid: f"PID {procs['static'].pid} (shapes_main): CUDA runtime static, linked into "
                                 f"{static / 'shapes_main'}, {static / 'libshapes_a.so'}",
            shared: f"PID {shared} (shapes_main): CUDA runtime shared {libcudart}",
        }
        r = run_pasta(["--dry-run", "-p", f"{procs['static'].pid},{shared}"], env=driver_env)
        assert r.returncode == 0, r.stderr
        assert r.stdout.splitlines()[:2] == [lines[procs["static"].pid], lines[shared]]
        r = run_pasta(["doctor"], timeout=120, env=driver_env)
        assert [f"ok   {lines[p.pid]}" in r.stdout.splitlines() for p in procs.values()] == [True, True], r.stdout
        r = run_pasta(["--dry-run", "--", str(static / "shapes_main"), str(static / "libshapes_b.so"), "1"],
                      env=driver_env)
        assert r.returncode == 0, r.stderr
        assert (f"its CUDA runtime at start: static, linked into {static / 'shapes_main'}, "
                f"{static / 'libshapes_a.so'}") in r.stdout.splitlines()
        r = run_pasta(["--dry-run", "--", str(shapes["shared"] / "shapes_main"), "x", "1"], env=driver_env)
        assert f"its CUDA runtime at start: shared {libcudart}" in r.stdout.splitlines()
    finally:
        for go in gos:
            go.touch()
        for p in procs.values():
            p.wait(timeout=60)
