#!/usr/bin/env python3
"""What the shim costs a real PyTorch training step: Debian's PyTorch 2.6 in
the rig (tests/torch), on the fake GPU, where a step is CPU-dispatch bound
(every kernel is a no-op) and so shows the shim's own cost, not hidden by
GPU time. A benchmark, never a test.

    GG_BUILD=build python3 bench/torch_step.py [--rounds N] [--steps N]
                                                           (make bench runs it)

Runs tests/torch/scripts/bench_step.py without the shim, with it (observe
mode, stacks = all, the shipped defaults) and without it again, interleaved
for N rounds, each run pinned to one CPU core, and prints the ratio of the
minima of the step times (target <= 1.01) beside the ratio of the two
series without the shim: the noise floor of this machine, which a ratio
inside it cannot be told from. It also counts the calls the shim
intercepts per step (a trace of one run): the most it can add. Then the
same step under gpuguard-run against the shim without its instrumentation
(a flat run: target <= 1.01), and with PyTorch's allocation history on (as
for a forecast's step): the microseconds it adds a step and an allocation.
Without the rig it says how to get one and exits 0.
"""
import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "torch"))

import torchrig  # noqa: E402

TARGET = 1.01
POLICY = """; bench: observe, the shipped defaults otherwise (stacks = all, python = yes)
[gpu]
match = *
[memory]
mode = observe
"""


def one_run(sess, policy, shim, steps, warmup, trace=False, gpuguard_run=None, extra=()):
    """The step times (seconds) of one run, pinned to the last CPU core."""
    d = tempfile.mkdtemp(prefix="bench-", dir=sess.host_dir)
    os.chmod(d, 0o777)
    argv = torchrig.command(["/usr/bin/python3", sess.dir + "/scripts/bench_step.py",
                             "--steps", steps, "--warmup", warmup] + list(extra), sess.inside(d),
                            preload=shim, policy=policy, trace=trace, gpuguard_run=gpuguard_run)
    if shutil.which("taskset"):
        argv = ["taskset", "-c", str(os.cpu_count() - 1)] + argv
    proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          timeout=600)
    run = torchrig.Run(proc, d)
    if run.rc != 0:
        raise SystemExit("real PyTorch step: the run failed (exit %d):\n%s" % (run.rc, run.err[-2000:]))
    return run


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=200)
    opts = ap.parse_args()
    if not torchrig.rig_root():
        print("real PyTorch step: not measured, " + torchrig.HOW)
        return 0
    sess = torchrig.session()
    policy = torchrig.write_policy(sess.host_dir, "bench.ini", POLICY)
    warmup = 20
    series = {"without": [], "with": [], "without again": []}
    for _ in range(opts.rounds):
        for name in series:
            series[name] += one_run(sess, policy, name == "with", opts.steps, warmup).result("times")["seconds"]
    best = {k: min(v) * 1e3 for k, v in series.items()}
    med = {k: statistics.median(v) * 1e3 for k, v in series.items()}
    base = min(best["without"], best["without again"])
    ratio = best["with"] / base
    noise = max(best["without"], best["without again"]) / base
    traced = one_run(sess, policy, True, "10", "10", trace=True)
    with open(traced.traces[0]) as f:
        calls = sum(1 for line in f if line.split(" ", 1)[0] in ("alloc", "free", "pool", "meminfo", "map", "unmap", "release"))
    print("real PyTorch 2.6 step on the fake GPU (rig), %d rounds x %d steps, interleaved, one core:"
          % (opts.rounds, opts.steps))
    print("  %-30s %10s %10s %10s %7s  %s" % ("", "without", "with", "without", "ratio", "target"))
    print("  %-30s %7.3f ms %7.3f ms %7.3f ms %6.3fx  <= %.2f  %s" % (
        "step, minimum", best["without"], best["with"], best["without again"], ratio, TARGET,
        "PASS" if ratio <= TARGET else ("within noise" if ratio <= noise else "MISS")))
    print("  %-30s %7.3f ms %7.3f ms %7.3f ms" % ("step, median", med["without"], med["with"],
                                                  med["without again"]))
    print("  noise floor: the two series without the shim differ by %.1f%% (minima)" % ((noise - 1) * 100))
    print("  calls the shim intercepts: %d in 20 steps (with the start), %.1f a step" % (calls, calls / 20.0))
    instrumentation(sess, policy, opts.rounds, str(opts.steps), str(warmup))
    return 0


