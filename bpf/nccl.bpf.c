/* NCCL (libnccl.so.2) argument shapes.  Concatenated after pasta.h by
 * pasta_trace/probes/program.py.
 *
 * Every NCCL call is paired with its return (its ncclResult_t and the time
 * in the call).  The entry saves four values; a collective's fourth packs
 * datatype | op << 8 | root-or-peer << 32.  The named columns live in payload
 * slots no NCCL call uses otherwise (PT_NCCL_<COLUMN> names the slot, from
 * schema.NCCL_SLOTS).  Signatures, nccl.h (arguments 7+ at [sp+8], ...):
 *
 *   AllReduce, ReduceScatter (send, recv, count, dt, op, comm, [stream])
 *   Reduce                   (send, recv, count, dt, op, root, [comm, stream])
 *   Broadcast, Gather, Scatter (send, recv, count, dt, root, comm, [stream])
 *   AllGather, AlltoAll      (send, recv, count, dt, comm, stream)
 *   Send, Recv               (buff, count, dt, peer, comm, stream)
 *   CommInitRank(Config)     (comm *out, nranks, ncclUniqueId id, rank[, config]):
 *                            the 128-byte id is passed by value in memory, at
 *                            [sp+8], and uses no register: rank is the 3rd
 */

/* Per process, its communicators' handles and comm_ids, for the
 * communicators split from them.  Keyed by the process, not the handle: a
 * handle is an address, which another process (or this one after
 * ncclCommDestroy) may hold for another communicator; the process's exit (or
 * exec) drops its entry in one delete (discover.bpf.c), and a destroyed
 * communicator frees its slot.  A communicator the table cannot hold
 * (PT_NCCL_IDS_MAX processes, or PT_NCCL_COMMS communicators of one process)
 * is counted in lost[PT_LOST_COMM_IDS]: those split from it get no comm_id. */
#define PT_NCCL_COMMS 32
struct pt_nccl_comms {
    u64 handle[PT_NCCL_COMMS];
    u64 id[PT_NCCL_COMMS]; /* pasta.h pt_slot_*: handle 0 is never looked up */
};
BPF_HASH(pt_nccl_ids, u32, struct pt_nccl_comms, PT_NCCL_IDS_MAX);
BPF_ARRAY(pt_nccl_empty, struct pt_nccl_comms, 1); /* a new entry's value (too large for the stack), never written */

/* Remember comm_id (not 0) of the process's communicator h. */
static __always_inline void pt_nccl_remember(u32 pid, u64 h, u64 comm_id)
{
    u32 z = 0;
    struct pt_nccl_comms *init = pt_nccl_empty.lookup(&z);
    struct pt_nccl_comms *c = init ? pt_nccl_ids.lookup_or_try_init(&pid, init) : 0;
    if (!c || pt_slot_set(c->handle, c->id, PT_NCCL_COMMS, h, comm_id) < 0)
        pt_lost(PT_LOST_COMM_IDS);
}

/* The process's communicator h was destroyed: its handle may name another one next. */
static __always_inline void pt_nccl_forget(u32 pid, u64 h)
{
    struct pt_nccl_comms *c = pt_nccl_ids.lookup(&pid);
    if (c)
        pt_slot_clear(c->handle, c->id, PT_NCCL_COMMS, h);
}

/* The process exited or exec'd. */
static __always_inline void pt_nccl_gone(u32 pid)
{
    pt_nccl_ids.delete(&pid);
}

/* comm_id of the process's communicator h; 0: not known */
static __always_inline u64 pt_nccl_lookup(u32 pid, u64 h)
{
    struct pt_nccl_comms *c = pt_nccl_ids.lookup(&pid);
    return c && h ? pt_slot_get(c->handle, c->id, PT_NCCL_COMMS, h) : 0;
}

#define PT_NCCL_PACK(dt, op, rp) \
    ((u64)(u8)(dt) | ((u64)((u32)(op) & 0xFFFFFF) << 8) | ((u64)(u32)(rp) << 32))

static __always_inline u64 pt_stack_arg(struct pt_regs *ctx, int i)
{
    u64 v = 0;
    bpf_probe_read_user(&v, sizeof(v), (void *)(PT_REGS_SP(ctx) + 8 + 8 * i));
    return v;
}

