"""One training step whose backward needs more than its forward: says what
PyTorch holds after the forward, and where an OutOfMemoryError came from.

    backward.py [--batch B] [--seq T] [--dim D] [--layers L] [--warm B]

--warm: a first step of batch B (forward and backward) before the one
measured: on a real GPU autograd's thread creates its cuBLAS handle and
workspace at its first backward, and a refusal there is cuBLAS's
RuntimeError, not an OutOfMemoryError.

Prints RESULT forward {allocated, reserved}, then RESULT step {ok,
max_reserved, max_allocated} or
RESULT oom {phase, type, message}.
"""
import argparse

import torch

from model import Model, loss_fn, result


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--dim", type=int, default=512)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--warm", type=int, default=0)
    a = ap.parse_args()
    torch.manual_seed(0)
    model = Model(dim=a.dim, layers=a.layers).cuda()
    if a.warm:
        loss_fn(model(torch.randn(a.warm, a.seq, a.dim, device="cuda"))).backward()
        model.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    x = torch.randn(a.batch, a.seq, a.dim, device="cuda")
    phase = "forward"
    try:
        loss = loss_fn(model(x))
        torch.cuda.synchronize()
        result("forward", allocated=torch.cuda.memory_allocated(),
               reserved=torch.cuda.memory_reserved())
        phase = "backward"
        loss.backward()
        torch.cuda.synchronize()
        result("step", ok=True, max_reserved=torch.cuda.max_memory_reserved(),
               max_allocated=torch.cuda.max_memory_allocated())
    except torch.OutOfMemoryError as e:
        result("oom", phase=phase, type=type(e).__qualname__, message=str(e))


if __name__ == "__main__":
    main()
