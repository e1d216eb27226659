"""Fuzz the capture directory as the verbs read it: truncation at many offsets,
bit flips, columns of another type, special files in place of every file, and
bad manifests, run through ``pasta_trace.cli.main`` by `report`, `report
--json`, `export --format chrome` and `merge`; extreme values (2^64-1, 2^63,
-1, the smallest integer, NaN, infinities, 1e308) in every numeric column,
nulls in every column, and numbers beyond 64 bits in the manifest, run by
every verb (also `report --html`, `export --format perfetto|csv`, and the
report of the merged timeline).

The promise under test: exit 0 or 1; a non-zero exit ends with exactly one
error line (and, where nothing could be read, that line is all of stderr); no
traceback, no "internal error", no Rust panic report; no hang; bounded memory.
Damage that is always detectable (a cut, a type, a special file) exits 1 and
names the file.

The verbs run in two worker processes (this file run as a script) under an
address-space limit, each verb with a watchdog that ends the worker when it
hangs; every case is seeded, so a failure names it.
"""

from __future__ import annotations

import faulthandler
import json
import os
import random
import re
import resource
import shutil
import subprocess
import sys
import traceback
from pathlib import Path

import pytest

AS_LIMIT = 8 << 30  # address space per worker: a blow-up fails fast instead of taking the machine
RSS_LIMIT_MIB = 1024  # peak resident memory per worker, asserted after the run
VERB_TIMEOUT_S = 30  # one verb on this small capture takes well under a second
WORKERS = max(2, min(4, os.cpu_count() or 1))
#: bit flips in Parquet files, each run by every verb; for a deeper run by hand:
#: PASTA_FUZZ_FLIPS=500 PASTA_FUZZ_SEED=11 PASTA_FUZZ_SUMMARY=1 pytest -s tests/unit/test_capture_fuzz.py
FLIPS = int(os.environ.get("PASTA_FUZZ_FLIPS", "24"))
SEED = int(os.environ.get("PASTA_FUZZ_SEED", "7"))

VERBS = {
    "report": lambda cap, d: ["report", cap],
    "json": lambda cap, d: ["report", cap, "--json"],
    "chrome": lambda cap, d: ["export", cap, "--format", "chrome", "-o", f"{d}/t.json", "--force"],
    "merge": lambda cap, d: ["merge", cap, "-o", f"{d}/tl", "--force"],
    # the verbs below run on the extreme values only (test_extreme_values): the damage above reaches
    # them through the same reader
    "html": lambda cap, d: ["report", cap, "--html", f"{d}/r.html", "--force"],
    "perfetto": lambda cap, d: ["export", cap, "--format", "perfetto", "-o", f"{d}/t.pftrace", "--force"],
    "csv": lambda cap, d: ["export", cap, "--format", "csv", "-o", f"{d}/csv", "--force"],
    "timeline": lambda cap, d: ["report", f"{d}/tl", "--json"],  # the merged timeline, after "merge"
}
ALL = ["report", "json", "chrome", "merge"]
EVERY = list(VERBS)
SPECIAL = {"fifo": "a FIFO, not a regular file", "dir": "a directory, not a regular file",
           "zero": "a symbolic link, not a regular file", "link": "a symbolic link, not a regular file",
           "chardev": "a character device, not a regular file"}


# --------------------------------------------------------------------------- worker (a child process)


