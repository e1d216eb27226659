"""A small device file holding every record type, with the frames a correct reader must return.

The expected frames are built from the values handed to the writer, not by the
reader, so a test comparing the two checks both directions of the format.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import polars as pl

from pasta_trace import schema
from pasta_trace.device import writer as W
from pasta_trace.schema import DeviceRecordType as RT

PID = 4242


def random_fields(rng: np.random.Generator, record: schema.Record) -> dict[str, int]:
    out = {}
    for f in record.fields:
        if f.name == "pad":
            continue
        info = np.iinfo(np.dtype(f.np_type()))
        out[f.name] = int(rng.integers(max(info.min, -(2**62)), min(info.max, 2**62), dtype=np.int64))
    return out


def random_entries(rng: np.random.Generator, record: schema.Record, n: int) -> np.ndarray:
    out = np.zeros(n, dtype=record.dtype)
    for f in record.fields:
        if f.name != "pad":
            info = np.iinfo(np.dtype(f.np_type()))
            out[f.name] = rng.integers(0, min(info.max, 2**62), size=n, dtype=np.int64)
    return out


@dataclass
class Sample:
    path: Path
    #: frame name -> expected frame
    expected: dict[str, pl.DataFrame]
    #: byte offset where each record starts, plus the file size at the end
    boundaries: list[int] = field(default_factory=list)


class _Rows:
    """Expected rows per frame, in file order."""

    def __init__(self) -> None:
        self.rows: dict[str, list[dict]] = {k: [] for k in schema.DEVICE_FRAMES}

    def add(self, frame: str, **values) -> None:
        self.rows[frame].append(values)

    def frames(self) -> dict[str, pl.DataFrame]:
        out = {}
        for k, sch in schema.DEVICE_FRAMES.items():
            out[k] = pl.DataFrame(
                {c: [r[c] for r in self.rows[k]] for c in sch}, schema=sch
            )
        return out


def write_sample(path: Path, seed: int = 7, per_type: int = 2) -> Sample:
    """Strings first (so names resolve for every later record), then ``per_type``
    records of each other type, interleaved."""
    rng = np.random.default_rng(seed)
    rows = _Rows()
    bounds: list[int] = []
    names = {1: "vecadd(float const*, float const*, float*, int)", 2: "LDG.E.128", 3: "STG.E", 4: "ünïcode_kernel"}
    with W.DeviceFileWriter(path, pid=PID, backend=schema.DeviceBackend.synthetic) as w:
        def mark() -> None:
            w.flush()
            bounds.append(path.stat().st_size)

        for sid, text in names.items():
            mark()
            w.string(sid, text)
        for i in range(per_type):
            lid = 100 + i
            for rt, frame in [
                (RT.CLOCK_SYNC, "clock_sync"),
                (RT.LAUNCH, "launches"),
                (RT.KERNEL_SUMMARY, "kernel_summaries"),
                (RT.ALLOC, "allocs"),
                (RT.FREE, "frees"),
                (RT.DROPPED, "dropped"),
                (RT.CUPTI_KERNEL, "cupti_kernels"),
                (RT.CUPTI_MEMCPY, "cupti_memcpy"),
                (RT.CUPTI_MEMSET, "cupti_memset"),
                (RT.TOOL_STATUS, "tool_status"),
            ]:
                vals = random_fields(rng, schema.DEVICE_PAYLOADS[rt])
                if "name_id" in vals:
                    vals["name_id"] = [1, 4, 99][i % 3]  # 99 is never defined -> null name
                mark()
                w.record(rt, launch_id=lid, **vals)
                extra = {"name": names.get(vals["name_id"])} if "name_id" in vals else {}
                rows.add(frame, pid=PID, launch_id=lid, **vals, **extra)

            n = 3 + i
            pages = rng.integers(0, 2**40, size=n)
            counts = rng.integers(1, 2**40, size=n)
            mark()
            w.page_hist(lid, pages, counts, page_shift=12 + i)
            for p, c in zip(pages.tolist(), counts.tolist()):
                rows.add("page_hist", pid=PID, launch_id=lid, page_shift=12 + i, page=p, count=c)

            touch = random_entries(rng, schema.DEV_ALLOC_TOUCH_ENTRY, n)
            mark()
            w.alloc_touch(lid, touch)
            for r in touch:
                rows.add("alloc_touch", pid=PID, launch_id=lid, **{k: int(r[k]) for k in touch.dtype.names})

            ops = np.array([2, 3, 77][: 2 + (i % 2)], dtype=np.uint32)
            opc = rng.integers(1, 2**50, size=len(ops))
            mark()
            w.opcode_hist(lid, ops, opc)
            for o, c in zip(ops.tolist(), opc.tolist()):
                rows.add("opcode_hist", pid=PID, launch_id=lid, opcode_id=o, count=c, opcode=names.get(o))

            smp = random_entries(rng, schema.DEV_ACCESS_SAMPLE, 5 + i)
            mark()
            w.access_samples(lid, smp, sample_every=32, dropped=i)
            for r in smp:
                rows.add("access_samples", pid=PID, launch_id=lid, **{k: int(r[k]) for k in smp.dtype.names})

            nbits = 64 * i + 5
            words = rng.integers(0, 2**63, size=-(-nbits // 64), dtype=np.int64).astype(np.uint64)
            base = int(rng.integers(0, 2**47))
            mark()
            w.ws_bitmap(lid, base, nbits, words)
            rows.add(
                "ws_bitmaps", pid=PID, launch_id=lid, alloc_base=base, page_shift=16, nbits=nbits,
                encoding=0, bits=words.astype("<u8").tobytes(),
            )
        mark()
    expected = rows.frames()
    return Sample(path=path, expected=expected, boundaries=bounds)


# --------------------------------------------------------------------------- tests

import struct  # noqa: E402

import pytest  # noqa: E402

from pasta_trace.device import FILES_SCHEMA, read_device_file, read_device_files  # noqa: E402
from pasta_trace.errors import FormatError  # noqa: E402


def assert_frames_equal(got: dict[str, pl.DataFrame], expected: dict[str, pl.DataFrame]) -> None:
    assert set(got) == set(schema.DEVICE_FRAMES)
    for k, e in expected.items():
        assert got[k].schema == pl.Schema(schema.DEVICE_FRAMES[k]), k
        assert got[k].equals(e), f"{k}:\n{got[k]}\n!=\n{e}"


def test_every_record_type_round_trips(tmp_path):
    s = write_sample(tmp_path / "gpu_probes.4242.synthetic.bin", per_type=3)
    d = read_device_file(s.path)
    assert d.problems == []
    assert_frames_equal(d.frames, s.expected)
    assert {k: len(v) for k, v in d.frames.items()} == {
        "clock_sync": 3, "launches": 3, "kernel_summaries": 3, "page_hist": 3 + 4 + 5, "alloc_touch": 12,
        "ws_bitmaps": 3, "allocs": 3, "frees": 3, "opcode_hist": 2 + 3 + 2, "access_samples": 5 + 6 + 7,
        "dropped": 3, "cupti_kernels": 3, "cupti_memcpy": 3, "cupti_memset": 3, "tool_status": 3,
    }
    # names resolved through STRING records; an id never defined stays null
    assert d.frames["launches"]["name"].to_list() == [
        "vecadd(float const*, float const*, float*, int)", "ünïcode_kernel", None,
    ]
    assert d.frames["opcode_hist"]["opcode"].to_list() == ["LDG.E.128", "STG.E", "LDG.E.128", "STG.E", None, "LDG.E.128", "STG.E"]


def test_file_header_is_reported(tmp_path):
    s = write_sample(tmp_path / "a.bin", per_type=1)
    f = read_device_file(s.path).files
    assert f.schema == pl.Schema(FILES_SCHEMA)
    row = f.row(0, named=True)
    assert (row["path"], row["pid"], row["backend"], row["ver_major"], row["ver_minor"], row["header_size"], row["page_shift"]) == (
        str(s.path), PID, int(schema.DeviceBackend.synthetic), *schema.DEVICE_FORMAT_VERSION, 64, 16,
    )
    assert row["mono_open"] <= row["mono_after"]


def test_several_files_concatenate_in_order(tmp_path):
    a = write_sample(tmp_path / "a.bin", seed=1, per_type=1)
    b = write_sample(tmp_path / "b.bin", seed=2, per_type=2)
    d = read_device_files([a.path, b.path])
    assert d.problems == []
    assert_frames_equal(d.frames, {k: pl.concat([a.expected[k], b.expected[k]]) for k in a.expected})
    assert d.files["path"].to_list() == [str(a.path), str(b.path)]


def test_no_files_gives_every_frame_empty_with_its_schema():
    d = read_device_files([])
    assert d.problems == []
    for k, sch in schema.DEVICE_FRAMES.items():
        assert d.frames[k].schema == pl.Schema(sch) and d.frames[k].height == 0


def _header(**over) -> bytes:
    h = W.pack(schema.DEV_FILE_HEADER, magic=schema.DEVICE_MAGIC, ver_major=1, ver_minor=0, header_size=64, pid=PID, backend=99)
    for k, v in over.items():
        h[k] = v
    return h.tobytes()


def test_not_a_device_file(tmp_path):
    p = tmp_path / "x.bin"
    p.write_bytes(b"PAR1" + bytes(100))
    with pytest.raises(FormatError) as e:
        read_device_file(p)
    assert str(e.value) == f"{p}: not a pasta-trace device file"
    d = read_device_files([p])
    assert d.problems == [f"{p}: not a pasta-trace device file"]
    assert all(f.height == 0 for f in d.frames.values())


def test_newer_major_is_refused_with_a_clear_message(tmp_path):
    p = tmp_path / "new.bin"
    p.write_bytes(_header(ver_major=2, ver_minor=3))
    with pytest.raises(FormatError) as e:
        read_device_file(p)
    assert e.value.one_line() == (
        f"{p}: device format 2.3 is newer than this pasta-trace supports (1.x) (upgrade pasta-trace)"
    )


def test_newer_minor_with_longer_header_is_read(tmp_path):
    body = W.encode(RT.STRING, W.pack(schema.DEV_STRING_HEADER, id=1, len=1), b"k") + W.encode(
        RT.LAUNCH, W.pack(schema.DEV_LAUNCH, grid_x=7, name_id=1), launch_id=5
    )
    p = tmp_path / "minor.bin"
    p.write_bytes(_header(ver_minor=9, header_size=96) + bytes(range(32)) + body)
    d = read_device_file(p)
    assert d.problems == []
    assert d.frames["launches"].select("launch_id", "grid_x", "name").rows() == [(5, 7, "k")]


@pytest.mark.parametrize(
    "size, header_size, message",
    [(10, 64, "truncated device file header (10 of 64 bytes)"), (64, 40, "damaged device file header (header_size 40)"),
     (64, 128, "damaged device file header (header_size 128)"), (64, 68, "damaged device file header (header_size 68)")],
)
def test_damaged_file_header(tmp_path, size, header_size, message):
    p = tmp_path / "h.bin"
    p.write_bytes(_header(header_size=header_size)[:size])
    with pytest.raises(FormatError) as e:
        read_device_file(p)
    assert str(e.value) == f"{p}: {message}"


def test_header_only_file_has_no_records_and_no_problems(tmp_path):
    p = tmp_path / "empty.bin"
    p.write_bytes(_header())
    d = read_device_file(p)
    assert d.problems == [] and all(f.height == 0 for f in d.frames.values())


@pytest.mark.parametrize(
    "bad, reason",
    [
        (struct.pack("<HHIQ", 2, 0, 0, 0), "bad record length 0 (must be >= 16 and a multiple of 8)"),
        (struct.pack("<HHIQ", 2, 0, 8, 0), "bad record length 8 (must be >= 16 and a multiple of 8)"),
        (struct.pack("<HHIQ", 2, 0, 20, 0) + bytes(8), "bad record length 20 (must be >= 16 and a multiple of 8)"),
        (struct.pack("<HHIQ", 2, 0, 4096, 0) + bytes(64), "record of 4096 bytes runs past the end of the file (224 bytes left)"),
        (struct.pack("<HHIQ", 2, 0, 24, 0) + bytes(8), f"LAUNCH record is too short for its {schema.DEV_LAUNCH.size}-byte payload (24 bytes)"),
        (W.encode(RT.PAGE_HIST, W.pack(schema.DEV_PAGE_HIST_HEADER, page_shift=16, n=3), bytes(32)),
         "PAGE_HIST record is too short for the entries it declares (56 bytes)"),
        (W.encode(RT.STRING, W.pack(schema.DEV_STRING_HEADER, id=3, len=100), b"abc"),
         "STRING record is too short for the entries it declares (32 bytes)"),
    ],
)
def test_damage_stops_reading_and_keeps_what_came_before(tmp_path, bad, reason):
    good = W.encode(RT.KERNEL_SUMMARY, W.pack(schema.DEV_KERNEL_SUMMARY, gld=11, gst=12), launch_id=1)
    after = W.encode(RT.KERNEL_SUMMARY, W.pack(schema.DEV_KERNEL_SUMMARY, gld=21, gst=22), launch_id=2)
    p = tmp_path / "d.bin"
    data = _header() + good + good + bad + after
    p.write_bytes(data)
    d = read_device_file(p)
    assert d.frames["kernel_summaries"].select("launch_id", "gld", "gst").rows() == [(1, 11, 12), (1, 11, 12)]
    assert d.problems == [f"{p}: stopped at byte {64 + 2 * len(good)} of {len(data)}: {reason}"]


def test_truncated_record_header_at_the_end(tmp_path):
    good = W.encode(RT.DROPPED, W.pack(schema.DEV_DROPPED, records=1, accesses=2, page_overflow=3), launch_id=4)
    p = tmp_path / "t.bin"
    p.write_bytes(_header() + good + good[:9])
    d = read_device_file(p)
    assert d.frames["dropped"].select("launch_id", "records", "accesses", "page_overflow").rows() == [(4, 1, 2, 3)]
    assert d.problems == [f"{p}: stopped at byte {64 + len(good)} of {64 + len(good) + 9}: truncated record header (9 bytes left)"]


def test_unknown_types_are_skipped_by_length(tmp_path):
    s = write_sample(tmp_path / "ref.bin", per_type=1)
    data = s.path.read_bytes()
    rng = np.random.default_rng(3)
    out = bytearray(data[: s.boundaries[0]])
    for a, b in zip(s.boundaries, s.boundaries[1:]):
        t = int(rng.choice([0, 250, 200, 0xFFFF]))
        out += W.encode(t, rng.bytes(int(rng.integers(0, 100))), launch_id=9)
        out += data[a:b]
    p = tmp_path / "unknown.bin"
    p.write_bytes(bytes(out))
    d = read_device_file(p)
    assert_frames_equal(d.frames, s.expected)
    assert len(d.problems) == 1 and d.problems[0].startswith(f"{p}: skipped records of unknown type(s) ")
    assert set(d.problems[0].split("type(s) ")[1].split(", ")) == {"0", "250", "200", "65535"}


def test_ws_bitmap_with_unknown_encoding_is_skipped_and_said(tmp_path):
    head = W.pack(schema.DEV_WS_BITMAP_HEADER, alloc_base=4096, page_shift=16, nbits=64, encoding=7)
    raw = W.pack(schema.DEV_WS_BITMAP_HEADER, alloc_base=8192, page_shift=16, nbits=64, encoding=0)
    p = tmp_path / "ws.bin"
    p.write_bytes(_header() + W.encode(RT.WS_BITMAP, head, bytes(8), launch_id=1)
                  + W.encode(RT.WS_BITMAP, raw, (3).to_bytes(8, "little"), launch_id=2))
    d = read_device_file(p)
    assert d.frames["ws_bitmaps"].select("launch_id", "alloc_base", "bits").rows() == [(2, 8192, (3).to_bytes(8, "little"))]
    assert d.problems == [f"{p}: skipped 1 WS_BITMAP record(s) with unknown encoding(s) [7]"]


def test_open_capture_reads_the_device_directory(tmp_path):
    import json

    from pasta_trace.read import open_capture

    (tmp_path / "device").mkdir()
    s = write_sample(tmp_path / "device" / "gpu_probes.4242.synthetic.bin", per_type=1)
    (tmp_path / "device" / "gpu_probes.5.sanitizer.bin").write_bytes(b"junk")
    (tmp_path / "manifest.json").write_text(json.dumps({"format_version": "1.0", "complete": True}))
    cap = open_capture(tmp_path)
    assert_frames_equal({k: v.collect() for k, v in cap.device.items()}, s.expected)
    assert cap.problems == [f"{tmp_path / 'device' / 'gpu_probes.5.sanitizer.bin'}: not a pasta-trace device file"]


@pytest.mark.parametrize("n_run", [1, 2, 3, 65, 66, 200, 1000])
def test_runs_of_equal_length_records(tmp_path, n_run):
    """Runs are walked with strided views in doubling windows; every run length and what
    breaks it (another length, the end of the file, a record cut short) must come out exact."""
    ks = [W.encode(RT.KERNEL_SUMMARY, W.pack(schema.DEV_KERNEL_SUMMARY, gld=i, gst=2 * i), launch_id=i) for i in range(n_run)]
    other = W.encode(RT.CLOCK_SYNC, W.pack(schema.DEV_CLOCK_SYNC, host_mono_before=5, gpu_globaltimer=6, host_mono_after=7))
    tail = [W.encode(RT.KERNEL_SUMMARY, W.pack(schema.DEV_KERNEL_SUMMARY, gld=10**6 + i), launch_id=10**6 + i) for i in range(n_run)]
    p = tmp_path / "runs.bin"
    data = _header() + b"".join(ks) + other + b"".join(tail)
    cut = len(data) - 8  # the last record loses its last 8 bytes
    p.write_bytes(data[:cut])
    d = read_device_file(p)
    want = [(i, i, 2 * i) for i in range(n_run)] + [(10**6 + i, 10**6 + i, 0) for i in range(n_run - 1)]
    assert d.frames["kernel_summaries"].select("launch_id", "gld", "gst").rows() == want
    assert d.frames["clock_sync"].select("host_mono_before", "gpu_globaltimer", "host_mono_after").rows() == [(5, 6, 7)]
    last = len(data) - len(tail[-1])
    assert d.problems == [
        f"{p}: stopped at byte {last} of {cut}: record of {len(tail[-1])} bytes runs past the end of the file ({cut - last} bytes left)"
    ]


@pytest.mark.parametrize("order, flagged", [([1, 1, 2, 5], True), ([1, 2, 2, 1], False)])
def test_launch_id_is_flagged_sorted_only_when_it_is(tmp_path, order, flagged):
    p = tmp_path / "o.bin"
    with W.DeviceFileWriter(p, pid=1, backend=schema.DeviceBackend.synthetic) as w:
        for i, lid in enumerate(order):
            w.access_samples(lid, W.entries(schema.DEV_ACCESS_SAMPLE, address=np.arange(3) + 10 * i))
    col = read_device_file(p).frames["access_samples"]["launch_id"]
    assert col.to_list() == [lid for lid in order for _ in range(3)]
    assert col.flags["SORTED_ASC"] is flagged
