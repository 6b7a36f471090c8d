"""Train the model (model.py) for some steps; say at each step boundary what
PyTorch's allocator holds and what the shim counts.

    train.py [--steps N] [--batch B] [--seq T] [--grow G] [--dim D] [--layers L]

--grow G: the sequence grows by G every step (a curriculum). Prints
RESULT step {step, reserved, max_reserved, allocated, shim_current} and
RESULT final {max_reserved, stats}.
"""
import argparse

import torch

from model import Model, loss_fn, result, shim_stats


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--grow", type=int, default=0)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--layers", type=int, default=2)
    a = ap.parse_args()
    torch.manual_seed(0)
    model = Model(dim=a.dim, layers=a.layers).cuda()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for step in range(1, a.steps + 1):
        x = torch.randn(a.batch, a.seq + a.grow * (step - 1), a.dim, device="cuda")
        loss = loss_fn(model(x))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        del x, loss
        torch.cuda.synchronize()
        s = shim_stats()
        result("step", step=step, reserved=torch.cuda.memory_reserved(),
               max_reserved=torch.cuda.max_memory_reserved(),
               allocated=torch.cuda.memory_allocated(),
               shim_current=s["current"] if s else None)
    stats = torch.cuda.memory_stats()
    result("final", max_reserved=torch.cuda.max_memory_reserved(),
           reserved=torch.cuda.memory_reserved(),
           retries=stats.get("num_alloc_retries", 0), ooms=stats.get("num_ooms", 0))


if __name__ == "__main__":
    main()
