"""ctypes on both CUDA libraries, the way Python code without a CUDA
extension allocates: ctypes.CDLL (RTLD_LOCAL, Python's default) of the
runtime and of the driver, each function found by dlsym on that handle.

    python3 ctypes_alloc.py rt:1G drv:512M meminfo free:0 freeall

The libraries are GG_FAKE_DIR's libcudart.so.13 and libcuda.so.1 (default:
build/fake beside this file's repository). Commands, one per argument:
    rt:SIZE     cudaMalloc into the next slot (freed with cudaFree)
    drv:SIZE    cuMemAlloc_v2 into the next slot (freed with cuMemFree_v2); the
                first one does cuInit and makes device 0's primary context current
    free:I      frees slot I; freeall: every live slot
    meminfo     cudaMemGetInfo: `meminfo free=F total=T`
Prints `CMD ARG: error N` on failure and `ctypes_alloc: done` at the end.
Standard library only.
"""
import ctypes
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
FAKE = os.environ.get("GG_FAKE_DIR") or os.path.join(HERE, "..", "..", "build", "fake")

UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def size(text):
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([KMGT]?)(?:i?B)?", text, re.I)
    if not m:
        sys.exit(f"ctypes_alloc: bad size: {text}")
    return int(float(m.group(1)) * UNITS[m.group(2).upper()] + 0.5)


def main(argv):
    rt = ctypes.CDLL(os.path.join(FAKE, "libcudart.so.13"))
    drv = ctypes.CDLL(os.path.join(FAKE, "libcuda.so.1"))
    rt.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
    rt.cudaFree.argtypes = [ctypes.c_void_p]
    rt.cudaMemGetInfo.argtypes = [ctypes.POINTER(ctypes.c_size_t)] * 2
    drv.cuMemAlloc_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t]
    drv.cuMemFree_v2.argtypes = [ctypes.c_uint64]
    drv.cuDevicePrimaryCtxRetain.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int]
    drv.cuCtxSetCurrent.argtypes = [ctypes.c_void_p]

    slots = []  # (api, pointer, live)
    drv_ready = []

    def driver_context():
        if drv_ready:
            return 0
        dev, ctx = ctypes.c_int(), ctypes.c_void_p()
        for call in (lambda: drv.cuInit(0), lambda: drv.cuDeviceGet(ctypes.byref(dev), 0),
                     lambda: drv.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev.value),
                     lambda: drv.cuCtxSetCurrent(ctx)):
            r = call()
            if r:
                return r
        drv_ready.append(True)
        return 0

    def free(i):
        if i >= len(slots):
            print(f"free {i}: no such slot")
            return
        api, p, _ = slots[i]
        r = rt.cudaFree(p) if api == "rt" else drv.cuMemFree_v2(p)
        slots[i] = (api, p, False)
        if r:
            print(f"free {i}: error {r}")

    for cmd in argv:
        name, _, arg = cmd.partition(":")
        if name == "rt" and arg:
            p = ctypes.c_void_p()
            r = rt.cudaMalloc(ctypes.byref(p), size(arg))
            slots.append(("rt", p.value, r == 0))
        elif name == "drv" and arg:
            p = ctypes.c_uint64()
            r = driver_context() or drv.cuMemAlloc_v2(ctypes.byref(p), size(arg))
            slots.append(("drv", p.value, r == 0))
        elif name == "free" and arg:
            free(int(arg))
            continue
        elif name == "freeall":
            for i, (_, _, live) in enumerate(slots):
                if live:
                    free(i)
            continue
        elif name == "meminfo":
            f, t = ctypes.c_size_t(), ctypes.c_size_t()
            r = rt.cudaMemGetInfo(ctypes.byref(f), ctypes.byref(t))
            print(f"meminfo: error {r}" if r else f"meminfo free={f.value} total={t.value}")
            continue
        else:
            sys.exit(f"ctypes_alloc: unknown command: {cmd}")
        if r:
            print(f"{name} {arg}: error {r}")
    print("ctypes_alloc: done")


if __name__ == "__main__":
    main(sys.argv[1:])
