/* Writes the golden device record file: every record type, deterministic
 * content, through the same writer and slot code as the tools.
 *
 *   golden_writer OUT.bin OUT.json
 *
 * OUT.json lists, record by record, the values as the C++ compiler sees the
 * structs (field names stringified from record.h), so a reader that decodes
 * OUT.bin with the schema's layouts must find exactly these values.
 *
 * Content: one vecadd launch of n = 4096 floats aggregated by agg.cuh with
 * 4 KiB pages and an 8-slot page hash (so 4 of its 12 pages overflow and a
 * per-launch DROPPED record appears), raw samples of one warp access in 8 with
 * room for 16, then NVBit-style opcode counts, CUPTI records, frees, and
 * finally more records than the 32-entry queue holds, so that the writer's own
 * DROPPED record closes the file. */
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "slot.h"
#include "writer.h"

namespace {

const uint64_t A = 0x7f0000200000ull, B = 0x7f0000210000ull, C = 0x7f0000220400ull;
const uint32_t N = 4096;

std::string js;
const char *sep = "";

void open_rec(const char *type, uint64_t launch_id) {
    char b[128];
    std::snprintf(b, sizeof b, "%s\n  {\"type\": \"%s\", \"launch_id\": %" PRIu64, sep, type, launch_id);
    js += b;
    sep = ",";
}
void close_rec() { js += "}"; }
void kv(const char *k, uint64_t v, bool first = false) {
    char b[96];
    std::snprintf(b, sizeof b, "%s\"%s\": %" PRIu64, first ? "" : ", ", k, v);
    js += b;
}
void kvi(const char *k, int64_t v) {
    char b[96];
    std::snprintf(b, sizeof b, ", \"%s\": %" PRId64, k, v);
    js += b;
}
void obj_begin(const char *k) { js += std::string(", \"") + k + "\": {"; }
void list_begin(const char *k) { js += std::string(", \"") + k + "\": ["; }

#define F(s, f) kv(#f, (uint64_t)(s).f, first), first = false
#define FI(s, f) kvi(#f, (int64_t)(s).f)

void j_clock(const gp_clock_sync &s) {
    bool first = true;
    obj_begin("payload"); F(s, host_mono_before); F(s, gpu_globaltimer); F(s, host_mono_after); F(s, device); js += "}";
}
void j_launch(const gp_launch &s) {
    bool first = true;
    obj_begin("payload");
    F(s, host_mono_begin); F(s, host_mono_end); F(s, ctx); F(s, stream); F(s, func); FI(s, grid_id);
    F(s, grid_x); F(s, grid_y); F(s, grid_z); F(s, block_x); F(s, block_y); F(s, block_z); F(s, device);
    F(s, correlation_id); F(s, name_id); F(s, tid);
    js += "}";
}
void j_alloc(const gp_alloc &s) {
    bool first = true;
    obj_begin("payload"); F(s, host_mono); F(s, address); F(s, size); F(s, ctx); F(s, stream); F(s, kind); js += "}";
}
void j_summary(const gp_kernel_summary &s) {
    bool first = true;
    obj_begin("payload");
    F(s, gpu_t_first); F(s, gpu_t_last); F(s, warp_instrs); F(s, thread_instrs); F(s, gld); F(s, gst); F(s, gatom);
    F(s, gld_warp); F(s, gst_warp); F(s, gatom_warp); F(s, bytes); F(s, shared); F(s, local); F(s, blocks_in);
    F(s, blocks_out); F(s, dropped);
    js += "}";
}
void j_dropped(const gp_dropped &s) {
    bool first = true;
    obj_begin("payload"); F(s, records); F(s, accesses); F(s, page_overflow); js += "}";
}
void j_cupti_kernel(const gp_cupti_kernel &s) {
    bool first = true;
    obj_begin("payload");
    F(s, start); F(s, end); FI(s, grid_id); F(s, stream_id); F(s, correlation_id); F(s, device); F(s, name_id);
    F(s, grid_x); F(s, grid_y); F(s, grid_z); F(s, block_x); F(s, block_y); F(s, block_z); F(s, graph_node_id);
    F(s, graph_id);
    js += "}";
}
void j_memop(const gp_cupti_memop &s) {
    bool first = true;
    obj_begin("payload"); F(s, start); F(s, end); F(s, bytes); F(s, stream_id); F(s, correlation_id); F(s, device);
    F(s, copy_kind); js += "}";
}
void j_tool_status(const gp_tool_status &s) {
    bool first = true;
    obj_begin("payload"); F(s, host_mono); F(s, stage); F(s, injection_mode); F(s, loading_mode);
    FI(s, rc_subscribe); FI(s, rc_add_patches); FI(s, rc_patch_instructions); FI(s, rc_patch_module);
    FI(s, rc_set_callback_data); FI(s, rc_set_launch_data); FI(s, rc_loaded_status); FI(s, rc_fallback_read);
    F(s, modules_patched); F(s, modules_failed); F(s, functions_not_loaded); F(s, launches); F(s, launches_with_data);
    F(s, patch_null_calls); F(s, patch_data_calls); js += "}";
}

/* The slot's records, described from the same bytes the writer gets. */
void j_slot_record(const std::vector<uint8_t> &r) {
    gp_record_header h;
    std::memcpy(&h, r.data(), sizeof h);
    const uint8_t *p = r.data() + sizeof h;
    bool first = true;
    switch (h.type) {
    case GP_REC_KERNEL_SUMMARY: {
        gp_kernel_summary s;
        std::memcpy(&s, p, sizeof s);
        open_rec("KERNEL_SUMMARY", h.launch_id); j_summary(s); break;
    }
    case GP_REC_PAGE_HIST: {
        gp_page_hist_header s;
        std::memcpy(&s, p, sizeof s);
        open_rec("PAGE_HIST", h.launch_id);
        obj_begin("payload"); F(s, page_shift); F(s, n); js += "}";
        list_begin("entries");
        for (uint32_t i = 0; i < s.n; ++i) {
            gp_page_hist_entry e;
            std::memcpy(&e, p + sizeof s + i * sizeof e, sizeof e);
            js += i ? ", {" : "{"; first = true; F(e, page); F(e, count); js += "}";
        }
        js += "]"; break;
    }
    case GP_REC_ALLOC_TOUCH: {
        gp_alloc_touch_header s;
        std::memcpy(&s, p, sizeof s);
        open_rec("ALLOC_TOUCH", h.launch_id);
        obj_begin("payload"); F(s, n); js += "}";
        list_begin("entries");
        for (uint32_t i = 0; i < s.n; ++i) {
            gp_alloc_touch_entry e;
            std::memcpy(&e, p + sizeof s + i * sizeof e, sizeof e);
            js += i ? ", {" : "{"; first = true; F(e, alloc_base); F(e, touches); F(e, bytes); F(e, unique_pages);
            js += "}";
        }
        js += "]"; break;
    }
    case GP_REC_WS_BITMAP: {
        gp_ws_bitmap_header s;
        std::memcpy(&s, p, sizeof s);
        open_rec("WS_BITMAP", h.launch_id);
        obj_begin("payload"); F(s, alloc_base); F(s, page_shift); F(s, nbits); F(s, encoding); js += "}";
        list_begin("words");
        for (uint32_t i = 0; i < (s.nbits + 63) / 64; ++i) {
            uint64_t w;
            std::memcpy(&w, p + sizeof s + i * 8, 8);
            js += (i ? ", " : "") + std::to_string(w);
        }
        js += "]"; break;
    }
    case GP_REC_ACCESS_SAMPLES: {
        gp_access_samples_header s;
        std::memcpy(&s, p, sizeof s);
        open_rec("ACCESS_SAMPLES", h.launch_id);
        obj_begin("payload"); F(s, n); F(s, sample_every); F(s, dropped); js += "}";
        list_begin("entries");
        for (uint32_t i = 0; i < s.n; ++i) {
            gp_access_sample e;
            std::memcpy(&e, p + sizeof s + i * sizeof e, sizeof e);
            js += i ? ", {" : "{"; first = true;
            F(e, address); F(e, gpu_time); F(e, block); F(e, warp); F(e, size); F(e, flags); F(e, lanes);
            js += "}";
        }
        js += "]"; break;
    }
    case GP_REC_DROPPED: {
        gp_dropped s;
        std::memcpy(&s, p, sizeof s);
        open_rec("DROPPED", h.launch_id); j_dropped(s); break;
    }
    }
    close_rec();
}

uint32_t string_rec(gp::Writer &w, uint32_t id, const std::string &text, bool expect_kept) {
    gp_string_header h{id, (uint32_t)text.size()};
    bool kept = w.submit(gp::Rec(GP_REC_STRING, 0).put(h).bytes(text.data(), text.size()));
    if (kept != expect_kept) std::fprintf(stderr, "golden_writer: queue behaved unexpectedly at string %u\n", id);
    if (kept) {
        open_rec("STRING", 0);
        bool first = true;
        obj_begin("payload"); F(h, id); F(h, len); js += "}, \"text\": \"" + text + "\"";
        close_rec();
    }
    return id;
}

} // namespace

