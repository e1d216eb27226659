"""contrib/'s systemd unit and Kubernetes DaemonSet run a daemon command line
this pasta-trace accepts (parsed by its own parser, so a renamed flag fails
here), and the DaemonSet has what BCC needs: privileged, the host's PIDs, and
debugfs, bpffs, the kernel's modules and headers mounted."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from pasta_trace import cli

CONTRIB = Path(__file__).resolve().parents[2] / "contrib"


def _parsed(argv: list[str]):
    assert Path(argv[0]).name == "pasta-trace"
    return cli.build_parser().parse_args(argv[1:])


def test_the_systemd_unit_runs_the_daemon_with_flags_it_takes() -> None:
    lines = (CONTRIB / "pasta-trace-daemon.service").read_text().splitlines()
    exec_start = [line.split("=", 1)[1] for line in lines if line.startswith("ExecStart=")]
    assert len(exec_start) == 1
    args = _parsed(shlex.split(exec_start[0]))
    assert (args.verb, str(args.output), args.window, args.window_bytes, args.keep, args.keep_bytes) == (
        "daemon", "/var/lib/pasta-trace/dumps", 60.0, 1 << 30, 20, 10 << 30)
    # the socket's directory, root's and 0755 (the daemon refuses one others may write)
    assert "RuntimeDirectory=pasta-trace" in lines and "RuntimeDirectoryMode=0755" in lines
    assert "KillMode=mixed" in lines  # SIGTERM reaches the daemon first: it resumes what it holds


def test_the_daemonset_is_privileged_on_the_host_pids_with_bccs_mounts() -> None:
    yaml = pytest.importorskip("yaml")
    docs = list(yaml.safe_load_all((CONTRIB / "pasta-trace-daemonset.yaml").read_text()))
    ds = next(d for d in docs if d["kind"] == "DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    assert pod["hostPID"] is True
    (container,) = pod["containers"]
    assert container["securityContext"]["privileged"] is True
    args = _parsed(container["command"])
    assert (args.verb, str(args.output), args.keep) == ("daemon", "/var/lib/pasta-trace/dumps", 20)
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    host = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"]}
    assert {path: host[name] for path, name in mounts.items()} == {
        "/sys/kernel/debug": "/sys/kernel/debug", "/sys/fs/bpf": "/sys/fs/bpf", "/lib/modules": "/lib/modules",
        "/usr/src": "/usr/src", "/run/pasta-trace": "/run/pasta-trace", "/var/lib/pasta-trace": "/var/lib/pasta-trace"}
    assert str(args.socket).startswith("/run/pasta-trace/")  # on the host's /run/pasta-trace: root there may dump
