"""NCCL events: the named columns read from their payload slots
(schema.NCCL_SLOTS), the per-communicator sequence number carried across
batches, and the communicators table."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from pasta_trace import schema
from pasta_trace.capture.output.collectives import CommunicatorTable, Sequencer
from pasta_trace.capture.output.decode import events_frame
from pasta_trace.capture.output.writer import CaptureWriter
from pasta_trace.probes.catalog import API_ID, APIS
from pasta_trace.read import open_capture
from pasta_trace.safe_output import OutputDir

NAMES = [a.symbol for a in APIS]
K = schema.Kind


def bits(*names: str) -> int:
    return sum(1 << schema.PAYLOAD_BITS[n] for n in names)


def ev(api: str, ts: int, *, pid: int = 7, ret: int = 0, **named) -> np.ndarray:
    """One record of `api`, its named NCCL columns written into their slots as the probe does."""
    rec = np.zeros(1, schema.HOST_EVENT.dtype)
    kind = next(a.kind for a in APIS if a.symbol == api)
    rec["api"], rec["kind"], rec["ts_ns"], rec["pid"], rec["tid"] = API_ID[api], int(kind), ts, pid, pid
    rec["ret"], rec["dur_ns"] = ret, 10
    rec["flags"] = schema.FLAG_HAS_RET | schema.FLAG_HAS_DUR
    valid = 0
    for name, value in named.items():
        if name in ("stream", "size"):
            rec[name] = value
            valid |= bits(name)
            continue
        slot = schema.NCCL_SLOTS[name]
        rec[slot] = np.array(value).astype(rec.dtype[slot])  # ints wrap as the C stores do
        valid |= bits(name)
    rec["valid"] = valid
    return rec


def coll(api: str, ts: int, comm: int, *, ret: int = 0, pid: int = 7, count: int = 1024, dt: int = 7) -> np.ndarray:
    return ev(api, ts, pid=pid, ret=ret, communicator=comm, count=count, datatype=dt, op=0, stream=0x55,
              size=count * schema.NCCL_DATATYPES[dt][1])


def init(ts: int, comm: int, *, pid: int = 7, rank: int = 0, nranks: int = 2, comm_id: int = 0xC0FFEE) -> np.ndarray:
    return ev("ncclCommInitRank", ts, pid=pid, communicator=comm, rank=rank, nranks=nranks, comm_id=comm_id)


def test_named_columns_come_from_their_slots_and_generic_ones_stay_null() -> None:
    recs = np.concatenate([
        ev("ncclReduce", 1, communicator=0xAB, count=1000, datatype=9, op=2, root=-1, stream=0x9, size=2000),
        ev("ncclSend", 2, communicator=0xAB, count=8, datatype=4, peer=3, stream=0x9, size=64),
        ev("ncclCommInitRank", 3, communicator=0xCD, rank=1, nranks=4, comm_id=0xFFFF_FFFF_FFFF_FFFE),
        ev("ncclAllReduce", 4, communicator=0xAB, count=1, datatype=200, op=77, stream=0),
    ])
    df = events_frame(recs, NAMES)
    assert df.schema == schema.empty_frame(schema.EVENTS_SCHEMA).schema
    cols = ["api", "kind", "layer", "communicator", "count", "datatype", "op", "root", "peer", "size", "stream",
            "rank", "nranks", "comm_id"]
    assert df.select(pl.col(c).cast(pl.String) if c in ("api", "kind", "layer", "datatype", "op") else pl.col(c)
                     for c in cols).rows() == [
        ("ncclReduce", "collective", "nccl", 0xAB, 1000, "bfloat16", "max", -1, None, 2000, 0x9, None, None, None),
        ("ncclSend", "p2p", "nccl", 0xAB, 8, "int64", None, None, 3, 64, 0x9, None, None, None),
        ("ncclCommInitRank", "comm", "nccl", 0xCD, None, None, None, None, None, None, None, 1, 4,
         0xFFFF_FFFF_FFFF_FFFE),
        # a datatype or op this reader does not know
        ("ncclAllReduce", "collective", "nccl", 0xAB, 1, "unknown", "premulsum", None, None, None, 0, None, None,
         None),
    ]
    generic = ["ptr", "dst", "src", "grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z", "func"]
    assert df.select(generic).null_count().row(0) == (4,) * len(generic)


def test_comm_id_is_fnv1a_over_the_unique_id_words() -> None:
    uid = bytes(range(128))
    h = 0xCBF29CE484222325
    for i in range(16):
        h = ((h ^ int.from_bytes(uid[8 * i:8 * i + 8], "little")) * 0x100000001B3) % 2**64
    assert schema.nccl_comm_id(uid) == h
    assert schema.nccl_comm_id(bytes(128)) != schema.nccl_comm_id(b"\1" + bytes(127))
    with pytest.raises(ValueError, match="an ncclUniqueId has 128 bytes, not 3"):
        schema.nccl_comm_id(b"abc")


def seqs(frame: pl.DataFrame) -> list[tuple]:
    return frame.select("ts_ns", "communicator", "seq").rows()


def test_seq_counts_successful_collectives_per_communicator_across_batches() -> None:
    s = Sequencer()
    first = events_frame(np.concatenate([
        init(1, 0xA), init(2, 0xB),
        coll("ncclAllReduce", 4, 0xA), coll("ncclAllReduce", 3, 0xB),  # ring order is not call order
        coll("ncclBroadcast", 5, 0xA, ret=4),  # failed: no number
        ev("ncclGroupStart", 6), ev("ncclSend", 7, communicator=0xA, count=1, datatype=0),  # p2p: no number
        coll("ncclAllGather", 8, 0xA),
    ]), NAMES, s)
    assert seqs(first) == [(1, 0xA, None), (2, 0xB, None), (4, 0xA, 0), (3, 0xB, 0), (5, 0xA, None),
                           (6, None, None), (7, 0xA, None), (8, 0xA, 1)]
    second = events_frame(np.concatenate([coll("ncclAllReduce", 9, 0xA), coll("ncclAllReduce", 10, 0xB)]), NAMES, s)
    assert seqs(second) == [(9, 0xA, 2), (10, 0xB, 1)]


def test_seq_starts_again_for_a_communicator_made_at_a_freed_handle_and_per_process() -> None:
    s = Sequencer()
    events_frame(np.concatenate([init(1, 0xA), coll("ncclAllReduce", 2, 0xA), coll("ncclAllReduce", 3, 0xA)]),
                 NAMES, s)
    df = events_frame(np.concatenate([
        coll("ncclAllReduce", 4, 0xA), ev("ncclCommDestroy", 5, communicator=0xA), init(6, 0xA),
        coll("ncclAllReduce", 7, 0xA), coll("ncclAllReduce", 8, 0xA, pid=8),
    ]), NAMES, s)
    assert df.select("ts_ns", "pid", "seq").rows() == [(4, 7, 2), (5, 7, None), (6, 7, None), (7, 7, 0), (8, 8, 0)]
    assert seqs(events_frame(coll("ncclAllReduce", 9, 0xA), NAMES, s)) == [(9, 0xA, 1)]


def test_communicators_table_rows_and_ends() -> None:
    t = CommunicatorTable("node7")
    assert not t.add(events_frame(coll("ncclAllReduce", 1, 0xA), NAMES))
    assert t.add(events_frame(np.concatenate([
        init(2, 0xA, rank=1, nranks=4, comm_id=5),
        ev("ncclCommInitRank", 3, ret=1, communicator=0xF, rank=0, nranks=4, comm_id=6),  # failed: no communicator
        ev("ncclCommSplit", 4, communicator=0xB, comm_id=9),
    ]), NAMES))
    assert t.add(events_frame(np.concatenate([
        ev("ncclCommFinalize", 5, communicator=0xA), ev("ncclCommDestroy", 6, communicator=0xA),
        ev("ncclCommAbort", 7, ret=5, communicator=0xB),  # failed: still there
    ]), NAMES))
    assert t.rows.schema == schema.empty_frame(schema.COMMUNICATORS_SCHEMA).schema
    assert t.rows.rows() == [
        ("node7", 7, 0xA, 5, 1, 4, "ncclCommInitRank", 2, 6),
        ("node7", 7, 0xB, 9, None, None, "ncclCommSplit", 4, None),
    ]


def test_the_events_writer_numbers_collectives_across_its_files_and_writes_the_communicators(tmp_path) -> None:
    """The events writer process keeps one Sequencer and one CommunicatorTable for the capture: `seq` goes on
    from one events file to the next, and communicators.parquet has the row made in the first file, ended in the
    second."""
    w = CaptureWriter(OutputDir.claim(tmp_path, force=False), NAMES)
    w.add_events(np.concatenate([init(1, 0xA, rank=1, nranks=2, comm_id=5), coll("ncclAllReduce", 2, 0xA)]))
    w.flush()
    w.add_events(np.concatenate([coll("ncclAllReduce", 3, 0xA), ev("ncclCommDestroy", 4, communicator=0xA)]))
    w.close()
    assert sorted(p.name for p in tmp_path.glob("events*.parquet")) == ["events-00000.parquet", "events-00001.parquet"]
    cap = open_capture(tmp_path)
    assert cap.events.filter(pl.col("kind") == "collective").sort("ts_ns").select("ts_ns", "seq").collect().rows() \
        == [(2, 0), (3, 1)]
    assert cap.communicators.drop("host").collect().rows() == [(7, 0xA, 5, 1, 2, "ncclCommInitRank", 1, 4)]


def test_a_batch_decodes_as_its_records_do_one_at_a_time() -> None:
    """The decoder leaves out of its work the fields no record of a batch set
    (a launch flood's ptr, dst, NCCL slots...): every kind decoded in one mixed
    batch equals the same records decoded alone, where those paths are taken."""
    def rec(api: str, ts: int, valid: tuple[str, ...] = (), flags: int = 0, **fields) -> np.ndarray:
        r = np.zeros(1, schema.HOST_EVENT.dtype)
        kind = fields.pop("kind", next(a.kind for a in APIS if a.symbol == api))
        r["api"], r["kind"], r["ts_ns"], r["pid"], r["tid"], r["comm"] = API_ID[api], int(kind), ts, 7, 8, b"x"
        for k, v in fields.items():
            r[k] = v
        r["valid"], r["flags"] = bits(*valid), flags
        return r

    ret = schema.FLAG_HAS_RET | schema.FLAG_HAS_DUR
    TENSOR_REPORT = next(a.symbol for a in APIS if a.api_name == "c10::reportMemoryUsageToProfiler")
    recs = [
        rec("cuLaunchKernel", 1, ("func", "grid", "block", "shmem", "stream"), ret, func=0xF, grid_x=2, grid_y=1,
            grid_z=1, block_x=64, block_y=1, block_z=1, shmem=16, stream=0x9, dur_ns=5, stack_id=3),
        rec("cudaLaunchKernel", 2, ("func", "grid", "block", "caller", "caller_fp"), func=0x10, grid_x=1, grid_y=1,
            grid_z=1, block_x=32, block_y=1, block_z=1, caller=0x401000, caller_fp=0x402000, outer_ts=1),
        rec("cuMemAlloc_v2", 3, ("ptr", "size", "aux"), ret, ptr=0x7000, size=4096, aux=1, ret=2, dur_ns=9),
        rec("cuMemcpyHtoD_v2", 4, ("dst", "src", "size", "copy_kind"), ret, dst=0x7000, src=0x1000, size=64,
            copy_kind=int(schema.CopyKind.h2d)),
        rec("cuMemsetD8_v2", 5, ("ptr", "size", "aux"), ptr=0x7000, size=8, aux=0xAB),
        rec(TENSOR_REPORT, 6, ("ptr", "size", "dst", "src", "aux"),
            schema.FLAG_AT_EXIT, kind=schema.Kind.tensor_alloc, ptr=0x9000, size=512, dst=512, src=2048,
            aux=1 | 0 << 8),
        coll("ncclAllReduce", 7, 0xAB),
        init(8, 0xCD),
        rec("cuCtxSynchronize", 9, (), ret, dur_ns=100),
    ]
    together = events_frame(recs, NAMES, Sequencer())
    one_by_one = Sequencer()
    alone = pl.concat([events_frame(r, NAMES, one_by_one) for r in recs])
    assert together.schema == alone.schema
    assert together.rows() == alone.rows()
    # and what each kind carries is there (not all null: the test would pass on a decoder that drops all)
    row = {r["api"]: r for r in together.iter_rows(named=True)}
    assert row["cudaLaunchKernel"]["caller"] == 0x401000 and row["cuMemAlloc_v2"]["aux"] == 1
    assert row["cuMemcpyHtoD_v2"]["copy_kind"] == "h2d" and row["cuMemsetD8_v2"]["aux"] == 0xAB
    assert row[TENSOR_REPORT]["device"] == "cuda:0"
    assert row[TENSOR_REPORT]["at_exit"] is True
    assert row["ncclAllReduce"]["datatype"] == "float32" and row["ncclCommInitRank"]["nranks"] == 2
