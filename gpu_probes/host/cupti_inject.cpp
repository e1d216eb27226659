/* CUPTI injection library: libgpu_probes_cupti.so, for programs that are not
 * Python (Python programs use pasta_trace's cupti-python collector).
 *
 * Load with CUDA_INJECTION64_PATH=<lib> (the driver calls InitializeInjection)
 * or LD_PRELOAD=<lib>.  It asks CUPTI for kernel, memcpy and memset activity,
 * with every timestamp taken by our callback from CLOCK_MONOTONIC, the clock of
 * the eBPF host events, so no fitting is needed to line them up.  Completed
 * activity buffers arrive on a CUPTI thread; records go through the same
 * writer as the other backends: $GPU_PROBES_DIR/gpu_probes.<pid>.cupti.bin.
 *
 * A running process gets it from `pasta-trace -p PID --device cupti`, which
 * loads it with dlopen through ptrace (pasta_trace/device/attach/) and calls
 * gp_cupti_attach_start at the attach and gp_cupti_attach_stop at the end of
 * the capture; the library then stays loaded and inert.
 */
#include <cupti.h>
#include <dlfcn.h>
#include <errno.h>
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
    /* held by buffer_completed and by the attach stop's close: CUPTI's buffer
     * thread never writes into a closed writer */
    std::mutex live;
    bool closed = false;
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
    Tool *tp = g_tool;
    if (!tp || (uint64_t)getpid() != tp->pid) {
        std::free(buffer);
        return;
    }
    Tool &t = *tp;
    std::lock_guard<std::mutex> live(t.live);
    if (t.closed) {
        std::free(buffer);
        return;
    }
    CUpti_Activity *a = nullptr;
    while (cuptiActivityGetNextRecord(buffer, valid, &a) == CUPTI_SUCCESS) {
        if (a->kind == CUPTI_ACTIVITY_KIND_KERNEL || a->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) {
            const auto *k = reinterpret_cast<const CUpti_ActivityKernel10 *>(a);
            /* graphId/graphNodeId: 0 unless a graph launch ran it; such a kernel
             * carries the correlation id of the graph launch call, which is how the
             * merge joins it to the host's cuGraphLaunch/cudaGraphLaunch */
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
                              (uint32_t)k->blockZ,
                              k->graphNodeId,
                              k->graphId,
                              0};
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
    Tool *t = g_tool;
    if (!t || (uint64_t)getpid() != t->pid) return;
    cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    std::lock_guard<std::mutex> live(t->live);
    t->closed = true;
    t->writer->close();
}

/* True when LD_PRELOAD names this library.  Loaded by neither variable, it was
 * loaded by dlopen (pasta-trace's attach): its constructor must not record. */
bool named_in_preload() {
    const char *pre = std::getenv("LD_PRELOAD");
    Dl_info info{};
    char self[PATH_MAX];
    if (!pre || !dladdr((const void *)&named_in_preload, &info) || !info.dli_fname || !realpath(info.dli_fname, self))
        return false;
    std::string all(pre);
    size_t at = 0;
    while (at <= all.size()) {
        size_t end = all.find_first_of(": ", at);
        if (end == std::string::npos) end = all.size();
        std::string one = all.substr(at, end - at);
        char real[PATH_MAX];
        if (!one.empty() && realpath(one.c_str(), real) && std::strcmp(real, self) == 0) return true;
        at = end + 1;
    }
    return false;
}

