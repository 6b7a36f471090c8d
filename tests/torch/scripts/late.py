"""An unmodified script that imports torch late, inside a function, after
other work: gpuguard-run's instrumentation installs itself then.

    late.py [--steps N]

Prints RESULT late {steps}.
"""
import argparse
import json  # noqa: F401  (work before torch)

from model import result


def train(steps):
    import torch
    from model import Model, loss_fn
    torch.manual_seed(0)
    model = Model(dim=64, layers=1).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        loss = loss_fn(model(torch.randn(2, 32, 64, device="cuda")))
        loss.backward()
        opt.step()
        opt.zero_grad()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=4)
    a = ap.parse_args()
    train(a.steps)
    result("late", steps=a.steps)


if __name__ == "__main__":
    main()
