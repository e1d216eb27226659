"""The device record file (TLV): its header and every record the device side writes."""

from __future__ import annotations

import enum

from .records import Record, fields


class DeviceRecordType(enum.IntEnum):
    CLOCK_SYNC = 1
    LAUNCH = 2
    KERNEL_SUMMARY = 3
    PAGE_HIST = 4
    ALLOC_TOUCH = 5
    WS_BITMAP = 6
    ALLOC = 7
    FREE = 8
    OPCODE_HIST = 9
    STRING = 10
    DROPPED = 11
    ACCESS_SAMPLES = 12
    CUPTI_KERNEL = 13
    CUPTI_MEMCPY = 14
    CUPTI_MEMSET = 15
    TOOL_STATUS = 16  # format 1.1


class DeviceBackend(enum.IntEnum):
    cupti = 1
    sanitizer = 2
    nvbit = 3
    cupti_sass = 4
    synthetic = 99  # written by tests and benchmarks


class DeviceAllocKind(enum.IntEnum):
    """`kind` of a device ALLOC record (gpu_probes' GP_ALLOC_*)."""

    device = 0
    managed = 1
    host = 2  # pinned or mapped host memory
    async_ = 3  # stream-ordered (cudaMallocAsync, pools)
    virtual = 4  # a virtual-address reservation: no memory of its own



DEV_FILE_HEADER = Record(
    "gp_file_header",
    fields(
        [
            ("magic", "u32", "", "DEVICE_MAGIC"),
            ("ver_major", "u16", "", ""),
            ("ver_minor", "u16", "", ""),
            ("header_size", "u32", "bytes", "readers skip unknown tails"),
            ("flags", "u32", "", ""),
            ("pid", "u64", "", ""),
            ("mono_open", "u64", "ns CLOCK_MONOTONIC", ""),
            ("real_open", "u64", "ns CLOCK_REALTIME", ""),
            ("mono_after", "u64", "ns CLOCK_MONOTONIC", ""),
            ("backend", "u32", "", "DeviceBackend"),
            ("device_count", "u32", "", ""),
            ("page_shift", "u32", "", "page size used by the aggregation"),
            ("reserved", "u32", "", ""),
        ]
    ),
    "device record file header",
)

DEV_RECORD_HEADER = Record(
    "gp_record_header",
    fields(
        [
            ("type", "u16", "", "DeviceRecordType"),
            ("flags", "u16", "", ""),
            ("total_len", "u32", "bytes", "header + payload, padded to 8"),
            ("launch_id", "u64", "", "per-process launch counter; 0 if not per launch"),
        ]
    ),
    "16-byte header in front of every record",
)

DEV_CLOCK_SYNC = Record(
    "gp_clock_sync",
    fields(
        [
            ("host_mono_before", "u64", "ns", ""),
            ("gpu_globaltimer", "u64", "ns", "%globaltimer"),
            ("host_mono_after", "u64", "ns", ""),
            ("device", "u32", "", ""),
            ("pad", "u32", "", ""),
        ]
    ),
)

DEV_LAUNCH = Record(
    "gp_launch",
    fields(
        [
            ("host_mono_begin", "u64", "ns", "API enter"),
            ("host_mono_end", "u64", "ns", "API exit"),
            ("ctx", "u64", "", ""),
            ("stream", "u64", "", ""),
            ("func", "u64", "", "CUfunction"),
            ("grid_id", "i64", "", "Sanitizer gridId / CUPTI grid_id"),
            ("grid_x", "u32", "", ""),
            ("grid_y", "u32", "", ""),
            ("grid_z", "u32", "", ""),
            ("block_x", "u32", "", ""),
            ("block_y", "u32", "", ""),
            ("block_z", "u32", "", ""),
            ("device", "u32", "", ""),
            ("correlation_id", "u32", "", "CUPTI correlation id, 0 if unknown"),
            ("name_id", "u32", "", "-> STRING"),
            ("tid", "u32", "", "host thread that launched"),
        ]
    ),
)

