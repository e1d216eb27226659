"""A staged device file is copied into the capture only where it fits: a
sparse 1 GiB file in the staging directory on a small file system is left
there and said in the manifest's notes, never copied until the disk is
full; the device files that fit are copied whole."""

from __future__ import annotations

import json
import os

import pytest

from pasta_trace import schema
from pasta_trace.capture.output.manifest import FILE_PROBLEMS
from pasta_trace.device import read_device_files
from pasta_trace.device.adopt import KEEP_FREE_BYTES
from pasta_trace.device.inject import DeviceSession
from pasta_trace.device.writer import DeviceFileWriter, device_file_name
from pasta_trace.safe_output import OutputDir


@pytest.fixture
def built(tmp_path):
    libs = tmp_path / "build"
    libs.mkdir()
    (libs / "libgpu_probes_sanitizer.so").write_bytes(b"\x7fELF")
    m = libs / "manifest.json"
    m.write_text(json.dumps({"format_version": 1,
                             "artifacts": {"sanitizer": str(libs / "libgpu_probes_sanitizer.so")}}))
    return m


def test_a_sparse_gigabyte_on_a_small_file_system_is_left_and_said(small_fs, built):
    FILE_PROBLEMS.take()  # this process's earlier notes are not this capture's
    cap = small_fs / "cap"
    s = DeviceSession("sanitizer", OutputDir.claim(cap, force=False), manifest=built)
    with DeviceFileWriter(s.staging / device_file_name(300, "sanitizer"), pid=300,
                          backend=schema.DeviceBackend.sanitizer) as w:
        w.string(1, "kernel_of_300")
    big = s.staging / device_file_name(301, "sanitizer")
    with open(big, "wb") as f:
        f.truncate(1 << 30)  # 1 GiB that takes no room
    free = os.statvfs(small_fs).f_bavail * os.statvfs(small_fs).f_frsize
    files = s.finish()
    assert files == [cap / "device" / "gpu_probes.300.sanitizer.bin"]
    assert read_device_files(files).problems == []
    assert sorted(p.name for p in (cap / "device").iterdir()) == ["gpu_probes.300.sanitizer.bin"]
    assert big.stat().st_size == 1 << 30  # the user's, where it was
    notes = FILE_PROBLEMS.take()
    assert len(notes) == 1 and notes[0].startswith(f"{big}: skipped: 1,073,741,824 bytes, more than the capture's "
                                                   "file system has free (")
    assert notes[0].endswith(f" bytes, {KEEP_FREE_BYTES >> 20} MiB of it kept free)")
    st = os.statvfs(small_fs)
    assert st.f_bavail * st.f_frsize >= free - (64 << 10)  # nothing but the small file was written
