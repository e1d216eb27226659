/* Compute Sanitizer injection library: libgpu_probes_sanitizer.so.
 *
 * Load with LD_PRELOAD=<lib> (the constructor starts it) or CUDA_INJECTION64_PATH=<lib>
 * (the driver calls InitializeInjection; on an H200 with driver 580.159.04 that way
 * died with SIGSEGV before the first callback, so pasta-trace uses LD_PRELOAD).  Per launch it binds one slot of
 * device memory (agg.cuh's gp_slot) to the launch, lets the patch functions in
 * device/san_patches.cu aggregate into it, and at LAUNCH_END copies it back
 * and queues KERNEL_SUMMARY, PAGE_HIST, ALLOC_TOUCH, WS_BITMAP, LAUNCH and
 * CLOCK_SYNC records for the writer thread.  Callbacks never touch the file.
 *
 * Mode: strict.  LAUNCH_END synchronises the launch's stream before reading
 * the slot, so launches are serialised per stream (the overhead class of
 * compute-sanitizer itself).  Slots come from a per-context pool and return to
 * it after the copy-back.
 *
 * Environment:
 *   GPU_PROBES_DIR          output directory (default: the working directory)
 *   GPU_PROBES_PAGE_SHIFT   log2 of the page size of histogram and bitmaps (default 16 = 64 KiB)
 *   GPU_PROBES_HASH_SLOTS   page-hash slots per launch, rounded up to a power of two (default 4096)
 *   GPU_PROBES_SAMPLE       off | warp:N | cta:K   raw access samples (default off)
 *   GPU_PROBES_SAMPLE_CAP   samples kept per launch (default 4096)
 *   GPU_PROBES_VERBOSE      1: log each module patched and each launch to stderr
 */
#include <dlfcn.h>
#include <limits.h>
#include <sanitizer.h>
#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "slot.h"
#include "injection.h"
#include "writer.h"

extern "C" const unsigned char gp_san_patches_fatbin[];

namespace {

struct DeviceSlot {
    void *dev = nullptr;
    size_t capacity = 0;
    uint64_t alloc_version = ~0ull;
    std::unique_ptr<gp::SlotImage> img;
};

struct Inflight {
    DeviceSlot *slot;
    CUcontext ctx;
    uint64_t launch_id;
    gp_launch rec;
};

struct Allocation {
    uint64_t size;
    uint32_t kind;
};

/* All state of the injection library.  One per process, by nature of the
 * driver's injection hook. */
struct Tool {
    uint64_t pid; /* a forked child inherits this state but none of its threads: it stays out */
    gp::SlotConfig cfg;
    std::unique_ptr<gp::Writer> writer;
    Sanitizer_SubscriberHandle sub = nullptr;
    std::atomic<uint64_t> next_launch{1};

    std::mutex mu; /* guards everything below; held for map updates only, never across I/O */
    std::map<uint64_t, Allocation> live;
    uint64_t alloc_version = 0;
    gp::AllocTable table;
    uint64_t table_version = ~0ull;
    std::unordered_map<CUcontext, std::vector<DeviceSlot *>> free_slots;
    std::unordered_map<CUcontext, std::vector<DeviceSlot *>> all_slots;
    std::unordered_map<Sanitizer_LaunchHandle, Inflight> inflight;
    std::unordered_map<std::string, uint32_t> strings;