int main(int argc, char **argv) {
    if (argc != 3) {
        std::fprintf(stderr, "usage: %s OUT.bin OUT.json\n", argv[0]);
        return 2;
    }
    gp::Writer::Options o;
    o.backend = GP_BACKEND_SANITIZER;
    o.page_shift = 12;
    o.device_count = 1;
    o.pid = 4242;
    o.queue_capacity = 32; /* a power of two: exactly what the queue holds */
    o.writer_thread = false; /* deterministic: everything waits in the queue until close() */
    const gp::Clocks clocks{1000000000ull, 1764633600000000000ull, 1000000640ull};
    std::string err;
    auto w = gp::Writer::open(argv[1], o, clocks, &err);
    if (!w) {
        std::fprintf(stderr, "golden_writer: %s\n", err.c_str());
        return 1;
    }
    js = "{\"header\": {";
    {
        bool first = true;
        gp_file_header h{GP_MAGIC, GP_VER_MAJOR, GP_VER_MINOR, 64, 0, o.pid, clocks.mono_open, clocks.real_open,
                         clocks.mono_after, o.backend, o.device_count, o.page_shift, 0};
        F(h, magic); F(h, ver_major); F(h, ver_minor); F(h, header_size); F(h, flags); F(h, pid); F(h, mono_open);
        F(h, real_open); F(h, mono_after); F(h, backend); F(h, device_count); F(h, page_shift);
    }
    js += "},\n\"records\": [";

    string_rec(*w, 1, "_Z6vecaddPKfS0_Pfi", true);
    for (int i = 0; i < 2; ++i) {
        gp_clock_sync c{1000001000ull + 1000000ull * i, 1764633600000100000ull + 1000020ull * i,
                        1000001800ull + 1000000ull * i, 0, 0};
        w->submit(gp::Rec(GP_REC_CLOCK_SYNC, 0).put(c));
        open_rec("CLOCK_SYNC", 0); j_clock(c); close_rec();
    }
    const uint64_t bases[3] = {A, B, C};
    for (int i = 0; i < 3; ++i) {
        gp_alloc a{1000002000ull + 10 * i, bases[i], N * 4ull, 0x5000, 0, 0, 0};
        w->submit(gp::Rec(GP_REC_ALLOC, 0).put(a));
        open_rec("ALLOC", 0); j_alloc(a); close_rec();
    }

    gp_launch l{1000003000ull, 1000003900ull, 0x5000, 0x6000, 0x7000, 17, N / 256, 1, 1, 256, 1, 1, 0, 99, 1, 4243};
    w->submit(gp::Rec(GP_REC_LAUNCH, 1).put(l));
    open_rec("LAUNCH", 1); j_launch(l); close_rec();

    gp::SlotConfig cfg;
    cfg.page_shift = 12;
    cfg.hash_capacity = 8;
    cfg.sample_mode = GP_SAMPLE_WARP_INSTR;
    cfg.sample_every = 8;
    cfg.sample_cap = 16;
    const std::vector<gp::Range> arrays{{A, N * 4ull, false}, {B, N * 4ull, false}, {C, N * 4ull, false}};
    gp::SlotImage img(cfg, gp::AllocTable::build(arrays, 12));
    img.reset_host();
    gp_slot *s = img.header();
    for (uint32_t blk = 0; blk < N / 256; ++blk) gp_block_enter(s, 1764633600000200000ull + 40 * blk);
    for (uint32_t wi = 0; wi < N / 32; ++wi) {
        const uint64_t t = 1764633600000200100ull + wi;
        const uint64_t lead = 4ull * 32 * wi;
        for (uint64_t base : {A, B}) {
            gp_count_access(s, GP_SPACE_GLOBAL, GP_ACC_READ, 4, 32);
            gp_sample(s, base + lead, t, wi / 8, wi % 8, 4, GP_SPACE_GLOBAL, GP_ACC_READ, 0xffffffffu);
            gp_global_group(s, base + lead, 4, 32, gp_alloc_find(s, base + lead));
        }
        /* c's base is 1 KiB into a page: lanes of one warp never straddle it here (128 B per warp). */
        gp_count_access(s, GP_SPACE_GLOBAL, GP_ACC_WRITE, 4, 32);
        gp_sample(s, C + lead, t, wi / 8, wi % 8, 4, GP_SPACE_GLOBAL, GP_ACC_WRITE, 0xffffffffu);
        gp_global_group(s, C + lead, 4, 32, gp_alloc_find(s, C + lead));
        gp_count_access(s, GP_SPACE_SHARED, GP_ACC_WRITE, 4, 32);
    }
    gp_count_access(s, GP_SPACE_GLOBAL, GP_ACC_READ | GP_ACC_ATOMIC, 8, 1);
    gp_count_access(s, GP_SPACE_LOCAL, GP_ACC_READ, 4, 3);
    for (uint32_t i = 0; i < 3 * N / 32; ++i) gp_count_instr(s, 32);
    for (uint32_t blk = 0; blk < N / 256; ++blk) gp_block_exit(s, 1764633600000300000ull + 40 * blk);
    for (auto &r : img.records(1)) {
        j_slot_record(r);
        w->submit(std::move(r));
    }

    /* OPCODE_HIST: ids point at STRING records (NVBit's opcode names). */
    const char *ops[3] = {"LDG.E", "STG.E", "FADD"};
    const uint64_t counts[3] = {2 * N / 32, N / 32, N / 32};
    for (uint32_t i = 0; i < 3; ++i) string_rec(*w, 2 + i, ops[i], true);
    {
        gp_opcode_hist_header h{3, 0};
        gp::Rec r(GP_REC_OPCODE_HIST, 1);
        r.put(h);
        open_rec("OPCODE_HIST", 1);
        bool first = true;
        obj_begin("payload"); F(h, n); js += "}";
        list_begin("entries");
        for (uint32_t i = 0; i < 3; ++i) {
            gp_opcode_hist_entry e{2 + i, 0, counts[i]};
            r.put(e);
            js += i ? ", {" : "{"; first = true; F(e, opcode_id); F(e, count); js += "}";
        }
        js += "]";
        close_rec();
        w->submit(r);
    }

    /* a graph node's kernel (format 1.2: graph_node_id, graph_id) */
    gp_cupti_kernel k{1000003100ull, 1000003700ull, 17, 7, 99, 0, 1, N / 256, 1, 1, 256, 1, 1, 0x300000002ull, 3, 0};
    w->submit(gp::Rec(GP_REC_CUPTI_KERNEL, 0).put(k));
    open_rec("CUPTI_KERNEL", 0); j_cupti_kernel(k); close_rec();
    gp_cupti_memop mc{1000002500ull, 1000002600ull, N * 4ull, 7, 97, 0, 1};
    w->submit(gp::Rec(GP_REC_CUPTI_MEMCPY, 0).put(mc));
    open_rec("CUPTI_MEMCPY", 0); j_memop(mc); close_rec();
    gp_cupti_memop ms{1000002700ull, 1000002750ull, N * 4ull, 7, 98, 0, 0};
    w->submit(gp::Rec(GP_REC_CUPTI_MEMSET, 0).put(ms));
    open_rec("CUPTI_MEMSET", 0); j_memop(ms); close_rec();
    /* A run whose patches got no buffer: every field distinct, a failure code, a call never made. */
    gp_tool_status st{1000002800ull, GP_STAGE_FINAL, GP_INJECTION_PRELOAD, GP_LOADING_LAZY, 0, 0, 0, 0,
                      0, 6, 0, GP_RC_NOT_CALLED, 2, 1, 3, 5, 4, 96, 0};
    w->submit(gp::Rec(GP_REC_TOOL_STATUS, 0).put(st));
    open_rec("TOOL_STATUS", 0); j_tool_status(st); close_rec();

    for (int i = 0; i < 3; ++i) {
        gp_alloc a{1000004000ull + 10 * i, bases[i], N * 4ull, 0x5000, 0, 0, 0};
        w->submit(gp::Rec(GP_REC_FREE, 0).put(a));
        open_rec("FREE", 0); j_alloc(a); close_rec();
    }

    /* Fill the queue: what does not fit is dropped and counted. */
    uint32_t id = 5, dropped = 0;
    const size_t queued = 1 + 2 + 3 + 1 + img.records(1).size() + 3 + 1 + 3 + 3 + 1;
    for (size_t q = queued; q < o.queue_capacity; ++q) string_rec(*w, id++, "filler", true);
    for (int i = 0; i < 3; ++i, ++dropped) string_rec(*w, id++, "lost", false);
    w->close();
    gp_dropped d{dropped, 0, 0};
    open_rec("DROPPED", 0); j_dropped(d); close_rec();
    js += "\n]}\n";
    FILE *f = std::fopen(argv[2], "w");
    if (!f || std::fwrite(js.data(), 1, js.size(), f) != js.size()) {
        std::fprintf(stderr, "golden_writer: cannot write %s\n", argv[2]);
        return 1;
    }
    std::fclose(f);
    return w->dropped() == dropped ? 0 : 1;
}
