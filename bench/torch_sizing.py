#!/usr/bin/env python3
"""What sizing each batch by its shape costs (docs/costs.md): Debian's
PyTorch 2.6 in the rig (tests/torch), on the fake GPU, where a step is
CPU-dispatch bound and so shows the helper's own cost. A benchmark, never a
test.

    GG_BUILD=build python3 bench/torch_sizing.py [--rounds N] [--batches N]
                                                            (make bench runs it)

Runs tests/torch/scripts/guard_lm.py (a small transformer language model
through Guard.run, long-tailed lengths, under gpuguard-run, a line no batch
crosses: every batch runs whole either way) with the helper sizing each
batch (size_by_shape=True) and without (False), interleaved for N rounds,
each pinned to one CPU core, and prints the ratio of the median step
times (target <= 1.01) beside the ratio of the two series without sizing
(the noise floor). Then what one prediction costs (gpuguard_predict
through ctypes, target <= 20 us) and the helper's whole sizing of a batch
(its shape, the predictions, telling the shape). Without the rig it says
how to get one and exits 0.
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

TARGET, PREDICT_TARGET = 1.01, 20e-6
POLICY = """; bench: a line no batch of the run crosses
[gpu]
match = *
[memory]
mode = auto
"""


def one_run(sess, policy, shapes, batches):
    d = tempfile.mkdtemp(prefix="bench-", dir=sess.host_dir)
    os.chmod(d, 0o777)
    argv = torchrig.command(["/usr/bin/python3", sess.dir + "/scripts/guard_lm.py", "--time",
                             "--batches", str(batches), "--shapes", shapes, "--long", ""],
                            sess.inside(d), policy=policy, gpuguard_run=[])
    if shutil.which("taskset"):
        argv = ["taskset", "-c", str(os.cpu_count() - 1)] + argv
    proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          timeout=600)
    run = torchrig.Run(proc, d)
    if run.rc != 0:
        raise SystemExit("sizing by shape: the run failed (exit %d):\n%s" % (run.rc, run.err[-2000:]))
    return run


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batches", type=int, default=60)
    opts = ap.parse_args()
    if not torchrig.rig_root():
        print("sizing by shape: not measured, " + torchrig.HOW)
        return 0
    sess = torchrig.session()
    policy = torchrig.write_policy(sess.host_dir, "sizing-bench.ini", POLICY)
    series = {"off": [], "on": [], "off again": []}
    predict = sizing = None
    for _ in range(opts.rounds):
        for name in series:
            run = one_run(sess, policy, "on" if name == "on" else "off", opts.batches)
            series[name] += run.result("times")["seconds"][5:]   # after the warm-up
            if name == "on":
                p = run.result("predict")
                predict = min(predict or p["seconds"], p["seconds"])
                sizing = min(sizing or p["sizing"], p["sizing"])
    med = {k: statistics.median(v) * 1e3 for k, v in series.items()}
    base = min(med["off"], med["off again"])
    ratio = med["on"] / base
    noise = max(med["off"], med["off again"]) / base
    print("sizing each batch by its shape: guard_lm.py through Guard.run on the fake GPU (rig), "
          "%d rounds x %d batches, interleaved, one core:" % (opts.rounds, opts.batches))
    print("  %-30s %10s %10s %10s %7s  %s" % ("", "off", "on", "off", "ratio", "target"))
    print("  %-30s %7.3f ms %7.3f ms %7.3f ms %6.3fx  <= %.2f  %s" % (
        "step, median", med["off"], med["on"], med["off again"], ratio, TARGET,
        "PASS" if ratio <= TARGET else ("within noise" if ratio <= noise else "MISS")))
    print("  noise floor: the two series without sizing differ by %.1f%% (medians)" % (
        (noise - 1) * 100))
    print("  a prediction (gpuguard_predict via ctypes): %.2f us  (target <= %.0f us)  %s" % (
        predict * 1e6, PREDICT_TARGET * 1e6, "PASS" if predict <= PREDICT_TARGET else "MISS"))
    print("  the helper's sizing of a batch (shape, predictions, telling the shape): %.2f us" % (
        sizing * 1e6))
    return 0


if __name__ == "__main__":
    sys.exit(main())
