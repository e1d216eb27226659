/* CUPTI injection library: libgpu_probes_cupti.so, for programs that are not
 * Python (Python programs use pasta_trace's cupti-python collector).
 *
 * Load with CUDA_INJECTION64_PATH=<lib> (the driver calls InitializeInjection)
 * or LD_PRELOAD=<lib>.  It asks CUPTI for kernel, memcpy and memset activity,
 * with every timestamp taken by our callback from CLOCK_MONOTONIC, the clock of
 * the eBPF host events, so no fitting is needed to line them up.  Completed
 * activity buffers arrive on a CUPTI thread; records go through the same
 * writer as the other backends: $GPU_PROBES_DIR/gpu_probes.<pid>.cupti.bin.
 */
#include <cupti.h>
#include <dlfcn.h>
#include <limits.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "injection.h"
#include "writer.h"

namespace {

constexpr size_t kBufferSize = 8 << 20;

struct Tool {
    uint64_t pid; /* a forked child inherits this state but none of its threads: it stays out */
    std::unique_ptr<gp::Writer> writer;
    std::mutex mu; /* names, from CUPTI's buffer thread and from exit */
    std::unordered_map<std::string, uint32_t> names;
};

Tool *g_tool = nullptr;

uint64_t CUPTIAPI monotonic() { return gp::mono_ns(); }

uint32_t intern(Tool &t, const char *name) {
    std::string key = name ? name : "";
    std::lock_guard<std::mutex> lock(t.mu);
    auto it = t.names.find(key);
    if (it != t.names.end()) return it->second;
    const uint32_t id = (uint32_t)t.names.size() + 1;
    t.names.emplace(key, id);
    gp_string_header h{id, (uint32_t)key.size()};
    t.writer->submit(gp::Rec(GP_REC_STRING, 0).put(h).bytes(key.data(), key.size()));
    return id;
}

void CUPTIAPI buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records) {
    *buffer = static_cast<uint8_t *>(std::aligned_alloc(8, kBufferSize));
    *size = *buffer ? kBufferSize : 0;
    *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t *buffer, size_t, size_t valid) {
    Tool &t = *g_tool;
    if ((uint64_t)getpid() != t.pid) {
        std::free(buffer);
        return;
    }
    CUpti_Activity *a = nullptr;
    while (cuptiActivityGetNextRecord(buffer, valid, &a) == CUPTI_SUCCESS) {
        if (a->kind == CUPTI_ACTIVITY_KIND_KERNEL || a->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) {
            const auto *k = reinterpret_cast<const CUpti_ActivityKernel10 *>(a);
            gp_cupti_kernel r{k->start,
                              k->end,
                              k->gridId,
                              k->streamId,
                              k->correlationId,
                              k->deviceId,
                              intern(t, k->name),
                              (uint32_t)k->gridX,
                              (uint32_t)k->gridY,
                              (uint32_t)k->gridZ,
                              (uint32_t)k->blockX,
                              (uint32_t)k->blockY,
                              (uint32_t)k->blockZ};
            t.writer->submit(gp::Rec(GP_REC_CUPTI_KERNEL, 0).put(r));
        } else if (a->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
            const auto *m = reinterpret_cast<const CUpti_ActivityMemcpy6 *>(a);
            gp_cupti_memop r{m->start, m->end, m->bytes, m->streamId, m->correlationId, m->deviceId, m->copyKind};
            t.writer->submit(gp::Rec(GP_REC_CUPTI_MEMCPY, 0).put(r));
        } else if (a->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
            const auto *m = reinterpret_cast<const CUpti_ActivityMemset4 *>(a);
            gp_cupti_memop r{m->start, m->end, m->bytes, m->streamId, m->correlationId, m->deviceId, m->value};
            t.writer->submit(gp::Rec(GP_REC_CUPTI_MEMSET, 0).put(r));
        }
    }
    size_t dropped = 0;
    if (cuptiActivityGetNumDroppedRecords(nullptr, 0, &dropped) == CUPTI_SUCCESS && dropped) {
        gp_dropped d{dropped, 0, 0};
        t.writer->submit(gp::Rec(GP_REC_DROPPED, 0).put(d));
    }
    std::free(buffer);
}

bool ok(CUptiResult r, const char *what) {
    if (r == CUPTI_SUCCESS) return true;
    const char *s = "?";
    cuptiGetResultString(r, &s);
    std::fprintf(stderr, "gpu_probes: CUPTI unavailable: %s: %s\n", what, s);
    return false;
}

void finish() {
    if (!g_tool || (uint64_t)getpid() != g_tool->pid) return;
    cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    g_tool->writer->close();
}

int init() {
    std::unique_ptr<Tool> t(new Tool());
    t->pid = (uint64_t)getpid();
    gp::Writer::Options o;
    o.backend = GP_BACKEND_CUPTI;
    o.pid = (uint64_t)getpid();
    std::string err;
    t->writer = gp::Writer::open(gp::default_path(o.pid, "cupti"), o, gp::Clocks::now(), &err);
    if (!t->writer) {
        std::fprintf(stderr, "gpu_probes: cannot write the device record file: %s\n", err.c_str());
        return 1;
    }
    g_tool = t.get();
    if (!ok(cuptiActivityRegisterTimestampCallback(monotonic), "timestamp callback") ||
        !ok(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed), "activity callbacks") ||
        !ok(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "kernel activity") ||
        !ok(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY), "memcpy activity") ||
        !ok(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET), "memset activity")) {
        g_tool = nullptr;
        t->writer->close();
        std::remove(t->writer->path().c_str()); /* no data will ever come: leave no empty file */
        return 0;
    }
    t.release();
    std::atexit(finish);
    return 1;
}

} // namespace

/* InitializeInjection returns 1 on success, 0 when CUPTI cannot run (as NVIDIA's
 * CUPTI injection samples); either way the program runs on. */
GP_INJECTION_ENTRY_POINTS(init)