def _apply(cap: Path, case: dict) -> None:
    f = cap / case["file"]
    kind = case["kind"]
    if kind == "truncate":
        f.write_bytes(f.read_bytes()[: case["at"]])
    elif kind == "flip":
        data = bytearray(f.read_bytes())
        data[case["at"]] ^= 1 << case["bit"]
        f.write_bytes(bytes(data))
    elif kind == "swap":
        import polars as pl

        pl.read_parquet(f).with_columns(pl.col(case["column"]).cast(getattr(pl, case["to"]))).write_parquet(f)
    elif kind == "special":
        good = cap.parent / "good"
        shutil.move(f, good)
        how = case["how"]
        if how == "fifo":
            os.mkfifo(f)
        elif how == "dir":
            f.mkdir()
        elif how == "zero":
            f.symlink_to("/dev/zero")
        elif how == "link":
            f.symlink_to(good)  # a link to the very file that was there
        elif how == "chardev":
            os.mknod(f, 0o600 | 0o020000, os.makedev(1, 5))  # /dev/zero itself
    elif kind == "text":
        f.write_bytes(case["text"].encode("utf-8", "surrogateescape"))
    elif kind == "sparse":
        with open(f, "r+b") as out:
            out.truncate(case["size"])
    elif kind in ("extreme", "null"):
        import polars as pl

        df = pl.read_parquet(f)
        df.with_columns(_extreme(df, case.get("value"))).write_parquet(f)
    elif kind == "manifest":
        m = json.loads(f.read_text())
        section = m.setdefault(case["section"], {}) if case["section"] else m
        section[case["key"]] = case["number"]
        f.write_text(json.dumps(m))


#: extreme values by name: what each is for an integer column of `bits` bits (None: not applicable)
EXTREMES = {
    "max": lambda signed, bits: (1 << (bits - 1)) - 1 if signed else (1 << bits) - 1,  # 2^64-1 unsigned
    "top": lambda signed, bits: None if signed else 1 << (bits - 1),  # 2^63: negative where read as signed
    "min": lambda signed, bits: -(1 << (bits - 1)) if signed else None,
    "neg1": lambda signed, bits: -1 if signed else None,  # -1 where unsigned is "max"
}
FLOATS = {"nan": float("nan"), "inf": float("inf"), "-inf": float("-inf"), "huge": 1e308}


#: (integer extreme, float extreme) of each case; None: nulls in every column
VALUES = [("max", "nan"), ("top", "inf"), ("min", "-inf"), ("neg1", "huge"), None]


def _extreme(df, value: list[str] | None) -> list:
    """Each column with `value` (an integer and a float extreme; None: null)
    in a quarter of its rows, a different quarter for neighbouring columns;
    the columns `value` does not apply to are left as they are."""
    import polars as pl

    out = []
    for j, (name, dtype) in enumerate(df.schema.items()):
        rows = (pl.int_range(pl.len()) + j) % 4 == 0
        if value is None:
            new = pl.lit(None, dtype)
        elif dtype.is_integer():
            v = EXTREMES[value[0]](dtype.is_signed_integer(), _bits(dtype))
            if v is None:
                continue
            new = pl.lit(v, dtype)
        elif dtype.is_float():
            new = pl.lit(FLOATS[value[1]], dtype)
        else:
            continue
        out.append(pl.when(rows).then(new).otherwise(pl.col(name)).alias(name))
    return out


def _bits(dtype) -> int:
    import polars as pl

    return {pl.Int8: 8, pl.UInt8: 8, pl.Int16: 16, pl.UInt16: 16, pl.Int32: 32, pl.UInt32: 32, pl.Int64: 64,
            pl.UInt64: 64}[dtype.base_type()]


def _run_verb(main, argv: list[str], d: Path) -> tuple[int, str, str]:
    """Run one verb with descriptors 1 and 2 on files, as a process of its own would."""
    out_path, err_path = d / "stdout", d / "stderr"
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        os.dup2(out.fileno(), 1)
        os.dup2(err.fileno(), 2)
        try:
            rc = main(argv)
        except SystemExit as e:
            rc = e.code if isinstance(e.code, int) else 2
        except BaseException:  # noqa: BLE001  escaping main is itself the failure
            sys.stderr.write("escaped cli.main: " + traceback.format_exc())
            rc = 99
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])
    return rc, out_path.read_text(errors="replace"), err_path.read_text(errors="replace")


def _whole_json(text: str) -> bool:
    try:
        json.loads(text)
        return True
    except ValueError:
        return False


