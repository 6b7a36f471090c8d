"""Time training steps of the model (model.py): the bench's real step.

    bench_step.py [--warmup N] [--steps N]

Prints RESULT times {seconds: [...]} (each step's wall time, after the
warm-up, with torch.cuda.synchronize() closing every step).
"""
import argparse
import time

import torch

from model import Model, loss_fn, result


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--steps", type=int, default=60)
    a = ap.parse_args()
    torch.set_num_threads(1)  # the bench pins the run to one core: no intra-op threads
    torch.manual_seed(0)
    model = Model(dim=256, layers=2).cuda()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.randn(8, 128, 256, device="cuda")
    times = []
    for i in range(a.warmup + a.steps):
        t0 = time.perf_counter()
        loss = loss_fn(model(x))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        if i >= a.warmup:
            times.append(time.perf_counter() - t0)
    result("times", seconds=times)


if __name__ == "__main__":
    main()
