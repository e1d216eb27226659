"""For the programs that call libcuda through ctypes (nccl_one_rank.py, attach_names_child.py), imported from
their own folder: ok() ends the program on a failed call, naming it; current_context() makes GPU 0's
primary context current."""
import ctypes
import sys


def ok(what, rc):
    if rc:
        sys.exit(f"{what} returned {rc}")


def current_context(cu):
    """cuInit, then GPU 0's primary context retained and made current, through the loaded libcuda `cu`."""
    ok("cuInit", cu.cuInit(0))
    dev, ctx = ctypes.c_int(), ctypes.c_void_p()
    ok("cuDeviceGet", cu.cuDeviceGet(ctypes.byref(dev), 0))
    ok("cuDevicePrimaryCtxRetain", cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev))
    ok("cuCtxSetCurrent", cu.cuCtxSetCurrent(ctx))