    /* The patching API must be serialised, and it may call back (a module or
     * functions loaded): its own lock, never held with `mu`. */
    std::recursive_mutex patch_mu;
    std::unordered_map<CUcontext, bool> patches_loaded;
    std::unordered_map<CUmodule, bool> patched; /* modules instrumented (sanitizerPatchModule succeeded) */
};

Tool *g_tool = nullptr;

/* Set while this thread is inside our own callback work: any callback that our
 * sanitizerAlloc/Memcpy/Free calls trigger is ours, not the program's, and
 * must not take t.mu again. */
thread_local bool in_tool = false;

/* Set while this thread is inside a patching call: a load it triggers is
 * patched at its module's first launch instead (the API is not re-entrant). */
thread_local bool in_patching = false;

bool g_verbose = false;

#define GP_LOG(...)                                                                                                    \
    do {                                                                                                               \
        if (g_verbose) {                                                                                               \
            std::fprintf(stderr, "gpu_probes[%d]: ", (int)getpid());                                                   \
            std::fprintf(stderr, __VA_ARGS__);                                                                         \
            std::fputc('\n', stderr);                                                                                  \
        }                                                                                                              \
    } while (0)

void warn(const char *what, SanitizerResult r) {
    const char *s = "?";
    sanitizerGetResultString(r, &s);
    std::fprintf(stderr, "gpu_probes: %s failed: %s\n", what, s);
}

#define GP_TRY(call)                                                                                                   \
    ([&] {                                                                                                             \
        SanitizerResult r_ = (call);                                                                                   \
        if (r_ != SANITIZER_SUCCESS) warn(#call, r_);                                                                  \
        return r_ == SANITIZER_SUCCESS;                                                                                \
    }())

uint32_t env_u32(const char *name, uint32_t dflt) {
    const char *v = std::getenv(name);
    if (!v || !*v) return dflt;
    char *end = nullptr;
    unsigned long x = std::strtoul(v, &end, 0);
    if (*end) {
        std::fprintf(stderr, "gpu_probes: ignoring %s=%s (not a number)\n", name, v);
        return dflt;
    }
    return (uint32_t)x;
}

gp::SlotConfig config_from_env() {
    gp::SlotConfig c;
    c.page_shift = env_u32("GPU_PROBES_PAGE_SHIFT", GP_DEFAULT_PAGE_SHIFT);
    if (c.page_shift < 8 || c.page_shift > 30) c.page_shift = GP_DEFAULT_PAGE_SHIFT;
    uint32_t slots = env_u32("GPU_PROBES_HASH_SLOTS", 4096);
    c.hash_capacity = 8;
    while (c.hash_capacity < slots && c.hash_capacity < (1u << 24)) c.hash_capacity <<= 1;
    const char *s = std::getenv("GPU_PROBES_SAMPLE");
    if (s && !std::strncmp(s, "warp:", 5)) {
        c.sample_mode = GP_SAMPLE_WARP_INSTR;
        c.sample_every = (uint32_t)std::strtoul(s + 5, nullptr, 10);
    } else if (s && !std::strncmp(s, "cta:", 4)) {
        c.sample_mode = GP_SAMPLE_CTA;
        c.sample_every = (uint32_t)std::strtoul(s + 4, nullptr, 10);
    }
    if (c.sample_every == 0) c.sample_mode = GP_SAMPLE_OFF;
    c.sample_cap = c.sample_mode == GP_SAMPLE_OFF ? 0 : env_u32("GPU_PROBES_SAMPLE_CAP", 4096);
    return c;
}

uint32_t intern(Tool &t, const char *name, uint64_t launch_id) {
    if (!name) name = "";
    std::string key(name);
    uint32_t id;
    {
        std::lock_guard<std::mutex> g(t.mu);
        auto it = t.strings.find(key);
        if (it != t.strings.end()) return it->second;
        id = (uint32_t)t.strings.size() + 1;
        t.strings.emplace(key, id);
    }
    gp_string_header h{id, (uint32_t)key.size()};
    t.writer->submit(gp::Rec(GP_REC_STRING, launch_id).put(h).bytes(key.data(), key.size()));
    return id;
}

void load_patches(Tool &t, CUcontext ctx, CUmodule module, const char *why) {
    std::lock_guard<std::recursive_mutex> g(t.patch_mu);
    if (in_patching) {
        GP_LOG("%s during patching: module %p is patched at its first launch", why, (void *)module);
        return;
    }
    in_patching = true;
    bool ok = true;
    if (!t.patches_loaded[ctx]) {
        ok = GP_TRY(sanitizerAddPatches(gp_san_patches_fatbin, ctx));
        t.patches_loaded[ctx] = ok;
        GP_LOG("patches added to context %p: %s", (void *)ctx, ok ? "ok" : "FAILED");
    }
    if (ok) {
        ok = GP_TRY(sanitizerPatchInstructions(SANITIZER_INSTRUCTION_GLOBAL_MEMORY_ACCESS, module,
                                               "gp_san_global_access")) &
             GP_TRY(sanitizerPatchInstructions(SANITIZER_INSTRUCTION_SHARED_MEMORY_ACCESS, module,
                                               "gp_san_shared_access")) &
             GP_TRY(sanitizerPatchInstructions(SANITIZER_INSTRUCTION_LOCAL_MEMORY_ACCESS, module,
                                               "gp_san_local_access")) &
             GP_TRY(sanitizerPatchInstructions(SANITIZER_INSTRUCTION_BLOCK_ENTER, module, "gp_san_block_enter")) &
             GP_TRY(sanitizerPatchInstructions(SANITIZER_INSTRUCTION_BLOCK_EXIT, module, "gp_san_block_exit")) &
             GP_TRY(sanitizerPatchModule(module));
        if (ok) t.patched[module] = true;
    }
    in_patching = false;
    GP_LOG("%s: module %p of context %p patched: %s", why, (void *)module, (void *)ctx, ok ? "ok" : "FAILED");
}

/* A module launched before it was patched (its load was missed, or came
 * during patching) is patched now, before this launch runs. */
void ensure_patched(Tool &t, CUcontext ctx, CUmodule module) {
    if (!module) return;
    {
        std::lock_guard<std::recursive_mutex> g(t.patch_mu);
        if (t.patched.count(module)) return;
    }
    load_patches(t, ctx, module, "first launch of an unpatched module");
}

void on_alloc(Tool &t, int type, uint64_t addr, uint64_t size, uint32_t kind, CUcontext ctx, CUstream stream) {
    {
        std::lock_guard<std::mutex> g(t.mu);
        if (type == GP_REC_ALLOC)
            t.live[addr] = Allocation{size, kind};
        else {
            auto it = t.live.find(addr);
            if (it == t.live.end()) return;
            size = it->second.size;
            kind = it->second.kind;
            t.live.erase(it);
        }
        ++t.alloc_version;
    }
    gp_alloc a{gp::mono_ns(), addr, size, (uint64_t)(uintptr_t)ctx, (uint64_t)(uintptr_t)stream, kind, 0};
    t.writer->submit(gp::Rec((uint16_t)type, 0).put(a));
}

uint32_t alloc_kind(uint32_t cbid, uint32_t flags) {
    if (cbid == SANITIZER_CBID_RESOURCE_MEMORY_ALLOC_ASYNC) return GP_ALLOC_ASYNC;
    if (cbid == SANITIZER_CBID_RESOURCE_HOST_MEMORY_ALLOC) return GP_ALLOC_HOST;
    if (flags & SANITIZER_MEMORY_FLAG_MANAGED) return GP_ALLOC_MANAGED;
    if (flags & (SANITIZER_MEMORY_FLAG_HOST_PINNED | SANITIZER_MEMORY_FLAG_HOST_MAPPED)) return GP_ALLOC_HOST;
    return GP_ALLOC_DEVICE;
}

/* A slot sized for the current allocation table, with its image reset and
 * pointing at its device memory.  Called with t.mu held. */
DeviceSlot *take_slot(Tool &t, CUcontext ctx) {
    if (t.table_version != t.alloc_version) {
        std::vector<gp::Range> v;
        v.reserve(t.live.size());
        for (const auto &kv : t.live) v.push_back({kv.first, kv.second.size, kv.second.kind == GP_ALLOC_VIRTUAL});
        t.table = gp::AllocTable::build(std::move(v), t.cfg.page_shift);
        t.table_version = t.alloc_version;
    }
    std::vector<DeviceSlot *> &pool = t.free_slots[ctx];
    DeviceSlot *s;
    if (pool.empty()) {
        s = new DeviceSlot();
        t.all_slots[ctx].push_back(s);
    } else {
        s = pool.back();
        pool.pop_back();
    }
    if (s->alloc_version != t.table_version) {
        s->img.reset(new gp::SlotImage(t.cfg, t.table));
        s->alloc_version = t.table_version;
    }
    const size_t need = s->img->layout().total;
    if (need > s->capacity) {
        if (s->dev) sanitizerFree(ctx, s->dev);
        s->dev = nullptr;
        s->capacity = 0;
        if (!GP_TRY(sanitizerAlloc(ctx, &s->dev, need))) {
            pool.push_back(s);
            return nullptr;
        }
        s->capacity = need;
    }
    s->img->reset((uint64_t)(uintptr_t)s->dev);
    return s;
}

void on_launch_begin(Tool &t, const Sanitizer_LaunchData *d) {
    ensure_patched(t, d->context, d->module);
    const uint64_t now = gp::mono_ns();
    const uint64_t id = t.next_launch.fetch_add(1);
    DeviceSlot *slot;
    {
        std::lock_guard<std::mutex> g(t.mu);
        slot = take_slot(t, d->context);
    }
    if (!slot) return;
    /* The whole image (header, zeroed hash and counters, allocation table) in one copy. */
    if (!GP_TRY(sanitizerMemcpyHostToDeviceAsync(slot->dev, slot->img->bytes().data(), slot->img->layout().total,
                                                 d->hStream)) ||
        !GP_TRY(sanitizerSetLaunchCallbackData(d->hLaunch, d->function, d->hStream, slot->dev))) {
        std::lock_guard<std::mutex> g(t.mu);
        t.free_slots[d->context].push_back(slot);
        return;
    }
    Inflight f{slot, d->context, id, {}};
    gp_launch &r = f.rec;
    r.host_mono_begin = now;
    r.ctx = (uint64_t)(uintptr_t)d->context;
    r.stream = (uint64_t)(uintptr_t)d->stream;
    r.func = (uint64_t)(uintptr_t)d->function;
    r.grid_id = (int64_t)d->gridId;
    r.grid_x = d->gridDim_x;
    r.grid_y = d->gridDim_y;
    r.grid_z = d->gridDim_z;
    r.block_x = d->blockDim_x;
    r.block_y = d->blockDim_y;
    r.block_z = d->blockDim_z;
    r.device = (uint32_t)d->device;
    r.name_id = intern(t, d->functionName, id);
    r.tid = (uint32_t)gettid();
    GP_LOG("launch %llu begins: %s, grid %u, slot %p (%zu B, %u allocations in its table)", (unsigned long long)id,
           d->functionName ? d->functionName : "?", d->gridDim_x, slot->dev, slot->img->layout().total,
           slot->img->header()->n_allocs);
    std::lock_guard<std::mutex> g(t.mu);
    t.inflight[d->hLaunch] = f;
}

void on_launch_end(Tool &t, const Sanitizer_LaunchData *d) {
    Inflight f;
    {
        std::lock_guard<std::mutex> g(t.mu);
        auto it = t.inflight.find(d->hLaunch);
        if (it == t.inflight.end()) return;
        f = it->second;
        t.inflight.erase(it);
    }
    f.rec.host_mono_end = gp::mono_ns();
    gp::SlotImage &img = *f.slot->img;
    const bool ok = GP_TRY(sanitizerStreamSynchronize(d->hStream)) &&
                    GP_TRY(sanitizerMemcpyDeviceToHost(img.bytes().data(), f.slot->dev, img.layout().total, d->hStream));
    const uint64_t after = gp::mono_ns();
    {
        std::lock_guard<std::mutex> g(t.mu);
        t.free_slots[f.ctx].push_back(f.slot);
    }
    t.writer->submit(gp::Rec(GP_REC_LAUNCH, f.launch_id).put(f.rec));
    GP_LOG("launch %llu ended: copied back %s, blocks entered %llu, global loads %llu",
           (unsigned long long)f.launch_id, ok ? "ok" : "FAILED", (unsigned long long)img.header()->sum.blocks_in,
           (unsigned long long)img.header()->sum.gld);
    if (!ok) return;
    /* The kernel ran between the launch call and the end of the sync: a loose
     * but honest clock bracket around its first %globaltimer reading. */
    if (img.header()->sum.blocks_in) {
        gp_clock_sync cs{f.rec.host_mono_begin, img.header()->sum.gpu_t_first, after, f.rec.device, 0};
        t.writer->submit(gp::Rec(GP_REC_CLOCK_SYNC, f.launch_id).put(cs));
    }
    for (auto &r : img.records(f.launch_id)) t.writer->submit(std::move(r));
}

void on_context_destroy(Tool &t, CUcontext ctx) {
    std::lock_guard<std::mutex> g(t.mu);
    for (DeviceSlot *s : t.all_slots[ctx]) {
        if (s->dev) sanitizerFree(ctx, s->dev);
        delete s;
    }
    t.all_slots.erase(ctx);
    t.free_slots.erase(ctx);
    std::lock_guard<std::recursive_mutex> p(t.patch_mu);
    t.patches_loaded.erase(ctx);
}

void dispatch(Tool &t, Sanitizer_CallbackDomain domain, Sanitizer_CallbackId cbid, const void *cbdata) {
    if (domain == SANITIZER_CB_DOMAIN_LAUNCH) {
        const auto *d = static_cast<const Sanitizer_LaunchData *>(cbdata);
        if (cbid == SANITIZER_CBID_LAUNCH_BEGIN) on_launch_begin(t, d);
        if (cbid == SANITIZER_CBID_LAUNCH_END) on_launch_end(t, d);
        return;
    }
    if (domain != SANITIZER_CB_DOMAIN_RESOURCE) return;
    switch (cbid) {
    case SANITIZER_CBID_RESOURCE_MODULE_LOADED: {
        const auto *m = static_cast<const Sanitizer_ResourceModuleData *>(cbdata);
        load_patches(t, m->context, m->module, "module loaded");
        break;
    }
    case SANITIZER_CBID_RESOURCE_FUNCTIONS_LAZY_LOADED: {
        /* Lazy loading brings functions in after MODULE_LOADED: patch them too. */
        const auto *m = static_cast<const Sanitizer_ResourceFunctionsLazyLoadedData *>(cbdata);
        load_patches(t, m->context, m->module, "functions lazy-loaded");
        break;
    }
    case SANITIZER_CBID_RESOURCE_FUNCTIONS_LAZY_PATCHED: {
        const auto *m = static_cast<const Sanitizer_ResourceFunctionsLazyLoadedData *>(cbdata);
        GP_LOG("%u lazily loaded functions of module %p patched", m->numFunctions, (void *)m->module);
        break;
    }
    case SANITIZER_CBID_RESOURCE_MODULE_UNLOAD_STARTING: {
        const auto *m = static_cast<const Sanitizer_ResourceModuleData *>(cbdata);
        std::lock_guard<std::recursive_mutex> g(t.patch_mu);
        t.patched.erase(m->module); /* the handle may be reused by a later load */
        break;
    }
    case SANITIZER_CBID_RESOURCE_CONTEXT_DESTROY_STARTING:
        on_context_destroy(t, static_cast<const Sanitizer_ResourceContextData *>(cbdata)->context);
        break;
    case SANITIZER_CBID_RESOURCE_DEVICE_MEMORY_ALLOC:
    case SANITIZER_CBID_RESOURCE_HOST_MEMORY_ALLOC:
    case SANITIZER_CBID_RESOURCE_MEMORY_ALLOC_ASYNC: {
        const auto *m = static_cast<const Sanitizer_ResourceMemoryData *>(cbdata);
        on_alloc(t, GP_REC_ALLOC, m->address, m->size, alloc_kind(cbid, m->flags), m->context, m->stream);
        break;
    }
    case SANITIZER_CBID_RESOURCE_DEVICE_MEMORY_FREE:
    case SANITIZER_CBID_RESOURCE_HOST_MEMORY_FREE:
    case SANITIZER_CBID_RESOURCE_MEMORY_FREE_ASYNC: {
        const auto *m = static_cast<const Sanitizer_ResourceMemoryData *>(cbdata);
        on_alloc(t, GP_REC_FREE, m->address, 0, 0, m->context, m->stream);
        break;
    }
    case SANITIZER_CBID_RESOURCE_VIRTUAL_RESERVE: {
        const auto *v = static_cast<const Sanitizer_ResourceVirtualRange *>(cbdata);
        on_alloc(t, GP_REC_ALLOC, v->address, v->size, GP_ALLOC_VIRTUAL, nullptr, nullptr);
        break;
    }
    case SANITIZER_CBID_RESOURCE_VIRTUAL_RELEASE: {
        const auto *v = static_cast<const Sanitizer_ResourceVirtualRange *>(cbdata);
        on_alloc(t, GP_REC_FREE, v->address, 0, 0, nullptr, nullptr);
        break;
    }
    default:
        break;
    }
}

void SANITIZERAPI callback(void *userdata, Sanitizer_CallbackDomain domain, Sanitizer_CallbackId cbid,
                           const void *cbdata) {
    Tool &t = *static_cast<Tool *>(userdata);
    if ((uint64_t)getpid() != t.pid) return;
    /* Inside our own work, callbacks are ours (our allocations, copies), except
     * code loaded meanwhile: a module or functions loaded must be patched. */
    const bool load = domain == SANITIZER_CB_DOMAIN_RESOURCE && (cbid == SANITIZER_CBID_RESOURCE_MODULE_LOADED ||
                                                                 cbid == SANITIZER_CBID_RESOURCE_FUNCTIONS_LAZY_LOADED);
    if (in_tool && !load) return;
    if (in_tool) {
        dispatch(t, domain, cbid, cbdata);
        return;
    }
    in_tool = true;
    dispatch(t, domain, cbid, cbdata);
    in_tool = false;
}

void finish() {
    if (!g_tool || (uint64_t)getpid() != g_tool->pid) return;
    if (g_tool->sub) sanitizerUnsubscribe(g_tool->sub);
    /* Under LD_PRELOAD every process the command starts loads the library: one
     * that never reached CUDA leaves no header-only file behind. */
    g_tool->writer->close(/*remove_if_empty=*/true);
}

int init() {
    const char *v = std::getenv("GPU_PROBES_VERBOSE");
    g_verbose = v && *v && std::strcmp(v, "0") != 0;
    Tool *t = new Tool();
    t->pid = (uint64_t)getpid();
    t->cfg = config_from_env();
    gp::Writer::Options o;
    o.backend = GP_BACKEND_SANITIZER;
    o.page_shift = t->cfg.page_shift;
    o.pid = (uint64_t)getpid();
    std::string err;
    t->writer = gp::Writer::open(gp::default_path(o.pid, "sanitizer"), o, gp::Clocks::now(), &err);
    if (!t->writer) {
        std::fprintf(stderr, "gpu_probes: cannot write the device record file: %s\n", err.c_str());
        delete t;
        return 1;
    }
    if (!GP_TRY(sanitizerSubscribe(&t->sub, callback, t))) {
        t->writer->close();
        delete t;
        return 1;
    }
    sanitizerEnableDomain(1, t->sub, SANITIZER_CB_DOMAIN_RESOURCE);
    sanitizerEnableDomain(1, t->sub, SANITIZER_CB_DOMAIN_LAUNCH);
    GP_LOG("subscribed (%s)", std::getenv("CUDA_INJECTION64_PATH") ? "CUDA_INJECTION64_PATH set" : "preloaded");
    g_tool = t;
    std::atexit(finish);
    return 0;
}

} // namespace

GP_INJECTION_ENTRY_POINTS(init)
