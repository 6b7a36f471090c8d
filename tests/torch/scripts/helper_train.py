"""The Python helper on real CUDA tensors: a run whose sequence length grows
every step, with the loader's batch fixed; the helper splits it into
micro-batches when memory runs short.

    helper_train.py [--way run|microbatches|step] [--steps N] [--batch B]
                    [--seq T] [--grow G]

--way step: a hand-written loop that calls guard.step() after the optimizer
(no splitting). Prints RESULT step {step, loader_batch, samples, split,
micro, max_reserved (PyTorch's peak of that step)} per step and RESULT done
{steps}.
"""
import argparse

import torch

import gpuguard
from model import Model, loss_fn, result


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--way", default="run")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--grow", type=int, default=64)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--shapes", default="on", choices=("on", "off"),
                    help="Guard(size_by_shape=...): off, the split follows the advice only")
    a = ap.parse_args()
    torch.manual_seed(0)
    model = Model(dim=a.dim).cuda()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    guard = gpuguard.Guard(batch_size=a.batch, min_batch_size=1,
                           size_by_shape=a.shapes == "on")
    for step in range(1, a.steps + 1):
        batch = torch.randn(a.batch, a.seq + a.grow * (step - 1), a.dim, device="cuda")
        samples = []

        def one(mb):
            samples.append(len(mb))
            loss = loss_fn(model(mb.data)) * mb.weight
            loss.backward()

        if a.way == "run":
            guard.run(batch, one, lambda: opt.zero_grad(set_to_none=True))
        elif a.way == "microbatches":
            for mb in guard.microbatches(batch):
                one(mb)
        else:  # a hand-written loop: the whole batch, then guard.step() after the optimizer
            loss = loss_fn(model(batch))
            loss.backward()
            samples.append(batch.shape[0])
            del loss
        opt.step()
        opt.zero_grad(set_to_none=True)
        if a.way == "step":
            guard.step()
        result("step", step=step, loader_batch=batch.shape[0], samples=sum(samples),
               split=guard.split, micro=guard.micro_batch_size,
               max_reserved=torch.cuda.max_memory_reserved())
        torch.cuda.reset_peak_memory_stats()
        del batch
    result("done", steps=a.steps)


if __name__ == "__main__":
    main()
