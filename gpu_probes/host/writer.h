/* Device record files: the TLV format of pasta_trace/schema/ (DEV_FILE_HEADER,
 * DEV_RECORD_HEADER, payloads padded to 8 bytes).
 *
 * Driver callbacks must never wait on the disk, so producers only build a
 * record in memory and push it on a bounded lock-free MPSC queue; one writer
 * thread pops and writes.  A full queue drops the record and counts it; the
 * writer then emits a DROPPED record, so a loss is always visible in the file.
 */
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gpu_probes/record.h"

namespace gp {

/* One record being built: header + payload, padded to 8 on finish(). */
class Rec {
  public:
    Rec(uint16_t type, uint64_t launch_id);
    template <typename T> Rec &put(const T &v) { return bytes(&v, sizeof v); }
    Rec &bytes(const void *p, size_t n);
    /* Pads, fills total_len and hands the buffer over. */
    std::vector<uint8_t> finish();

  private:
    std::vector<uint8_t> buf_;
};

struct Clocks {
    uint64_t mono_open, real_open, mono_after;
    static Clocks now();
};

uint64_t mono_ns();

/* Bounded multi-producer single-consumer queue of records (Vyukov's bounded
 * queue): push never blocks and never allocates beyond the record itself. */
class RecordQueue {
  public:
    explicit RecordQueue(size_t capacity_pow2);
    ~RecordQueue();
    bool push(std::vector<uint8_t> *rec);
    std::vector<uint8_t> *pop();

  private:
    struct Cell {
        std::atomic<size_t> seq;
        std::vector<uint8_t> *rec;
    };
    std::vector<Cell> cells_;
    size_t mask_;
    alignas(64) std::atomic<size_t> head_{0};
    alignas(64) std::atomic<size_t> tail_{0};
};

class Writer {
  public:
    struct Options {
        uint32_t backend = GP_BACKEND_SANITIZER;
        uint32_t page_shift = 16;
        uint32_t device_count = 0;
        uint64_t pid = 0;
        size_t queue_capacity = 1 << 14; /* records; rounded up to a power of two */
        bool writer_thread = true;       /* false: records wait in the queue until close() (tests) */
    };

    /* Opens `path` (truncating) and writes the file header; nullptr + *err on failure. */
    static std::unique_ptr<Writer> open(const std::string &path, const Options &opt, const Clocks &clocks,
                                        std::string *err);
    ~Writer();

    /* Never blocks.  Returns false when the queue was full (the record is counted as dropped). */
    bool submit(Rec &rec); /* consumes rec */
    bool submit(std::vector<uint8_t> &&rec);

    /* Drains the queue, writes a final DROPPED record if anything was lost, closes the file;
     * with remove_if_empty, a file that never got a record (its header only) is removed. */
    void close(bool remove_if_empty = false);

    uint64_t dropped() const { return dropped_.load(std::memory_order_relaxed); }
    const std::string &path() const { return path_; }

  private:
    Writer(int fd, std::string path, size_t capacity);
    void run();
    size_t drain(); /* records written */
    void append_dropped_delta(std::vector<uint8_t> &out);

    /* A plain descriptor, no stdio buffer: a forked child that calls exit()
     * has nothing of ours to flush a second time. */
    int fd_;
    std::string path_;
    RecordQueue q_;
    std::atomic<uint64_t> dropped_{0};
    uint64_t dropped_written_ = 0;
    /* bytes after the header (records, DROPPED included): the writer thread's,
     * then close()'s once it has joined that thread */
    uint64_t body_bytes_ = 0;
    std::atomic<bool> stop_{false};
    std::thread thread_;
    bool closed_ = false;
};

/* $GPU_PROBES_DIR/gpu_probes.<pid>.<backend>.bin ($GPU_PROBES_DIR defaults to "."). */
std::string default_path(uint64_t pid, const char *backend_name);

} // namespace gp