int init() {
    if (!gp::loaded_as_injection((const void *)&init) && !named_in_preload()) return 0;
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

/* ------------------------------------------------------------------ attach
 * Called by pasta-trace in a running process, on one of its threads that
 * ptrace stopped (pasta_trace/device/attach/collector.py, which reads `out`
 * back from the target's memory).  Both save and restore errno: the thread was
 * stopped at an arbitrary point of the program. */
namespace {

struct AttachResult { /* pasta_trace/device/attach/collector.py: RESULT */
    int32_t rc;       /* GP_ATTACH_* */
    uint32_t started; /* records of the attach (start: 1 once running) */
    char message[240];
};
enum { GP_ATTACH_OK = 0, GP_ATTACH_BUSY = 1, GP_ATTACH_NO_FILE = 2, GP_ATTACH_NO_CUPTI = 3, GP_ATTACH_NOT_STARTED = 4 };

Tool *g_attached = nullptr; /* never freed: CUPTI may still hold its callbacks */

void say(AttachResult *out, int rc, const std::string &msg) {
    out->rc = rc;
    std::snprintf(out->message, sizeof out->message, "%s", msg.c_str());
}

bool ok_into(CUptiResult r, const char *what, std::string *why) {
    if (r == CUPTI_SUCCESS) return true;
    const char *s = "?";
    cuptiGetResultString(r, &s);
    *why = std::string(what) + ": " + s;
    return false;
}

} // namespace

extern "C" __attribute__((visibility("default"))) void gp_cupti_attach_start(const char *path, AttachResult *out) {
    const int saved_errno = errno;
    out->started = 0;
    if (g_tool) { /* an injection or a preload of this library already records, or an attach never stopped */
        say(out, GP_ATTACH_BUSY, "this process already runs the CUPTI collector");
        errno = saved_errno;
        return;
    }
    Tool *t = g_attached ? g_attached : new Tool();
    g_attached = t;
    t->pid = (uint64_t)getpid();
    t->names.clear();
    gp::Writer::Options o;
    o.backend = GP_BACKEND_CUPTI;
    o.pid = t->pid;
    std::string err;
    t->writer = gp::Writer::open(path, o, gp::Clocks::now(), &err);
    if (!t->writer) {
        say(out, GP_ATTACH_NO_FILE, "cannot write the device record file: " + err);
        errno = saved_errno;
        return;
    }
    t->closed = false;
    g_tool = t;
    std::string why;
    /* registering callbacks again after an earlier attach's stop is allowed: they are ours */
    if (!ok_into(cuptiActivityRegisterTimestampCallback(monotonic), "timestamp callback", &why) ||
        !ok_into(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed), "activity callbacks", &why) ||
        !ok_into(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "kernel activity", &why) ||
        !ok_into(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY), "memcpy activity", &why) ||
        !ok_into(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET), "memset activity", &why)) {
        cuptiActivityDisable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
        cuptiActivityDisable(CUPTI_ACTIVITY_KIND_MEMCPY);
        g_tool = nullptr;
        {
            std::lock_guard<std::mutex> live(t->live);
            t->closed = true;
            t->writer->close();
        }
        std::remove(t->writer->path().c_str()); /* no data will ever come: leave no empty file */
        say(out, GP_ATTACH_NO_CUPTI, "CUPTI unavailable: " + why);
        errno = saved_errno;
        return;
    }
    static bool at_exit = false; /* a process that exits while recorded flushes its records */
    if (!at_exit) at_exit = std::atexit(finish) == 0;
    out->started = 1;
    say(out, GP_ATTACH_OK, "recording");
    errno = saved_errno;
}

extern "C" __attribute__((visibility("default"))) void gp_cupti_attach_stop(AttachResult *out) {
    const int saved_errno = errno;
    Tool *t = g_attached;
    if (!t || g_tool != t) {
        say(out, GP_ATTACH_NOT_STARTED, "not recording");
        errno = saved_errno;
        return;
    }
    /* forced: the records of kernels still running are delivered too, now */
    cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    cuptiActivityDisable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
    cuptiActivityDisable(CUPTI_ACTIVITY_KIND_MEMCPY);
    cuptiActivityDisable(CUPTI_ACTIVITY_KIND_MEMSET);
    cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    {
        std::lock_guard<std::mutex> live(t->live);
        t->closed = true;
        t->writer->close();
    }
    g_tool = nullptr; /* inert: a later buffer is freed unread, a later attach may start again */
    say(out, GP_ATTACH_OK, "stopped");
    errno = saved_errno;
}
