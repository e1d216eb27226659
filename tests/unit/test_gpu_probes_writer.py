"""The C++ record writer under concurrent producers: nothing is lost without
being counted, every kept record is whole, and each producer's records stay in
its order (gpu_probes/host/writer.cpp's bounded MPSC queue + writer thread)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from pasta_trace import schema
from pasta_trace.schema import DeviceRecordType as RT

ROOT = Path(__file__).resolve().parents[2]
GP = ROOT / "gpu_probes"

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")


@pytest.fixture(scope="module")
def stress(tmp_path_factory: pytest.TempPathFactory) -> Path:
    exe = tmp_path_factory.mktemp("writer") / "writer_stress"
    subprocess.run(["g++", "-std=c++17", "-O2", "-Wall", "-Wextra", "-Werror", f"-I{GP / 'include'}",
                    f"-I{GP / 'host'}", str(GP / "tests/writer_stress.cpp"), str(GP / "host/writer.cpp"),
                    "-pthread", "-o", str(exe)], check=True)
    return exe


def records(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(bytes after the file header, types, launch ids, record offsets)."""
    raw = np.fromfile(path, dtype=np.uint8)
    hdr = raw[:64].view(schema.DEV_FILE_HEADER.dtype)[0]
    assert hdr["magic"] == schema.DEVICE_MAGIC and hdr["backend"] == schema.DeviceBackend.synthetic
    body = raw[64:]
    # All records here are 16 + 32 (CLOCK_SYNC) or 16 + 24 (DROPPED) bytes: walk them.
    offs, off = [], 0
    while off < len(body):
        offs.append(off)
        off += int(body[off + 4:off + 8].view("<u4")[0])
    assert off == len(body)
    offs = np.array(offs, dtype=np.int64)
    types = np.array([int(body[o:o + 2].view("<u2")[0]) for o in offs])
    lids = np.array([int(body[o + 8:o + 16].view("<u8")[0]) for o in offs])
    return body, types, lids, offs


@pytest.mark.parametrize("threads,per,queue", [(4, 20_000, 64), (3, 5_000, 1 << 16)])
def test_concurrent_producers_lose_nothing_uncounted(stress: Path, tmp_path: Path, threads: int, per: int,
                                                     queue: int) -> None:
    out = tmp_path / "w.bin"
    r = subprocess.run([str(stress), str(out), str(threads), str(per), str(queue)], capture_output=True, text=True,
                       check=True, timeout=120)
    submitted, kept, dropped = map(int, r.stdout.split())
    assert submitted == threads * per and kept + dropped == submitted
    body, types, lids, offs = records(out)
    sync = offs[types == RT.CLOCK_SYNC]
    assert len(sync) == kept
    drop_recs = offs[types == RT.DROPPED]
    assert sum(int(body[o + 16:o + 24].view("<u8")[0]) for o in drop_recs) == dropped
    if queue > threads * per:
        assert dropped == 0 and len(drop_recs) == 0
    payload = np.stack([body[o + 16:o + 32].view("<u8") for o in sync])  # (thread, sequence)
    for t in range(threads):
        seq = payload[payload[:, 0] == t, 1]
        assert np.all(np.diff(seq.astype(np.int64)) > 0), f"thread {t} out of order"
        assert (lids[types == RT.CLOCK_SYNC][payload[:, 0] == t] == t + 1).all()
