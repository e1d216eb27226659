"""The --native-stacks tables cache cannot be forged: entries are keyed by the
file's content, not its build-id, and kept per user in a directory no one
else can write (stacks.unwind_table)."""

from __future__ import annotations

import hashlib
import os
import pwd
import shutil
import subprocess
from pathlib import Path

import pytest

from pasta_trace.stacks import unwind_table as ut

BUILD_ID = "0123456789abcdef0123456789abcdef01234567"
SOURCES = {
    "real": "int real_inner(int x) { return x * 3; }\nint shared_entry(int x) { return real_inner(x) + 1; }\n",
    "forged": ("int forged_inner(int x) { return x - 7; }\nint forged_mid(int x) { return forged_inner(x) * 2; }\n"
               "int shared_entry(int x) { return forged_mid(x) + 5; }\n"),
}


@pytest.fixture
def same_build_id(tmp_path) -> dict[str, Path]:
    """Two shared libraries with one build-id note and different code."""
    if shutil.which("gcc") is None:
        pytest.skip("gcc is missing")
    out = {}
    for name, text in SOURCES.items():
        (tmp_path / f"{name}.c").write_text(text)
        lib = tmp_path / f"lib{name}.so"
        subprocess.run(["gcc", "-shared", "-fPIC", "-O0", f"-Wl,--build-id=0x{BUILD_ID}", "-o", str(lib),
                        str(tmp_path / f"{name}.c")], check=True)
        out[name] = lib
    return out


def functions(tables: ut.Tables) -> set[str]:
    return {n for n in tables.sym_name.tolist() if n.startswith(("real_", "forged_", "shared_"))}


def test_a_forged_build_id_gets_its_own_tables(same_build_id, tmp_path):
    cache = tmp_path / "cache"
    with open(same_build_id["forged"], "rb") as f:
        assert ut.build_id_of(f) == BUILD_ID
        forged = ut.tables_for(f, cache=cache)  # traced first: its tables are kept
    with open(same_build_id["real"], "rb") as f:
        assert ut.build_id_of(f) == BUILD_ID
        real = ut.tables_for(f, cache=cache)
    assert functions(forged) == {"forged_inner", "forged_mid", "shared_entry"}
    assert functions(real) == {"real_inner", "shared_entry"}
    want = {hashlib.sha256(p.read_bytes()).hexdigest() + ".npz" for p in same_build_id.values()}
    assert {p.name for p in cache.iterdir()} == want
    # and a later capture of the real file reads the real file's entry
    with open(same_build_id["real"], "rb") as f:
        again = ut.cached(f, cache)
    assert again is not None and functions(again) == {"real_inner", "shared_entry"}


def test_under_sudo_the_cache_is_roots_and_per_user_whatever_the_environment(monkeypatch, tmp_path):
    if os.geteuid() != 0:
        pytest.skip("sudo is played by root")
    for var in ("HOME", "XDG_CACHE_HOME", "PASTA_TRACE_CACHE"):
        monkeypatch.setenv(var, str(tmp_path / "users"))
    monkeypatch.setenv("SUDO_UID", "4242")
    monkeypatch.setenv("SUDO_GID", "4242")
    root_home = Path(pwd.getpwuid(0).pw_dir)
    assert ut.cache_dir() == root_home / ".cache/pasta-trace/unwind/uid-4242"
    monkeypatch.setenv("SUDO_UID", "4243")
    assert ut.cache_dir() == root_home / ".cache/pasta-trace/unwind/uid-4243"


def test_without_sudo_each_uid_has_its_own_directory(monkeypatch, tmp_path):
    monkeypatch.delenv("SUDO_UID", raising=False)
    monkeypatch.setenv("PASTA_TRACE_CACHE", str(tmp_path))
    assert ut.cache_dir() == tmp_path / "unwind" / f"uid-{os.geteuid()}"


@pytest.mark.parametrize("how", ["another owner", "group writable", "a link"])
def test_a_directory_someone_else_can_change_is_not_used(same_build_id, tmp_path, how):
    if os.geteuid() != 0 and how == "another owner":
        pytest.skip("giving a directory away needs root")
    cache = tmp_path / "cache"
    if how == "a link":
        (tmp_path / "elsewhere").mkdir(mode=0o700)
        cache.symlink_to(tmp_path / "elsewhere")
    else:
        cache.mkdir(mode=0o700)
        if how == "another owner":
            os.chown(cache, 4242, 4242)
        else:
            cache.chmod(0o770)
    assert not ut.trusted_dir(cache)
    with open(same_build_id["real"], "rb") as f:
        tables = ut.tables_for(f, cache=cache)
        assert ut.cached(f, cache) is None
    assert functions(tables) == {"real_inner", "shared_entry"}  # parsed, just not kept
    assert list((tmp_path / "elsewhere" if how == "a link" else cache).iterdir()) == []


def test_a_new_directory_is_made_private(tmp_path):
    d = tmp_path / "a" / "b"
    assert ut.trusted_dir(d)
    assert (d.stat().st_mode & 0o777, d.stat().st_uid) == (0o700, os.geteuid())
