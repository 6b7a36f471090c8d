"""Each batch sized by its shape before it runs, on real PyTorch 2.6 (the
fake GPU): a small transformer language model (guard_lm.py) through
Guard.run under gpuguard-run, on long-tailed documents (most short, a few of
4 000-8 000 tokens) and on a sequence that grows then shrinks, against a
near-miss line of about 6 GiB. The batches split are the ones whose unsplit
peak, measured alone in observe on a larger GPU, crosses the line; the rest
run whole, with no refusal, no OOM and no flush after the first batches; a
growing run is split step by step before any near miss, and whole again as
it shrinks."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from torchrig import GiB, TorchCase  # noqa: E402

MiB = 1 << 20
TOTAL = 24 * GiB
NEAR = 256 * MiB
LIMIT = TOTAL - (17 * GiB + 819 * MiB)        # headroom 17.8 GiB: a 6.2 GiB limit
LINE = LIMIT - NEAR
H100 = "NVIDIA H100 80GB HBM3,80GiB,9.0"
POLICY = """[gpu]
match = *
[memory]
headroom = 17.8 GiB
near_miss = 256 MiB
mode = auto
"""


class Sizing(TorchCase):
    def guarded(self, *args):
        pol = self.write_policy("sizing.ini", POLICY)
        run = self.torch("guard_lm.py", "--way", "run", *args, policy=pol, gpuguard_run=[])
        self.assertRan(run)
        return run

    def alone(self, *args):
        """Each batch's unsplit peak: run whole and alone (the cache emptied
        before it) in observe on an 80 GiB GPU."""
        pol = self.write_policy("observe.ini", "[gpu]\nmatch = *\n[memory]\nmode = observe\n")
        run = self.torch("guard_lm.py", "--way", "measure", *args, policy=pol, devices=H100)
        self.assertRan(run)
        self.assertFalse(run.of("refused") or run.of("oom"))
        return {r["step"]: r["max_reserved"] for r in run.results if r["kind"] == "alone"}

    def failures_after(self, run, batch):
        """Refusals, OOMs and flush-recovered failures in batches after
        `batch` (a batch's events come after the step line of the batch
        before it)."""
        out, step = [], 0
        for e in run.events:
            if e["ev"] == "step":
                step = e["step"]
                if e.get("flushes") and step > batch:
                    out.append((step, "flush"))
            elif e["ev"] in ("refused", "oom") and step >= batch:
                out.append((step + 1, e["ev"]))
        return out

    def test_long_tailed_batches_split_only_where_they_cross(self):
        peaks = self.alone()
        crossing = sorted(s for s, p in peaks.items() if p > LINE)
        self.assertTrue(2 <= len(crossing) <= 4, (crossing, peaks))  # the workload, as meant
        run = self.guarded()
        steps = [r for r in run.results if r["kind"] == "step"]
        self.assertEqual([s["step"] for s in steps], list(range(1, 61)))
        for s in steps:
            self.assertEqual(sum(s["sizes"]), 8, s)   # every sample trained, each batch
        split = sorted(s["step"] for s in steps if s["pieces"] > 1)
        self.assertTrue(set(crossing) <= set(split), (crossing, split))
        self.assertLessEqual(len(split), len(crossing) + 1, (crossing, split))
        self.assertGreaterEqual(60 - len(split), 56)
        self.assertEqual(self.failures_after(run, 10), [])
        self.assertFalse(run.of("oom"))
        final = run.result("final")
        self.assertEqual(final["ooms"], 0)
        self.assertEqual((final["whole"], final["split_by_shape"]), (60 - len(split), len(split)))
        for s in split:
            self.assertIn("gpuguard: batch %d: 8 x " % s, run.err)
        self.assertIn("gpuguard: 60 batches: %d whole, %d split by their shape, 0 redone"
                      % (60 - len(split), len(split)), run.err)
        self.assertLessEqual(run.summary()["peak_used"], LIMIT)
        # each sized step's line says what was predicted for it, within 10%
        predicted = [e for e in run.of("step") if "predicted" in e]
        self.assertGreaterEqual(len(predicted), 50)
        for e in predicted:
            need = e["needed"] + e["peak_used"] - e["peak"]
            self.assertLess(abs(e["predicted"] - need), 0.1 * need, e)
        model = run.summary()["model"]
        self.assertEqual(model["steps"], 60)
        self.assertGreater(model["per_token"], 0)
        # each change of the split is a batch line saying why: the shape
        changes = [e for e in run.of("batch") if not e.get("final") and "was_batch_size" in e]
        self.assertEqual(len(changes), 2 * len(split))          # split, then whole again
        self.assertEqual({e.get("reason") for e in changes}, {"shape"})

    def test_growing_shapes_split_step_by_step_and_grow_back(self):
        args = ("--lengths", "growshrink", "--batches", "28", "--seq", "512", "--grow", "512",
                "--turn", "14")
        peaks = self.alone(*args)
        run = self.guarded(*args)
        steps = {r["step"]: r for r in run.results if r["kind"] == "step"}
        self.assertEqual(sorted(steps), list(range(1, 29)))
        crossing = {s for s, p in peaks.items() if p > LINE}
        split = {s for s, r in steps.items() if r["pieces"] > 1}
        self.assertTrue(crossing, peaks)
        self.assertTrue(crossing <= split, (crossing, split))
        self.assertLessEqual(len(split - crossing), 2, (crossing, split))  # one each way
        # split as the shapes grow, whole again as they shrink
        first, last = min(split), max(split)
        self.assertEqual(split, set(range(first, last + 1)))
        self.assertLess(first, 14)
        self.assertGreater(last, 14)
        self.assertTrue(all(steps[s]["pieces"] == 1 for s in range(last + 1, 29)))
        # before any near miss: none at all, nothing refused
        self.assertFalse(run.of("near_miss") or run.of("refused") or run.of("oom"))
        self.assertEqual(run.result("final")["redone"], 0)
