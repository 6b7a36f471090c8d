"""Time training steps of the model (model.py): the bench's real step.

    bench_step.py [--warmup N] [--steps N] [--history] [--capture] [--batch B] [--seq T]
                  [--dim D] [--layers L]

Prints RESULT times {seconds: [...], allocs_per_step} (each step's wall
time, after the warm-up, with torch.cuda.synchronize() closing every step;
the caching allocator's allocations per timed step). --history: PyTorch's
allocation history on for every other block of 10 timed steps, as
gpuguard-run's instrumentation turns it on for a forecast's step, and off
for the others; the times of the steps with it on are in `history`, of those
with it off in `seconds` (one process: the two series share its noise).
--capture: the same blocks, for what gpuguard-run's instrumentation does at
each step to know its input and its need (gpuguard.torch_instrument's own
code: the forward pre-hook armed at the boundary, PyTorch's peak counters
read and reset, both told to the shim); the shim's step boundary in both.
Run under gpuguard-run --no-torch (the shim, no instrumentation installed).
"""
import argparse
import sys
import time

import torch

from model import Model, loss_fn, result


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--history", action="store_true")
    ap.add_argument("--capture", action="store_true")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--layers", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(1)  # the bench pins the run to one core: no intra-op threads
    torch.manual_seed(0)
    model = Model(dim=a.dim, layers=a.layers).cuda()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.randn(a.batch, a.seq, a.dim, device="cuda")
    inst = None
    if a.capture:
        from gpuguard import _native, torch_instrument
        inst = torch_instrument._Instrument(torch, _native.load())
        inst._watch_peaks()
        inst._watch_inputs()
    times, history = [], []
    allocs = 0
    on = False
    for i in range(a.warmup + a.steps):
        if i == a.warmup:
            allocs = torch.cuda.memory_stats()["allocation.all.allocated"]
        want = (a.history or a.capture) and i >= a.warmup and (i - a.warmup) // 10 % 2 == 1
        if want != on:  # at a step boundary, as gpuguard.torch_instrument does
            on = want
            if a.history:
                torch.cuda.memory._record_memory_history(
                    enabled="all" if on else None, context="alloc", stacks="python",
                    max_entries=65536)  # HISTORY_MAX_ENTRIES
            elif not on:
                inst._disarm_inputs()
        t0 = time.perf_counter()
        loss = loss_fn(model(x))
        loss.backward()
        opt.step()
        if inst is not None:
            if on:
                inst.boundary()  # the step's need told, its input hook armed again
            inst.fn_step(i + 1)  # the shim's step boundary, both ways
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        if i >= a.warmup:
            (history if on else times).append(time.perf_counter() - t0)
    allocs = torch.cuda.memory_stats()["allocation.all.allocated"] - allocs
    result("times", seconds=times, history=history, allocs_per_step=allocs / max(1, a.steps))


if __name__ == "__main__":
    main()
