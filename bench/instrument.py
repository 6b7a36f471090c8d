#!/usr/bin/env python3
"""What gpuguard-run's instrumentation of Python costs a process that never
imports torch: the interpreter's start-up (python3 -c pass, the shim
preloaded in both) with GPUGUARD_TORCH=1 (the library checks gpuguard's site
directory and puts it first on PYTHONPATH; its sitecustomize runs) against
GPUGUARD_TORCH=0, bytecode cached as an installed package has it. Runs
alternate; the figure is the median of the paired differences. A benchmark,
never a test.

    GG_BUILD=build python3 bench/instrument.py [--runs N]   (make bench runs it)
"""
import argparse
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.environ.get("GG_BUILD") or os.path.join(ROOT, "build")
if not os.path.isabs(BUILD):
    BUILD = os.path.join(ROOT, BUILD)


def once(env):
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", "pass"], env=env, check=True)
    return time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=200)
    a = ap.parse_args()
    # As installed: bytecode cached (pip and the first run write it), so
    # neither side compiles at start-up.
    base = {k: v for k, v in os.environ.items()
            if not k.startswith("GPUGUARD_") and k not in ("PYTHONDONTWRITEBYTECODE", "PYTHONPATH")}
    base["LD_PRELOAD"] = os.path.join(BUILD, "libgpuguard.so")
    without = dict(base, GPUGUARD_TORCH="0")
    within = dict(base, GPUGUARD_TORCH="1")
    for _ in range(10):  # warm the caches
        once(without), once(within)
    diffs, w0, w1 = [], [], []
    for i in range(a.runs):
        if i % 2:
            t1, t0 = once(within), once(without)
        else:
            t0, t1 = once(without), once(within)
        w0.append(t0)
        w1.append(t1)
        diffs.append(t1 - t0)
    print("python3 -c pass (%s), shim preloaded, %d runs alternated:" % (
        sys.version.split()[0], a.runs))
    print("  without the sitecustomize %.2f ms, with it (GPUGUARD_TORCH=1) %.2f ms (medians): "
          "%+.3f ms (median of paired differences)" % (
              statistics.median(w0) * 1e3, statistics.median(w1) * 1e3,
              statistics.median(diffs) * 1e3))
    return 0


if __name__ == "__main__":
    sys.exit(main())
