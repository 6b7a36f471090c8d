"""A small transformer language model trained as users write it: token ids,
an embedding, nn.TransformerEncoder, logits over the vocabulary,
cross-entropy, AdamW; no gpuguard in it. The sequence length is what the
workloads vary:

    lm.py [--steps N] [--batch B] [--seq T] [--grow G] [--lengths fixed|grow|longtail]
          [--long-step S] [--long-len L] [--vocab V] [--dim D] [--layers L]
          [--keep none|outputs|losses] [--empty-cache] [--catch] [--loader]
          [--optimizers 1|2] [--accum K] [--seq-first] [--sleep S] [--peaks]

--lengths grow: the sequence grows by G tokens a step (a curriculum);
longtail: each batch is B documents padded to the longest, lengths drawn
from a long tail (most 300-2 000 tokens), and at step --long-step one
document of --long-len tokens. --keep: a leak (every step's logits kept in
a list, or every step's loss with its graph). --catch: an OutOfMemoryError
ends the run cleanly (RESULT oom) instead of killing it. --seq-first: the
encoder takes (sequence, batch, features), nn.Transformer's default.
--peaks: the script reads and resets PyTorch's peak statistics itself, as
a trainer's logging does (RESULT peaks).

Prints RESULT step {step, shape, tokens, loss} after every optimizer step and
RESULT final {steps, backwards, retries, ooms, ...} (PyTorch's own counts); an
OutOfMemoryError prints RESULT oom {step, steps, backwards, retries, ooms} first.
"""
import argparse
import math
import random
import sys
import time

import torch

from model import result


class LM(torch.nn.Module):
    def __init__(self, vocab, dim, layers, heads, batch_first=True):
        super().__init__()
        self.batch_first = batch_first
        self.embed = torch.nn.Embedding(vocab, dim)
        layer = torch.nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout=0.0,
                                                 batch_first=batch_first)
        self.encoder = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = torch.nn.Linear(dim, vocab)

    def forward(self, ids):
        return self.head(self.encoder(self.embed(ids)))


def lengths(a, step, rng):
    """The (batch, length) of a step's batch."""
    if a.lengths == "grow":
        return a.batch, a.seq + a.grow * (step - 1)
    if a.lengths == "longtail":
        docs = [min(2000, max(300, int(rng.lognormvariate(math.log(700), 0.5))))
                for _ in range(a.batch)]
        if step == a.long_step:
            docs[0] = a.long_len
        return a.batch, max(docs)
    return a.batch, a.seq


class Batches(torch.utils.data.IterableDataset):
    def __init__(self, a):
        self.a = a

    def __iter__(self):
        rng = random.Random(0)
        for step in range(1, self.a.steps + 1):
            b, t = lengths(self.a, step, rng)
            yield torch.randint(0, self.a.vocab, (b, t))


def peaks(dev=0):
    s = torch.cuda.memory_stats(dev)
    return {"max_allocated": torch.cuda.max_memory_allocated(dev),
            "max_reserved": torch.cuda.max_memory_reserved(dev),
            "stats": {k: v for k, v in s.items() if k.endswith(".peak")}}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--grow", type=int, default=256)
    ap.add_argument("--lengths", default="grow", choices=("fixed", "grow", "longtail"))
    ap.add_argument("--long-step", type=int, default=18)
    ap.add_argument("--long-len", type=int, default=7556)
    ap.add_argument("--vocab", type=int, default=8000)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--keep", default="none", choices=("none", "outputs", "losses"))
    ap.add_argument("--empty-cache", action="store_true")
    ap.add_argument("--catch", action="store_true")
    ap.add_argument("--loader", action="store_true")
    ap.add_argument("--optimizers", type=int, default=1)
    ap.add_argument("--accum", type=int, default=1)
    ap.add_argument("--seq-first", action="store_true")
    ap.add_argument("--sleep", type=float, default=0.0)
    ap.add_argument("--peaks", action="store_true")
    a = ap.parse_args()
    torch.manual_seed(0)
    model = LM(a.vocab, a.dim, a.layers, a.heads, batch_first=not a.seq_first).cuda()
    if a.optimizers == 2:  # the embedding apart, as some fine-tuning recipes do
        body = [p for n, p in model.named_parameters() if not n.startswith("embed.")]
        opts = [torch.optim.AdamW(body, lr=1e-4), torch.optim.SGD(model.embed.parameters(), lr=1e-2)]
    else:
        opts = [torch.optim.AdamW(model.parameters(), lr=1e-4)]
    if a.loader:
        batches = iter(torch.utils.data.DataLoader(Batches(a), batch_size=None, num_workers=2))
    else:
        batches = iter(Batches(a))
    kept = []
    backwards = 0
    step = 0
    if a.peaks:
        result("peaks", at="start", **peaks())
    try:
        for step in range(1, a.steps + 1):
            ids = next(batches).cuda(non_blocking=True)
            if a.seq_first:
                ids = ids.t().contiguous()
            for micro in ids.chunk(a.accum, dim=1 if a.seq_first else 0):
                logits = model(micro)
                loss = torch.nn.functional.cross_entropy(logits.reshape(-1, a.vocab),
                                                         micro.reshape(-1)) / a.accum
                backwards += 1  # calls made, the one that fails included
                loss.backward()
                if a.keep == "outputs":
                    kept.append(logits.detach())
                elif a.keep == "losses":
                    kept.append(loss)
            for opt in opts:
                opt.step()
            for opt in opts:
                opt.zero_grad(set_to_none=True)
            if a.empty_cache:
                torch.cuda.empty_cache()
            result("step", step=step, shape=list(ids.shape), tokens=ids.numel(),
                   loss=float(loss.item()))
            del ids, logits, loss
            if a.peaks and step % 3 == 0:
                result("peaks", at=step, **peaks())
                if step % 6 == 0:
                    torch.cuda.reset_peak_memory_stats()
                    result("peaks", at="reset %d" % step, **peaks())
            if a.sleep:
                time.sleep(a.sleep)
    except torch.OutOfMemoryError as e:
        # what the script saw and PyTorch counted, said before it dies of it
        s = torch.cuda.memory_stats()
        result("oom", step=step, message=str(e)[:400], retries=s.get("num_alloc_retries", 0),
               ooms=s.get("num_ooms", 0), backwards=backwards, steps=step - 1)
        if not a.catch:
            raise
        return
    s = torch.cuda.memory_stats()
    result("final", steps=a.steps, backwards=backwards, retries=s.get("num_alloc_retries", 0),
           ooms=s.get("num_ooms", 0), max_allocated=torch.cuda.max_memory_allocated(),
           max_reserved=torch.cuda.max_memory_reserved(), kept=len(kept))
    if a.peaks:
        result("peaks", at="end", **peaks())
    sys.stdout.flush()


if __name__ == "__main__":
    main()
