/* On-GPU aggregation of memory events, shared by every device backend.
 *
 * Every function here is __host__ __device__: the Sanitizer patches and the
 * NVBit device functions call them on the GPU, and the CPU tests compile the
 * very same code with g++ and feed it synthetic access streams
 * (tests/unit/test_gpu_probes_agg.py).  On the device the updates are atomics;
 * on the host they are plain read-modify-writes (the host harness is single
 * threaded).
 *
 * One gp_slot holds the state of one kernel launch.  The slot lives in device
 * memory; its pointers point into the same allocation (see gp_slot_layout).
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "gpu_probes/record.h"

#if defined(__CUDACC__)
#define GP_HD __host__ __device__ __forceinline__
#else
#define GP_HD inline
#endif

#define GP_DEFAULT_PAGE_SHIFT 16u /* 64 KiB: GPU large page and UVM migration granule */
#define GP_MAX_PROBES 8u          /* bounded probing: a full hash costs at most 8 reads */
#define GP_HASH_MULT 0x9E3779B97F4A7C15ull

/* Access space and flags, as the backends report them. */
#define GP_SPACE_GLOBAL 0u
#define GP_SPACE_SHARED 1u
#define GP_SPACE_LOCAL 2u
#define GP_ACC_READ 0x1u
#define GP_ACC_WRITE 0x2u
#define GP_ACC_ATOMIC 0x4u

/* gp_access_sample.flags bits (schema: bit0 write, bit1 atomic, bit2 shared, bit3 local). */
#define GP_SAMPLE_WRITE 0x1u
#define GP_SAMPLE_ATOMIC 0x2u
#define GP_SAMPLE_SHARED 0x4u
#define GP_SAMPLE_LOCAL 0x8u

/* Raw-access sampling modes. */
#define GP_SAMPLE_OFF 0u
#define GP_SAMPLE_WARP_INSTR 1u /* one warp-level access in `sample_every` */
#define GP_SAMPLE_CTA 2u        /* every access of one CTA in `sample_every` */

/* One page-hash slot: key 0 means empty, so the key is page + 1. */
struct gp_page_slot {
    uint64_t key;
    uint64_t count;
};

/* One live allocation as uploaded by the host, sorted by base. */
struct gp_alloc_desc {
    uint64_t base;
    uint64_t size;
    uint64_t bitmap_word; /* first u64 word of this allocation's working-set bitmap */
    uint64_t first_page;  /* base >> page_shift */
};

/* Per-allocation counters of one launch. */
struct gp_alloc_count {
    uint64_t touches; /* thread-level accesses */
    uint64_t bytes;
};

struct gp_slot {
    struct gp_kernel_summary sum; /* written out as KERNEL_SUMMARY as is */
    uint64_t page_overflow;       /* thread-level accesses whose page found no hash slot */
    uint64_t sample_ticket;       /* warp-level accesses seen by the sampler */
    uint64_t samples_taken;       /* may exceed sample_cap: the excess was dropped */
    uint32_t page_shift;
    uint32_t hash_mask; /* capacity - 1; capacity is a power of two */
    uint32_t n_allocs;
    uint32_t sample_mode;
    uint32_t sample_every;
    uint32_t sample_cap;
    struct gp_page_slot *pages;
    const struct gp_alloc_desc *allocs;
    struct gp_alloc_count *touch;
    uint64_t *bitmap;
    struct gp_access_sample *samples;
    /* The Sanitizer patches write the device address of their fallback
     * counters (san_patches.cu) here, so the host can read those counters
     * even for launches that got no slot.  0: no patch wrote it. */
    uint64_t fallback;
};

/* ------------------------------------------------------------------ atomics */

GP_HD uint64_t gp_add(uint64_t *p, uint64_t v) {
#if defined(__CUDA_ARCH__)
    return atomicAdd((unsigned long long *)p, (unsigned long long)v);
#else
    uint64_t old = *p;
    *p = old + v;
    return old;
#endif
}

