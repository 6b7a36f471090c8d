"""Allocate tensors until PyTorch raises, then carry on.

    oom.py [--chunk MiB] [--max N]

Prints RESULT oom {type, is_oom, message, held} (held: tensors made before
the error) and, after letting them go and emptying the cache, RESULT after
{ok, reserved}: the process allocates again.
"""
import argparse

import torch

from model import result


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--chunk", type=int, default=64)
    ap.add_argument("--max", type=int, default=1000)
    a = ap.parse_args()
    held = []
    try:
        for _ in range(a.max):
            held.append(torch.empty(a.chunk << 20, dtype=torch.uint8, device="cuda"))
        result("oom", type=None, is_oom=False, message="", held=len(held))
    except Exception as e:  # what PyTorch raises is the test's question
        result("oom", type=type(e).__module__ + "." + type(e).__qualname__,
               is_oom=isinstance(e, torch.OutOfMemoryError), message=str(e), held=len(held))
    held = None
    torch.cuda.empty_cache()
    y = torch.ones(4 << 20, device="cuda")
    torch.cuda.synchronize()
    result("after", ok=True, reserved=torch.cuda.memory_reserved(), numel=y.numel())


if __name__ == "__main__":
    main()
