"""An inference loop as users write it: a model in eval mode, torch.no_grad(),
batches of rows through it, no optimizer (no steps), no gpuguard in it.

    infer.py [--batches N] [--batch B] [--dim D] [--hidden H]

Prints RESULT final {batches, batch}.
"""
import argparse

import torch

from model import result


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", type=int, default=20)
    ap.add_argument("--batch", type=int, default=59392)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--hidden", type=int, default=4096)
    a = ap.parse_args()
    model = torch.nn.Sequential(torch.nn.Linear(a.dim, a.hidden), torch.nn.GELU(),
                                torch.nn.Linear(a.hidden, 16)).cuda().eval()
    with torch.no_grad():
        for _ in range(a.batches):
            rows = torch.randn(a.batch, a.dim, device="cuda")
            out = model(rows).argmax(dim=1)
            del rows, out
    result("final", batches=a.batches, batch=a.batch)


if __name__ == "__main__":
    main()
