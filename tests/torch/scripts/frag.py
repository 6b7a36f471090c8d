"""An unmodified script whose cache is fragmented when it asks for one large
block: a 1 GiB segment is cached, split into odd-sized blocks, every other
one freed, then 400 MiB is asked for (test_torch_instrument.py).

    frag.py [--segment MiB] [--block MiB] [--blocks N] [--request MiB]

Prints RESULT cache {reserved, allocated} before the request, then RESULT
ok or RESULT oom {message}.
"""
import argparse

import torch

from model import result

MiB = 1 << 20


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--segment", type=int, default=1024)
    ap.add_argument("--block", type=int, default=97)
    ap.add_argument("--blocks", type=int, default=10)
    ap.add_argument("--request", type=int, default=400)
    a = ap.parse_args()
    big = torch.empty(a.segment * MiB, dtype=torch.uint8, device="cuda")
    del big  # the segment stays in PyTorch's cache
    blocks = [torch.empty(a.block * MiB + 4096 * i, dtype=torch.uint8, device="cuda")
              for i in range(a.blocks)]
    for i in range(0, a.blocks, 2):
        blocks[i] = None  # holes between live blocks: free, but not one piece
    result("cache", reserved=torch.cuda.memory_reserved(), allocated=torch.cuda.memory_allocated())
    try:
        x = torch.empty(a.request * MiB, dtype=torch.uint8, device="cuda")
        result("ok", bytes=x.numel())
    except torch.OutOfMemoryError as e:
        result("oom", message=str(e)[:400])


if __name__ == "__main__":
    main()