GP_HD uint64_t gp_cas(uint64_t *p, uint64_t expect, uint64_t desired) {
#if defined(__CUDA_ARCH__)
    return atomicCAS((unsigned long long *)p, (unsigned long long)expect, (unsigned long long)desired);
#else
    uint64_t old = *p;
    if (old == expect) *p = desired;
    return old;
#endif
}

GP_HD void gp_or(uint64_t *p, uint64_t v) {
#if defined(__CUDA_ARCH__)
    atomicOr((unsigned long long *)p, (unsigned long long)v);
#else
    *p |= v;
#endif
}

GP_HD void gp_min(uint64_t *p, uint64_t v) {
#if defined(__CUDA_ARCH__)
    atomicMin((unsigned long long *)p, (unsigned long long)v);
#else
    if (v < *p) *p = v;
#endif
}

GP_HD void gp_max(uint64_t *p, uint64_t v) {
#if defined(__CUDA_ARCH__)
    atomicMax((unsigned long long *)p, (unsigned long long)v);
#else
    if (v > *p) *p = v;
#endif
}

/* Volatile read: another warp may have set the word since we last looked. */
GP_HD uint64_t gp_load(const uint64_t *p) { return *(const volatile uint64_t *)p; }

/* ------------------------------------------------------------------ counters */

/* Count one warp-level access made by `lanes` threads of `size` bytes each. */
GP_HD void gp_count_access(struct gp_slot *s, uint32_t space, uint32_t flags, uint32_t size, uint32_t lanes) {
    struct gp_kernel_summary *k = &s->sum;
    if (space == GP_SPACE_SHARED) {
        gp_add(&k->shared, lanes);
        return;
    }
    if (space == GP_SPACE_LOCAL) {
        gp_add(&k->local, lanes);
        return;
    }
    if (flags & GP_ACC_ATOMIC) {
        gp_add(&k->gatom, lanes);
        gp_add(&k->gatom_warp, 1);
    } else if (flags & GP_ACC_WRITE) {
        gp_add(&k->gst, lanes);
        gp_add(&k->gst_warp, 1);
    } else {
        gp_add(&k->gld, lanes);
        gp_add(&k->gld_warp, 1);
    }
    gp_add(&k->bytes, (uint64_t)size * lanes);
}

GP_HD void gp_block_enter(struct gp_slot *s, uint64_t now) {
    gp_add(&s->sum.blocks_in, 1);
    gp_min(&s->sum.gpu_t_first, now);
}

GP_HD void gp_block_exit(struct gp_slot *s, uint64_t now) {
    gp_add(&s->sum.blocks_out, 1);
    gp_max(&s->sum.gpu_t_last, now);
}

/* NVBit: one executed warp instruction with `lanes` active, predicated-on threads. */
GP_HD void gp_count_instr(struct gp_slot *s, uint32_t lanes) {
    gp_add(&s->sum.warp_instrs, 1);
    gp_add(&s->sum.thread_instrs, lanes);
}

/* ------------------------------------------------------------------ page hash */

GP_HD uint32_t gp_page_hash(uint64_t page, uint32_t mask) {
    return (uint32_t)((page * GP_HASH_MULT) >> 32) & mask;
}

/* Add `count` accesses to `page`.  Open addressing, linear probing, at most
 * GP_MAX_PROBES slots; when none is free (or ours) the accesses go to
 * page_overflow, so that sum(hist) + page_overflow = global accesses, always. */
GP_HD void gp_page_add(struct gp_slot *s, uint64_t page, uint64_t count) {
    const uint64_t key = page + 1;
    uint32_t i = gp_page_hash(page, s->hash_mask);
    for (uint32_t probe = 0; probe < GP_MAX_PROBES && probe <= s->hash_mask; ++probe) {
        struct gp_page_slot *e = &s->pages[(i + probe) & s->hash_mask];
        uint64_t k = gp_load(&e->key);
        if (k == 0) k = gp_cas(&e->key, 0, key);
        if (k == 0 || k == key) {
            gp_add(&e->count, count);
            return;
        }
    }
    gp_add(&s->page_overflow, count);
}

