/* The control of scripts/gpu_check: the smallest Sanitizer tool that counts
 * global loads, written the way NVIDIA's compute-sanitizer-samples
 * (MemoryTracker) write theirs: subscribe from a static initializer, patch in
 * MODULE_LOADED from a fatbin file, hand the launch its buffer with
 * sanitizerSetCallbackData(function, buffer) at LAUNCH_BEGIN, read it back at
 * LAUNCH_END.  If this counts vecadd's loads and gpu_probes' tool does not,
 * the machine allows instrumentation and our tool is wrong; if this counts
 * nothing either, the machine (driver, permissions) is the question.
 *
 * With GP_CONTROL_TRACE=N it is also the CPU-side baseline of PASTA's
 * headline: every global access's address goes into a device buffer of N
 * entries, is copied to the host and aggregated there into 64 KiB pages,
 * where gpu_probes aggregates on the GPU.  One line per launch on stderr:
 *   gp_control: <kernel> loads=L stores=S traced=T pages=P copy_ms=C agg_ms=A
 *
 * GP_CONTROL_FATBIN: the patch fatbin (default: control_patches.fatbin next to this library). */
#include <dlfcn.h>
#include <sanitizer.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace {

struct Counters {
    unsigned long long loads, stores, traced, cap;
    unsigned long long *trace;
};

struct Launch {
    Counters *dev;
    unsigned long long *trace;
    std::string name;
};

std::mutex mu;
std::unordered_set<CUcontext> patches_added;
std::unordered_map<Sanitizer_LaunchHandle, Launch> launches;
unsigned long long trace_cap = 0;
std::string fatbin;

void report(const char *what, SanitizerResult r) {
    if (r == SANITIZER_SUCCESS) return;
    const char *s = "?";
    sanitizerGetResultString(r, &s);
    std::fprintf(stderr, "gp_control: %s failed: %s\n", what, s);
}

void module_loaded(const Sanitizer_ResourceModuleData *m) {
    std::lock_guard<std::mutex> g(mu);
    if (!patches_added.count(m->context)) {
        report("sanitizerAddPatchesFromFile", sanitizerAddPatchesFromFile(fatbin.c_str(), m->context));
        patches_added.insert(m->context);
    }
    report("sanitizerPatchInstructions",
           sanitizerPatchInstructions(SANITIZER_INSTRUCTION_GLOBAL_MEMORY_ACCESS, m->module, "gp_control_global"));
    report("sanitizerPatchModule", sanitizerPatchModule(m->module));
}

void launch_begin(const Sanitizer_LaunchData *d) {
    Launch l{nullptr, nullptr, d->functionName ? d->functionName : "?"};
    report("sanitizerAlloc", sanitizerAlloc(d->context, (void **)&l.dev, sizeof(Counters)));
    Counters h{0, 0, 0, trace_cap, nullptr};
    if (trace_cap) {
        report("sanitizerAlloc(trace)", sanitizerAlloc(d->context, (void **)&l.trace, trace_cap * 8));
        h.trace = l.trace;
        if (!l.trace) h.cap = 0;
    }
    report("sanitizerMemcpyHostToDeviceAsync", sanitizerMemcpyHostToDeviceAsync(l.dev, &h, sizeof h, d->hStream));
    report("sanitizerSetCallbackData", sanitizerSetCallbackData(d->function, l.dev));
    std::lock_guard<std::mutex> g(mu);
    launches[d->hLaunch] = l;
}

void launch_end(const Sanitizer_LaunchData *d) {
    Launch l;
    {
        std::lock_guard<std::mutex> g(mu);
        auto it = launches.find(d->hLaunch);
        if (it == launches.end()) return;
        l = it->second;
        launches.erase(it);
    }
    report("sanitizerStreamSynchronize", sanitizerStreamSynchronize(d->hStream));
    Counters h{};
    report("sanitizerMemcpyDeviceToHost", sanitizerMemcpyDeviceToHost(&h, l.dev, sizeof h, d->hStream));
    size_t pages = 0;
    double copy_ms = 0, agg_ms = 0;
    if (l.trace) {
        const unsigned long long n = h.traced < h.cap ? h.traced : h.cap;
        std::vector<unsigned long long> addrs(n);
        auto t0 = std::chrono::steady_clock::now();
        report("sanitizerMemcpyDeviceToHost(trace)",
               sanitizerMemcpyDeviceToHost(addrs.data(), l.trace, n * 8, d->hStream));
        auto t1 = std::chrono::steady_clock::now();
        std::unordered_map<unsigned long long, unsigned long long> hist; /* 64 KiB page -> accesses */
        for (unsigned long long a : addrs) ++hist[a >> 16];
        auto t2 = std::chrono::steady_clock::now();
        pages = hist.size();
        copy_ms = std::chrono::duration<double, std::milli>(t1 - t0).count();
        agg_ms = std::chrono::duration<double, std::milli>(t2 - t1).count();
        sanitizerFree(d->context, l.trace);
    }
    sanitizerFree(d->context, l.dev);
    std::fprintf(stderr, "gp_control: %s loads=%llu stores=%llu traced=%llu pages=%zu copy_ms=%.3f agg_ms=%.3f\n",
                 l.name.c_str(), h.loads, h.stores, h.traced, pages, copy_ms, agg_ms);
}

void SANITIZERAPI callback(void *, Sanitizer_CallbackDomain domain, Sanitizer_CallbackId cbid, const void *cbdata) {
    if (domain == SANITIZER_CB_DOMAIN_RESOURCE && cbid == SANITIZER_CBID_RESOURCE_MODULE_LOADED)
        module_loaded(static_cast<const Sanitizer_ResourceModuleData *>(cbdata));
    if (domain == SANITIZER_CB_DOMAIN_LAUNCH && cbid == SANITIZER_CBID_LAUNCH_BEGIN)
        launch_begin(static_cast<const Sanitizer_LaunchData *>(cbdata));
    if (domain == SANITIZER_CB_DOMAIN_LAUNCH && cbid == SANITIZER_CBID_LAUNCH_END)
        launch_end(static_cast<const Sanitizer_LaunchData *>(cbdata));
}

int init() {
    const char *f = std::getenv("GP_CONTROL_FATBIN");
    if (f && *f) {
        fatbin = f;
    } else {
        Dl_info info{};
        dladdr((const void *)&init, &info);
        std::string self = info.dli_fname ? info.dli_fname : "";
        fatbin = self.substr(0, self.rfind('/') + 1) + "control_patches.fatbin";
    }
    const char *t = std::getenv("GP_CONTROL_TRACE");
    trace_cap = t ? std::strtoull(t, nullptr, 10) : 0;
    Sanitizer_SubscriberHandle h;
    SanitizerResult r = sanitizerSubscribe(&h, callback, nullptr);
    report("sanitizerSubscribe", r);
    if (r != SANITIZER_SUCCESS) return 0;
    sanitizerEnableDomain(1, h, SANITIZER_CB_DOMAIN_RESOURCE);
    sanitizerEnableDomain(1, h, SANITIZER_CB_DOMAIN_LAUNCH);
    std::fprintf(stderr, "gp_control: subscribed, patches from %s\n", fatbin.c_str());
    return 1;
}

const int subscribed = init(); /* the samples' static initializer */

} // namespace

extern "C" __attribute__((visibility("default"))) int InitializeInjection() { return subscribed; }
