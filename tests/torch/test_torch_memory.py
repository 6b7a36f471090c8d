"""Real PyTorch 2.6 (Debian's CUDA build) on the fake GPU, under a real
LD_PRELOAD of the shim: the ledger agrees with PyTorch's own allocator, and a
refusal is PyTorch's own OutOfMemoryError on each of its allocator paths."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from torchrig import GiB, MiB, RTX3090, TorchCase, format_size  # noqa: E402

OBSERVE = """[gpu]
match = *
[memory]
mode = observe
"""


def enforce_policy(limit_bytes, total=24 * GiB, near_miss="5%"):
    return """[gpu]
match = *
[memory]
headroom = %d
near_miss = %s
mode = enforce
""" % (total - limit_bytes, near_miss)


class LedgerAgreesWithPyTorch(TorchCase):
    """A clean run: the journal's peak is max_memory_reserved() to the byte,
    and at every step boundary memory_reserved() is what the shim holds."""

    def check(self, conf):
        policy = self.write_policy("observe.ini", OBSERVE)
        run = self.torch("train.py", "--steps", "5", "--grow", "32", policy=policy,
                         env={"PYTORCH_CUDA_ALLOC_CONF": conf})
        self.assertRan(run)
        steps = [r for r in run.results if r["kind"] == "step"]
        self.assertEqual(len(steps), 5)
        for s in steps:
            self.assertEqual(s["reserved"], s["shim_current"],
                             "step %d: PyTorch reserves %d, the shim counts %d" %
                             (s["step"], s["reserved"], s["shim_current"]))
        final = run.result("final")
        summ = run.summary()
        self.assertEqual(summ["peak"], final["max_reserved"])
        self.assertGreater(final["max_reserved"], steps[0]["reserved"])  # it grew: a real test
        self.assertEqual(summ["refusals"], 0)
        self.assertEqual(final["retries"], 0)
        return run

    def test_default_allocator(self):
        run = self.check("")
        self.assertGreater(run.summary()["allocs"], 3)
        apis = {e.get("api") for e in run.events if e["ev"] in ("near_miss", "refused")}
        self.assertFalse(apis)  # observe, 24 GiB: nothing near

    def test_expandable_segments(self):
        self.check("expandable_segments:True")

    def test_without_the_shim_pytorch_says_the_same(self):
        """The figures are PyTorch's, not the shim's making: the same run
        without the shim reserves the same bytes at every step."""
        policy = self.write_policy("observe.ini", OBSERVE)
        args = ("--steps", "3", "--grow", "32")
        with_shim = self.torch("train.py", *args, policy=policy)
        without = self.torch("train.py", *args, preload=False)
        self.assertRan(with_shim)
        self.assertRan(without)
        self.assertEqual([(r["reserved"], r["allocated"]) for r in with_shim.results if r["kind"] == "step"],
                         [(r["reserved"], r["allocated"]) for r in without.results if r["kind"] == "step"])
        self.assertFalse(without.files)


class RefusalIsPyTorchsOwnOOM(TorchCase):
    """With a limit, the shim's refusal reaches the script as
    torch.OutOfMemoryError, whose text gives the policy's limit as the GPU's
    capacity; the process then allocates again."""

    LIMIT = 400 * MiB

    def check(self, conf, api):
        policy = self.write_policy("enforce.ini", enforce_policy(self.LIMIT))
        run = self.torch("oom.py", "--chunk", "64", policy=policy,
                         env={"PYTORCH_CUDA_ALLOC_CONF": conf})
        self.assertRan(run)
        oom = run.result("oom")
        self.assertTrue(oom["is_oom"], oom)
        self.assertEqual(oom["type"], "torch.OutOfMemoryError")
        self.assertGreaterEqual(oom["held"], 5)
        self.assertLessEqual(oom["held"] * 64 * MiB, self.LIMIT)
        self.assertTrue(run.result("after")["ok"])
        refused = run.of("refused")
        self.assertTrue(refused, run.err[-2000:])
        self.assertEqual({e["api"] for e in refused}, {api})
        self.assertEqual(run.summary()["refusals"], len(refused))
        self.assertEqual(run.summary()["limit"], self.LIMIT)
        return oom, run

    def test_default_allocator(self):
        oom, run = self.check("", "cudaMalloc")
        self.assertIn("CUDA out of memory. Tried to allocate 64.00 MiB", oom["message"])
        self.assertIn("total capacity of %s" % format_size(self.LIMIT), oom["message"])
        # The caching allocator frees its cache and retries once, refused
        # again: one request, one refusal, its line saying PyTorch's retry
        # failed (raised) after its flush
        [refused] = run.of("refused")
        self.assertEqual((refused["retried"], refused["recovered"]), (True, False))
        self.assertEqual(run.summary()["refusals_recovered"], 0)

    def test_expandable_segments(self):
        """Through cuMemCreate, which PyTorch 2.6 takes with dlsym on libcuda."""
        oom, run = self.check("expandable_segments:True", "cuMemCreate")
        self.assertIn("total capacity of %s" % format_size(self.LIMIT), oom["message"])

    def test_cuda_malloc_async_backend(self):
        oom, run = self.check("backend:cudaMallocAsync", "cudaMallocAsync")
        self.assertIn("Allocation on device", oom["message"])

    def test_without_the_shim_nothing_is_refused(self):
        run = self.torch("oom.py", "--chunk", "64", "--max", "12", preload=False)
        self.assertRan(run)
        self.assertEqual(run.result("oom")["held"], 12)
        self.assertIsNone(run.result("oom")["type"])
