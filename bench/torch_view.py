#!/usr/bin/env python3
"""What gpuguard-run's instrumentation costs when it reads PyTorch's view:
at a step's first near miss, at a refusal and at an OOM (docs/costs.md).
Debian's PyTorch 2.6 in the rig (tests/torch), on the fake GPU. A benchmark,
never a test.

    GG_BUILD=build python3 bench/torch_view.py [--views N]   (make bench runs it)

Runs tests/torch/scripts/view_cost.py through gpuguard-run once per kind of
moment, the model (bench_step.py's: 2 transformer blocks, 256 wide, batch
8 x 128, Adam) trained a few steps first, and prints the median and the
range of the time each view took to read (memory_stats, the snapshot's
segments and blocks, the journal line). Without the rig it says how to get
one and exits 0.
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "torch"))

import torchrig  # noqa: E402

GiB = 1 << 30
TOTAL = 24 * GiB
POLICIES = {
    # every allocation past 8 MiB device-wide is a near miss
    "near_miss": "[gpu]\nmatch = *\n[memory]\nmode = observe\nheadroom = 1 GiB\n"
                 "near_miss = %d\n[trainer]\nsignal = none\n" % (TOTAL - GiB - (8 << 20)),
    # a 12 GiB request past the 8 GiB limit is refused
    "refused": "[gpu]\nmatch = *\n[memory]\nmode = enforce\nheadroom = 16 GiB\n"
               "[trainer]\nsignal = none\n",
    # 25 GiB past the 24 GiB device: the fake driver's own out of memory
    "oom": "[gpu]\nmatch = *\n[memory]\nmode = observe\n[trainer]\nsignal = none\n",
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--views", type=int, default=20)
    a = ap.parse_args()
    if torchrig.rig_root() is None:
        print("bench: the view's cost needs the real-PyTorch rig: " + torchrig.HOW)
        return 0
    sess = torchrig.session()
    print("PyTorch's view read by gpuguard-run's instrumentation (%d views each):" % a.views)
    for kind, text in POLICIES.items():
        d = tempfile.mkdtemp(prefix="view-", dir=sess.host_dir)
        os.chmod(d, 0o777)
        policy = torchrig.write_policy(d, kind + ".ini", text)
        argv = torchrig.command(["/usr/bin/python3", sess.dir + "/scripts/view_cost.py",
                                 "--kind", kind, "--views", str(a.views)], sess.inside(d),
                                policy=policy, gpuguard_run=[])
        proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              timeout=600)
        run = torchrig.Run(proc, d)
        if run.rc != 0:
            print("  %s: the run failed (exit %d): %s" % (kind, run.rc, run.err[-500:]))
            continue
        r = run.result("view")
        ms = r["ms"]
        if not ms:
            print("  %-9s no view read (%s)" % (kind, r.get("error", "?")))
            continue
        print("  %-9s median %.2f ms, %.2f-%.2f ms over %d views; torch lines %d" % (
            kind, statistics.median(ms), min(ms), max(ms), len(ms), len(run.of("torch"))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
