"""The model every real-PyTorch test trains: what a user writes.

A small transformer: pre-norm blocks of LayerNorm, attention written out
with matmul and softmax, and a GELU MLP; Adam. Its memory is PyTorch's own:
the caching allocator's segments, autograd's saved activations, Adam's two
moments, cuBLAS's workspace.
"""
import json
import math
import sys

import torch


class Attention(torch.nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.proj = torch.nn.Linear(dim, dim)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        q = q.view(b, t, self.heads, d // self.heads).transpose(1, 2)
        k = k.view(b, t, self.heads, d // self.heads).transpose(1, 2)
        v = v.view(b, t, self.heads, d // self.heads).transpose(1, 2)
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.heads)
        weights = torch.softmax(scores, dim=-1)
        y = (weights @ v).transpose(1, 2).reshape(b, t, d)
        return self.proj(y)


class Block(torch.nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.ln1 = torch.nn.LayerNorm(dim)
        self.attn = Attention(dim, heads)
        self.ln2 = torch.nn.LayerNorm(dim)
        self.fc1 = torch.nn.Linear(dim, 4 * dim)
        self.fc2 = torch.nn.Linear(4 * dim, dim)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        h = torch.nn.functional.gelu(self.fc1(self.ln2(x)))
        return x + self.fc2(h)


class Model(torch.nn.Module):
    def __init__(self, dim=256, heads=4, layers=2):
        super().__init__()
        self.blocks = torch.nn.Sequential(*[Block(dim, heads) for _ in range(layers)])
        self.head = torch.nn.Linear(dim, dim)

    def forward(self, x):
        return self.head(self.blocks(x))


def loss_fn(out):
    return out.pow(2).mean()


def result(kind, **kw):
    """One line the test reads."""
    kw["kind"] = kind
    print("RESULT " + json.dumps(kw), flush=True)


def shim_stats(dev=0):
    """The shim's figures for the device (gpuguard_stats), or None without it."""
    try:
        from gpuguard import _native
        native = _native.load()
        return native.stats(dev) if native else None
    except Exception:
        return None