DEV_KERNEL_SUMMARY = Record(
    "gp_kernel_summary",
    fields(
        [
            ("gpu_t_first", "u64", "ns %globaltimer", ""),
            ("gpu_t_last", "u64", "ns %globaltimer", ""),
            ("warp_instrs", "u64", "", "NVBit only"),
            ("thread_instrs", "u64", "", "NVBit only"),
            ("gld", "u64", "", "thread-level global loads"),
            ("gst", "u64", "", "thread-level global stores"),
            ("gatom", "u64", "", "thread-level global atomics"),
            ("gld_warp", "u64", "", "warp-level global loads"),
            ("gst_warp", "u64", "", "warp-level global stores"),
            ("gatom_warp", "u64", "", "warp-level global atomics"),
            ("bytes", "u64", "bytes", "sum of accessSize x active lanes"),
            ("shared", "u64", "", "shared accesses (thread level)"),
            ("local", "u64", "", "local accesses (thread level)"),
            ("blocks_in", "u64", "", ""),
            ("blocks_out", "u64", "", ""),
            ("dropped", "u64", "", "page-hash overflow + raw-sample drops"),
        ]
    ),
)

DEV_PAGE_HIST_HEADER = Record(
    "gp_page_hist_header",
    fields([("page_shift", "u32", "", ""), ("n", "u32", "", "entries that follow")]),
)
DEV_PAGE_HIST_ENTRY = Record(
    "gp_page_hist_entry", fields([("page", "u64", "", "address >> page_shift"), ("count", "u64", "", "")])
)

DEV_ALLOC_TOUCH_HEADER = Record(
    "gp_alloc_touch_header", fields([("n", "u32", "", ""), ("pad", "u32", "", "")])
)
DEV_ALLOC_TOUCH_ENTRY = Record(
    "gp_alloc_touch_entry",
    fields(
        [
            ("alloc_base", "u64", "", ""),
            ("touches", "u64", "", "thread-level accesses"),
            ("bytes", "u64", "bytes", ""),
            ("unique_pages", "u32", "", ""),
            ("pad", "u32", "", ""),
        ]
    ),
)

DEV_WS_BITMAP_HEADER = Record(
    "gp_ws_bitmap_header",
    fields(
        [
            ("alloc_base", "u64", "", ""),
            ("page_shift", "u32", "", ""),
            ("nbits", "u32", "", "pages in the allocation"),
            ("encoding", "u32", "", "0 = raw little-endian u64 words"),
            ("pad", "u32", "", ""),
        ]
    ),
)

DEV_ALLOC = Record(
    "gp_alloc",
    fields(
        [
            ("host_mono", "u64", "ns", ""),
            ("address", "u64", "", ""),
            ("size", "u64", "bytes", ""),
            ("ctx", "u64", "", ""),
            ("stream", "u64", "", ""),
            ("kind", "u32", "", "DeviceAllocKind: 0 device, 1 managed, 2 host pinned, 3 async/pool, 4 virtual"),
            ("pad", "u32", "", ""),
        ]
    ),
    "ALLOC and FREE share this payload",
)

DEV_OPCODE_HIST_HEADER = Record(
    "gp_opcode_hist_header", fields([("n", "u32", "", ""), ("pad", "u32", "", "")])
)
DEV_OPCODE_HIST_ENTRY = Record(
    "gp_opcode_hist_entry",
    fields([("opcode_id", "u32", "", "-> STRING id"), ("pad", "u32", "", ""), ("count", "u64", "", "")]),
)

DEV_STRING_HEADER = Record(
    "gp_string_header", fields([("id", "u32", "", ""), ("len", "u32", "bytes", "utf-8 bytes that follow")])
)

DEV_DROPPED = Record(
    "gp_dropped",
    fields(
        [
            ("records", "u64", "", "records the writer could not queue"),
            ("accesses", "u64", "", "raw access samples dropped on the device"),
            ("page_overflow", "u64", "", "thread-level accesses whose page found no hash slot (histogram + overflow = all global accesses)"),
        ]
    ),
)

