"""The compiled handlers cache (probes/compiled_cache) with BCC and the
kernel: the handlers a hit loads are the bytes the compiler made, a capture
whose handlers came from the cache records call for call what a compiled one
records, a damaged entry is compiled again and replaced, and a directory
others can write is not used."""

from __future__ import annotations

import struct
import types
from pathlib import Path

import polars as pl
import pytest

from pasta_run import run_pasta
from pasta_trace.capture.bpf.probe_set import handler_names
from pasta_trace.probes import catalog, compiled_cache as cc, program, uprobe_link
from pasta_trace.read import open_capture
from test_record_modes import ALL_PHASES, check_capture, workload_cmd

pytestmark = [pytest.mark.live, pytest.mark.usefixtures("require_bpf")]

#: one API of each handler macro: every kind of handler body, compiled in seconds
ONE_PER_MACRO = tuple({a.macro: a for a in catalog.APIS}.values())


def texts(apis: tuple, ring_pages: int = 64) -> tuple[str, str]:
    """(the program with ``apis``' handlers, the same without handlers), as a capture builds them."""
    def text(a):
        return program.build(program.Spec(ring_pages=ring_pages, filter_pids=True, apis=a))
    return text(apis), text(())


def names(apis: tuple) -> list[str]:
    return [n for a in apis for n in program.handler_names(a) if n]


def build(bcc, in_process, apis: tuple, notes: list[str], ring_pages: int = 64):
    full, short = texts(apis, ring_pages)
    b = cc.compile_program(bcc, full, lambda: short, names(apis), notes.append)
    in_process.closing(types.SimpleNamespace(close=b.cleanup))
    return b


def normalised(b, fn: str) -> bytes:
    """``fn``'s bytecode in ``b`` with its map fds zeroed (the same in every module)."""
    return cc.normalise(b.dump_func(fn.encode()), {fd: 0 for fd, _ in cc.module_maps(b).values()}).code


def test_a_hit_loads_the_bytes_the_compiler_made(in_process, tmp_path, monkeypatch):
    import bcc

    monkeypatch.setenv(cc.ENV, str(tmp_path / "cache"))
    notes: list[str] = []
    compiled = build(bcc, in_process, ONE_PER_MACRO, notes)
    cached = build(bcc, in_process, ONE_PER_MACRO, notes)
    entry = tmp_path / "cache" / (cc.key(texts(ONE_PER_MACRO)[0]) + cc.SUFFIX)
    assert notes == [f"BPF cache: compiled, saved as {entry}",
                     f"BPF cache: {len(names(ONE_PER_MACRO))} handlers from {entry}"]
    assert type(compiled) is bcc.BPF and type(cached).__name__ == "CachedBPF"
    for fn in names(ONE_PER_MACRO):
        assert normalised(cached, fn) == normalised(compiled, fn), fn
        # as a capture loads them: the kernel verifies each against the new module's maps
        assert uprobe_link.load(cached, fn).fd >= 0
        assert not bcc.lib.bpf_function_start(cached.module, fn.encode())  # not compiled this time
    assert set(cc.module_maps(cached)) == set(cc.module_maps(compiled))


def test_an_entry_that_is_damaged_or_does_not_fit_is_not_loaded(in_process, tmp_path, monkeypatch):
    """A damaged entry is compiled again and replaced; one whose maps are not
    the new module's (the events ring of another size) is not loaded."""
    import bcc

    monkeypatch.setenv(cc.ENV, str(tmp_path / "cache"))
    apis = ONE_PER_MACRO[:3]
    notes: list[str] = []
    build(bcc, in_process, apis, notes)
    entry = tmp_path / "cache" / (cc.key(texts(apis)[0]) + cc.SUFFIX)
    whole = entry.read_bytes()
    entry.write_bytes(whole[: len(whole) // 2])
    build(bcc, in_process, apis, notes)
    assert entry.read_bytes() == whole
    hit = build(bcc, in_process, apis, notes)
    assert notes == [f"BPF cache: compiled, saved as {entry}"] * 2 + [f"BPF cache: {len(names(apis))} handlers from {entry}"]
    assert type(hit).__name__ == "CachedBPF"
    assert cc.load(bcc, texts(apis, ring_pages=128)[1], cc.decode(whole)) is None


def test_a_directory_others_can_write_is_not_used(in_process, tmp_path, monkeypatch):
    import bcc

    d = tmp_path / "cache"
    d.mkdir(mode=0o700)
    d.chmod(0o770)
    monkeypatch.setenv(cc.ENV, str(d))
    notes: list[str] = []
    b = build(bcc, in_process, ONE_PER_MACRO[:3], notes)
    assert notes == [f"BPF cache: not using {d}: writable by others than root; compiling"]
    assert type(b) is bcc.BPF
    assert list(d.iterdir()) == []


def _record(families, tmp_path: Path, run: str, cache: Path):
    cuda, hip = families
    cmds = [workload_cmd(cuda, tmp_path / f"{run}-cuda.json"), workload_cmd(hip, tmp_path / f"{run}-hip.json")]
    out = tmp_path / run
    r = run_pasta(["-v", "-o", str(out), "--", "sh", "-c", " && ".join(" ".join(map(str, c)) for c in cmds)],
                  timeout=300, env={cc.ENV: str(cache)})
    assert r.returncode == 0, r.stderr
    check_capture(out, [(tmp_path / f"{run}-cuda.json", ALL_PHASES, cuda.workload.name),
                        (tmp_path / f"{run}-hip.json", ALL_PHASES, hip.workload.name)])
    calls = (open_capture(out).events.group_by("api", "kind").agg(pl.len()).sort("api", "kind").collect())
    return r.stderr, calls


def test_a_capture_from_the_cache_records_what_a_compiled_one_records(families, tmp_path):
    """The CUDA and HIP workloads recorded twice with an empty cache: compiled, then from the cache;
    each capture equals the workloads' own reports, call for call."""
    cache = tmp_path / "cache"
    compiled_err, compiled = _record(families, tmp_path, "compiled", cache)
    cached_err, cached = _record(families, tmp_path, "cached", cache)
    [entry] = cache.iterdir()
    assert f"BPF cache: compiled, saved as {entry}" in compiled_err
    assert f"BPF cache: {len(handler_names())} handlers from {entry}" in cached_err
    assert cached.equals(compiled)
    assert compiled.height > 10


def test_handlers_the_kernel_refuses_are_not_saved(in_process):
    """Checked on the miss as a hit loads them (alone, without the module's BTF info)."""
    import bcc

    b = in_process.bpf("int f(void *ctx) { return 0; }")
    cc.verify(bcc, b, cc.Entry([], {"pt_e_good": cc.Handler(b.dump_func(b"f"), [])}))
    exit_only = struct.pack("<BBhi", 0x95, 0, 0, 0)  # returns r0, never set
    with pytest.raises(cc.Uncacheable) as e:
        cc.verify(bcc, b, cc.Entry([], {"pt_e_bad": cc.Handler(exit_only, [])}))
    assert str(e.value) == "the kernel refuses pt_e_bad loaded alone: Permission denied"
