/* Host side of one launch's aggregation state (gp_slot in agg.cuh): build the
 * allocation table, lay out one contiguous buffer, and turn a finished slot
 * into TLV records.  Used by the Sanitizer and NVBit tools (buffer copied back
 * from the GPU) and by the CPU harness (buffer filled on the host). */
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "gpu_probes/agg.cuh"
#include "writer.h"

namespace gp {

struct SlotConfig {
    uint32_t page_shift = GP_DEFAULT_PAGE_SHIFT;
    uint32_t hash_capacity = 4096; /* power of two */
    uint32_t sample_mode = GP_SAMPLE_OFF;
    uint32_t sample_every = 0;
    uint32_t sample_cap = 0;
};

/* A live address range: an allocation, or a virtual-address reservation
 * (the Sanitizer's VIRTUAL_RESERVE, cuMemAddressReserve). */
struct Range {
    uint64_t base;
    uint64_t size;
    bool reservation;
};

/* Live allocations, sorted and disjoint, with each one's first bitmap word.
 *
 * Ranges overlap in real processes: on driver 580 (H200, 2026-12-04) every
 * cudaMalloc'd array lay inside a virtual-address reservation that the driver
 * reported first, one of them at the same base.  An access belongs to the
 * allocation, not to the reservation around it, so allocations are kept first
 * (of two overlapping allocations, the lower base, then the larger, is kept);
 * a reservation is kept only where it overlaps nothing kept (memory mapped
 * into it that no allocation callback reported, such as cuMemMap). */
struct AllocTable {
    std::vector<gp_alloc_desc> descs;
    uint64_t bitmap_words = 0;
    static AllocTable build(std::vector<Range> ranges, uint32_t page_shift);
    /* All ranges allocations (the NVBit tool, which sees no reservations). */
    static AllocTable build(const std::vector<std::pair<uint64_t, uint64_t>> &base_size, uint32_t page_shift);
};

/* One slot as a byte image: header + page hash + alloc table + touch counts +
 * bitmaps + samples, in the order of gp_layout(). */
class SlotImage {
  public:
    SlotImage(const SlotConfig &cfg, const AllocTable &allocs);

    /* Zero the counters and point the header's pointers at `base` (the device
     * address of the buffer, or the image's own bytes on the host). */
    void reset(uint64_t base);
    void reset_host() { reset((uint64_t)(uintptr_t)buf_.data()); }

    gp_slot *header() { return reinterpret_cast<gp_slot *>(buf_.data()); }
    const gp_slot *header() const { return reinterpret_cast<const gp_slot *>(buf_.data()); }
    std::vector<uint8_t> &bytes() { return buf_; }
    const gp_slot_layout &layout() const { return layout_; }

    /* Records of a finished launch: KERNEL_SUMMARY, PAGE_HIST, ALLOC_TOUCH,
     * WS_BITMAP (one per touched allocation), ACCESS_SAMPLES (if sampling),
     * DROPPED (if the hash overflowed or samples were lost).  Reads only
     * offsets, never the header's pointers, which may be device addresses. */
    std::vector<std::vector<uint8_t>> records(uint64_t launch_id) const;

  private:
    template <typename T> const T *at(size_t off) const { return reinterpret_cast<const T *>(buf_.data() + off); }
    SlotConfig cfg_;
    uint32_t n_allocs_;
    gp_slot_layout layout_;
    std::vector<uint8_t> buf_;
};

} // namespace gp
