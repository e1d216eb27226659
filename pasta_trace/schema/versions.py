"""The versions of every format pasta-trace writes, and the device files' magic."""

from __future__ import annotations


#: Version of the capture directory layout (manifest.json + Parquet files).
#: Readers refuse a newer major with a clear message.
#: 1.9: copies and memsets under capture are kind captured (ptr = the address written, dst = the
#: capture id), on streams joined to a capture by an event wait too; event record and stream wait probed
#: 1.10: the manifest's trigger object (a daemon's dump: its trigger and the window it holds)
#: 1.11: the trigger object of an automatic trigger (oom, cuda_error, init_failed, nccl_hang, quiet, killed,
#: exit): fired_ns, after_s and the trigger's own fields (api, error, comm_id, sequence, signal, ...)
#: 1.12: an events file leaves out the columns null in every row of it (a file of launches has no ptr, dst,
#: NCCL or tensor columns); readers insert them as nulls (parquet_scan)
CAPTURE_FORMAT_VERSION = (1, 12)

#: Version of the device record file (TLV) format, written in its file header
#: (1.1: TOOL_STATUS, what the injection library's set-up calls returned;
#: 1.2: CUPTI_KERNEL's graph_node_id and graph_id, read as 0 from a 1.1 record).
DEVICE_FORMAT_VERSION = (1, 2)

#: Version of the merged timeline layout (1.1: cluster timelines, many captures in one;
#: 1.2: kernels' via_graph and graph_exec; 1.3: kernels' ret; 1.4: kernels' graph_id and
#: graph_node_id, read as null from an older timeline).
TIMELINE_FORMAT_VERSION = (1, 4)

DEVICE_MAGIC = 0x42525047  # bytes b"GPRB" little-endian
