/* CUDA driver (libcuda.so.1) argument shapes that only the driver has.
 * Concatenated after pasta.h by pasta_trace/probes/program.py; the struct
 * offsets (PT_OFF_*) come from pasta_trace/probes/offsets.py. */

/* Pointer of one side of a CUDA_MEMCPY2D/3D, chosen by its CUmemorytype. */
static __always_inline u64 pt_cu_side(u32 mt, u64 host, u64 dev, u64 arr)
{
    if (mt == PT_CU_MEMORYTYPE_HOST)
        return host;
    if (mt == PT_CU_MEMORYTYPE_ARRAY)
        return arr;
    return dev;
}

static __always_inline u32 pt_cu_dir(u32 smt, u32 dmt)
{
    if (smt < PT_CU_MEMORYTYPE_HOST || smt > PT_CU_MEMORYTYPE_UNIFIED ||
        dmt < PT_CU_MEMORYTYPE_HOST || dmt > PT_CU_MEMORYTYPE_UNIFIED)
        return PT_COPY_UNKNOWN;
    if (smt == PT_CU_MEMORYTYPE_UNIFIED || dmt == PT_CU_MEMORYTYPE_UNIFIED)
        return PT_COPY_DEFAULT;
    if (smt == PT_CU_MEMORYTYPE_HOST)
        return dmt == PT_CU_MEMORYTYPE_HOST ? PT_COPY_H2H : PT_COPY_H2D;
    return dmt == PT_CU_MEMORYTYPE_HOST ? PT_COPY_D2H : PT_COPY_D2D;
}

#define PT_U32(b, off) (*(u32 *)((u8 *)(b) + (off)))
#define PT_U64(b, off) (*(u64 *)((u8 *)(b) + (off)))

/* arg: a CopyKind, or 255 = from the struct's memory types */
static __always_inline void pt_cu_copy2d(struct pt_event *e, u64 p, u32 arg)
{
    u64 b[16] = {};
    if (bpf_probe_read_user(b, sizeof(b), (void *)p))
        return;
    u32 smt = PT_U32(b, PT_OFF_M2D_SRCMEMORYTYPE), dmt = PT_U32(b, PT_OFF_M2D_DSTMEMORYTYPE);
    e->src = pt_cu_side(smt, PT_U64(b, PT_OFF_M2D_SRCHOST), PT_U64(b, PT_OFF_M2D_SRCDEVICE),
                        PT_U64(b, PT_OFF_M2D_SRCARRAY));
    e->dst = pt_cu_side(dmt, PT_U64(b, PT_OFF_M2D_DSTHOST), PT_U64(b, PT_OFF_M2D_DSTDEVICE),
                        PT_U64(b, PT_OFF_M2D_DSTARRAY));
    e->size = PT_U64(b, PT_OFF_M2D_WIDTHINBYTES) * PT_U64(b, PT_OFF_M2D_HEIGHT);
    e->copy_kind = arg == 255 ? pt_cu_dir(smt, dmt) : arg;
    e->valid |= PT_V_DST | PT_V_SRC | PT_V_SIZE | PT_V_COPY_KIND;
}

static __always_inline void pt_cu_copy3d(struct pt_event *e, u64 p, u32 arg)
{
    u64 b[25] = {};
    if (bpf_probe_read_user(b, sizeof(b), (void *)p))
        return;
    u32 smt = PT_U32(b, PT_OFF_M3D_SRCMEMORYTYPE), dmt = PT_U32(b, PT_OFF_M3D_DSTMEMORYTYPE);
    e->src = pt_cu_side(smt, PT_U64(b, PT_OFF_M3D_SRCHOST), PT_U64(b, PT_OFF_M3D_SRCDEVICE),
                        PT_U64(b, PT_OFF_M3D_SRCARRAY));
    e->dst = pt_cu_side(dmt, PT_U64(b, PT_OFF_M3D_DSTHOST), PT_U64(b, PT_OFF_M3D_DSTDEVICE),
                        PT_U64(b, PT_OFF_M3D_DSTARRAY));
    e->size = PT_U64(b, PT_OFF_M3D_WIDTHINBYTES) * PT_U64(b, PT_OFF_M3D_HEIGHT) *
              PT_U64(b, PT_OFF_M3D_DEPTH);
    e->copy_kind = arg == 255 ? pt_cu_dir(smt, dmt) : arg;
    e->valid |= PT_V_DST | PT_V_SRC | PT_V_SIZE | PT_V_COPY_KIND;
}

/* (const CUDA_MEMCPY2D *p[, stream]) */
#define PT_H_COPY_2D_CU(name, id, kind, arg) PT_ENTRY(name, id, kind, pt_cu_copy2d(E, PT_P1, arg))

