/* HIP (libamdhip64.so) argument shapes that only HIP has.
 * Concatenated after pasta.h and cuda.bpf.c by pasta_trace/probes/program.py. */

/* hipMemcpyKind 0..4 is numbered like CopyKind h2h..default.  It is an int:
 * the upper half of its register or stack slot is not defined. */
static __always_inline u32 pt_hip_kind(u64 slot)
{
    u32 k = (u32)slot;
    return k <= PT_COPY_DEFAULT ? k : PT_COPY_UNKNOWN;
}

/* hipExtModuleLaunchKernel / hipHccModuleLaunchKernel: cuLaunchKernel's
 * registers, but sizes are total work-items: grid = global / local. */
#define PT_H_LAUNCH_HCC(name, id, kind, arg)                                     \
    PT_ENTRY(name, id, kind, {                                                 \
        u64 st[3] = {};                                                        \
        u32 lx = PT_P5;                                                        \
        u32 ly = PT_P6;                                                        \
        u32 lz = 0;                                                            \
        E->valid = PT_V_FUNC;                                                  \
        if (!pt_stack(ctx, st, sizeof(st))) {                                  \
            lz = st[0];                                                        \
            E->valid = PT_LAUNCH_V;                                            \
        }                                                                      \
        E->func = PT_P1;                                                       \
        E->grid_x = lx ? (u32)PT_P2 / lx : 0;                                  \
        E->grid_y = ly ? (u32)PT_P3 / ly : 0;                                  \
        E->grid_z = lz ? (u32)PT_P4 / lz : 0;                                  \
        E->block_x = lx;                                                       \
        E->block_y = ly;                                                       \
        E->block_z = lz;                                                       \
        E->shmem = st[1];                                                      \
        E->stream = st[2];                                                     \
    })

/* (dst, src, size, kind[, stream]) */
#define PT_H_COPY_HIP(name, id, kind, arg)                                       \
    PT_ENTRY(name, id, kind, {                                                 \
        E->dst = PT_P1;                                                        \
        E->src = PT_P2;                                                        \
        E->size = PT_P3;                                                       \
        E->copy_kind = pt_hip_kind(PT_P4);                                     \
        E->valid = PT_V_DST | PT_V_SRC | PT_V_SIZE | PT_V_COPY_KIND;           \
    })

#define PT_H_COPY_HIP_ASYNC(name, id, kind, arg)                                 \
    PT_ENTRY(name, id, kind, {                                                 \
        E->dst = PT_P1;                                                        \
        E->src = PT_P2;                                                        \
        E->size = PT_P3;                                                       \
        E->copy_kind = pt_hip_kind(PT_P4);                                     \
        E->stream = PT_P5;                                                     \
        E->valid = PT_V_DST | PT_V_SRC | PT_V_SIZE | PT_V_COPY_KIND | PT_V_STREAM; \
    })

/* (dst, dpitch, src, spitch, width, height, [kind, stream]) */
static __always_inline void pt_hip_copy2d(struct pt_regs *ctx, struct pt_event *e, int async)
{
    u64 st[2] = {};
    e->dst = PT_P1;
    e->src = PT_P3;
    e->size = PT_P5 * PT_P6;
    e->valid = PT_V_DST | PT_V_SRC | PT_V_SIZE;
    if (pt_stack(ctx, st, sizeof(st)))
        return;
    e->copy_kind = pt_hip_kind(st[0]);
    e->valid |= PT_V_COPY_KIND;
    if (async) {
        e->stream = st[1];
        e->valid |= PT_V_STREAM;
    }
}

#define PT_H_COPY_2D_HIP(name, id, kind, arg) PT_ENTRY(name, id, kind, pt_hip_copy2d(ctx, E, 0))
#define PT_H_COPY_2D_HIP_ASYNC(name, id, kind, arg) PT_ENTRY(name, id, kind, pt_hip_copy2d(ctx, E, 1))

/* (const hipMemcpy3DParms *p[, stream]): a linear side is its pitched
 * pointer, an array side its hipArray_t; size = extent w x h x d. */
static __always_inline void pt_hip_copy3d(struct pt_event *e, u64 p)
{
    u64 b[20] = {};
    if (bpf_probe_read_user(b, sizeof(b), (void *)p))
        return;
    u8 *c = (u8 *)b;
    u64 sp = *(u64 *)(c + PT_OFF_H3D_SRCPTR_PTR), dp = *(u64 *)(c + PT_OFF_H3D_DSTPTR_PTR);
    e->src = sp ? sp : *(u64 *)(c + PT_OFF_H3D_SRCARRAY);
    e->dst = dp ? dp : *(u64 *)(c + PT_OFF_H3D_DSTARRAY);
    e->size = *(u64 *)(c + PT_OFF_H3D_EXTENT_WIDTH) * *(u64 *)(c + PT_OFF_H3D_EXTENT_HEIGHT) *
              *(u64 *)(c + PT_OFF_H3D_EXTENT_DEPTH);
    e->copy_kind = pt_hip_kind(*(u32 *)(c + PT_OFF_H3D_KIND));
    e->valid |= PT_V_DST | PT_V_SRC | PT_V_SIZE | PT_V_COPY_KIND;
}

#define PT_H_COPY_3D_HIP(name, id, kind, arg) PT_ENTRY(name, id, kind, pt_hip_copy3d(E, PT_P1))

#define PT_H_COPY_3D_HIP_ASYNC(name, id, kind, arg)                              \
    PT_ENTRY(name, id, kind, {                                                 \
        E->stream = PT_P2;                                                     \
        E->valid = PT_V_STREAM;                                                \
        pt_hip_copy3d(E, PT_P1);                                               \
    })