/* ------------------------------------------------------------------ allocations */

/* Index of the allocation holding `addr`, or -1.  The table is sorted by base
 * and allocations do not overlap. */
GP_HD int32_t gp_alloc_find(const struct gp_slot *s, uint64_t addr) {
    int32_t lo = 0, hi = (int32_t)s->n_allocs - 1;
    while (lo <= hi) {
        int32_t mid = (lo + hi) >> 1;
        const struct gp_alloc_desc *a = &s->allocs[mid];
        if (addr < a->base)
            hi = mid - 1;
        else if (addr - a->base >= a->size)
            lo = mid + 1;
        else
            return mid;
    }
    return -1;
}

GP_HD void gp_alloc_touch(struct gp_slot *s, int32_t idx, uint64_t lanes, uint64_t bytes) {
    gp_add(&s->touch[idx].touches, lanes);
    gp_add(&s->touch[idx].bytes, bytes);
}

/* Working set: check before set, so a hot page costs a read, not an atomic. */
GP_HD void gp_ws_mark(struct gp_slot *s, int32_t idx, uint64_t addr) {
    const struct gp_alloc_desc *a = &s->allocs[idx];
    uint64_t bit = (addr >> s->page_shift) - a->first_page;
    uint64_t *w = &s->bitmap[a->bitmap_word + (bit >> 6)];
    uint64_t m = 1ull << (bit & 63);
    if (!(gp_load(w) & m)) gp_or(w, m);
}

/* ------------------------------------------------------------------ raw samples */

GP_HD uint8_t gp_sample_flags(uint32_t space, uint32_t flags) {
    uint8_t f = 0;
    if (flags & GP_ACC_WRITE) f |= GP_SAMPLE_WRITE;
    if (flags & GP_ACC_ATOMIC) f |= GP_SAMPLE_ATOMIC;
    if (space == GP_SPACE_SHARED) f |= GP_SAMPLE_SHARED;
    if (space == GP_SPACE_LOCAL) f |= GP_SAMPLE_LOCAL;
    return f;
}

/* Called once per warp-level access (by one lane).  Returns 1 if a sample was
 * stored; samples past the buffer are counted, never silently lost. */
GP_HD int gp_sample(struct gp_slot *s, uint64_t addr, uint64_t now, uint32_t block, uint32_t warp, uint32_t size,
                    uint32_t space, uint32_t flags, uint32_t lane_mask) {
    if (s->sample_mode == GP_SAMPLE_OFF || s->sample_every == 0) return 0;
    if (s->sample_mode == GP_SAMPLE_WARP_INSTR) {
        if (gp_add(&s->sample_ticket, 1) % s->sample_every) return 0;
    } else if (block % s->sample_every) {
        return 0;
    }
    uint64_t i = gp_add(&s->samples_taken, 1);
    if (i >= s->sample_cap) return 0;
    struct gp_access_sample *o = &s->samples[i];
    o->address = addr;
    o->gpu_time = now;
    o->block = block;
    o->warp = (uint16_t)warp;
    o->size = (uint8_t)size;
    o->flags = gp_sample_flags(space, flags);
    o->lanes = lane_mask;
    o->pad = 0;
    return 1;
}

GP_HD uint64_t gp_samples_dropped(const struct gp_slot *s) {
    return s->samples_taken > s->sample_cap ? s->samples_taken - s->sample_cap : 0;
}

/* ------------------------------------------------------------------ one group of lanes */

/* The global-memory work for `lanes` threads of one warp-level access that
 * share one page and one allocation (the device groups them with
 * __match_any_sync, the host harness with a loop): one hash update, one
 * touch update, one bitmap check per group instead of per thread. */