#define PT_H_COPY_2D_CU_ASYNC(name, id, kind, arg)                               \
    PT_ENTRY(name, id, kind, {                                                 \
        E->stream = PT_P2;                                                     \
        E->valid = PT_V_STREAM;                                                \
        pt_cu_copy2d(E, PT_P1, arg);                                           \
    })

/* (const CUDA_MEMCPY3D(_PEER) *p[, stream]) */
#define PT_H_COPY_3D_CU(name, id, kind, arg) PT_ENTRY(name, id, kind, pt_cu_copy3d(E, PT_P1, arg))

#define PT_H_COPY_3D_CU_ASYNC(name, id, kind, arg)                               \
    PT_ENTRY(name, id, kind, {                                                 \
        E->stream = PT_P2;                                                     \
        E->valid = PT_V_STREAM;                                                \
        pt_cu_copy3d(E, PT_P1, arg);                                           \
    })

/* cuGetProcAddress(_v2)(const char *symbol, void **pfn, int cudaVersion,
 * flags[, status*]): func = *pfn, aux = cudaVersion; a name record maps the
 * returned entry point to the requested symbol. */
#define PT_H_GET_PROC_ADDRESS(name, id, kind, arg)                               \
    PT_PAIR(name, id, kind, PT_P1, PT_P2, PT_P3, 0, {                          \
        u64 fn = 0;                                                            \
        E->aux = IN.a[2];                                                      \
        E->valid = PT_V_AUX;                                                   \
        if (!pt_read_out(E, IN.a[1], &fn)) {                                   \
            E->func = fn;                                                      \
            E->valid |= PT_V_FUNC;                                             \
        }                                                                      \
        pt_name_emit(id, arg, E->ret, fn, 0, IN.a[0]);                         \
    })

/* ------------------------------------------------- initialization and devices
 * The first calls of any CUDA program: a process without a usable GPU fails
 * here (cuInit: CUDA_ERROR_NO_DEVICE, 100), so their return codes are kept.
 * Shared with the runtime's counterparts (cudaGetDeviceCount, cudaSetDevice). */

/* cuInit(unsigned flags), cudaSetDevice(int device): aux = the argument */
#define PT_H_INIT(name, id, kind, arg)                                           \
    PT_PAIR(name, id, kind, PT_P1, 0, 0, 0, {                                  \
        E->aux = (u32)IN.a[0];                                                 \
        E->valid = PT_V_AUX;                                                   \
    })

/* (int *count): aux = *count of a successful call */
#define PT_H_DEVICE_COUNT(name, id, kind, arg)                                   \
    PT_PAIR(name, id, kind, PT_P1, 0, 0, 0, {                                  \
        int n = 0;                                                             \
        if (E->ret == 0 && !bpf_probe_read_user(&n, sizeof(n), (void *)IN.a[0])) { \
            E->aux = (u32)n;                                                   \
            E->valid = PT_V_AUX;                                               \
        }                                                                      \
    })

/* cuDeviceGet(CUdevice *out, int ordinal): aux = ordinal, ptr = *out */
#define PT_H_DEVICE_GET(name, id, kind, arg)                                     \
    PT_PAIR(name, id, kind, PT_P1, PT_P2, 0, 0, {                              \
        int d = 0;                                                             \
        E->aux = (u32)IN.a[1];                                                 \
        E->valid = PT_V_AUX;                                                   \
        if (E->ret == 0 && !bpf_probe_read_user(&d, sizeof(d), (void *)IN.a[0])) { \
            E->ptr = (u32)d;                                                   \
            E->valid |= PT_V_PTR;                                              \
        }                                                                      \
    })

/* (CUcontext *out, ..., CUdevice dev, ...): ptr = the context, aux = dev, the
 * argument numbered arg (cuDevicePrimaryCtxRetain 2, cuCtxCreate(_v2) 3,
 * cuCtxCreate_v4 4, cuCtxCreate_v3 5) */
#define PT_H_CTX_CREATE(name, id, kind, arg)                                     \
    PT_PAIR(name, id, kind, PT_P1,                                             \
            arg == 2 ? PT_P2 : arg == 3 ? PT_P3 : arg == 4 ? PT_P4 : PT_P5, 0, 0, { \
        u64 c;                                                                 \
        E->aux = (u32)IN.a[1];                                                 \
        E->valid = PT_V_AUX;                                                   \
        if (!pt_read_out(E, IN.a[0], &c)) {                                    \
            E->ptr = c;                                                        \
            E->valid |= PT_V_PTR;                                              \
        }                                                                      \
    })
