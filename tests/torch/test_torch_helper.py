"""The Python helper on real CUDA tensors (real PyTorch 2.6 on the fake GPU):
a run whose sequence length grows every step outgrows the limit at its full
batch; the helper splits the loader's batch into micro-batches on the shim's
advice (sizing by shape off: test_torch_sizing.py has it on) and every step
finishes with the loader's batch unchanged."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from torchrig import GiB, TorchCase  # noqa: E402

TOTAL = 24 * GiB
STEPS = 8
ARGS = ("--steps", str(STEPS), "--batch", "16", "--seq", "64", "--grow", "64")


class GrowingRun(TorchCase):
    def limit(self):
        """Between the full batch's peak at the first step and at the last."""
        run = self.torch("train.py", *ARGS, "--dim", "256", "--layers", "2")
        self.assertRan(run)
        peaks = [r["max_reserved"] for r in run.results if r["kind"] == "step"]
        self.assertGreater(peaks[-1], 2 * peaks[0])
        return (peaks[0] + peaks[-1]) // 2

    def check(self, way):
        limit = self.limit()
        pol = self.write_policy("auto.ini", """[gpu]
match = *
[memory]
headroom = %d
near_miss = 16 MiB
mode = auto
""" % (TOTAL - limit))
        run = self.torch("helper_train.py", "--way", way, *ARGS, "--shapes", "off", policy=pol)
        self.assertRan(run)
        steps = [r for r in run.results if r["kind"] == "step"]
        self.assertEqual([s["step"] for s in steps], list(range(1, STEPS + 1)))
        for s in steps:
            self.assertEqual(s["loader_batch"], 16)
            self.assertEqual(s["samples"], 16, s)  # every sample trained, each step
        self.assertGreater(steps[-1]["split"], 1)  # it did split
        self.assertEqual(steps[0]["split"], 1)
        self.assertTrue(run.of("advice"), run.err[-2000:])
        self.assertTrue(run.of("mode"))  # auto switched to enforce when the Guard registered
        self.assertLessEqual(run.summary()["peak_used"], limit)
        return run

    def test_guard_run(self):
        self.check("run")

    def test_guard_microbatches(self):
        """microbatches() splits at batch boundaries only, on the shim's
        advice: what it followed was a forecast or a near miss of an earlier
        step, before any OutOfMemoryError reached the script."""
        run = self.check("microbatches")
        reasons = [a["reason"] for a in run.of("advice")]
        self.assertTrue(set(reasons) & {"forecast", "near_miss"}, reasons)


class HandWrittenLoop(TorchCase):
    def test_guard_step_marks_each_step(self):
        """guard.step() after optimizer.step() gives the shim the script's step
        boundaries: one step line per step, whose peak is PyTorch's own
        max_memory_reserved() of that step."""
        pol = self.write_policy("observe.ini", "[gpu]\nmatch = *\n[memory]\nmode = observe\n")
        run = self.torch("helper_train.py", "--way", "step", "--steps", "5", "--batch", "8",
                         "--seq", "64", "--grow", "64", policy=pol)
        self.assertRan(run)
        steps = [r for r in run.results if r["kind"] == "step"]
        lines = run.of("step")
        self.assertEqual([e["step"] for e in lines], [1, 2, 3, 4, 5])
        self.assertEqual([e["peak"] for e in lines], [s["max_reserved"] for s in steps])
        self.assertGreater(lines[-1]["peak"], lines[0]["peak"])  # the sequence grew
