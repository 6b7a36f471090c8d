"""The first matrix product of a process whose cache already holds nearly
all the device may have: PyTorch's first cuBLAS call creates a cuBLAS handle,
and cuBLAS allocates its own device memory then, outside PyTorch's caching
allocator (64 MiB a handle for cuBLAS 13 on an H200; the fake cuBLAS does the
same with FAKECUDA_CUBLAS_WORKSPACE). A failed allocation there is cuBLAS's
CUBLAS_STATUS_ALLOC_FAILED, which PyTorch raises as a RuntimeError, not as an
OutOfMemoryError: no OOM handler of the program catches it.

    cublas.py --fill MiB

The program handles an OutOfMemoryError as a trainer does (it lets go of
what it holds and tries again); any other error ends it.

Prints RESULT matmul {ok, handled_oom} or RESULT error {type, message}.
"""
import argparse

import torch

from model import result

MiB = 1 << 20


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fill", type=int, required=True)
    a = ap.parse_args()
    held = torch.empty(a.fill * MiB, dtype=torch.uint8, device="cuda")
    x = torch.randn(64, 64, device="cuda")
    handled = False
    try:
        try:
            y = x @ x
        except torch.OutOfMemoryError:  # a trainer's handler: a smaller batch, again
            handled = True
            del held
            torch.cuda.empty_cache()
            y = x @ x
        torch.cuda.synchronize()
        result("matmul", ok=True, handled_oom=handled, shape=list(y.shape))
    except Exception as e:  # what no OOM handler catches
        result("error", type=type(e).__qualname__, message=str(e)[:300])


if __name__ == "__main__":
    main()
