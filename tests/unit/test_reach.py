"""capture.procs.reach on /proc status files written here: which processes a
capture under sudo may trace, and the one line that refuses the others."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pasta_trace.capture.procs import reach
from pasta_trace.errors import EXIT_NOPERM


def _proc(tmp_path: Path, **uid_lines: str) -> Path:
    for pid, uids in uid_lines.items():
        d = tmp_path / pid.removeprefix("p")
        d.mkdir()
        (d / "status").write_text(f"Name:\tx\nState:\tS (sleeping)\nUid:\t{uids}\nGid:\t0\t0\t0\t0\n")
    return tmp_path


def test_only_a_process_with_all_four_uids_the_users_may_be_traced(tmp_path):
    proc = _proc(tmp_path, p10="1000\t1000\t1000\t1000", p11="0\t0\t0\t0", p12="1000\t0\t0\t0",
                 p13="1000\t1000\t0\t1000", p14="1000\t1000\t1000\t0", p15="1001\t1001\t1001\t1001")
    assert [pid for pid in range(10, 17) if reach.may_trace(pid, 1000, proc)] == [10]
    assert [pid for pid in range(10, 17) if reach.may_trace(pid, None, proc)] == list(range(10, 17))  # root's use
    assert reach.uids(12, proc) == (1000, 0, 0, 0)
    assert reach.uids(16, proc) is None  # gone


def test_refusal_names_the_pid_and_its_owner(tmp_path):
    proc = _proc(tmp_path, p10="1000\t1000\t1000\t1000", p11="0\t0\t0\t0", p12="1000\t0\t0\t0")
    assert reach.refusal(10, 1000, proc) is None
    assert reach.refusal(11, None, proc) is None
    assert reach.refusal(99, 1000, proc) is None  # gone: the caller says "no such process"
    err = reach.refusal(11, 1000, proc)
    assert err.exit_code == EXIT_NOPERM
    name = reach.user_name(1000)
    assert err.one_line() == (f"PID 11 belongs to root (uid 0), not to {name} (uid 1000): under sudo pasta-trace "
                              "traces only the invoking user's own processes")
    assert str(reach.refusal(12, 1000, proc)).startswith(
        "PID 12 belongs to root (effective uid 0: a setuid program, or one that changed uid), not to ")


@pytest.mark.parametrize("env, uid", [({}, None), ({"SUDO_UID": "0", "SUDO_GID": "0"}, None),
                                      ({"SUDO_UID": "1000", "SUDO_GID": "1000"}, 1000)])
def test_the_uid_comes_from_sudo_only_for_a_user_other_than_root(monkeypatch, env, uid):
    if os.geteuid() != 0:
        pytest.skip("the invoking user counts only when we run as root")
    for k in ("SUDO_UID", "SUDO_GID", "SUDO_USER"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert reach.traced_uid() == uid