GP_HD void gp_global_group(struct gp_slot *s, uint64_t addr, uint32_t size, uint32_t lanes, int32_t alloc_idx) {
    gp_page_add(s, addr >> s->page_shift, lanes);
    if (alloc_idx >= 0) {
        gp_alloc_touch(s, alloc_idx, lanes, (uint64_t)size * lanes);
        gp_ws_mark(s, alloc_idx, addr);
    }
}

/* ------------------------------------------------------------------ device side */

#if defined(__CUDACC__)
__device__ __forceinline__ uint64_t gp_globaltimer() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__device__ __forceinline__ uint32_t gp_lane_id() {
    uint32_t l;
    asm volatile("mov.u32 %0, %%laneid;" : "=r"(l));
    return l;
}

__device__ __forceinline__ uint32_t gp_block_linear() {
    return blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
}

__device__ __forceinline__ uint32_t gp_warp_in_block() {
    uint32_t t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    return t >> 5;
}

/* Warp-aggregated handling of one memory access, called by every active lane
 * with its own address.  Counters: the leader adds popc(active).  Global
 * accesses: lanes are grouped by (page, allocation) with __match_any_sync so
 * that a coalesced access costs one or two atomics per warp, not 32. */
__device__ __forceinline__ void gp_warp_access(struct gp_slot *s, uint64_t addr, uint32_t size, uint32_t space,
                                               uint32_t flags) {
    const uint32_t active = __activemask();
    const uint32_t lane = gp_lane_id();
    const uint32_t leader = __ffs(active) - 1;
    const uint32_t lanes = __popc(active);
    if (lane == leader) {
        gp_count_access(s, space, flags, size, lanes);
        if (s->sample_mode != GP_SAMPLE_OFF)
            gp_sample(s, addr, gp_globaltimer(), gp_block_linear(), gp_warp_in_block(), size, space, flags, active);
    }
    if (space != GP_SPACE_GLOBAL) return;
    const int32_t idx = gp_alloc_find(s, addr);
    const uint64_t page = addr >> s->page_shift;
    const uint32_t same_page = __match_any_sync(active, page);
    const uint32_t group = same_page & __match_any_sync(active, (uint32_t)idx);
    if (lane == (uint32_t)(__ffs(group) - 1)) gp_global_group(s, addr, size, __popc(group), idx);
}
#endif

/* ------------------------------------------------------------------ host side: slot layout */

/* Byte offsets of the parts of one slot allocation; the host computes them,
 * points the slot's pointers at base + offset, and copies the header in. */
struct gp_slot_layout {
    size_t pages, allocs, touch, bitmap, samples, total;
};

GP_HD size_t gp_align8(size_t n) { return (n + 7) & ~(size_t)7; }

GP_HD struct gp_slot_layout gp_layout(uint32_t hash_capacity, uint32_t n_allocs, uint64_t bitmap_words,
                                      uint32_t sample_cap) {
    struct gp_slot_layout l;
    l.pages = gp_align8(sizeof(struct gp_slot));
    l.allocs = l.pages + (size_t)hash_capacity * sizeof(struct gp_page_slot);
    l.touch = l.allocs + (size_t)n_allocs * sizeof(struct gp_alloc_desc);
    l.bitmap = l.touch + (size_t)n_allocs * sizeof(struct gp_alloc_count);
    l.samples = l.bitmap + (size_t)bitmap_words * sizeof(uint64_t);
    l.total = l.samples + (size_t)sample_cap * sizeof(struct gp_access_sample);
    return l;
}

/* Pages of [base, base+size) at this page size (size > 0). */
GP_HD uint64_t gp_alloc_pages(uint64_t base, uint64_t size, uint32_t page_shift) {
    return ((base + size - 1) >> page_shift) - (base >> page_shift) + 1;
}

GP_HD uint64_t gp_popcount64(uint64_t x) {
#if defined(__CUDA_ARCH__)
    return __popcll(x);
#else
    return (uint64_t)__builtin_popcountll(x);
#endif
}
