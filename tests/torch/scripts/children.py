"""An unmodified script with child processes: a child forked before the
parent uses CUDA trains on the CPU; the parent trains on CUDA; a child
forked after that (like a DataLoader worker) runs the model forward and an
optimizer step on the CPU (neither CUDA nor autograd's engine survives a
fork: PyTorch refuses both there); a spawned child trains on CUDA in its
own interpreter.

    children.py [--steps N]

Prints RESULT child {how, ok, exitcode} per child and RESULT parent {steps}.
"""
import argparse
import multiprocessing as mp
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

from model import Model, loss_fn, result  # noqa: E402


def train(steps, device):
    torch.manual_seed(0)
    model = Model(dim=64, layers=1).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        loss = loss_fn(model(torch.randn(2, 32, 64, device=device)))
        loss.backward()
        opt.step()
        opt.zero_grad()
    return float(loss)


def worker(steps):
    """Forward and an optimizer step, no backward: what a forked worker may do."""
    model = Model(dim=64, layers=1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with torch.no_grad():
        for _ in range(steps):
            loss = loss_fn(model(torch.randn(2, 32, 64)))
            for p in model.parameters():
                p.grad = torch.ones_like(p)
            opt.step()
    return float(loss)


def child(how, steps, queue):
    try:
        if how == "spawn":
            loss = train(steps, "cuda")
        elif how == "fork-before":
            loss = train(steps, "cpu")
        else:
            loss = worker(steps)
        queue.put((how, loss == loss))
    except BaseException as e:
        queue.put((how, repr(e)))


def start(how, steps):
    ctx = mp.get_context("spawn" if how == "spawn" else "fork")
    q = ctx.Queue()
    p = ctx.Process(target=child, args=(how, steps, q))
    p.start()
    got = q.get(timeout=300)
    p.join(300)
    result("child", how=how, ok=got[1] is True, detail=str(got[1]), exitcode=p.exitcode)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=3)
    a = ap.parse_args()
    start("fork-before", a.steps)
    train(a.steps, "cuda")
    start("fork-after", a.steps)
    start("spawn", a.steps)
    result("parent", steps=a.steps)


if __name__ == "__main__":
    main()
