/* Generated from pasta_trace/schema/ by `python -m pasta_trace.schema --write`: do not edit. */
#pragma once
#include <stdint.h>
typedef uint8_t __u8; typedef uint16_t __u16; typedef uint32_t __u32; typedef uint64_t __u64;
typedef int32_t __s32; typedef int64_t __s64;
#define GP_MAGIC 0x42525047u
#define GP_VER_MAJOR 1
#define GP_VER_MINOR 2
#define GP_REC_CLOCK_SYNC 1
#define GP_REC_LAUNCH 2
#define GP_REC_KERNEL_SUMMARY 3
#define GP_REC_PAGE_HIST 4
#define GP_REC_ALLOC_TOUCH 5
#define GP_REC_WS_BITMAP 6
#define GP_REC_ALLOC 7
#define GP_REC_FREE 8
#define GP_REC_OPCODE_HIST 9
#define GP_REC_STRING 10
#define GP_REC_DROPPED 11
#define GP_REC_ACCESS_SAMPLES 12
#define GP_REC_CUPTI_KERNEL 13
#define GP_REC_CUPTI_MEMCPY 14
#define GP_REC_CUPTI_MEMSET 15
#define GP_REC_TOOL_STATUS 16
#define GP_BACKEND_CUPTI 1
#define GP_BACKEND_SANITIZER 2
#define GP_BACKEND_NVBIT 3
#define GP_BACKEND_CUPTI_SASS 4
#define GP_BACKEND_SYNTHETIC 99
#define GP_ALLOC_DEVICE 0
#define GP_ALLOC_MANAGED 1
#define GP_ALLOC_HOST 2
#define GP_ALLOC_ASYNC 3
#define GP_ALLOC_VIRTUAL 4
#define GP_STAGE_INIT 1
#define GP_STAGE_MODULE 2
#define GP_STAGE_FINAL 3
#define GP_LOADING_UNSET 0
#define GP_LOADING_LAZY 1
#define GP_LOADING_EAGER 2
#define GP_LOADING_OTHER 3
#define GP_INJECTION_PRELOAD 1
#define GP_INJECTION_INJECTION 2
#define GP_RC_NOT_CALLED (-1)
/* device record file header */
struct gp_file_header {
    __u32 magic;
    __u16 ver_major;
    __u16 ver_minor;
    __u32 header_size; /* bytes */
    __u32 flags;
    __u64 pid;
    __u64 mono_open; /* ns CLOCK_MONOTONIC */
    __u64 real_open; /* ns CLOCK_REALTIME */
    __u64 mono_after; /* ns CLOCK_MONOTONIC */
    __u32 backend;
    __u32 device_count;
    __u32 page_shift;
    __u32 reserved;
};
#ifdef __cplusplus
static_assert(sizeof(struct gp_file_header) == 64, "gp_file_header size");
#endif
/* 16-byte header in front of every record */
struct gp_record_header {
    __u16 type;
    __u16 flags;
    __u32 total_len; /* bytes */
    __u64 launch_id;
};
#ifdef __cplusplus
static_assert(sizeof(struct gp_record_header) == 16, "gp_record_header size");
#endif
struct gp_clock_sync {
    __u64 host_mono_before; /* ns */
    __u64 gpu_globaltimer; /* ns */
    __u64 host_mono_after; /* ns */
    __u32 device;
    __u32 pad;
};
#ifdef __cplusplus
static_assert(sizeof(struct gp_clock_sync) == 32, "gp_clock_sync size");
#endif
struct gp_launch {
    __u64 host_mono_begin; /* ns */
    __u64 host_mono_end; /* ns */
    __u64 ctx;
    __u64 stream;
    __u64 func;
    __s64 grid_id;
    __u32 grid_x;
    __u32 grid_y;
    __u32 grid_z;
    __u32 block_x;
    __u32 block_y;
    __u32 block_z;
    __u32 device;
    __u32 correlation_id;
    __u32 name_id;
    __u32 tid;
};
#ifdef __cplusplus
static_assert(sizeof(struct gp_launch) == 88, "gp_launch size");
#endif
struct gp_kernel_summary {
    __u64 gpu_t_first; /* ns %globaltimer */
    __u64 gpu_t_last; /* ns %globaltimer */
    __u64 warp_instrs;
    __u64 thread_instrs;
    __u64 gld;
    __u64 gst;
    __u64 gatom;
    __u64 gld_warp;
    __u64 gst_warp;
    __u64 gatom_warp;
    __u64 bytes; /* bytes */
    __u64 shared;
    __u64 local;
    __u64 blocks_in;
    __u64 blocks_out;
    __u64 dropped;
};
#ifdef __cplusplus
static_assert(sizeof(struct gp_kernel_summary) == 128, "gp_kernel_summary size");
#endif
struct gp_page_hist_header {
    __u32 page_shift;
    __u32 n;
};
#ifdef __cplusplus
static_assert(sizeof(struct gp_page_hist_header) == 8, "gp_page_hist_header size");
#endif
struct gp_alloc_touch_header {
    __u32 n;
    __u32 pad;
};
#ifdef __cplusplus
static_assert(sizeof(struct gp_alloc_touch_header) == 8, "gp_alloc_touch_header size");
#endif
struct gp_ws_bitmap_header {
    __u64 alloc_base;
    __u32 page_shift;
    __u32 nbits;
    __u32 encoding;
    __u32 pad;
};
#ifdef __cplusplus
static_assert(sizeof(struct gp_ws_bitmap_header) == 24, "gp_ws_bitmap_header size");
#endif
/* ALLOC and FREE share this payload */
struct gp_alloc {
    __u64 host_mono; /* ns */
    __u64 address;
    __u64 size; /* bytes */
    __u64 ctx;
    __u64 stream;
    __u32 kind;
    __u32 pad;
};
#ifdef __cplusplus
static_assert(sizeof(struct gp_alloc) == 48, "gp_alloc size");
#endif
struct gp_opcode_hist_header {
    __u32 n;
    __u32 pad;
};
#ifdef __cplusplus
static_assert(sizeof(struct gp_opcode_hist_header) == 8, "gp_opcode_hist_header size");
#endif
struct gp_string_header {
    __u32 id;
    __u32 len; /* bytes */
};
#ifdef __cplusplus
static_assert(sizeof(struct gp_string_header) == 8, "gp_string_header size");
#endif
struct gp_dropped {
    __u64 records;
    __u64 accesses;
    __u64 page_overflow;
};
#ifdef __cplusplus
static_assert(sizeof(struct gp_dropped) == 24, "gp_dropped size");
#endif
struct gp_access_samples_header {
    __u32 n;
    __u32 sample_every;
    __u64 dropped;
};
#ifdef __cplusplus
static_assert(sizeof(struct gp_access_samples_header) == 16, "gp_access_samples_header size");
#endif
struct gp_cupti_kernel {
    __u64 start; /* ns CLOCK_MONOTONIC */
    __u64 end; /* ns CLOCK_MONOTONIC */
    __s64 grid_id;
    __u32 stream_id;
    __u32 correlation_id;
    __u32 device;
    __u32 name_id;
    __u32 grid_x;
    __u32 grid_y;
    __u32 grid_z;
    __u32 block_x;
    __u32 block_y;
    __u32 block_z;
    __u64 graph_node_id;
    __u32 graph_id;
    __u32 pad;
};
#ifdef __cplusplus
static_assert(sizeof(struct gp_cupti_kernel) == 80, "gp_cupti_kernel size");
#endif
/* CUPTI_MEMCPY and CUPTI_MEMSET share this payload */
struct gp_cupti_memop {
    __u64 start; /* ns CLOCK_MONOTONIC */
    __u64 end; /* ns CLOCK_MONOTONIC */
    __u64 bytes; /* bytes */
    __u32 stream_id;
    __u32 correlation_id;
    __u32 device;
    __u32 copy_kind;
};
#ifdef __cplusplus
static_assert(sizeof(struct gp_cupti_memop) == 40, "gp_cupti_memop size");
#endif
/* what the Sanitizer injection's set-up calls returned (format 1.1) */
struct gp_tool_status {
    __u64 host_mono; /* ns CLOCK_MONOTONIC */
    __u32 stage;
    __u32 injection_mode;
    __u32 loading_mode;
    __s32 rc_subscribe;
    __s32 rc_add_patches;
    __s32 rc_patch_instructions;
    __s32 rc_patch_module;
    __s32 rc_set_callback_data;
    __s32 rc_set_launch_data;
    __s32 rc_loaded_status;
    __s32 rc_fallback_read;
    __u32 modules_patched;
    __u32 modules_failed;
    __u32 functions_not_loaded;
    __u64 launches;
    __u64 launches_with_data;
    __u64 patch_null_calls;
    __u64 patch_data_calls;
};
#ifdef __cplusplus
static_assert(sizeof(struct gp_tool_status) == 96, "gp_tool_status size");
#endif
struct gp_page_hist_entry {
    __u64 page;
    __u64 count;
};
#ifdef __cplusplus
static_assert(sizeof(struct gp_page_hist_entry) == 16, "gp_page_hist_entry size");
#endif
struct gp_alloc_touch_entry {
    __u64 alloc_base;
    __u64 touches;
    __u64 bytes; /* bytes */
    __u32 unique_pages;
    __u32 pad;
};
#ifdef __cplusplus
static_assert(sizeof(struct gp_alloc_touch_entry) == 32, "gp_alloc_touch_entry size");
#endif
struct gp_opcode_hist_entry {
    __u32 opcode_id;
    __u32 pad;
    __u64 count;
};
#ifdef __cplusplus
static_assert(sizeof(struct gp_opcode_hist_entry) == 16, "gp_opcode_hist_entry size");
#endif
struct gp_access_sample {
    __u64 address;
    __u64 gpu_time; /* ns %globaltimer */
    __u32 block;
    __u16 warp;
    __u8 size; /* bytes */
    __u8 flags;
    __u32 lanes;
    __u32 pad;
};
#ifdef __cplusplus
static_assert(sizeof(struct gp_access_sample) == 32, "gp_access_sample size");
#endif
