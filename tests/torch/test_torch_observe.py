"""In observe mode the shim changes nothing PyTorch reports: import torch,
torch.cuda.is_available(), the device's properties, mem_get_info() before
and after a training step, memory_stats(), max_memory_reserved() and
memory_summary() are the same with and without it."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from torchrig import TorchCase  # noqa: E402

OBSERVE = """[gpu]
match = *
[memory]
mode = observe
virtualize_meminfo = yes
headroom = 20 GiB
"""


class ObserveChangesNothing(TorchCase):
    def test_pytorch_reports_the_same(self):
        policy = self.write_policy("observe.ini", OBSERVE)
        # the same simulated GPU for both runs, one after the other: its UUID
        # is the shared state's (tests/fake/README.md)
        gpu = {"FAKECUDA_STATE": self.sess.inside(os.path.join(self.tmp, "gpu.state"))}
        with_shim = self.torch("observe.py", policy=policy, env=gpu)
        without = self.torch("observe.py", preload=False, env=gpu)
        self.assertRan(with_shim)
        self.assertRan(without)
        seen, plain = with_shim.result("observed"), without.result("observed")
        self.assertTrue(plain["available"])
        self.assertGreater(plain["stats"]["allocation.all.allocated"], 0)  # it did train
        self.assertEqual(seen, plain)
        self.assertEqual(with_shim.summary()["peak"], plain["max_reserved"])  # and it was seen

    def test_enforce_virtualizes_what_observe_leaves(self):
        """The counter-test: the same policy enforcing shows PyTorch the limit
        (so the comparison above would see a change)."""
        policy = self.write_policy("enforce.ini", OBSERVE.replace("mode = observe", "mode = enforce"))
        run = self.torch("observe.py", policy=policy)
        self.assertRan(run)
        free, total = run.result("observed")["mem_get_info_before"]
        self.assertEqual(total, 4 << 30)