/* schema.nccl_comm_id: FNV-1a over the id's 16 words; 0 if unreadable */
static __always_inline u64 pt_nccl_id_hash(u64 addr)
{
    u64 w[16];
    if (bpf_probe_read_user(w, sizeof(w), (void *)addr))
        return 0;
    u64 h = PT_NCCL_FNV_OFFSET;
#pragma unroll
    for (int i = 0; i < 16; i++)
        h = (h ^ w[i]) * PT_NCCL_FNV_PRIME;
    return h;
}

/* a0 = count, a1 = comm, a2 = stream, a3 = PT_NCCL_PACK; `with` says which
 * of op, root and peer the call has (PT_V_OP | PT_V_ROOT | PT_V_PEER) */
static __always_inline void pt_nccl_coll(struct pt_event *e, struct pt_frame *in, u32 with)
{
    u32 dt = (u8)in->a[3];
    e->PT_NCCL_COUNT = in->a[0];
    e->PT_NCCL_COMMUNICATOR = in->a[1];
    e->stream = in->a[2];
    e->PT_NCCL_DATATYPE = dt;
    e->valid = PT_V_COUNT | PT_V_DATATYPE | PT_V_COMMUNICATOR | PT_V_STREAM | with;
    if (with & PT_V_OP)
        e->PT_NCCL_OP = (in->a[3] >> 8) & 0xFFFFFF;
    if (with & PT_V_ROOT)
        e->PT_NCCL_ROOT = in->a[3] >> 32;
    if (with & PT_V_PEER)
        e->PT_NCCL_PEER = in->a[3] >> 32;
    if (dt < PT_NCCL_NUM_TYPES) {
        e->size = in->a[0] * ((PT_NCCL_ELEM_SIZES >> (dt * 4)) & 0xF);
        e->valid |= PT_V_SIZE;
    }
}

#define PT_H_NCCL_REDUCE_OP(name, id, kind, arg)                                \
    PT_PAIR(name, id, kind, PT_P3, PT_P6, pt_stack_arg(ctx, 0), PT_NCCL_PACK(PT_P4, PT_P5, 0), \
            pt_nccl_coll(E, &IN, PT_V_OP))

#define PT_H_NCCL_REDUCE_ROOT(name, id, kind, arg)                              \
    PT_PAIR(name, id, kind, PT_P3, pt_stack_arg(ctx, 0), pt_stack_arg(ctx, 1),  \
            PT_NCCL_PACK(PT_P4, PT_P5, PT_P6), pt_nccl_coll(E, &IN, PT_V_OP | PT_V_ROOT))

#define PT_H_NCCL_ROOT(name, id, kind, arg)                                     \
    PT_PAIR(name, id, kind, PT_P3, PT_P6, pt_stack_arg(ctx, 0), PT_NCCL_PACK(PT_P4, 0, PT_P5), \
            pt_nccl_coll(E, &IN, PT_V_ROOT))

#define PT_H_NCCL_GATHER(name, id, kind, arg)                                   \
    PT_PAIR(name, id, kind, PT_P3, PT_P5, PT_P6, PT_NCCL_PACK(PT_P4, 0, 0), pt_nccl_coll(E, &IN, 0))

#define PT_H_NCCL_P2P(name, id, kind, arg)                                      \
    PT_PAIR(name, id, kind, PT_P2, PT_P5, PT_P6, PT_NCCL_PACK(PT_P3, 0, PT_P4), \
            pt_nccl_coll(E, &IN, PT_V_PEER))

/* GroupStart, GroupEnd: the return code and the time in the call */
#define PT_H_NCCL_NONE(name, id, kind, arg) PT_PAIR(name, id, kind, 0, 0, 0, 0, {})

/* (comm): Finalize, Destroy, Abort.  Destroy and Abort (the ninth letter of
 * the name, a constant the compiler folds) free the communicator, whatever
 * they return: its handle may be another's next. */
