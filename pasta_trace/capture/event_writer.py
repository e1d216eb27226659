"""The events writer process: decodes ring records and writes events-NNNNN.parquet
(and communicators.parquet whenever an NCCL communicator is made or ended).

It runs apart from the tracer (``python -m pasta_trace.capture.event_writer
DIR_FD``, at lower priority) so that decoding and compressing never hold the GIL or the
CPU that the drain needs to keep the ring buffer from overflowing.  It reads
framed messages on stdin: a type byte, a u64 length, the payload.

    b"A"  JSON list of API names (first message)
    b"E"  raw records: schema.HOST_EVENT, plain or as laid out in the ring
    b"F"  write what arrived since the last flush
    b"S"  the same, then answer b"ok\\n" on stdout (a synchronous flush)
    b"C"  flush, answer a JSON line {"comms": {pid: comm}, "files": [...]}, exit
"""

from __future__ import annotations

import json
import os
import socket
import struct
import sys
from pathlib import Path

import numpy as np
import polars as pl

from .. import schema
from ..safe_output import OutputDir
from . import own_process
from .collectives import CommunicatorTable, Sequencer
from .decode import events_frame
from .ringbuf import padded_dtype

HEADER = struct.Struct("<cQ")
COMPRESSION = "lz4"
NICE = 5
COMMUNICATORS = "communicators.parquet"


def frame(kind: bytes, payload: bytes = b"") -> bytes:
    return HEADER.pack(kind, len(payload)) + payload


def write_atomic(out: OutputDir, name: str, data: pl.DataFrame) -> None:
    """Write ``data`` to ``name`` in ``out`` via a new temporary file and a rename."""
    out.write_atomic(name, lambda path: data.write_parquet(path, compression=COMPRESSION, statistics=False))


def _read_exact(stream, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = stream.read(n - len(buf))
        if not chunk:
            raise EOFError("the tracer closed the pipe")
        buf += chunk
    return bytes(buf)


def main(argv: list[str]) -> int:
    own_process.mark()
    fd = int(argv[0])  # the capture directory, inherited open: every file is written relative to it
    out = OutputDir(fd, Path(f"/proc/self/fd/{fd}"))
    os.nice(NICE)
    dtypes = {d.itemsize: d for d in (schema.HOST_EVENT.dtype, padded_dtype(schema.HOST_EVENT.dtype))}
    stdin, stdout = sys.stdin.buffer, sys.stdout
    api_names: list[str] = []
    pending: list[np.ndarray] = []
    files: list[str] = []
    comms: dict[int, str] = {}
    sequencer = Sequencer()
    communicators = CommunicatorTable(socket.gethostname())

    def flush() -> None:
        if not pending:
            return
        recs = np.concatenate(pending)
        pending.clear()
        data = events_frame(recs, api_names, sequencer)
        name = f"events-{len(files):05d}.parquet"
        write_atomic(out, name, data)
        files.append(name)
        if communicators.add(data):
            write_atomic(out, COMMUNICATORS, communicators.rows)
        for pid, comm in data.select("pid", pl.col("comm").cast(pl.String)).unique().iter_rows():
            comms.setdefault(pid, comm)

    while True:
        try:
            kind, length = HEADER.unpack(_read_exact(stdin, HEADER.size))
            payload = _read_exact(stdin, length) if length else b""
        except EOFError:
            flush()  # the tracer died: keep what we have
            return 1
        if kind == b"A":
            api_names = json.loads(payload)
        elif kind == b"E":
            size = struct.unpack_from("<I", payload)[0]
            pending.append(np.frombuffer(payload, dtypes[size], offset=4))
        elif kind in (b"F", b"S"):
            flush()
            if kind == b"S":
                stdout.write("ok\n")
                stdout.flush()
        elif kind == b"C":
            flush()
            stdout.write(json.dumps({"comms": comms, "files": files}) + "\n")
            stdout.flush()
            return 0
        else:
            raise ValueError(f"unknown message {kind!r}")


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
