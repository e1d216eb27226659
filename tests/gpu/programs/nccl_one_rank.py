"""A 1-rank communicator on GPU 0 through ctypes (driver API for memory, NCCL for the rest): AllReduce
of each count in argv[2:] (float32, sum, default stream) with the libnccl.so.2 at argv[1]; prints the
ncclUniqueId in hex and exits non-zero on the first failed call.

Run by scripts/gpu_check."""
import ctypes, sys
from cuda_context import current_context, ok
cu = ctypes.CDLL("libcuda.so.1")
nccl = ctypes.CDLL(sys.argv[1])
current_context(cu)
counts = [int(c) for c in sys.argv[2:]]
buf = ctypes.c_uint64()
ok("cuMemAlloc_v2", cu.cuMemAlloc_v2(ctypes.byref(buf), 4 * max(counts)))
class UniqueId(ctypes.Structure):  # passed by value to ncclCommInitRank
    _fields_ = [("internal", ctypes.c_char * 128)]
uid = UniqueId()
ok("ncclGetUniqueId", nccl.ncclGetUniqueId(ctypes.byref(uid)))
comm = ctypes.c_void_p()
ok("ncclCommInitRank", nccl.ncclCommInitRank(ctypes.byref(comm), 1, uid, 0))
for c in counts:  # float32 = 7, sum = 0, in place, default stream
    ok("ncclAllReduce", nccl.ncclAllReduce(ctypes.c_void_p(buf.value), ctypes.c_void_p(buf.value),
                                           ctypes.c_size_t(c), 7, 0, comm, None))
ok("cuCtxSynchronize", cu.cuCtxSynchronize())
ok("ncclCommDestroy", nccl.ncclCommDestroy(comm))
print("unique_id", bytes(uid).hex())
