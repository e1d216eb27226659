#include "writer.h"

#include <fcntl.h>
#include <unistd.h>

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

/* Whole buffer or nothing more to do: a full disk loses data, never the program. */
static bool write_all(int fd, const uint8_t *p, size_t n) {
    while (n) {
        ssize_t w = ::write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return false;
        p += w;
        n -= (size_t)w;
    }
    return true;
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
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
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
    if (!write_all(fd, reinterpret_cast<const uint8_t *>(&h), sizeof h)) {
        if (err) *err = path + ": " + std::strerror(errno);
        ::close(fd);
        return nullptr;
    }
    std::unique_ptr<Writer> w(new Writer(fd, path, opt.queue_capacity));
    if (opt.writer_thread) w->thread_ = std::thread(&Writer::run, w.get());
    return w;
}

Writer::Writer(int fd, std::string path, size_t capacity) : fd_(fd), path_(std::move(path)), q_(capacity) {}

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
    std::vector<uint8_t> out;
    size_t n = 0;
    while (std::vector<uint8_t> *r = q_.pop()) {
        out.insert(out.end(), r->begin(), r->end());
        delete r;
        ++n;
    }
    append_dropped_delta(out);
    if (!out.empty()) write_all(fd_, out.data(), out.size());
    body_bytes_ += out.size();
    return n;
}

void Writer::append_dropped_delta(std::vector<uint8_t> &out) {
    uint64_t d = dropped_.load(std::memory_order_relaxed);
    if (d == dropped_written_) return;
    gp_dropped p{};
    p.records = d - dropped_written_;
    dropped_written_ = d;
    std::vector<uint8_t> r = Rec(GP_REC_DROPPED, 0).put(p).finish();
    out.insert(out.end(), r.begin(), r.end());
}

void Writer::run() {
    /* Polling keeps producers free of any wake-up syscall: 1 ms naps while
     * records flow, up to 16 ms when idle. */
    long nap_ms = 1;
    while (!stop_.load(std::memory_order_acquire)) {
        if (drain())
            nap_ms = 1;
        else if (nap_ms < 16)
            nap_ms *= 2;
        const timespec nap{0, nap_ms * 1000000};
        nanosleep(&nap, nullptr);
    }
}

void Writer::close(bool remove_if_empty) {
    if (closed_) return;
    closed_ = true;
    stop_.store(true, std::memory_order_release);
    if (thread_.joinable()) thread_.join();
    drain();
    ::close(fd_);
    if (remove_if_empty && body_bytes_ == 0) ::unlink(path_.c_str());
}

std::string default_path(uint64_t pid, const char *backend_name) {
    const char *dir = std::getenv("GPU_PROBES_DIR");
    std::string d = (dir && *dir) ? dir : ".";
    return d + "/gpu_probes." + std::to_string(pid) + "." + backend_name + ".bin";
}

} // namespace gp
