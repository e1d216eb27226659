"""The ledger (capture.output.ledger): records published by one process are read
whole by another after it is gone, and a record is never seen half-written."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from pasta_trace.capture.output.ledger import RECORDS, Ledger


def test_a_record_never_published_reads_as_none():
    ledger = Ledger.create()
    try:
        assert [ledger.read(name) for name in RECORDS] == [None, None, None]
    finally:
        os.close(ledger.fd)


def test_each_record_reads_as_last_published_and_apart_from_the_others():
    ledger = Ledger.create()
    try:
        ledger.publish("TRACER", (1, 2, 3, 4))
        ledger.publish("TAKEN", (5, 6, 7, 8, 9, 2**64 - 1))
        ledger.publish("TRACER", (10, 20, 30, 40))
        ledger.publish("UNWRITTEN", (7,))
        ledger.publish("TRACER", (11, 21, 31, 41))
        assert ledger.read("TRACER") == (11, 21, 31, 41)
        assert ledger.read("TAKEN") == (5, 6, 7, 8, 9, 2**64 - 1)
        assert ledger.read("UNWRITTEN") == (7,)
    finally:
        os.close(ledger.fd)


PUBLISHER = """
import os, signal, sys
from pasta_trace.capture.output.ledger import Ledger
ledger = Ledger(int(sys.argv[1]))
i = 0
while True:
    i += 1
    ledger.publish("TAKEN", (i, i, i, i, i, i))
    if i == 1000:
        os.write(1, b"go\\n")
"""


def test_a_publisher_killed_at_any_moment_leaves_a_whole_record():
    """SIGKILL a process that publishes as fast as it can: what it left is
    one of its records, whole (all six values equal), never a mix of two."""
    ledger = Ledger.create()
    try:
        for _ in range(20):
            p = subprocess.Popen([sys.executable, "-c", PUBLISHER, str(ledger.fd)], pass_fds=(ledger.fd,),
                                 stdout=subprocess.PIPE)
            assert p.stdout.readline() == b"go\n"
            os.kill(p.pid, signal.SIGKILL)
            p.wait()
            p.stdout.close()
            record = ledger.read("TAKEN")
            assert record is not None and record[0] >= 1000 and len(set(record)) == 1, record
    finally:
        os.close(ledger.fd)
