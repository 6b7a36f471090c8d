"""What reading PyTorch's view costs (gpuguard-run's instrumentation): the
model trains a few steps (bench_step.py's), then N views are taken at one
kind of moment, each timed around the instrumentation's reading
(_Instrument._answer: memory_stats, the snapshot's segments and blocks, the
journal line).

    view_cost.py --kind near_miss|refused|oom [--views N]

near_miss: every step empties PyTorch's cache, so its first allocation is a
near miss (the policy's near-miss line lies below), and the shim asks for a
view (a pending call in the main thread). refused: a request past the
policy's limit (enforce), which PyTorch retries after emptying its cache
and then raises: its OOM observer reads the view. oom: a request past the
device's memory: the real allocator's failure, read the same way.

Prints RESULT view {moment, ms: [...], views}.
"""
import argparse
import sys
import time

import torch

from model import Model, loss_fn, result


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kind", choices=("near_miss", "refused", "oom"), required=True)
    ap.add_argument("--views", type=int, default=20)
    a = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = Model(dim=256, layers=2).cuda()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.randn(8, 128, 256, device="cuda")

    def step():
        loss = loss_fn(model(x))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(5):
        step()
    ti = sys.modules.get("gpuguard.torch_instrument")
    st = ti.STATE if ti is not None else None
    if st is None:
        result("view", moment=a.kind, ms=[], views=0, error="not instrumented")
        return
    times = []
    answer = st._answer

    def timed(*args, **kw):
        t0 = time.perf_counter()
        try:
            return answer(*args, **kw)
        finally:
            times.append((time.perf_counter() - t0) * 1000.0)
    st._answer = timed
    total = torch.cuda.get_device_properties(0).total_memory
    for _ in range(a.views * 3):
        if len(times) >= a.views:
            break
        if a.kind == "near_miss":
            torch.cuda.empty_cache()
            step()
            for _ in range(1000):  # Python runs: the pending call comes
                pass
        else:
            big = total // 2 if a.kind == "refused" else total + (1 << 30)
            try:
                torch.empty(big, dtype=torch.uint8, device="cuda")
            except torch.OutOfMemoryError:
                pass
            step()
    result("view", moment=a.kind, ms=times[:a.views], views=st.views)


if __name__ == "__main__":
    main()
