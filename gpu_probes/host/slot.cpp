#include "slot.h"

#include <algorithm>
#include <cstring>

namespace gp {

namespace {

bool before(const Range &a, const Range &b) { return a.base != b.base ? a.base < b.base : a.size > b.size; }

/* Disjoint ranges of `v` (sorted by before()), skipping any that overlaps one
 * already in `kept` (sorted, disjoint) or kept before it from `v`. */
void keep_disjoint(std::vector<Range> v, std::vector<Range> &kept) {
    std::sort(v.begin(), v.end(), before);
    std::vector<Range> out;
    out.reserve(kept.size() + v.size());
    size_t k = 0;
    uint64_t end = 0;
    for (const Range &r : v) {
        if (r.size == 0 || r.base < end) continue;
        while (k < kept.size() && kept[k].base + kept[k].size <= r.base) out.push_back(kept[k++]);
        if (k < kept.size() && kept[k].base < r.base + r.size) continue; /* overlaps a kept range */
        out.push_back(r);
        end = r.base + r.size;
    }
    out.insert(out.end(), kept.begin() + (std::ptrdiff_t)k, kept.end());
    kept = std::move(out);
}

} // namespace

AllocTable AllocTable::build(std::vector<Range> ranges, uint32_t page_shift) {
    std::vector<Range> allocs, reservations, kept;
    for (const Range &r : ranges) (r.reservation ? reservations : allocs).push_back(r);
    keep_disjoint(std::move(allocs), kept);
    keep_disjoint(std::move(reservations), kept);
    AllocTable t;
    for (const Range &r : kept) {
        gp_alloc_desc d{};
        d.base = r.base;
        d.size = r.size;
        d.first_page = r.base >> page_shift;
        d.bitmap_word = t.bitmap_words;
        t.bitmap_words += (gp_alloc_pages(r.base, r.size, page_shift) + 63) / 64;
        t.descs.push_back(d);
    }
    return t;
}

AllocTable AllocTable::build(const std::vector<std::pair<uint64_t, uint64_t>> &base_size, uint32_t page_shift) {
    std::vector<Range> v;
    v.reserve(base_size.size());
    for (const auto &bs : base_size) v.push_back(Range{bs.first, bs.second, false});
    return build(std::move(v), page_shift);
}

SlotImage::SlotImage(const SlotConfig &cfg, const AllocTable &allocs)
    : cfg_(cfg), n_allocs_((uint32_t)allocs.descs.size()),
      layout_(gp_layout(cfg.hash_capacity, n_allocs_, allocs.bitmap_words, cfg.sample_cap)), buf_(layout_.total) {
    if (n_allocs_)
        std::memcpy(buf_.data() + layout_.allocs, allocs.descs.data(), n_allocs_ * sizeof(gp_alloc_desc));
}

void SlotImage::reset(uint64_t base) {
    std::memset(buf_.data(), 0, layout_.allocs);
    std::memset(buf_.data() + layout_.touch, 0, layout_.total - layout_.touch);
    gp_slot *s = header();
    s->sum.gpu_t_first = ~0ull; /* gp_min needs a neutral start */
    s->page_shift = cfg_.page_shift;
    s->hash_mask = cfg_.hash_capacity - 1;
    s->n_allocs = n_allocs_;
    s->sample_mode = cfg_.sample_mode;
    s->sample_every = cfg_.sample_every;
    s->sample_cap = cfg_.sample_cap;
    s->pages = reinterpret_cast<gp_page_slot *>(base + layout_.pages);
    s->allocs = reinterpret_cast<const gp_alloc_desc *>(base + layout_.allocs);
    s->touch = reinterpret_cast<gp_alloc_count *>(base + layout_.touch);
    s->bitmap = reinterpret_cast<uint64_t *>(base + layout_.bitmap);
    s->samples = reinterpret_cast<gp_access_sample *>(base + layout_.samples);
}

std::vector<std::vector<uint8_t>> SlotImage::records(uint64_t launch_id) const {
    std::vector<std::vector<uint8_t>> out;
    const gp_slot *s = header();
    const uint64_t sample_drops = gp_samples_dropped(s);

    gp_kernel_summary k = s->sum;
    if (k.gpu_t_first == ~0ull) k.gpu_t_first = 0; /* no block was seen */
    k.dropped = s->page_overflow + sample_drops;
    out.push_back(Rec(GP_REC_KERNEL_SUMMARY, launch_id).put(k).finish());

    std::vector<gp_page_hist_entry> hist;
    const gp_page_slot *pages = at<gp_page_slot>(layout_.pages);
    for (uint32_t i = 0; i < cfg_.hash_capacity; ++i)
        if (pages[i].key) hist.push_back({pages[i].key - 1, pages[i].count});
    std::sort(hist.begin(), hist.end(),
              [](const gp_page_hist_entry &a, const gp_page_hist_entry &b) { return a.page < b.page; });
    gp_page_hist_header hh{cfg_.page_shift, (uint32_t)hist.size()};
    out.push_back(Rec(GP_REC_PAGE_HIST, launch_id).put(hh).bytes(hist.data(), hist.size() * sizeof hist[0]).finish());

    const gp_alloc_desc *allocs = at<gp_alloc_desc>(layout_.allocs);
    const gp_alloc_count *touch = at<gp_alloc_count>(layout_.touch);
    const uint64_t *bitmap = at<uint64_t>(layout_.bitmap);
    std::vector<gp_alloc_touch_entry> touched;
    std::vector<uint32_t> touched_idx;
    for (uint32_t i = 0; i < n_allocs_; ++i) {
        if (!touch[i].touches) continue;
        const uint64_t nbits = gp_alloc_pages(allocs[i].base, allocs[i].size, cfg_.page_shift);
        uint64_t unique = 0;
        for (uint64_t w = 0; w < (nbits + 63) / 64; ++w) unique += gp_popcount64(bitmap[allocs[i].bitmap_word + w]);
        touched.push_back({allocs[i].base, touch[i].touches, touch[i].bytes, (uint32_t)unique, 0});
        touched_idx.push_back(i);
    }
    gp_alloc_touch_header th{(uint32_t)touched.size(), 0};
    out.push_back(
        Rec(GP_REC_ALLOC_TOUCH, launch_id).put(th).bytes(touched.data(), touched.size() * sizeof touched[0]).finish());

    for (uint32_t i : touched_idx) {
        const uint64_t nbits = gp_alloc_pages(allocs[i].base, allocs[i].size, cfg_.page_shift);
        gp_ws_bitmap_header wh{allocs[i].base, cfg_.page_shift, (uint32_t)nbits, 0, 0};
        out.push_back(Rec(GP_REC_WS_BITMAP, launch_id)
                          .put(wh)
                          .bytes(bitmap + allocs[i].bitmap_word, (nbits + 63) / 64 * sizeof(uint64_t))
                          .finish());
    }

    if (cfg_.sample_mode != GP_SAMPLE_OFF) {
        const uint64_t n = std::min<uint64_t>(s->samples_taken, cfg_.sample_cap);
        gp_access_samples_header sh{(uint32_t)n, cfg_.sample_every, sample_drops};
        out.push_back(Rec(GP_REC_ACCESS_SAMPLES, launch_id)
                          .put(sh)
                          .bytes(at<gp_access_sample>(layout_.samples), n * sizeof(gp_access_sample))
                          .finish());
    }

    if (s->page_overflow || sample_drops) {
        gp_dropped d{0, sample_drops, s->page_overflow};
        out.push_back(Rec(GP_REC_DROPPED, launch_id).put(d).finish());
    }
    return out;
}

} // namespace gp
