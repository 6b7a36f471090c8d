"""An unmodified training script of the kind users run (no gpuguard in it):
a small language model, nn.TransformerEncoder over token embeddings and
logits over a vocabulary, trained with AdamW on batches of token ids.

    pf_lm.py [--batch B] [--seq T] [--dim D] [--layers L] [--vocab V] [--steps N]
             [--ckpt FILE] [--save-at-exit FILE] [--mask] [--fail-at STEP]

Prints RESULT step {step, loss, max_reserved, max_allocated, used} after
every optimizer step (PyTorch's own figures, as a user reads them, and the
device's use by torch.cuda.mem_get_info()); --ckpt saves
model and optimizer state at the last step, --save-at-exit in an exit
handler (the files a run on zeros must never replace). --mask leaves out
padding tokens (id 0) by a boolean mask made on the GPU, a shape that
follows values; --fail-at raises a ValueError of the script's own at that
step (a failure that is not about memory).
"""
import argparse
import atexit

import torch

from model import result


class LM(torch.nn.Module):
    def __init__(self, vocab, dim, layers, heads):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, dim)
        layer = torch.nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout=0.0,
                                                 batch_first=True, norm_first=True)
        self.encoder = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = torch.nn.Linear(dim, vocab)

    def forward(self, ids):
        return self.head(self.encoder(self.embed(ids)))


def check_batch(step):
    raise ValueError("batch %d has no labels" % step)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=8000)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--ckpt")
    ap.add_argument("--save-at-exit")
    ap.add_argument("--mask", action="store_true")
    ap.add_argument("--fail-at", type=int, default=0)
    a = ap.parse_args()
    torch.manual_seed(0)
    torch.backends.cudnn.enabled = False
    model = LM(a.vocab, a.dim, a.layers, a.heads).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    if a.save_at_exit:
        atexit.register(lambda: torch.save(model.state_dict(), a.save_at_exit))
    data = torch.randint(0, a.vocab, (a.steps, a.batch, a.seq + 1))
    for step in range(1, a.steps + 1):
        if step == a.fail_at:
            check_batch(step)
        ids = data[step - 1].cuda()
        logits = model(ids[:, :-1])
        target = ids[:, 1:]
        if a.mask:
            keep = target != 0
            loss = torch.nn.functional.cross_entropy(logits[keep], target[keep])
        else:
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, a.vocab),
                                                     target.reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        free, total = torch.cuda.mem_get_info()
        result("step", step=step, loss=float(loss.item()),
               max_reserved=torch.cuda.max_memory_reserved(),
               max_allocated=torch.cuda.max_memory_allocated(), used=total - free)
        if step == a.steps and a.ckpt:
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step},
                       a.ckpt)


if __name__ == "__main__":
    main()
