"""The Perfetto encoder's rows, grouped by the lengths of their fields, give
the bytes of the encoder before it (tests/fixtures/protowire_masked.py: one
matrix as wide as the widest row, the used bytes picked out with a boolean
mask) on a synthetic capture with every kind of event, with and without device
data, and the scalar encoder's, field by field, on rows of every length."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import protowire_masked
import pytest

from pasta_trace import merge
from pasta_trace.export import perfetto, trace_model
from pasta_trace.export import protowire as pw
from pasta_trace.testing import synthetic

#: every kind of host event the generator makes, each call with a stack, and device data for every launch
SPEC = synthetic.Spec(pids=2, launches=3_000, allocations=120, accesses=2_000, syncs=60, failed_allocs=5,
                      stacks=True, copies=40, tensors=80, collectives=30, seed=7)


@pytest.fixture(scope="module")
def capture(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("enc") / "cap"
    synthetic.write_capture(path, SPEC)
    return path


@pytest.mark.parametrize("device", [True, False], ids=["device", "host-only"])
def test_trace_bytes_equal_the_masked_encoder(capture: Path, tmp_path: Path, device: bool,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    if not device:
        host = tmp_path / "host"
        host.mkdir()
        for f in capture.iterdir():
            if f.is_file():
                (host / f.name).write_bytes(f.read_bytes())
        capture = host
    model = trace_model.build(merge.load(capture))
    kinds = set(model.api["kind"].cast(str).unique())
    assert kinds == {"launch", "alloc", "free", "sync", "memcpy", "tensor_alloc", "tensor_free", "comm", "collective"}
    assert model.api["coll_out"].drop_nulls().len() > 0 and model.kernels.height > 0 and model.memory.height > 0
    new = io.BytesIO()
    n = perfetto.write(model, new, chunk_rows=997)  # many windows, groups of every size
    with monkeypatch.context() as m:
        m.setattr(perfetto, "pw", protowire_masked)
        old = io.BytesIO()
        assert perfetto.write(model, old, chunk_rows=997) == n
    assert n > SPEC.launches
    assert new.getvalue() == old.getvalue()


def test_rows_of_every_length_match_the_scalar_encoder() -> None:
    rng = np.random.default_rng(3)
    n = 2_000
    sizes = rng.choice(np.array([0, 1, 127, 128, 2**14, 2**21, 2**35, 2**63, 2**64 - 1], dtype=np.uint64), n)
    small = rng.integers(0, 300, n).astype(np.uint64)
    has_size, has_small, has_flow = rng.random(n) < 0.7, rng.random(n) < 0.5, rng.random(n) < 0.3
    every = np.ones(n, dtype=bool)
    body = [pw.varint_field(1, small, every), pw.small_message(4, b"\x08\x05\x18", sizes, has_size),
            pw.fixed64_field(47, sizes, has_flow), pw.const(b"\x50\x01", has_small),
            pw.varint_field(30, small, has_small)]
    segs = [pw.varint_field(8, sizes, every), *pw.message_field(11, body, every)]
    got, lens = pw.assemble(segs)
    want = []
    for i in range(n):
        b = pw.field_varint(1, int(small[i]))
        if has_size[i]:
            b += pw.field_bytes(4, b"\x08\x05\x18" + pw.varint(int(sizes[i])))
        if has_flow[i]:
            b += pw.tag(47, pw.I64) + int(sizes[i]).to_bytes(8, "little")
        if has_small[i]:
            b += b"\x50\x01" + pw.field_varint(30, int(small[i]))
        want.append(pw.field_varint(8, int(sizes[i])) + pw.field_bytes(11, b))
    assert lens.tolist() == [len(w) for w in want]
    assert got.tobytes() == b"".join(want)