def _peak_rss_mib() -> int:
    """This process's own peak resident memory: VmHWM, the high-water mark of
    its address space.  Not ru_maxrss: a child made by vfork and exec (as
    subprocess makes it) inherits in ru_maxrss the peak of its parent, the
    pytest process, which after a whole suite holds a gigabyte."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) // 1024


def worker(cases_file: str, results_file: str) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (AS_LIMIT, AS_LIMIT))
    from pasta_trace.cli import main

    # where the watchdog writes: the worker's own stdout, which the verbs' redirections do not touch
    watchdog_out = os.fdopen(os.dup(1), "w")
    spec = json.loads(Path(cases_file).read_text())
    base, work = Path(spec["base"]), Path(spec["work"])
    with open(results_file, "w") as results:
        def say(**kw) -> None:
            results.write(json.dumps(kw) + "\n")
            results.flush()

        for case in spec["cases"]:
            d = work / case["id"]
            shutil.copytree(base, d / "cap", symlinks=True)
            _apply(d / "cap", case)
            for verb in case["verbs"]:
                say(id=case["id"], verb=verb, started=True)
                # a hang ends the worker with every thread's stack on its stderr
                faulthandler.dump_traceback_later(VERB_TIMEOUT_S, exit=True, file=watchdog_out)
                rc, out, err = _run_verb(main, VERBS[verb](str(d / "cap"), str(d)), d)
                faulthandler.cancel_dump_traceback_later()
                say(id=case["id"], verb=verb, rc=rc, stdout=bool(out), json_ok=_whole_json(out), stderr=err,
                    maxrss=_peak_rss_mib())
            shutil.rmtree(d)
        say(maxrss_mib=_peak_rss_mib())


# --------------------------------------------------------------------------- cases (in the test)


def _base_capture(root: Path) -> Path:
    import polars as pl

    from pasta_trace import schema
    from pasta_trace.testing import synthetic

    cap = root / "base"
    synthetic.write_capture(cap, synthetic.Spec(pids=2, launches=40, allocations=8, accesses=300, seed=3))
    pl.DataFrame({
        "path": ["/usr/lib/libcuda.so.1"], "attach_path": ["/proc/1/root/usr/lib/libcuda.so.1"], "dev": [64768],
        "inode": [1234], "build_id": ["ab12"], "family": ["cuda"], "symbols_attached": [60], "symbols_missing": [2],
    }, schema=schema.LIBRARIES_SCHEMA).write_parquet(cap / "libraries.parquet")
    pl.DataFrame({
        "pid": [4242, 4242], "stack_id": [7, 7], "depth": [0, 1], "kind": ["python", "python"],
        "function": ["step", "<module>"], "file": ["train.py", "train.py"], "line": [10, 3], "module": [None, None],
        "addr": [0x1000, 0x2000], "truncated": [False, False],
    }, schema=schema.STACKS_SCHEMA).write_parquet(cap / "stacks.parquet")
    return cap


def _schemas() -> dict:
    from pasta_trace import schema

    return {"events-00000.parquet": schema.EVENTS_SCHEMA, "names.parquet": schema.NAMES_SCHEMA,
            "processes.parquet": schema.PROCESSES_SCHEMA, "libraries.parquet": schema.LIBRARIES_SCHEMA,
            "stacks.parquet": schema.STACKS_SCHEMA,
            **{f"device/{k}.parquet": v for k, v in schema.DEVICE_FRAMES.items()}}


def _swap_to(dtype) -> str:
    """A type a column of `dtype` casts to without error, and that does not read as it."""
    import polars as pl

    if dtype.base_type() in (pl.String, pl.Categorical, pl.Enum):
        return "Binary"
    if dtype == pl.Boolean or dtype.is_integer():
        return "Float64" if dtype == pl.Boolean else ("Int64" if dtype != pl.Int64 else "UInt64")
    return "String"


def _cases(base: Path, seed: int = SEED) -> list[dict]:
    rng = random.Random(seed)
    files = {n: s for n, s in _schemas().items() if (base / n).exists()}
    cases: list[dict] = []

    def add(kind: str, file: str, verbs: list[str], rc: tuple[int, ...], expect: str | None = None, **kw) -> None:
        cases.append({"id": f"{len(cases):03d}-{kind}", "kind": kind, "file": file, "verbs": verbs, "rc": rc,
                      "expect": expect, **kw})

    kinds = [h for h in SPECIAL if h != "chardev" or os.geteuid() == 0]  # mknod needs root
    for i, name in enumerate(files):
        size = (base / name).stat().st_size
        # every cut takes the same way (test_truncation_at_many_offsets tries many): two per file here
        for at in (size // 2, rng.randrange(size)):
            why = "not a Parquet file" if at < 12 else "truncated Parquet file (no footer at its end)"
            add("truncate", name, ALL if at == size // 2 else ["json"], (1,), f"/cap/{name}: {why}", at=at)
        column, want = next(iter(files[name].items()))
        add("swap", name, ["json", "merge"], (1,),
            f"/cap/{name}: column {column} is {_swap_to(want)}, expected {want}", column=column, to=_swap_to(want))
        for how in kinds if name.startswith("events") else [kinds[i % len(kinds)]]:
            add("special", name, ALL if how == "fifo" else ["json"], (1,), f"/cap/{name}: {SPECIAL[how]}", how=how)
    # bit flips: anywhere, any verb; what damage Polars cannot see reads as other values (exit 0)
    for _ in range(FLIPS):
        name = rng.choice(sorted(files))
        add("flip", name, ALL, (0, 1), at=rng.randrange((base / name).stat().st_size), bit=rng.randrange(8))
    # found by deeper runs (tied to the synthetic capture above: if that changes, find others with
    # PASTA_FUZZ_FLIPS): Polars panics on the first only when the whole file is collected, and
    # aborts the process on the second (an allocation of 2**61 bytes); both are left out at open
    add("flip", "device/alloc_touch.parquet", ALL, (1,),
        "/cap/device/alloc_touch.parquet: damaged Parquet data (", at=1084, bit=1)
    add("flip", "stacks.parquet", ALL, (1,), "/cap/stacks.parquet: damaged Parquet data (", at=161, bit=0)
    m = (base / "manifest.json").read_text()
    for how in kinds:
        add("special", "manifest.json", ALL if how == "fifo" else ["json"], (1,),
            f"/cap/manifest.json: {SPECIAL[how]}", how=how, fatal=True)
    for at in (0, 1, len(m) // 2, len(m) - 1):
        add("truncate", "manifest.json", ["json"], (1,), "/cap/manifest.json: damaged manifest (", at=at, fatal=True)
    for _ in range(10):
        at = rng.randrange(len(m))
        add("flip", "manifest.json", ["json"], (0, 1), at=at, bit=rng.randrange(8), fatal=True)
    bad = {
        "[1]": "not a pasta-trace manifest (it is an array, expected an object)",
        "null": "not a pasta-trace manifest (it is null, expected an object)",
        '{"format_version": "1.0", "counts": "abc"}': "not a pasta-trace manifest (counts is a string",
        '{"format_version": "1.0", "counts": {"lost_events": "abc"}}':
            "not a pasta-trace manifest (counts.lost_events is a string",
        '{"format_version": "1.0", "x": ' + "[" * 100_000: "damaged manifest (nested too deeply)",
        '{"format_version": "1.0", "host": "\udcff"}': "damaged manifest (not UTF-8 at byte",
    }
    for text, why in bad.items():
        add("text", "manifest.json", ["json"], (1,), f"/cap/manifest.json: {why}", text=text, fatal=True)
    add("sparse", "manifest.json", ALL, (1,), "/cap/manifest.json: 10737418240 bytes, more than a manifest can hold",
        size=10 << 30, fatal=True)
    return cases


def _check(case: dict, r: dict) -> None:
    where = f"case {case['id']} {case['kind']} {case['file']} {({k: case[k] for k in ('at', 'bit', 'how', 'column') if k in case})} verb {r['verb']}"
    err = r["stderr"]
    for bad in ("Traceback", "internal error", "panicked", "RUST_BACKTRACE", "escaped cli.main"):
        assert bad not in err, f"{where}: {bad!r} on stderr:\n{err}"
    assert r["rc"] in case["rc"], f"{where}: exit {r['rc']}\n{err}"
    lines = err.splitlines()
    errors = [line for line in lines if line.startswith("pasta-trace: error: ")]
    if r["rc"] == 0:
        assert errors == [], f"{where}: exit 0 with {errors}"
        return
    assert errors == lines[-1:], f"{where}: not one error line at the end:\n{err}"
    if case.get("fatal") or not r["stdout"] and not any(line.startswith("Wrote ") for line in lines):
        assert len(lines) == 1, f"{where}: nothing was read, yet more than one line:\n{err}"
    # a damaged file, or (values no file check can see, such as a clock sample near 2**63) the capture
    # ("timeline" reads what "merge" wrote: when the merge refused, that the timeline is not there)
    assert re.search(r"/(cap|tl)(/[^:]+)?: ", errors[0]), f"{where}: the error names no file: {errors[0]!r}"
    if case["expect"]:
        assert case["expect"] in errors[0], f"{where}: {case['expect']!r} not in {errors[0]!r}"
    if r["verb"] == "json" and r["stdout"]:
        assert r["json_ok"], f"{where}: stdout is no whole JSON document"


def _heights(cap) -> dict[str, int]:
    frames = {"events": cap.events, "names": cap.names, "processes": cap.processes, "libraries": cap.libraries,
              "stacks": cap.stacks, **{f"device/{k}": v for k, v in cap.device.items()}}
    return {k: v.select(__import__("polars").len()).collect().item() for k, v in frames.items()}


def test_truncation_at_many_offsets(tmp_path: Path) -> None:
    """Each Parquet file cut at 24 offsets from the first byte to the last: left
    out with its name and why, every other file read whole (in this process:
    a cut makes no special file, nothing here can block)."""
    from pasta_trace.read import open_capture

    base = _base_capture(tmp_path)
    whole = _heights(open_capture(base))
    for name in _schemas():
        f = base / name
        if not f.exists():
            continue
        data = f.read_bytes()
        for at in sorted({*range(0, len(data), max(1, len(data) // 16)), *range(len(data) - 8, len(data))}):
            f.write_bytes(data[:at])
            cap = open_capture(base)
            why = "not a Parquet file" if at < 12 else "truncated Parquet file (no footer at its end)"
            assert cap.damaged == [f"{f}: {why}"], (name, at)
            key = name.removesuffix(".parquet").removesuffix("-00000")
            assert _heights(cap) == {**whole, key: 0}, (name, at)
        f.write_bytes(data)


def test_capture_fuzz(tmp_path: Path) -> None:
    base = _base_capture(tmp_path)
    _run_cases(tmp_path, base, _cases(base))


def _extreme_cases(base: Path) -> list[dict]:
    """Extreme values in every numeric column and nulls in every column, file
    by file, run by every verb; extreme numbers in the manifest.  The verbs
    give a result (exit 0) or one line naming the file (exit 1)."""
    cases: list[dict] = []

    def add(kind: str, file: str, verbs: list[str], **kw) -> None:
        cases.append({"id": f"{len(cases):03d}-{kind}", "kind": kind, "file": file, "verbs": verbs, "rc": (0, 1),
                      "expect": None, **kw})

    for name in (n for n in _schemas() if (base / n).exists()):
        # the device frames reach the terminal report and the Chrome export through the same tables
        verbs = EVERY if not name.startswith("device/") else ["json", "html", "merge", "perfetto", "timeline"]
        for value in VALUES:
            add("null" if value is None else "extreme", name, verbs, value=value)
    numbers = [(1 << 64) - 1, 1 << 63, (1 << 63) - 1, -1, -(1 << 63), 10**40, 1.5e300]
    keys = [("clock", "start_ns"), ("clock", "end_ns"), ("counts", "lost_events"), ("counts", "events"),
            (None, "format_version")]
    for i, number in enumerate(numbers):  # each number in two places, each place given several numbers
        for section, key in (keys[i % len(keys)], keys[(i + 2) % len(keys)]):
            add("manifest", "manifest.json", ["json", "html", "merge"], section=section, key=key, number=number)
    return cases


def test_extreme_values(tmp_path: Path) -> None:
    base = _base_capture(tmp_path)
    _run_cases(tmp_path, base, _extreme_cases(base))


def _run_cases(tmp_path: Path, base: Path, cases: list[dict]) -> None:
    by_id = {c["id"]: c for c in cases}
    procs = []
    runs_of: dict[Path, int] = {}
    for w in range(WORKERS):
        spec = tmp_path / f"cases-{w}.json"
        spec.write_text(json.dumps({"base": str(base), "work": str(tmp_path), "cases": cases[w::WORKERS]}))
        results = tmp_path / f"results-{w}.jsonl"
        env = {**os.environ, "POLARS_MAX_THREADS": "2"}
        runs_of[results] = sum(len(c["verbs"]) for c in cases[w::WORKERS])
        procs.append((subprocess.Popen([sys.executable, __file__, str(spec), str(results)], env=env,
                                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT), results))
    runs = 0
    outcomes: dict[tuple, int] = {}
    for proc, results in procs:
        try:
            # a backstop only: each verb's watchdog ends a hung worker after VERB_TIMEOUT_S
            output = proc.communicate(timeout=120 + 3 * runs_of[results])[0].decode(errors="replace")
        except subprocess.TimeoutExpired:
            proc.kill()
            output = proc.communicate()[0].decode(errors="replace")
        lines = [json.loads(line) for line in results.read_text().splitlines()]
        done = lines[-1] if lines and "maxrss_mib" in lines[-1] else None
        if done is None:
            last = next((r for r in reversed(lines) if r.get("started")), None)
            pytest.fail(f"worker ended (exit {proc.returncode}) during {last and by_id[last['id']]} "
                        f"verb {last and last['verb']}: a hang or a crash\n{output[-4000:]}")
        assert proc.returncode == 0, output
        if done["maxrss_mib"] >= RSS_LIMIT_MIB:
            grew = [(b["maxrss"] - a["maxrss"], b["id"], b["verb"]) for a, b in
                    zip([r for r in lines[:-1] if "maxrss" in r], [r for r in lines[:-1] if "maxrss" in r][1:])]
            pytest.fail(f"peak RSS {done['maxrss_mib']} MiB; the verbs it grew most in (MiB, case, verb): "
                        f"{sorted(grew, reverse=True)[:5]}")
        for r in lines[:-1]:
            if not r.get("started"):
                _check(by_id[r["id"]], r)
                runs += 1
                # what each kind of damage came to: (kind, exit, the error's reason)
                said = r["stderr"].splitlines()[-1].split(": ", 3)[-1].split(" (")[0][:40] if r["rc"] else ""
                key = (by_id[r["id"]]["kind"], r["rc"], said)
                outcomes[key] = outcomes.get(key, 0) + 1
    assert runs == sum(len(c["verbs"]) for c in cases)
    if os.environ.get("PASTA_FUZZ_SUMMARY"):  # with -s, for a deeper run by hand
        for key, n in sorted(outcomes.items()):
            print(*key, n, sep="  ")


if __name__ == "__main__":
    worker(sys.argv[1], sys.argv[2])
