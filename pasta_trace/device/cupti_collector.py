"""CUPTI activity collector for Python workloads, through cupti-python.

Records kernel (concurrent kernel), memcpy, memset and memory (MEMORY2:
alloc/free) activity.  CUPTI stamps every record through a timestamp callback
that returns ``time.monotonic_ns()``, so start/end are CLOCK_MONOTONIC, the
clock of the eBPF host events.  Completed buffers become TLV records
(CUPTI_KERNEL, CUPTI_MEMCPY, CUPTI_MEMSET, ALLOC, FREE, STRING) in
``$GPU_PROBES_DIR/gpu_probes.<pid>.cupti.bin``, flushed at exit.

When CUPTI cannot run (no driver, driver too old, cupti-python missing) the
collector prints one line, ``CUPTI unavailable: <reason>``, on stderr, writes
no file, and the traced program goes on untouched.

A launched Python program runs this through ``cupti_bootstrap/sitecustomize.py``
(put on PYTHONPATH by :class:`pasta_trace.device.inject.DeviceSession`).
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterable

from ..schema import DeviceBackend
from ..schema import DeviceRecordType as RT
from .writer import DeviceFileWriter, device_file_name

#: CUPTI hands us buffers of this size; 8 MiB is what NVIDIA's samples use
BUFFER_SIZE = 8 << 20

UNAVAILABLE = "CUPTI unavailable"


class CuptiUnavailable(Exception):
    """CUPTI cannot trace this process; the message is the reason."""


def _memory_kind(cupti: Any, act: Any) -> int:
    """schema.DEV_ALLOC.kind: 0 device, 1 managed, 2 host pinned, 3 async/pool."""
    if act.is_async:
        return 3
    mk = cupti.ActivityMemoryKind
    return {int(mk.MANAGED): 1, int(mk.MANAGED_STATIC): 1, int(mk.PINNED): 2}.get(int(act.memory_kind), 0)


class ActivityEncoder:
    """Turns cupti-python activity objects into device records.  Kernel names
    are interned: each distinct name is written once as a STRING."""

    def __init__(self, cupti: Any, writer: DeviceFileWriter) -> None:
        self.cupti = cupti
        self.writer = writer
        self._names: dict[str, int] = {}
        k = cupti.ActivityKind
        self._kernel = {int(k.CONCURRENT_KERNEL), int(k.KERNEL)}
        self._memcpy, self._memset, self._memory = int(k.MEMCPY), int(k.MEMSET), int(k.MEMORY2)
        self._alloc = int(cupti.ActivityMemoryOperationType.ALLOCATION)
        self._release = int(cupti.ActivityMemoryOperationType.RELEASE)

    def _name_id(self, name: str) -> int:
        sid = self._names.get(name)
        if sid is None:
            sid = self._names[name] = len(self._names) + 1
            self.writer.string(sid, name)
        return sid

    def write(self, activities: Iterable[Any]) -> None:
        w = self.writer
        for a in activities:
            kind = int(a.kind)
            if kind in self._kernel:
                w.record(
                    RT.CUPTI_KERNEL, start=a.start, end=a.end, grid_id=a.grid_id, stream_id=a.stream_id,
                    correlation_id=a.correlation_id, device=a.device_id, name_id=self._name_id(a.name),
                    grid_x=a.grid_x, grid_y=a.grid_y, grid_z=a.grid_z,
                    block_x=a.block_x, block_y=a.block_y, block_z=a.block_z,
                    graph_node_id=a.graph_node_id, graph_id=a.graph_id,
                )
            elif kind == self._memcpy:
                w.record(
                    RT.CUPTI_MEMCPY, start=a.start, end=a.end, bytes=a.bytes, stream_id=a.stream_id,
                    correlation_id=a.correlation_id, device=a.device_id, copy_kind=a.copy_kind,
                )
            elif kind == self._memset:
                w.record(
                    RT.CUPTI_MEMSET, start=a.start, end=a.end, bytes=a.bytes, stream_id=a.stream_id,
                    correlation_id=a.correlation_id, device=a.device_id, copy_kind=a.value,
                )
            elif kind == self._memory:
                op = int(a.memory_operation_type)
                if op in (self._alloc, self._release):
                    w.record(
                        RT.ALLOC if op == self._alloc else RT.FREE, host_mono=a.timestamp, address=a.address,
                        size=a.bytes, ctx=a.context_id, stream=a.stream_id, kind=_memory_kind(self.cupti, a),
                    )


class CuptiCollector:
    """CUPTI activity tracing of this process into one device file."""

    def __init__(self, out_dir: str | os.PathLike, pid: int | None = None) -> None:
        self.pid = os.getpid() if pid is None else pid
        self.path = Path(out_dir) / device_file_name(self.pid, DeviceBackend.cupti)
        self._lock = threading.Lock()
        self._encoder: ActivityEncoder | None = None
        self._kinds: list[Any] = []
        self._cupti: Any = None

    def start(self) -> None:
        """Raises CuptiUnavailable (with the reason) and leaves no file behind."""
        try:
            from cupti import cupti
        except ImportError as e:
            raise CuptiUnavailable(f"cupti-python is not installed for {sys.executable} ({e})") from None
        writer = DeviceFileWriter(self.path, pid=self.pid, backend=DeviceBackend.cupti)
        self._encoder = ActivityEncoder(cupti, writer)
        k = cupti.ActivityKind
        try:
            # the timestamp callback first: CUPTI must never stamp a record in its own clock
            cupti.activity_register_timestamp_callback(time.monotonic_ns)
            cupti.activity_register_callbacks(self._buffer_requested, self._buffer_completed)
            for kind in (k.CONCURRENT_KERNEL, k.MEMCPY, k.MEMSET, k.MEMORY2):
                cupti.activity_enable(kind)
                self._kinds.append(kind)
        except Exception as e:  # cupti raises NotSupportedError (a RuntimeError) or cuptiError
            self._encoder = None
            writer.discard()
            raise CuptiUnavailable(str(e) or type(e).__name__) from None
        self._cupti = cupti

    @staticmethod
    def _buffer_requested() -> tuple[int, int]:
        return BUFFER_SIZE, 0  # 0: as many records as fit

    def _buffer_completed(self, activities: list) -> None:
        with self._lock:
            if self._encoder is not None:
                self._encoder.write(activities)
                self._encoder.writer.flush()

    def stop(self) -> None:
        """Flush CUPTI's buffers into the file and close it.  Safe to call twice."""
        if self._encoder is None:
            return
        cupti = self._cupti
        try:
            cupti.activity_flush_all(int(cupti.ActivityFlag.FLUSH_FORCED))
            for kind in self._kinds:
                cupti.activity_disable(kind)
        finally:
            with self._lock:
                self._encoder.writer.close()
                self._encoder = None


def start_from_env(environ: dict[str, str] | None = None) -> CuptiCollector | None:
    """Start collecting into ``$GPU_PROBES_DIR`` and stop at exit; on failure say
    why in one stderr line and return None.  Never raises: the traced program
    must go on whatever happens here."""
    env = os.environ if environ is None else environ
    out = env.get("GPU_PROBES_DIR")
    if not out:
        print(f"{UNAVAILABLE}: GPU_PROBES_DIR is not set", file=sys.stderr)
        return None
    c = CuptiCollector(out)
    try:
        c.start()
    except (CuptiUnavailable, OSError) as e:
        print(f"{UNAVAILABLE}: {e}", file=sys.stderr)
        return None
    atexit.register(c.stop)
    return c