DEV_ACCESS_SAMPLES_HEADER = Record(
    "gp_access_samples_header",
    fields(
        [
            ("n", "u32", "", "entries that follow"),
            ("sample_every", "u32", "", "1 in N warp instructions (or CTAs)"),
            ("dropped", "u64", "", "samples lost because the buffer was full"),
        ]
    ),
)
DEV_ACCESS_SAMPLE = Record(
    "gp_access_sample",
    fields(
        [
            ("address", "u64", "", ""),
            ("gpu_time", "u64", "ns %globaltimer", ""),
            ("block", "u32", "", "linear block index"),
            ("warp", "u16", "", "warp in block"),
            ("size", "u8", "bytes", "access size per lane"),
            ("flags", "u8", "", "bit0 write, bit1 atomic, bit2 shared, bit3 local"),
            ("lanes", "u32", "", "active lane mask"),
            ("pad", "u32", "", ""),
        ]
    ),
)

DEV_CUPTI_KERNEL = Record(
    "gp_cupti_kernel",
    fields(
        [
            ("start", "u64", "ns CLOCK_MONOTONIC", "via CUPTI timestamp callback"),
            ("end", "u64", "ns CLOCK_MONOTONIC", ""),
            ("grid_id", "i64", "", ""),
            ("stream_id", "u32", "", ""),
            ("correlation_id", "u32", "", ""),
            ("device", "u32", "", ""),
            ("name_id", "u32", "", "-> STRING"),
            ("grid_x", "u32", "", ""),
            ("grid_y", "u32", "", ""),
            ("grid_z", "u32", "", ""),
            ("block_x", "u32", "", ""),
            ("block_y", "u32", "", ""),
            ("block_z", "u32", "", ""),
            # format 1.2: a 1.1 record ends above (DEVICE_PAYLOAD_MIN_SIZES) and reads these as 0
            ("graph_node_id", "u64", "", "CUPTI's node of the graph that launched it; 0: not a graph's"),
            ("graph_id", "u32", "", "CUPTI's id of that graph; 0: not launched by a graph"),
            ("pad", "u32", "", ""),
        ]
    ),
)

#: The payload size of a record type before fields were appended to it (an
#: older minor version): a record that short reads those fields as 0; anything
#: shorter is damage.
DEVICE_PAYLOAD_MIN_SIZES: dict[DeviceRecordType, int] = {DeviceRecordType.CUPTI_KERNEL: 64}  # 1.1

DEV_CUPTI_MEMOP = Record(
    "gp_cupti_memop",
    fields(
        [
            ("start", "u64", "ns CLOCK_MONOTONIC", ""),
            ("end", "u64", "ns CLOCK_MONOTONIC", ""),
            ("bytes", "u64", "bytes", ""),
            ("stream_id", "u32", "", ""),
            ("correlation_id", "u32", "", ""),
            ("device", "u32", "", ""),
            ("copy_kind", "u32", "", "CUpti_ActivityMemcpyKind, or memset value"),
        ]
    ),
    "CUPTI_MEMCPY and CUPTI_MEMSET share this payload",
)

#: `rc_*` of TOOL_STATUS for a call not made (yet); other values are SanitizerResult codes.
TOOL_STATUS_NOT_CALLED = -1


class ToolStage(enum.IntEnum):
    """When a TOOL_STATUS record was written: the last one of a file is the run's final word."""

    init = 1  # after the subscribe
    module = 2  # after a module was patched (or failed to be)
    final = 3  # at exit, with the device fallback counters read back


class LoadingMode(enum.IntEnum):
    """CUDA_MODULE_LOADING as the process saw it (unset: the driver's default, lazy since CUDA 12.2)."""

    unset = 0
    lazy = 1
    eager = 2
    other = 3


class InjectionMode(enum.IntEnum):
    """How the injection library came in: LD_PRELOAD (its static initializer) or the driver's CUDA_INJECTION64_PATH."""

    preload = 1
    injection = 2


