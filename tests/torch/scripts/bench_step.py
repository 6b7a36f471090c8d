"""Time training steps of the model (model.py): the bench's real step.

    bench_step.py [--warmup N] [--steps N] [--history | --instrumented]

Prints RESULT times {seconds: [...], allocs_per_step} (each step's wall
time, after the warm-up, with torch.cuda.synchronize() closing every step;
the caching allocator's allocations per timed step). --history: PyTorch's
allocation history on for every other block of 10 timed steps, as
gpuguard-run's instrumentation turns it on for a forecast's step, and off
for the others; the times of the steps with it on are in `history`, of those
with it off in `seconds` (one process: the two series share its noise).
--instrumented (under gpuguard-run): gpuguard's instrumentation on for every
other block of 10 steps and taken out for the others (its optimizer hook
and backward wrapper), the steps with it on in `instrumented`.
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
    ap.add_argument("--instrumented", action="store_true")
    a = ap.parse_args()
    toggle = instrumentation_toggle() if a.instrumented else None
    torch.set_num_threads(1)  # the bench pins the run to one core: no intra-op threads
    torch.manual_seed(0)
    model = Model(dim=256, layers=2).cuda()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.randn(8, 128, 256, device="cuda")
    times, history = [], []
    allocs = 0
    on = False
    for i in range(a.warmup + a.steps):
        if i == a.warmup:
            allocs = torch.cuda.memory_stats()["allocation.all.allocated"]
        want = (a.history or toggle is not None) and i >= a.warmup and (i - a.warmup) // 10 % 2 == 1
        if want != on:  # at a step boundary, as gpuguard.torch_instrument does
            on = want
            if toggle is not None:
                toggle(on)
            else:
                torch.cuda.memory._record_memory_history(
                    enabled="all" if on else None, context="alloc", stacks="python",
                    max_entries=65536)  # HISTORY_MAX_ENTRIES
        t0 = time.perf_counter()
        loss = loss_fn(model(x))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        if i >= a.warmup:
            (history if on else times).append(time.perf_counter() - t0)
    allocs = torch.cuda.memory_stats()["allocation.all.allocated"] - allocs
    result("times", seconds=times, history=history, instrumented=history if toggle else [],
           allocs_per_step=allocs / max(1, a.steps))


def instrumentation_toggle():
    """A function that puts gpuguard's instrumentation in (True) or takes it
    out (False): its global optimizer hook and its wrapper of
    torch.autograd.backward. It starts out, so blocks alternate out, in."""
    st = getattr(sys.modules.get("gpuguard.torch_instrument"), "STATE", None)
    if st is None:
        raise SystemExit("bench_step.py --instrumented: run it under gpuguard-run")
    hooks = sys.modules["torch.optim.optimizer"]._global_optimizer_post_hooks
    ours = {k: v for k, v in hooks.items() if getattr(v, "__self__", None) is st}
    wrapper = torch.autograd.backward
    original = wrapper._gpuguard_original

    def toggle(on):
        if on:
            hooks.update(ours)
            torch.autograd.backward = wrapper
        else:
            for k in ours:
                hooks.pop(k, None)
            torch.autograd.backward = original
    toggle(False)
    return toggle


if __name__ == "__main__":
    main()