def instrumentation(sess, policy, rounds, steps, warmup):
    """gpuguard-run's instrumentation of PyTorch (docs/costs.md). A flat run:
    the same step under gpuguard-run with its instrumentation and with
    --no-torch (the shim alone), runs interleaved, the ratio of the minima
    as for the shim's own figure (its optimizer hook, backward wrapper and
    the shim's step boundaries: a flat run's whole cost). PyTorch's
    allocation history (as for a forecast's step) in blocks of 10 steps on
    and off in one process, whose two series share its noise."""
    series = {"without": [], "with": [], "without again": []}
    for _ in range(rounds):
        for name in series:
            series[name] += one_run(sess, policy, True, steps, warmup,
                                    gpuguard_run=[] if name == "with" else ["--no-torch"]
                                    ).result("times")["seconds"]
    best = {k: min(v) for k, v in series.items()}
    base = min(best["without"], best["without again"])
    ratio = best["with"] / base
    noise = max(best["without"], best["without again"]) / base
    off, on, allocs = [], [], 0
    for _ in range(rounds):
        r = one_run(sess, policy, True, steps, warmup, gpuguard_run=["--no-torch"],
                    extra=["--history"]).result("times")
        off += r["seconds"]
        on += r["history"]
        allocs = r["allocs_per_step"]

    def low(v):  # the 10th percentile: the steps the machine's own noise left alone
        return sorted(v)[len(v) // 10]
    added = (low(on) - low(off)) * 1e6  # us a step
    print("gpuguard-run's instrumentation of the same step, %d rounds x %s steps, interleaved:"
          % (rounds, steps))
    print("  %-34s %7.3f ms --no-torch, %.3f ms instrumented, %.3f ms --no-torch: %+.1f us a step, "
          "%.3fx  <= %.2f  %s" % (
              "flat run, minimum", best["without"] * 1e3, best["with"] * 1e3,
              best["without again"] * 1e3, (best["with"] - base) * 1e6, ratio, TARGET,
              "PASS" if ratio <= TARGET else ("within noise" if ratio <= noise else "MISS")))
    print("  %-34s %7.3f ms off, %.3f ms on: %+.0f us a step, %.0f allocations a step: "
          "%+.2f us an allocation  (10th percentiles; medians %.3f, %.3f ms)" % (
              "history on (a forecast's step)", low(off) * 1e3, low(on) * 1e3, added, allocs,
              added / allocs if allocs else float("nan"), statistics.median(off) * 1e3,
              statistics.median(on) * 1e3))
    # each step's input and need: the forward pre-hook armed at each
    # boundary, PyTorch's peak counters read and reset, both told to the shim
    off, on = [], []
    for _ in range(rounds):
        r = one_run(sess, policy, True, steps, warmup, gpuguard_run=["--no-torch"],
                    extra=["--capture"]).result("times")
        off += r["seconds"]
        on += r["history"]
    added = (low(on) - low(off)) * 1e6
    print("  %-34s %7.3f ms off, %.3f ms on: %+.1f us a step, %.4fx  (10th percentiles; medians "
          "%.3f, %.3f ms)" % ("each step's input and need", low(off) * 1e3, low(on) * 1e3, added,
                              low(on) / low(off), statistics.median(off) * 1e3,
                              statistics.median(on) * 1e3))


if __name__ == "__main__":
    sys.exit(main())
