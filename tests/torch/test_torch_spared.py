"""Safe by default, on real PyTorch: what must never be refused. PyTorch's
first matrix product creates a cuBLAS handle, and cuBLAS allocates device
memory of its own then (seen on an H200: 64 MiB through cuMemAlloc from
cublasCreate_v2, on autograd's thread at the first backward). Refused, that
is CUBLAS_STATUS_ALLOC_FAILED, a RuntimeError no OOM handler catches, where
without gpuguard the job would have gone on. The shipped policies spare
libcublas* (as they spare NCCL): counted, journaled as a near miss past the
limit, let through. A policy that leaves it out gets the RuntimeError, which
is why the default has it. (The program here, as a trainer, handles an
OutOfMemoryError by letting go of what it holds and trying again.)"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from torchrig import GiB, MiB, TorchCase  # noqa: E402

TOTAL = 24 * GiB
HANDLE = 64 * MiB


def policy(never_refuse=None):
    """Enforcing with a 1 GiB limit."""
    text = ("[gpu]\nmatch = *\n[memory]\nheadroom = %d\nnear_miss = 0\nmode = enforce\n"
            % (TOTAL - GiB))
    if never_refuse is not None:
        text += "never_refuse = %s\n" % never_refuse
    return text


class CublasHandle(TorchCase):
    def run_fill(self, never_refuse=None):
        # 960 MiB held by PyTorch's cache (one 960 MiB segment): the handle's
        # 64 MiB is past the 1 GiB limit
        return self.torch("cublas.py", "--fill", "960", gpuguard_run=[],
                          env={"FAKECUDA_CUBLAS_WORKSPACE": str(HANDLE)},
                          policy=self.write_policy("p.ini", policy(never_refuse)))

    def test_the_default_spares_cublas(self):
        run = self.run_fill()
        self.assertRan(run)
        # past the limit after the handle, PyTorch's next allocation is refused:
        # an OutOfMemoryError, which the program's handler recovers from
        self.assertEqual(run.result("matmul")["handled_oom"], True, run.out)
        spared = [e for e in run.of("near_miss") if e.get("spared") == "never_refuse"]
        self.assertTrue(spared, run.events)
        self.assertEqual((spared[0]["caller"], spared[0]["bytes"], spared[0]["api"]),
                         ("libcublas.so.12", HANDLE, "cuMemAlloc"))
        self.assertTrue(spared[0]["over_limit"])
        # what was refused is PyTorch's own allocator's (its cuBLAS workspace): an OOM it raises
        self.assertTrue(run.of("refused"))
        self.assertEqual({e["caller"] for e in run.of("refused")}, {"libc10_cuda.so.2.6"})

    def test_without_it_pytorch_raises_a_runtime_error(self):
        run = self.run_fill(never_refuse="libnccl*")
        self.assertRan(run)
        err = run.result("error")
        self.assertEqual(err["type"], "RuntimeError")
        self.assertIn("CUBLAS_STATUS_ALLOC_FAILED", err["message"])
        refused = run.of("refused")
        self.assertTrue(refused)
        self.assertEqual(refused[0]["caller"], "libcublas.so.12")
