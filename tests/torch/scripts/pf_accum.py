"""An unmodified script with gradient accumulation by hand (no gpuguard in
it): micro-batches of a small transformer's batch, the loss divided by
their number, one optimizer step per batch; the sequence length of each
batch drawn from a long tail, as real text is.

    pf_accum.py [--batch B] [--accum K] [--seq T] [--steps N]

Prints RESULT step {step, loss, max_reserved, max_allocated} after every
optimizer step.
"""
import argparse
import random

import torch

from model import Model, loss_fn, result


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--accum", type=int, default=4)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--steps", type=int, default=20)
    a = ap.parse_args()
    torch.manual_seed(0)
    rng = random.Random(0)
    model = Model(dim=a.dim, layers=2).cuda()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    micro = a.batch // a.accum
    for step in range(1, a.steps + 1):
        # long-tailed lengths: most short, a few near the maximum
        t = min(a.seq, int(32 + rng.paretovariate(1.5) * 32))
        for k in range(a.accum):
            x = torch.randn(micro, t, a.dim).cuda()
            loss = loss_fn(model(x)) / a.accum
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        result("step", step=step, seq=t, loss=float(loss.item()),
               max_reserved=torch.cuda.max_memory_reserved(),
               max_allocated=torch.cuda.max_memory_allocated())


if __name__ == "__main__":
    main()
