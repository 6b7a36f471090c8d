#!/usr/bin/env python3
"""What the shim costs a real PyTorch training step: Debian's PyTorch 2.6 in
the rig (tests/torch), on the fake GPU, where a step is CPU-dispatch bound
(every kernel is a no-op) and so shows the shim's own cost, not hidden by
GPU time. A benchmark, never a test.

    GG_BUILD=build python3 bench/torch_step.py [--rounds N]   (make bench runs it)

Runs tests/torch/scripts/bench_step.py without and with the shim (observe
mode, stacks = all, the shipped default), interleaved for N rounds, and
prints the ratio of the minima of the step times (target <= 1.01). Without
the rig it says how to get one and exits 0.
"""
import argparse
import os
import statistics
import sys

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


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=60)
    opts = ap.parse_args()
    if not torchrig.rig_root():
        print("real PyTorch step: not measured, " + torchrig.HOW)
        return 0
    sess = torchrig.session()
    policy = torchrig.write_policy(sess.host_dir, "bench.ini", POLICY)
    times = {False: [], True: []}
    for _ in range(opts.rounds):
        for shim in (False, True):
            run = torchrig.run("bench_step.py", "--steps", opts.steps, preload=shim, policy=policy)
            if run.rc != 0:
                print("real PyTorch step: the run failed (exit %d):\n%s" % (run.rc, run.err[-2000:]))
                return 1
            times[shim] += run.result("times")["seconds"]
    best = {k: min(v) * 1e3 for k, v in times.items()}
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    ratio = best[True] / best[False]
    print("real PyTorch 2.6 step on the fake GPU (rig), %d rounds x %d steps, interleaved:"
          % (opts.rounds, opts.steps))
    print("  %-34s %9s %9s %7s  %s" % ("", "without", "with", "ratio", "target"))
    print("  %-34s %7.3f ms %7.3f ms %6.3fx  <= %.2f  %s" % (
        "step, minimum", best[False], best[True], ratio, TARGET,
        "PASS" if ratio <= TARGET else "MISS"))
    print("  %-34s %7.3f ms %7.3f ms %6.3fx" % ("step, median", med[False], med[True],
                                                  med[True] / med[False]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