DEV_TOOL_STATUS = Record(
    "gp_tool_status",
    fields(
        [
            ("host_mono", "u64", "ns CLOCK_MONOTONIC", ""),
            ("stage", "u32", "", "ToolStage"),
            ("injection_mode", "u32", "", "InjectionMode"),
            ("loading_mode", "u32", "", "LoadingMode"),
            ("rc_subscribe", "i32", "", "sanitizerSubscribe's SanitizerResult"),
            ("rc_add_patches", "i32", "", "sanitizerAddPatches: the first failure, else 0; -1 not called"),
            ("rc_patch_instructions", "i32", "", "sanitizerPatchInstructions: the first failure, else 0; -1 not called"),
            ("rc_patch_module", "i32", "", "sanitizerPatchModule: the first failure, else 0; -1 not called"),
            ("rc_set_callback_data", "i32", "", "sanitizerSetCallbackData(function): the first failure, else 0"),
            ("rc_set_launch_data", "i32", "", "sanitizerSetLaunchCallbackData: the first failure, else 0"),
            ("rc_loaded_status", "i32", "", "sanitizerGetFunctionLoadedStatus: the first failure, else 0"),
            ("rc_fallback_read", "i32", "", "reading the patches' fallback counters back; -1 never published"),
            ("modules_patched", "u32", "", "modules sanitizerPatchModule instrumented"),
            ("modules_failed", "u32", "", "modules whose patching failed"),
            ("functions_not_loaded", "u32", "", "launches whose function was not fully loaded at LAUNCH_BEGIN"),
            ("launches", "u64", "", "LAUNCH_BEGIN callbacks seen"),
            ("launches_with_data", "u64", "", "launches given their buffer"),
            ("patch_null_calls", "u64", "", "patch calls that got no buffer (device fallback counter)"),
            ("patch_data_calls", "u64", "", "block entries that got their buffer (device fallback counter)"),
        ]
    ),
    "what the Sanitizer injection's set-up calls returned (format 1.1)",
)

#: Fixed payload (or payload header) of each device record type.
DEVICE_PAYLOADS: dict[DeviceRecordType, Record] = {
    DeviceRecordType.CLOCK_SYNC: DEV_CLOCK_SYNC,
    DeviceRecordType.LAUNCH: DEV_LAUNCH,
    DeviceRecordType.KERNEL_SUMMARY: DEV_KERNEL_SUMMARY,
    DeviceRecordType.PAGE_HIST: DEV_PAGE_HIST_HEADER,
    DeviceRecordType.ALLOC_TOUCH: DEV_ALLOC_TOUCH_HEADER,
    DeviceRecordType.WS_BITMAP: DEV_WS_BITMAP_HEADER,
    DeviceRecordType.ALLOC: DEV_ALLOC,
    DeviceRecordType.FREE: DEV_ALLOC,
    DeviceRecordType.OPCODE_HIST: DEV_OPCODE_HIST_HEADER,
    DeviceRecordType.STRING: DEV_STRING_HEADER,
    DeviceRecordType.DROPPED: DEV_DROPPED,
    DeviceRecordType.ACCESS_SAMPLES: DEV_ACCESS_SAMPLES_HEADER,
    DeviceRecordType.CUPTI_KERNEL: DEV_CUPTI_KERNEL,
    DeviceRecordType.CUPTI_MEMCPY: DEV_CUPTI_MEMOP,
    DeviceRecordType.CUPTI_MEMSET: DEV_CUPTI_MEMOP,
    DeviceRecordType.TOOL_STATUS: DEV_TOOL_STATUS,
}

#: Variable-length arrays that follow a payload header: type -> entry record.
DEVICE_ENTRIES: dict[DeviceRecordType, Record] = {
    DeviceRecordType.PAGE_HIST: DEV_PAGE_HIST_ENTRY,
    DeviceRecordType.ALLOC_TOUCH: DEV_ALLOC_TOUCH_ENTRY,
    DeviceRecordType.OPCODE_HIST: DEV_OPCODE_HIST_ENTRY,
    DeviceRecordType.ACCESS_SAMPLES: DEV_ACCESS_SAMPLE,
}

DEVICE_RECORDS = tuple(
    dict.fromkeys(
        [DEV_FILE_HEADER, DEV_RECORD_HEADER, *DEVICE_PAYLOADS.values(), *DEVICE_ENTRIES.values()]
    )
)
