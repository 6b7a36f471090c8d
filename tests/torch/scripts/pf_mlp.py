"""An unmodified MLP training script (no gpuguard in it): a classifier on
feature vectors, SGD with momentum.

    pf_mlp.py [--batch B] [--features F] [--hidden H] [--steps N]

Prints RESULT step {step, loss, max_reserved, max_allocated} after every
optimizer step.
"""
import argparse

import torch

from model import result


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--features", type=int, default=1024)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--classes", type=int, default=1000)
    ap.add_argument("--steps", type=int, default=20)
    a = ap.parse_args()
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(a.features, a.hidden), torch.nn.ReLU(),
        torch.nn.Linear(a.hidden, a.hidden), torch.nn.ReLU(),
        torch.nn.Linear(a.hidden, a.classes)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    for step in range(1, a.steps + 1):
        x = torch.randn(a.batch, a.features).cuda()
        y = torch.randint(0, a.classes, (a.batch,)).cuda()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        result("step", step=step, loss=float(loss.item()),
               max_reserved=torch.cuda.max_memory_reserved(),
               max_allocated=torch.cuda.max_memory_allocated())


if __name__ == "__main__":
    main()
