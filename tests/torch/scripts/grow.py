"""An unmodified training script (no gpuguard in it) whose batch grows by
the same number of samples every step, so its step peak rises on a line:
what gpuguard-run's instrumentation is tested on (test_torch_instrument.py).

    grow.py [--steps N] [--batch B] [--grow G] [--seq T] [--dim D] [--layers L]
            [--keep]

Prints RESULT step {step, batch, loss, reserved} after every optimizer step
and RESULT final {steps, reserved, max_reserved}; an OutOfMemoryError ends
the run with RESULT oom {step, phase, message}. --keep keeps every step's
loss with its graph (retain_graph=True): each step's activations stay, a leak.
"""
import argparse

import torch

from model import Model, loss_fn, result


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--grow", type=int, default=4)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--keep", action="store_true")
    a = ap.parse_args()
    torch.manual_seed(0)
    model = Model(dim=a.dim, layers=a.layers).cuda()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    kept = []
    phase = "forward"
    for step in range(1, a.steps + 1):
        batch = a.batch + a.grow * (step - 1)
        try:
            phase = "forward"
            x = torch.randn(batch, a.seq, a.dim, device="cuda")
            loss = loss_fn(model(x))
            phase = "backward"
            loss.backward(retain_graph=a.keep)
            phase = "step"
            opt.step()
            opt.zero_grad(set_to_none=True)
        except torch.OutOfMemoryError as e:
            result("oom", step=step, phase=phase, message=str(e)[:300])
            return
        if a.keep:
            kept.append(loss)
        del x
        result("step", step=step, batch=batch, loss=float(loss.item()),
               reserved=torch.cuda.memory_reserved())
        del loss
    result("final", steps=a.steps, reserved=torch.cuda.memory_reserved(),
           max_reserved=torch.cuda.max_memory_reserved())


if __name__ == "__main__":
    main()
