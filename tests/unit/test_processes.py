"""processes.parquet rows read from /proc: the distributed-job coordinates
come from the process's own environment."""

from __future__ import annotations

import os
import subprocess
import sys

from pasta_trace.capture.procs.processes import distributed, process_row


def test_rank_from_the_environment_of_the_process() -> None:
    env = {**os.environ, "RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "16"}
    child = subprocess.Popen([sys.executable, "-c", "import sys; print('ready', flush=True); sys.stdin.read()"],
                             env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert child.stdout.readline() == b"ready\n"  # past its exec: its environment is in place
        row = process_row(child.pid)
    finally:
        child.communicate(b"")
    assert (row["rank"], row["local_rank"], row["world_size"]) == (5, 1, 16)


def test_unset_or_garbled_variables_are_unknown() -> None:
    assert distributed(b"PATH=/bin\0RANK=x\0WORLD_SIZE=4\0LOCAL_RANKS=2\0") == {
        "rank": None, "local_rank": None, "world_size": 4}
    assert distributed(b"") == {"rank": None, "local_rank": None, "world_size": None}
