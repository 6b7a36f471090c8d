"""The measuring half of bench/run.py's Python figure: cudaMalloc+cudaFree
pairs called through ctypes from DEPTH Python frames, as a training script's
allocations are (the settings docs/costs.md measures: stacks = all, native depth 32 and
Python frames depth 50).

    python3 bench/pyloop.py LIBCUDART N DEPTH REPS

Prints one JSON line: the wall time of each of REPS repetitions of N pairs.
Run with and without LD_PRELOAD=libgpuguard.so by bench/run.py, which
subtracts. Nothing here asserts. Standard library only.
"""
import ctypes
import json
import sys
import time


def main():
    lib, n, depth, reps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    rt = ctypes.CDLL(lib)
    rt.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
    rt.cudaFree.argtypes = [ctypes.c_void_p]
    malloc, free, size = rt.cudaMalloc, rt.cudaFree, 1 << 20
    p = ctypes.c_void_p()
    ref = ctypes.byref(p)

    def loop(count):
        for _ in range(count):
            if malloc(ref, size) or free(p):
                raise SystemExit("pyloop: CUDA error")

    def deep(d, count):
        # Not a tail call in any CPython: each level keeps a frame.
        if d <= 1:
            loop(count)
        else:
            deep(d - 1, count)
        return d

    deep(depth, max(n // 10, 100))  # warm-up: context, the shim's start, first peak
    ns = []
    for _ in range(reps):
        t0 = time.perf_counter_ns()
        deep(depth, n)
        ns.append(time.perf_counter_ns() - t0)
    print(json.dumps({"mode": "pyloop", "pairs": n, "depth": depth, "ns": ns,
                      "python": "%d.%d.%d" % sys.version_info[:3]}))


if __name__ == "__main__":
    main()
