"""An unmodified script that trains on the CPU only (torch imported, CUDA
never used), seeded: its losses and parameters are the same bits run after
run, with gpuguard-run's instrumentation or without it.

    cpu_train.py [--steps N]

Prints RESULT losses {losses: [float.hex], params: float.hex of the sum}.
"""
import argparse

import torch

from model import Model, loss_fn, result


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=6)
    a = ap.parse_args()
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    model = Model(dim=32, heads=4, layers=2)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    sched = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)  # a second optimizer
    losses = []
    for _ in range(a.steps):
        x = torch.randn(4, 16, 32)
        loss = loss_fn(model(x))
        loss.backward()
        opt.step()
        sched.step()
        opt.zero_grad()
        losses.append(float(loss).hex())
    total = sum(float(p.detach().double().sum()) for p in model.parameters())
    result("losses", losses=losses, params=total.hex())


if __name__ == "__main__":
    main()
