"""Looks kernels up, waits for SIGUSR1 (the tracer attaches meanwhile), then launches each handle once.
argv: MODE (module: CUfunctions; library: CUkernels; mixed: both) FATBIN CARRIER_SO READY_FILE

Run by scripts/gpu_check."""
import ctypes, json, os, signal, sys, time
from cuda_context import current_context, ok
mode, fatbin, carrier, ready = sys.argv[1:5]
ctypes.CDLL(carrier)  # maps a file whose .nv_fatbin holds these kernels, as a real program's own binary does
cu = ctypes.CDLL("libcuda.so.1")
current_context(cu)
image = ctypes.create_string_buffer(open(fatbin, "rb").read())
names = [n.encode() for n in ("_Z6vecAddPKfS0_Pfi", "_Z5scaleIfEvPT_S0_i", "plain_c_kernel", "_ZN2ns5innerEPd")]
handles = []  # (handle, is_kernel)
if mode in ("module", "mixed"):
    mod = ctypes.c_void_p()
    ok("cuModuleLoadData", cu.cuModuleLoadData(ctypes.byref(mod), image))
    for n in names[: 4 if mode == "module" else 2]:
        f = ctypes.c_void_p()
        ok("cuModuleGetFunction", cu.cuModuleGetFunction(ctypes.byref(f), mod, n))
        handles.append((f.value, False))
if mode in ("library", "mixed"):
    lib = ctypes.c_void_p()
    ok("cuLibraryLoadData", cu.cuLibraryLoadData(ctypes.byref(lib), image, None, None, 0, None, None, 0))
    for n in names[0 if mode == "library" else 2:]:
        k = ctypes.c_void_p()
        ok("cuLibraryGetKernel", cu.cuLibraryGetKernel(ctypes.byref(k), lib, n))
        handles.append((k.value, True))
ref = {}
for h, is_kernel in handles:  # the driver's own answer, to compare with (545+)
    fn = getattr(cu, "cuKernelGetName" if is_kernel else "cuFuncGetName", None)
    s = ctypes.c_char_p()
    ref[hex(h)] = (s.value.decode() if fn is not None and fn(ctypes.byref(s), ctypes.c_void_p(h)) == 0
                   else None)
buf = ctypes.c_uint64()
ok("cuMemAlloc_v2", cu.cuMemAlloc_v2(ctypes.byref(buf), 4096))
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
json.dump({"pid": os.getpid(), "names": ref}, open(ready + ".tmp", "w"))
os.rename(ready + ".tmp", ready)
signal.sigwait({signal.SIGUSR1})
ptr, zero, two = ctypes.c_uint64(buf.value), ctypes.c_int(0), ctypes.c_float(2.0)
params = {  # n = 0: vecAdd and scale touch nothing; the others write the buffer
    names[0]: [ptr, ptr, ptr, zero], names[1]: [ptr, two, zero], names[2]: [ptr], names[3]: [ptr]}
for (h, _), n in zip(handles, names):
    args = (ctypes.c_void_p * len(params[n]))(*[ctypes.addressof(a) for a in params[n]])
    ok("cuLaunchKernel", cu.cuLaunchKernel(ctypes.c_void_p(h), 1, 1, 1, 32, 1, 1, 0, None, args, None))
ok("cuCtxSynchronize", cu.cuCtxSynchronize())
open(ready + ".launched", "w").close()
time.sleep(600)  # until the check ends it
