"""CUDA tensors of many sizes (small ones share 2 MiB segments, large ones get their own), a third kept
to the end, between two torch.cuda.memory_stats() snapshots and two CLOCK_MONOTONIC stamps (the
probes' clock); writes the pid, the stamps and the counters' deltas as JSON to argv[1].

Run by scripts/gpu_check."""
import json, os, sys, time, torch
torch.empty(1, device="cuda"); torch.cuda.synchronize()
keys = ["allocation.all.allocated", "allocation.all.freed", "allocated_bytes.all.allocated",
        "allocated_bytes.all.freed"]
s0 = torch.cuda.memory_stats(); t0 = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
kept = []
for i in range(300):
    t = torch.empty((i % 23 + 1) * 4096 + 8 * i, dtype=torch.uint8, device="cuda")
    if i % 3 == 0:
        kept.append(t)
big = [torch.empty(n << 20, dtype=torch.uint8, device="cuda") for n in (3, 25, 64)]
del big, t
torch.cuda.synchronize()
t1 = time.clock_gettime_ns(time.CLOCK_MONOTONIC); s1 = torch.cuda.memory_stats()
json.dump({"pid": os.getpid(), "t0": t0, "t1": t1, "delta": {k: s1[k] - s0[k] for k in keys},
           "allocated": s1["allocated_bytes.all.current"], "reserved": s1["reserved_bytes.all.current"]},
          open(sys.argv[1], "w"))
