"""The answers in PyTorch's terms as the user reads them: gpuguard-report on the journals
of unmodified scripts run through gpuguard-run on real PyTorch 2.6. An OOM in
backward is named by its autograd node and its `.backward()` line, with what
held the memory by line and whether it was fragmentation; a run that keeps
each step's loss with its graph is a leak whose tensors are named by line; a
fragmented cache is called fragmentation with its largest free block; a
growing run's forecast comes with its step's tensors by line. The report
reads the scripts' sources from the rig (--substitute-path), as a user's
report reads them where they ran."""
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from torchrig import GiB, MiB, ROOT, TorchCase  # noqa: E402
from test_torch_instrument import GROW_STEPS, TOTAL, line_of, policy  # noqa: E402

REPORT = os.path.join(ROOT, "tools", "bin", "gpuguard-report")
# the leak finder believes a leak after 3 warm-up boundaries, 12 readings
# and 3 agreeing boundaries; then history needs two more steps
LEAK_STEPS = 24


class Reported(TorchCase):
    def report(self, run, *args):
        """gpuguard-report's text on the run's journals, reading sources
        from the chroot."""
        self.assertTrue(run.files, run.err[-2000:])
        out = subprocess.run([sys.executable, REPORT, "--substitute-path", "/", self.sess.root]
                             + list(args) + run.files,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)
        self.assertEqual(out.returncode, 0, out.stderr)
        return out.stdout

    def verdict(self, text):
        """The verdict: the lines before the first section rule."""
        return text.split("=" * 20)[0]

    def test_an_oom_in_backward_by_node_line_and_what_held_it(self):
        args = ("--batch", "16", "--seq", "256", "--dim", "512", "--layers", "2")
        probe = self.torch("backward.py", *args, gpuguard_run=[],
                           policy=self.write_policy("wide.ini", policy(TOTAL - GiB, 0)))
        self.assertRan(probe)
        limit = (probe.result("forward")["reserved"] + probe.result("step")["max_allocated"]) // 2
        run = self.torch("backward.py", *args, gpuguard_run=[],
                         policy=self.write_policy("mid.ini", policy(limit, 0, "enforce")))
        self.assertRan(run)
        self.assertEqual(run.result("oom")["phase"], "backward")
        verdict = self.verdict(self.report(run))
        backward = line_of("backward.py", "loss.backward()")
        m = re.search(r"(Refusal|OOM) in backward of `loss\.backward\(\)` \(\S*/backward\.py:(\d+) "
                      r"in main\), `(\w+Backward\d)` asked ([\d.]+ [KMG]iB): (.*)", verdict)
        self.assertTrue(m, verdict)
        self.assertEqual(int(m.group(2)), backward)
        # the node is one autograd ran for this graph: the loss's or a layer's
        self.assertIn(m.group(3), ("PowBackward0", "MeanBackward0", "MmBackward0", "AddmmBackward0",
                                   "BmmBackward0", "GeluBackward0", "NativeLayerNormBackward0",
                                   "MulBackward0", "DivBackward0", "SoftmaxBackward0",
                                   "ViewBackward0", "UnsafeViewBackward0", "TBackward0",
                                   "TransposeBackward0", "CloneBackward0", "AddBackward0"))
        rest = m.group(5)
        # what held it: the forward's activations, by the model's line
        held = re.search(r"of PyTorch's cache grown for activations at \S*/model\.py:(\d+) in "
                         r"(\w+\.)?forward \(\d+ segments?\)", rest)
        self.assertTrue(held, rest)
        with open(os.path.join(ROOT, "tests", "torch", "scripts", "model.py")) as f:
            self.assertTrue(f.read().splitlines()[int(held.group(1)) - 1].strip())
        # and PyTorch's own figures: fragmentation or real demand, said
        self.assertRegex(rest, r"reserved but unallocated, largest free block [\d.]+ [KMG]?i?B: "
                               r"(fragmentation|real demand)")

    def test_a_kept_graph_is_a_leak_named_by_line(self):
        """grow.py --keep keeps every step's loss with its graph (retain_graph):
        each step's activations stay. The leak is said, PyTorch's history is
        on for one step after it, and the tensors that step kept are named by
        the model's lines, adding up to the leak's rate."""
        run = self.torch("introspect.py", "%s/scripts/grow.py" % self.sess.dir,
                         "--steps", str(LEAK_STEPS), "--grow", "0", "--keep", gpuguard_run=[],
                         policy=self.write_policy("wide.ini", policy(TOTAL - GiB, 0)))
        self.assertRan(run)
        leaks = run.of("leak")
        self.assertTrue(leaks, run.err[-2000:])
        rate = leaks[0]["rate"]
        views = [v for v in run.of("torch") if v["why"] == "leak"]
        self.assertEqual(len(views), 1, run.of("torch"))
        # said once the check confirmed it: at the view's step, at the rate
        # of what one step kept (those tensors), the live bytes' trend beside
        self.assertEqual(views[0]["step"], leaks[0]["step"])
        self.assertTrue(leaks[0]["confirmed"])
        kept = [t for t in views[0]["tensors"] if t["pystack"]]
        files = {os.path.basename(t["pystack"][0]["file"]) for t in kept}
        self.assertIn("model.py", files)
        total = sum(t["bytes"] for t in kept)
        self.assertEqual(total, views[0]["kept"])
        self.assertEqual(rate, total)
        self.assertLess(abs(rate - leaks[0]["live_rate"]), rate // 4, leaks[0])
        info = run.result("instrument")
        self.assertEqual((info["history_turns"], info["history"]), (1, False))
        verdict = self.verdict(self.report(run))
        m = re.search(r"leak: \+[\d.]+ [KMG]iB per step since step \d+: ([\d.]+ [KMG]iB) a step kept "
                      r"in (\d+) tensors, most from \S*/model\.py:(\d+) in forward", verdict)
        self.assertTrue(m, verdict)

    def test_without_the_kept_graph_no_leak(self):
        run = self.torch("grow.py", "--steps", str(LEAK_STEPS), "--grow", "0", gpuguard_run=[],
                         policy=self.write_policy("wide.ini", policy(TOTAL - GiB, 0)))
        self.assertRan(run)
        self.assertEqual(run.of("leak"), [])
        self.assertEqual(run.of("torch"), [])
        self.assertNotIn("leak", self.verdict(self.report(run)))

    def test_a_fragmented_cache_is_called_fragmentation(self):
        run = self.torch("frag.py", gpuguard_run=[], policy=self.write_policy(
            "frag.ini", policy(1024 * MiB + 200 * MiB, 0, "enforce")))
        self.assertRan(run)
        verdict = self.verdict(self.report(run))
        m = re.search(r"Refusal at \S*/frag\.py:(\d+) in main, `aten::\w+` asked 400 MiB: "
                      r".*?([\d.]+ [KMG]iB) "
                      r"reserved but unallocated, largest free block ([\d.]+) MiB: fragmentation; "
                      r"`PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` would have fit it",
                      verdict)
        self.assertTrue(m, verdict)
        self.assertEqual(int(m.group(1)), line_of("frag.py", "torch.empty(a.request"))
        self.assertGreaterEqual(float(m.group(3)), 97)
        self.assertLess(float(m.group(3)), 400)

    def test_a_growing_run_forecast_with_its_tensors(self):
        wide = self.torch("grow.py", "--steps", str(GROW_STEPS), gpuguard_run=[],
                          policy=self.write_policy("wide.ini", policy(TOTAL - GiB, 0)))
        self.assertRan(wide)
        # the forecast follows the tensors' need (not the cache's peak)
        needs = [e["needed"] + e["peak_used"] - e["peak"] for e in wide.of("step")]
        line, margin = (needs[8] + needs[9]) // 2, 64 * MiB
        run = self.torch("grow.py", "--steps", str(GROW_STEPS), gpuguard_run=[],
                         policy=self.write_policy("grow.ini", policy(line + margin, margin)))
        self.assertRan(run)
        verdict = self.verdict(self.report(run))
        self.assertIn("forecast", verdict)
        m = re.search(r"the forecast step's tensors at the first near miss of its step "
                      r"\(step (\d+)\): ([\d.]+ [KMG]iB) held by (\d+) tensors? from "
                      r"\S*/(model|grow)\.py:(\d+)", verdict)
        self.assertTrue(m, verdict)
