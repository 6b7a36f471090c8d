#!/usr/bin/env python3
"""Record the golden traces (tests/traces/NAME.trace) with real PyTorch in the
rig: each scenario of scenarios.py run under the shim with GPUGUARD_TRACE,
then made golden by tests/traces/tracefmt.py with the run's journal.

    tests/torch/record_traces.py [NAME...]      (make torch-traces)

Needs the rig (make torch-rig) and a build ($GG_BUILD, default build/).
"""
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import torchrig  # noqa: E402
from scenarios import DEVICE, SCENARIOS  # noqa: E402,F401 (SCENARIOS: for the tests too)

TRACES = os.path.join(torchrig.ROOT, "tests", "traces")


def source():
    """What recorded it: the PyTorch package's version, from the rig's dpkg."""
    out = subprocess.run(["dpkg-query", "--admindir", os.path.join(torchrig.rig_root(), "var/lib/dpkg"),
                          "-W", "-f", "${Version}", "python3-torch-cuda"],
                         stdout=subprocess.PIPE, text=True)
    return "Debian python3-torch-cuda %s (PyTorch 2.6, CUDA 12.4) on the fake GPU of tests/torch" % (
        out.stdout.strip() or "?")


def record(name, where):
    sc = SCENARIOS[name]
    policy = torchrig.write_policy(where, name + ".ini", sc["policy"])
    run = torchrig.run(sc["script"], *sc["args"], policy=policy, devices=DEVICE, trace=True,
                       env={"PYTORCH_CUDA_ALLOC_CONF": sc["conf"]}, parent=where,
                       gpuguard_run=[] if sc.get("gpuguard_run") else None)
    if run.rc != 0 or len(run.traces) != 1 or len(run.files) != 1:
        raise SystemExit("record %s: exit %d, %d traces, %d journals\n%s" %
                         (name, run.rc, len(run.traces), len(run.files), run.err[-3000:]))
    final = [r for r in run.results if r.get("kind") == "final"]
    torch_kv = ["max_memory_reserved=%d" % final[-1]["max_reserved"]] if final else []
    return run, torch_kv


def make_golden(name, run, torch_kv, src, out):
    sc = SCENARIOS[name]
    argv = [sys.executable, os.path.join(TRACES, "tracefmt.py"), run.traces[0], run.files[0],
            "--runtime", "12", "--source", src,
            "--script", "tests/torch/scripts/%s %s" % (sc["script"], " ".join(sc["args"])),
            "--env", "PYTORCH_CUDA_ALLOC_CONF=%s" % sc["conf"], "-o", out]
    for kv in torch_kv:
        argv += ["--torch", kv]
    subprocess.run(argv, check=True)


def main():
    names = sys.argv[1:] or sorted(SCENARIOS)
    src = source()
    where = torchrig.session().host_dir
    for name in names:
        run, torch_kv = record(name, where)
        out = os.path.join(TRACES, name + ".trace")
        make_golden(name, run, torch_kv, src, out)
        with open(out) as f:
            calls = sum(1 for l in f if l and l.split(" ", 1)[0] in (
                "alloc", "free", "map", "unmap", "release", "pool", "meminfo", "lookup", "step",
                "batch", "ack", "shape", "needed"))
        print("recorded %s: %d calls" % (os.path.relpath(out, torchrig.ROOT), calls))


if __name__ == "__main__":
    main()
