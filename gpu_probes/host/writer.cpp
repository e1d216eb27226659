#include "writer.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <ctime>

namespace gp {

static uint64_t clock_ns(clockid_t id) {
    timespec ts;
    clock_gettime(id, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t mono_ns() { return clock_ns(CLOCK_MONOTONIC); }

Clocks Clocks::now() {
    Clocks c;
    c.mono_open = clock_ns(CLOCK_MONOTONIC);
    c.real_open = clock_ns(CLOCK_REALTIME);
    c.mono_after = clock_ns(CLOCK_MONOTONIC);
    return c;
}

Rec::Rec(uint16_t type, uint64_t launch_id) {
    buf_.reserve(256);
    gp_record_header h{};
    h.type = type;
    h.launch_id = launch_id;
    bytes(&h, sizeof h);
}

Rec &Rec::bytes(const void *p, size_t n) {
    const uint8_t *b = static_cast<const uint8_t *>(p);
    buf_.insert(buf_.end(), b, b + n);
    return *this;
}

std::vector<uint8_t> Rec::finish() {
    buf_.resize((buf_.size() + 7) & ~size_t(7), 0);
    uint32_t len = (uint32_t)buf_.size();
    std::memcpy(buf_.data() + offsetof(gp_record_header, total_len), &len, sizeof len);
    return std::move(buf_);
}

static size_t pow2_at_least(size_t n) {
    size_t p = 2;
    while (p < n) p <<= 1;
    return p;
}

RecordQueue::RecordQueue(size_t capacity) : cells_(pow2_at_least(capacity)), mask_(cells_.size() - 1) {
    for (size_t i = 0; i < cells_.size(); ++i) cells_[i].seq.store(i, std::memory_order_relaxed);
}

RecordQueue::~RecordQueue() {
    while (std::vector<uint8_t> *r = pop()) delete r;
}

bool RecordQueue::push(std::vector<uint8_t> *rec) {
    size_t pos = tail_.load(std::memory_order_relaxed);
    for (;;) {
        Cell &c = cells_[pos & mask_];
        size_t seq = c.seq.load(std::memory_order_acquire);
        intptr_t diff = (intptr_t)seq - (intptr_t)pos;
        if (diff == 0) {
            if (tail_.compare_exchange_weak(pos, pos + 1, std::memory_order_relaxed)) {
                c.rec = rec;
                c.seq.store(pos + 1, std::memory_order_release);
                return true;
            }
        } else if (diff < 0) {
            return false; /* full */
        } else {
            pos = tail_.load(std::memory_order_relaxed);
        }
    }
}

std::vector<uint8_t> *RecordQueue::pop() {
    size_t pos = head_.load(std::memory_order_relaxed);
    Cell &c = cells_[pos & mask_];
    size_t seq = c.seq.load(std::memory_order_acquire);
    if ((intptr_t)seq - (intptr_t)(pos + 1) < 0) return nullptr; /* empty */
    head_.store(pos + 1, std::memory_order_relaxed);
    std::vector<uint8_t> *r = c.rec;
    c.seq.store(pos + mask_ + 1, std::memory_order_release);
    return r;
}

std::unique_ptr<Writer> Writer::open(const std::string &path, const Options &opt, const Clocks &clocks,
                                     std::string *err) {
    FILE *f = std::fopen(path.c_str(), "wb");
    if (!f) {
        if (err) *err = path + ": " + std::strerror(errno);
        return nullptr;
    }
    gp_file_header h{};
    h.magic = GP_MAGIC;
    h.ver_major = GP_VER_MAJOR;
    h.ver_minor = GP_VER_MINOR;
    h.header_size = sizeof h;
    h.pid = opt.pid;
    h.mono_open = clocks.mono_open;
    h.real_open = clocks.real_open;
    h.mono_after = clocks.mono_after;
    h.backend = opt.backend;
    h.device_count = opt.device_count;
    h.page_shift = opt.page_shift;
    if (std::fwrite(&h, sizeof h, 1, f) != 1) {
        if (err) *err = path + ": " + std::strerror(errno);
        std::fclose(f);
        return nullptr;
    }
    std::unique_ptr<Writer> w(new Writer(f, path, opt.queue_capacity));
    if (opt.writer_thread) w->thread_ = std::thread(&Writer::run, w.get());
    return w;
}

Writer::Writer(FILE *f, std::string path, size_t capacity) : f_(f), path_(std::move(path)), q_(capacity) {}

Writer::~Writer() { close(); }

bool Writer::submit(Rec &rec) { return submit(rec.finish()); }

bool Writer::submit(std::vector<uint8_t> &&rec) {
    auto *r = new std::vector<uint8_t>(std::move(rec));
    if (q_.push(r)) return true;
    delete r;
    dropped_.fetch_add(1, std::memory_order_relaxed);
    return false;
}

size_t Writer::drain() {
    size_t n = 0;
    while (std::vector<uint8_t> *r = q_.pop()) {
        std::fwrite(r->data(), 1, r->size(), f_);
        delete r;
        ++n;
    }
    write_dropped_delta();
    return n;
}

void Writer::write_dropped_delta() {
    uint64_t d = dropped_.load(std::memory_order_relaxed);
    if (d == dropped_written_) return;
    gp_dropped p{};
    p.records = d - dropped_written_;
    dropped_written_ = d;
    std::vector<uint8_t> r = Rec(GP_REC_DROPPED, 0).put(p).finish();
    std::fwrite(r.data(), 1, r.size(), f_);
}

void Writer::run() {
    /* Polling keeps producers free of any wake-up syscall: 1 ms naps while
     * records flow, up to 16 ms when idle. */
    long nap_ms = 1;
    while (!stop_.load(std::memory_order_acquire)) {
        if (drain()) {
            std::fflush(f_);
            nap_ms = 1;
        } else if (nap_ms < 16) {
            nap_ms *= 2;
        }
        const timespec nap{0, nap_ms * 1000000};
        nanosleep(&nap, nullptr);
    }
}

void Writer::close() {
    if (closed_) return;
    closed_ = true;
    stop_.store(true, std::memory_order_release);
    if (thread_.joinable()) thread_.join();
    drain();
    std::fclose(f_);
}

std::string default_path(uint64_t pid, const char *backend_name) {
    const char *dir = std::getenv("GPU_PROBES_DIR");
    std::string d = (dir && *dir) ? dir : ".";
    return d + "/gpu_probes." + std::to_string(pid) + "." + backend_name + ".bin";
}

} // namespace gp
