/* CPU harness for agg.cuh: runs the shared aggregation functions on a
 * synthetic access stream and prints the resulting state as JSON.
 *
 * Input (text, one command a line):
 *   config <page_shift> <hash_capacity> <sample_mode> <sample_every> <sample_cap>   (first line)
 *   alloc <base> <size>                                     (before the first event)
 *   reserve <base> <size>                                   a virtual-address reservation (likewise)
 *   enter <gpu_time> | exit <gpu_time>                      block enter / exit
 *   instr <lanes>                                           one executed warp instruction (NVBit)
 *   access <space> <flags> <size> <block> <warp> <gpu_time> <lane_mask> <addr>...
 *       one warp-level access: one address per set bit of lane_mask, lowest lane first
 *
 * The warp step stands in for __match_any_sync: lanes that share (page,
 * allocation) form one group, led by their lowest lane, exactly as
 * gp_warp_access groups them on the device.
 */
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "slot.h"

static void warp_access(gp_slot *s, uint32_t space, uint32_t flags, uint32_t size, uint32_t block, uint32_t warp,
                        uint64_t now, uint32_t mask, const std::vector<uint64_t> &addr) {
    const uint32_t lanes = (uint32_t)addr.size();
    gp_count_access(s, space, flags, size, lanes);
    gp_sample(s, addr[0], now, block, warp, size, space, flags, mask);
    if (space != GP_SPACE_GLOBAL) return;
    std::vector<int32_t> idx(lanes);
    for (uint32_t i = 0; i < lanes; ++i) idx[i] = gp_alloc_find(s, addr[i]);
    std::vector<bool> done(lanes, false);
    for (uint32_t i = 0; i < lanes; ++i) {
        if (done[i]) continue;
        uint32_t n = 0;
        for (uint32_t j = i; j < lanes; ++j) {
            if (!done[j] && idx[j] == idx[i] && (addr[j] >> s->page_shift) == (addr[i] >> s->page_shift)) {
                done[j] = true;
                ++n;
            }
        }
        gp_global_group(s, addr[i], size, n, idx[i]);
    }
}

int main(int argc, char **argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: %s STREAM\n", argv[0]);
        return 2;
    }
    std::ifstream in(argv[1]);
    std::string line, cmd;
    gp::SlotConfig cfg;
    std::vector<gp::Range> allocs;
    std::vector<std::string> events;
    while (std::getline(in, line)) {
        std::istringstream ls(line);
        ls >> cmd;
        if (cmd == "config")
            ls >> cfg.page_shift >> cfg.hash_capacity >> cfg.sample_mode >> cfg.sample_every >> cfg.sample_cap;
        else if (cmd == "alloc" || cmd == "reserve") {
            uint64_t b, n;
            ls >> b >> n;
            allocs.push_back({b, n, cmd == "reserve"});
        } else
            events.push_back(line);
    }
    gp::AllocTable table = gp::AllocTable::build(allocs, cfg.page_shift);
    gp::SlotImage img(cfg, table);
    img.reset_host();
    gp_slot *s = img.header();
    for (const std::string &ev : events) {
        std::istringstream ls(ev);
        ls >> cmd;
        if (cmd == "enter" || cmd == "exit") {
            uint64_t t;
            ls >> t;
            if (cmd == "enter")
                gp_block_enter(s, t);
            else
                gp_block_exit(s, t);
        } else if (cmd == "instr") {
            uint32_t lanes;
            ls >> lanes;
            gp_count_instr(s, lanes);
        } else if (cmd == "access") {
            uint32_t space, flags, size, block, warp, mask;
            uint64_t now, a;
            ls >> space >> flags >> size >> block >> warp >> now >> mask;
            std::vector<uint64_t> addr;
            while (ls >> a) addr.push_back(a);
            warp_access(s, space, flags, size, block, warp, now, mask, addr);
        }
    }

    /* Dump through the same record builder the tools use, then as JSON. */
    const gp_kernel_summary &k = s->sum;
    std::printf("{\"summary\": {\"gld\": %" PRIu64 ", \"gst\": %" PRIu64 ", \"gatom\": %" PRIu64
                ", \"gld_warp\": %" PRIu64 ", \"gst_warp\": %" PRIu64 ", \"gatom_warp\": %" PRIu64
                ", \"bytes\": %" PRIu64 ", \"shared\": %" PRIu64 ", \"local\": %" PRIu64 ", \"blocks_in\": %" PRIu64
                ", \"blocks_out\": %" PRIu64 ", \"gpu_t_first\": %" PRIu64 ", \"gpu_t_last\": %" PRIu64
                ", \"warp_instrs\": %" PRIu64 ", \"thread_instrs\": %" PRIu64 "},\n",
                k.gld, k.gst, k.gatom, k.gld_warp, k.gst_warp, k.gatom_warp, k.bytes, k.shared, k.local, k.blocks_in,
                k.blocks_out, k.gpu_t_first, k.gpu_t_last, k.warp_instrs, k.thread_instrs);
    std::printf("\"page_overflow\": %" PRIu64 ", \"samples_dropped\": %" PRIu64 ",\n", s->page_overflow,
                gp_samples_dropped(s));
    std::printf("\"hash\": [");
    const char *sep = "";
    for (uint32_t i = 0; i <= s->hash_mask; ++i) {
        std::printf("%s[%" PRIu64 ", %" PRIu64 "]", sep, s->pages[i].key, s->pages[i].count);
        sep = ", ";
    }
    std::printf("],\n\"touch\": [");
    sep = "";
    for (uint32_t i = 0; i < s->n_allocs; ++i) {
        std::printf("%s[%" PRIu64 ", %" PRIu64 ", %" PRIu64 "]", sep, s->allocs[i].base, s->touch[i].touches,
                    s->touch[i].bytes);
        sep = ", ";
    }
    std::printf("],\n\"bitmap\": [");
    sep = "";
    for (uint64_t i = 0; i < table.bitmap_words; ++i) {
        std::printf("%s%" PRIu64, sep, s->bitmap[i]);
        sep = ", ";
    }
    std::printf("],\n\"samples\": [");
    sep = "";
    const uint64_t n = s->samples_taken < s->sample_cap ? s->samples_taken : s->sample_cap;
    for (uint64_t i = 0; i < n; ++i) {
        const gp_access_sample &o = s->samples[i];
        std::printf("%s[%" PRIu64 ", %" PRIu64 ", %u, %u, %u, %u, %u]", sep, o.address, o.gpu_time, o.block,
                    (unsigned)o.warp, (unsigned)o.size, (unsigned)o.flags, o.lanes);
        sep = ", ";
    }
    std::printf("],\n\"records\": [");
    sep = "";
    for (const auto &r : img.records(1)) {
        gp_record_header h;
        std::memcpy(&h, r.data(), sizeof h);
        std::printf("%s[%u, %u]", sep, (unsigned)h.type, h.total_len);
        sep = ", ";
    }
    std::printf("]}\n");
    return 0;
}
