/* Entry points shared by the injection libraries.  The driver calls
 * InitializeInjection from cuInit when CUDA_INJECTION64_PATH names the library
 * (the documented place to subscribe); under LD_PRELOAD nothing calls it, so a
 * constructor starts the tool instead.  `init` runs once, whichever comes first. */
#pragma once

#include <dlfcn.h>
#include <limits.h>
#include <stdlib.h>

#include <cstring>
#include <mutex>

namespace gp {

/* True when CUDA_INJECTION64_PATH names the library that contains `self`. */
inline bool loaded_as_injection(const void *self) {
    const char *inj = std::getenv("CUDA_INJECTION64_PATH");
    Dl_info info{};
    if (!inj || !*inj || !dladdr(self, &info) || !info.dli_fname) return false;
    char a[PATH_MAX], b[PATH_MAX];
    return realpath(inj, a) && realpath(info.dli_fname, b) && std::strcmp(a, b) == 0;
}

} // namespace gp

/* Defines InitializeInjection (returning init()'s result) and the LD_PRELOAD
 * constructor around `int init()`. */
#define GP_INJECTION_ENTRY_POINTS(init)                                                 \
    namespace {                                                                       \
    int gp_init_once() {                                                              \
        static std::once_flag once;                                                   \
        static int rc = 0;                                                            \
        std::call_once(once, [] { rc = init(); });                                    \
        return rc;                                                                    \
    }                                                                                 \
    __attribute__((constructor)) void gp_preload_init() {                             \
        if (!gp::loaded_as_injection((const void *)&gp_init_once)) gp_init_once();    \
    }                                                                                 \
    }                                                                                 \
    extern "C" __attribute__((visibility("default"))) int InitializeInjection() { return gp_init_once(); }
