"""lm.py's small transformer language model trained through the Python
helper, on the shapes real data has: long-tailed documents (most short, a
few of 4 000-8 000 tokens), or a sequence that grows then shrinks.

    guard_lm.py [--way run|microbatches|measure] [--batches N] [--batch B]
                [--lengths longtail|growshrink] [--long STEP:LEN,...]
                [--seq T] [--grow G] [--turn S] [--vocab V] [--dim D] [--layers L]

--way run: Guard.run(batch, step, zero_grad); microbatches: a `for mb in
guard.microbatches(batch)` loop; measure: no helper, each batch whole and
alone, PyTorch's cache emptied and its peak counters reset before it (what
the batch needs unsplit, from an empty cache: RESULT alone {step, shape,
max_reserved, max_allocated}). longtail: each batch is B documents padded
to the longest, lengths drawn from a long tail (300-2 000 tokens), and at
each --long STEP one document of LEN tokens. growshrink: the length grows by
G a batch from T until batch --turn, then shrinks by G a batch.

Prints RESULT step {step, shape, tokens, pieces, sizes, loss} after every
optimizer step (pieces: the micro-batches the batch ran in, the last
attempt's), RESULT grads {step, norm} for the steps named by --grads, and
RESULT final {batches, ooms (Guard.run's), history, split_by_shape, whole,
redone}.
"""
import argparse
import math
import random
import time

import torch

import gpuguard
from lm import LM
from model import result


def lengths(a, step, rng):
    if a.lengths == "growshrink":
        k = step - 1 if step <= a.turn else 2 * (a.turn - 1) - (step - 1)
        return a.batch, max(16, a.seq + a.grow * k)
    docs = [min(2000, max(300, int(rng.lognormvariate(math.log(700), 0.5))))
            for _ in range(a.batch)]
    if step in a.long:
        docs[0] = a.long[step]
    return a.batch, max(docs)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--way", default="run", choices=("run", "microbatches", "measure"))
    ap.add_argument("--batches", type=int, default=60)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--lengths", default="longtail", choices=("longtail", "growshrink"))
    ap.add_argument("--long", default="14:7556,23:4100,31:6200,38:5200,47:7900,55:4600")
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--grow", type=int, default=512)
    ap.add_argument("--turn", type=int, default=14)
    ap.add_argument("--vocab", type=int, default=8000)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--grads", default="")
    ap.add_argument("--shapes", default="on", choices=("on", "off"),
                    help="Guard(size_by_shape=...)")
    ap.add_argument("--time", action="store_true",
                    help="RESULT times: each batch's seconds; then a prediction's cost")
    a = ap.parse_args()
    a.long = {int(s): int(n) for s, n in (p.split(":") for p in a.long.split(",") if p)}
    grads = {int(s) for s in a.grads.split(",") if s}
    torch.manual_seed(0)
    model = LM(a.vocab, a.dim, a.layers, a.heads).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    guard = None if a.way == "measure" else gpuguard.Guard(batch_size=a.batch,
                                                         size_by_shape=a.shapes == "on")
    times = []
    rng = random.Random(0)
    data = torch.Generator().manual_seed(1)
    for step in range(1, a.batches + 1):
        t0 = time.perf_counter()
        b, t = lengths(a, step, rng)
        ids = torch.randint(0, a.vocab, (b, t), generator=data).cuda()
        sizes = []
        losses = []

        def one(mb):
            sizes.append(len(mb))
            logits = model(mb.data)
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, a.vocab),
                                                     mb.data.reshape(-1))
            losses.append(float(loss.detach()) * mb.weight)
            guard.backward(loss)

        def zero_grad():
            sizes.clear()
            losses.clear()
            opt.zero_grad(set_to_none=True)

        if a.way == "measure":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            logits = model(ids)
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, a.vocab), ids.reshape(-1))
            loss.backward()
            del logits
            losses.append(float(loss.detach()))
            del loss
            sizes.append(b)
            result("alone", step=step, shape=[b, t], tokens=b * t,
                   max_reserved=torch.cuda.max_memory_reserved(),
                   max_allocated=torch.cuda.max_memory_allocated())
        elif a.way == "run":
            guard.run(ids, one, zero_grad)
        else:
            for mb in guard.microbatches(ids):
                one(mb)
        if step in grads:
            norm = math.sqrt(sum(float(p.grad.double().pow(2).sum())
                                 for p in model.parameters() if p.grad is not None))
            result("grads", step=step, norm=norm)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if a.time:
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        result("step", step=step, shape=[b, t], tokens=b * t, pieces=len(sizes), sizes=sizes,
               loss=sum(losses))
        del ids
    if a.time:
        result("times", seconds=times)
        if guard is not None and guard.active and guard._native.has("gpuguard_predict"):
            n, tokens = 20000, a.batch * a.seq
            t0 = time.perf_counter()
            for _ in range(n):
                guard._native.predict(0, tokens)
            predict = (time.perf_counter() - t0) / n
            ids = torch.randint(0, a.vocab, (a.batch, a.seq))
            t0 = time.perf_counter()
            for _ in range(2000):
                guard._size_by_shape(ids)
            size = (time.perf_counter() - t0) / 2000
            result("predict", seconds=predict, sizing=size)
    out = {"batches": a.batches}
    if guard is not None:
        guard.finish()
        out.update(ooms=guard.ooms, history=guard.history)
        out.update(getattr(guard, "sizing", {}) or {})
    result("final", **out)


if __name__ == "__main__":
    main()
