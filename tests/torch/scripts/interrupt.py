"""grow.py's training, interrupted by a signal the process sends itself
while PyTorch's memory_stats runs for the Nth time: at step N's first near
miss, what gpuguard-run's instrumentation calls to read PyTorch's view.
Without gpuguard nothing calls it; --self has the program call it once a
step itself, at the same point of the step, for the comparison.

    interrupt.py --signal INT|TERM --at N [--self] [grow.py's options]

SIGTERM has a handler that calls sys.exit(3), as a job's clean shutdown
does; SIGINT is Python's own (KeyboardInterrupt). Prints grow.py's RESULT
lines, and RESULT stopped {how} when a KeyboardInterrupt reaches the
program (exit status 5).
"""
import argparse
import os
import signal
import sys

import torch

import model

ap = argparse.ArgumentParser()
ap.add_argument("--signal", choices=("INT", "TERM"), required=True)
ap.add_argument("--at", type=int, required=True)
ap.add_argument("--self", dest="by_itself", action="store_true")
a, rest = ap.parse_known_args()
sig = {"INT": signal.SIGINT, "TERM": signal.SIGTERM}[a.signal]
if sig == signal.SIGTERM:
    signal.signal(signal.SIGTERM, lambda s, f: sys.exit(3))

calls = [0]
memory_stats, randn = torch.cuda.memory_stats, torch.randn


def stats(*args, **kw):
    calls[0] += 1
    if calls[0] == a.at:
        os.kill(os.getpid(), sig)
        for _ in range(300000):  # Python runs on: a handler may run here
            pass
    return memory_stats(*args, **kw)


def step_input(*args, **kw):
    torch.cuda.empty_cache()  # each step allocates from the device again: a near miss each
    x = randn(*args, **kw)  # the step's first allocation: its first near miss
    if a.by_itself:
        torch.cuda.memory_stats()
    return x


torch.cuda.memory_stats = stats
torch.randn = step_input
import grow  # noqa: E402

sys.argv = [sys.argv[0]] + rest
try:
    grow.main()
except KeyboardInterrupt:
    model.result("stopped", how="KeyboardInterrupt")
    sys.exit(5)
