"""The injection library at argv[1] loaded as the driver loads it (dlopen, then InitializeInjection,
twice), by a process with no CUDA; prints both results.

Run by scripts/gpu_check (--dry)."""
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
print('InitializeInjection', lib.InitializeInjection(), lib.InitializeInjection())
