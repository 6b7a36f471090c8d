"""What shim/probe/pyframes.c costs, per CPython present (a benchmark, not a test).

  make build/tests/pyframes/libpyprobe.so
  python3 tests/pyframes/bench_pyframes.py [build/tests/pyframes/libpyprobe.so]

Under each interpreter, 50 Python frames deep (docs/costs.md), through
ctypes: the Python capture, resolution per frame from the cache, uncached
with direct reads (on the capturing thread) and with checked reads (late),
and unw_backtrace of 32 native frames with and without the Python capture.
"""
import ctypes
import glob
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEPTH = 50
ITERS = 20000


def child(probe):
    lib = ctypes.CDLL(probe)
    out = (ctypes.c_double * 7)()

    def deep(n):
        if n > 1:
            return deep(n - 1)
        return lib.pyprobe_bench(ITERS, out)
    base = len(stack())
    n = deep(DEPTH - base)
    if n <= 0:
        print("%d.%d.%d: no frames" % sys.version_info[:3])
        return
    print("%-8s %6d %11.0f %12.1f %14.0f %14.0f %14.0f %12.0f" % (
        "%d.%d.%d" % sys.version_info[:3], int(out[0]), out[1], out[2], out[3], out[4], out[5],
        out[6]))


def stack():
    f, out = sys._getframe(1), []
    while f:
        out.append(f)
        f = f.f_back
    return out


def main():
    probe = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                            os.path.join(ROOT, "build", "tests", "pyframes", "libpyprobe.so"))
    if len(sys.argv) > 2 and sys.argv[2] == "--child":
        return child(probe)
    root = os.environ.get("PYENV_ROOT") or os.path.expanduser("~/.pyenv")
    pythons, seen = [], set()
    for p in sorted(glob.glob(os.path.join(root, "versions", "3.1[0-9]*", "bin", "python3"))) + \
            ["/usr/bin/python3"]:
        if os.path.exists(p) and os.path.realpath(p) not in seen:
            seen.add(os.path.realpath(p))
            pythons.append(p)
    print("ns; Python %d frames deep, %d iterations" % (DEPTH, ITERS))
    print("%-8s %6s %11s %12s %14s %14s %14s %12s" % (
        "python", "frames", "capture", "resolve/hit", "resolve/live", "resolve/late",
        "native32+py", "native32"))
    for p in pythons:
        subprocess.run([p, os.path.abspath(__file__), probe, "--child"])


if __name__ == "__main__":
    main()