#define PT_H_NCCL_COMM(name, id, kind, arg)                                     \
    PT_PAIR(name, id, kind, PT_P1, 0, 0, 0, {                                  \
        E->PT_NCCL_COMMUNICATOR = IN.a[0];                                     \
        E->valid = PT_V_COMMUNICATOR;                                          \
        if (#name[8] == 'D' || #name[8] == 'A')                                \
            pt_nccl_forget(E->pid, IN.a[0]);                                   \
    })

/* a new communicator: its handle (read from *out when the call succeeded),
 * remembered with its comm_id for the communicators split from it */
static __always_inline void pt_nccl_made(struct pt_event *e, u64 out, u64 comm_id, int with_id)
{
    u64 h;
    if (!pt_read_out(e, out, &h)) {
        e->PT_NCCL_COMMUNICATOR = h;
        e->valid |= PT_V_COMMUNICATOR;
        if (with_id)
            pt_nccl_remember(e->pid, h, comm_id);
    }
    if (with_id) {
        e->PT_NCCL_COMM_ID = comm_id;
        e->valid |= PT_V_COMM_ID;
    }
}

#define PT_H_NCCL_INIT_RANK(name, id, kind, arg)                                \
    PT_PAIR(name, id, kind, PT_P1, PT_P2, PT_P3, pt_nccl_id_hash(PT_REGS_SP(ctx) + 8), { \
        E->PT_NCCL_NRANKS = IN.a[1];                                           \
        E->PT_NCCL_RANK = IN.a[2];                                             \
        E->valid = PT_V_NRANKS | PT_V_RANK;                                    \
        pt_nccl_made(E, IN.a[0], IN.a[3], IN.a[3] != 0);                       \
    })

/* (comm *out, ndev, devlist): one process holds every rank; communicator =
 * the first of them, nranks = ndev */
#define PT_H_NCCL_INIT_ALL(name, id, kind, arg)                                 \
    PT_PAIR(name, id, kind, PT_P1, PT_P2, 0, 0, {                              \
        E->PT_NCCL_NRANKS = IN.a[1];                                           \
        E->valid = PT_V_NRANKS;                                                \
        pt_nccl_made(E, IN.a[0], 0, 0);                                        \
    })

/* comm_id of the communicator split from `parent` with `color`: the same on
 * every rank that passed that color; 0 if the parent was made before the
 * probes were attached or not held (counted), or the rank asked for no
 * communicator (color < 0) */
static __always_inline u64 pt_nccl_split_id(u32 pid, u64 parent, int color)
{
    u64 id = pt_nccl_lookup(pid, parent);
    if (!id || color < 0)
        return 0;
    return (id ^ (u32)color) * PT_NCCL_FNV_PRIME;
}

/* (parent, color, key, comm *out, config): rank and nranks are decided
 * inside the call */
#define PT_H_NCCL_SPLIT(name, id, kind, arg)                                    \
    PT_PAIR(name, id, kind, PT_P1, PT_P2, PT_P4, 0, {                          \
        u64 cid = pt_nccl_split_id(E->pid, IN.a[0], (int)IN.a[1]);             \
        pt_nccl_made(E, IN.a[2], cid, cid != 0);                               \
    })

/* (ncclUniqueId *out): comm_id of the id it wrote */
#define PT_H_NCCL_UNIQUE_ID(name, id, kind, arg)                                \
    PT_PAIR(name, id, kind, PT_P1, 0, 0, 0, {                                  \
        if (E->ret == 0) {                                                     \
            u64 h = pt_nccl_id_hash(IN.a[0]);                                  \
            if (h) {                                                           \
                E->PT_NCCL_COMM_ID = h;                                        \
                E->valid = PT_V_COMM_ID;                                       \
            }                                                                  \
        }                                                                      \
    })

/* (int *version): aux = the version code (e.g. 23203 for 2.32.3) */
#define PT_H_NCCL_VERSION(name, id, kind, arg)                                  \
    PT_PAIR(name, id, kind, PT_P1, 0, 0, 0, {                                  \
        u64 v;                                                                 \
        if (!pt_read_out(E, IN.a[0], &v)) {                                    \
            E->aux = (u32)v;                                                   \
            E->valid = PT_V_AUX;                                               \
        }                                                                      \
    })
