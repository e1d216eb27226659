/* CUDA runtime (libcudart, shared or linked into the executable) argument
 * shapes.  Concatenated after pasta.h, cuda.bpf.c and hip.bpf.c by
 * pasta_trace/probes/program.py.  Its calls are "outer" calls (PT_ROLE_OUTER,
 * pt_nest in pasta.h): the driver calls they make are marked nested. */

/* Where a runtime launch came from, to name it through its host stub offline
 * (capture/naming/symbolize.py): the return address, and the one a frame up through
 * rbp.  A CUDA 13 stub built without optimization calls __cudaLaunchKernel
 * through a helper function, so [sp] is in that helper and the stub is the
 * frame above; an optimized stub inlines the helper ([sp] is in the stub);
 * a CUDA 12 stub passes itself as the function (func). */
#define PT_FRAME_MAX 65536 /* a caller's frame pointer lies this close above sp */

/* caller_fp is read once per (function, return address) on a thread (o's
 * table, pasta.h): a launch from the same place names its function the
 * same, and the read costs about a third of the launch's probe.  Later
 * launches from there leave it unset. */
static __always_inline void pt_rt_caller(struct pt_regs *ctx, struct pt_event *e, u64 ret,
                                         struct pt_outer *o)
{
    u64 up = 0, fp = PT_REGS_FP(ctx), sp = PT_REGS_SP(ctx);
    e->caller = ret;
    e->valid |= PT_V_CALLER;
    /* only where rbp can be a frame pointer: code built without one keeps
     * anything in rbp, and a read that faults costs about 1 us */
    if (!(fp > sp && fp - sp < PT_FRAME_MAX))
        return;
    u32 i = pt_fold_slot(e->func);
    if (o && o->seen[i].outer == e->func && o->seen[i].site == ret)
        return;
    if (bpf_probe_read_user(&up, sizeof(up), (void *)(fp + 8)))
        return;
    e->caller_fp = up;
    e->valid |= PT_V_CALLER_FP;
    if (!o)
        return;
    if (o->seen[i].outer != e->func) { /* the slot changes hands */
        o->seen[i].outer = e->func;
        o->seen[i].inner = 0;
    }
    o->seen[i].site = ret;
}

/* cudaLaunchKernel layout (see PT_H_LAUNCH_RT), read with the return address:
 * [sp] = return address, [sp+8] = shmem, [sp+16] = stream */
#define PT_H_LAUNCH_RT_CALLER(name, id, kind, arg)                               \
    PT_ENTRY_ALL(name, id, kind, {                                             \
        u64 st[3];                                                             \
        PT_LAUNCH_ZERO(E);                                                     \
        pt_launch_rt_regs(ctx, E);                                             \
        E->shmem = 0;                                                          \
        E->stream = 0;                                                         \
        E->valid = PT_V_FUNC | PT_V_GRID | PT_V_BLOCK;                         \
        if (!bpf_probe_read_user(st, sizeof(st), (void *)PT_REGS_SP(ctx))) {   \
            E->shmem = (u32)st[1];                                             \
            E->stream = st[2];                                                 \
            E->valid = PT_LAUNCH_V;                                            \
            pt_rt_caller(ctx, E, st[0], O);                                       \
        }                                                                      \
    })

/* cudaLaunchKernelExC(const cudaLaunchConfig_t *, const void *func, void **args) */
#define PT_H_LAUNCH_CFG_RT_CALLER(name, id, kind, arg)                           \
    PT_ENTRY(name, id, kind, {                                                 \
        u64 ret;                                                               \
        E->func = PT_P2;                                                       \
        pt_launch_cfg_rt(E, PT_P1);                                            \
        if (!bpf_probe_read_user(&ret, sizeof(ret), (void *)PT_REGS_SP(ctx)))  \
            pt_rt_caller(ctx, E, ret, O);                                         \
    })

/* cudaMemcpyKind is numbered like hipMemcpyKind: the HIP copy shapes fit.
 * (dst, src, count, kind[, stream]) and (dst, dpitch, src, spitch, width,
 * height, [kind, stream]) */
#define PT_H_COPY_RT(name, id, kind, arg) PT_H_COPY_HIP(name, id, kind, arg)
#define PT_H_COPY_RT_ASYNC(name, id, kind, arg) PT_H_COPY_HIP_ASYNC(name, id, kind, arg)
#define PT_H_COPY_2D_RT(name, id, kind, arg) PT_H_COPY_2D_HIP(name, id, kind, arg)
#define PT_H_COPY_2D_RT_ASYNC(name, id, kind, arg) PT_H_COPY_2D_HIP_ASYNC(name, id, kind, arg)

/* cudaMemcpyToSymbol(symbol, src, count, offset, kind[, stream]) and
 * cudaMemcpyFromSymbol(dst, symbol, ...): a symbol is the address of the
 * device variable's host shadow */
#define PT_H_COPY_SYMBOL(name, id, kind, arg)                                    \
    PT_ENTRY(name, id, kind, {                                                 \
        E->dst = PT_P1;                                                        \
        E->src = PT_P2;                                                        \
        E->size = PT_P3;                                                       \
        E->copy_kind = pt_hip_kind(PT_P5);                                     \
        E->valid = PT_V_DST | PT_V_SRC | PT_V_SIZE | PT_V_COPY_KIND;           \
    })

#define PT_H_COPY_SYMBOL_ASYNC(name, id, kind, arg)                              \
    PT_ENTRY(name, id, kind, {                                                 \
        E->dst = PT_P1;                                                        \
        E->src = PT_P2;                                                        \
        E->size = PT_P3;                                                       \
        E->copy_kind = pt_hip_kind(PT_P5);                                     \
        E->stream = PT_P6;                                                     \
        E->valid = PT_V_DST | PT_V_SRC | PT_V_SIZE | PT_V_COPY_KIND | PT_V_STREAM; \
    })

/* cudaGetDeviceCount(int *count), cudaSetDevice(int device): the driver's
 * shapes (cuda.bpf.c) */
#define PT_H_RT_DEVICE_COUNT(name, id, kind, arg) PT_H_DEVICE_COUNT(name, id, kind, arg)
#define PT_H_RT_SET_DEVICE(name, id, kind, arg) PT_H_INIT(name, id, kind, arg)
