"""gpuguard.preflight's parts without PyTorch: the GPU models and --gpu, the
estimates, the verdict's decisions, the largest batch's line and its checks,
and the probe's step hook, stop and sites on a stand-in torch (the real
thing runs on the rig: tests/torch/test_torch_preflight.py)."""
import json
import os
import sys
import tempfile
import types
import unittest

from gpuguard.preflight import answer as ans
from gpuguard.preflight import models, probe

GiB = 1 << 30
MiB = 1 << 20


class Models(unittest.TestCase):
    def test_a_policy_model_by_key_or_name(self):
        m = models.parse_gpu("rtx-3090")
        self.assertEqual((m.name, m.cc), ("NVIDIA GeForce RTX 3090", "8.6"))
        self.assertEqual(m.total, models.gib(23.70))
        self.assertIn("total capacity", m.source)
        self.assertEqual(models.parse_gpu("nvidia h200").total, 150109880320)

    def test_name_memory_cc(self):
        m = models.parse_gpu("NVIDIA GeForce RTX 3090, Founders,24GiB,8.6")
        self.assertEqual((m.name, m.total, m.cc), ("NVIDIA GeForce RTX 3090, Founders", 24 * GiB,
                                                   "8.6"))
        self.assertEqual(m.device, "NVIDIA GeForce RTX 3090, Founders,%d,8.6" % (24 * GiB))
        self.assertEqual(models.parse_gpu("X,1.5G,9.0").total, int(1.5 * GiB))

    def test_bad_gpus_say_what_is_wrong(self):
        for spec, said in (("X,lots,8.6", "not a memory size"), ("X,24GiB,eight", "compute"),
                           ("rtx-9999", "not a GPU model gpuguard knows"), (",24GiB,8.6", "name")):
            with self.assertRaises(ValueError) as e:
                models.parse_gpu(spec)
            self.assertIn(said, str(e.exception))

    def test_every_shipped_policy_has_its_model(self):
        root = os.path.join(os.path.dirname(__file__), "..", "..", "..", "policy")
        keys = {n[:-4] for n in os.listdir(root) if n.endswith(".ini")} - {"default"}
        self.assertEqual(keys, {k for k, _, _, _, _ in models.MODELS})
        self.assertEqual(len(models.shipped(keys)), len(keys))

    def test_estimates_by_model_and_cuda(self):
        h200 = models.outside("NVIDIA H200", 13, "context")
        self.assertEqual(h200.bytes, 626 * MiB)
        self.assertEqual(models.outside("NVIDIA H200", 12, "context").bytes, 400 * MiB)
        self.assertEqual(models.outside("Tesla T4", 13, "cublas_handle").bytes, 64 * MiB)
        self.assertEqual(models.outside("Tesla T4", 12, "cublas_handle").bytes, 0)
        for f in models.OUTSIDE:
            self.assertTrue(f.source and ("http" in f.source or "tests/traces" in f.source),
                            f.source)


class Run(object):
    """A stand-in for runner.Result."""

    def __init__(self, completed=True, reserved=0, needed=0, flushes=0, failure=None, steps=3,
                 tokens=None):
        self.completed = completed
        self.max_reserved = reserved
        self.max_needed = needed
        self.flushes = flushes
        self.failure = failure
        self.reached = steps
        self.peak_step = {"step": 2, "tokens": tokens, "shape": None}


def batch(total, limit, run, b=None, near=None, outside=400 * MiB):
    x = ans.Batch(models.Model("GPU", total, "8.6"), b)
    x.limit, x.near, x.total = limit, near, total
    x.fit = run
    x.outside = types.SimpleNamespace(bytes=outside, parts=[])
    return x


class Verdicts(unittest.TestCase):
    def test_under_the_limit_it_fits_with_no_other_run(self):
        b = batch(24 * GiB, 21 * GiB, Run(reserved=10 * GiB, needed=9 * GiB))
        self.assertEqual(ans.plan_followups(b), [])
        self.assertEqual(b.verdict, ans.FITS)
        self.assertEqual(b.need, 10 * GiB + 400 * MiB)
        self.assertIn("<= limit", ans.explain(b))

    def test_near_the_limit_a_run_under_it_decides(self):
        b = batch(16 * GiB, 14 * GiB, Run(reserved=14 * GiB, needed=12 * GiB))
        self.assertEqual(ans.plan_followups(b), ["limit"])
        self.assertIsNone(b.verdict)
        b.limit_run = Run(completed=True, reserved=13 * GiB, needed=12 * GiB, flushes=4)
        ans.settle(b)
        self.assertEqual(b.verdict, ans.FITS)
        self.assertIn("emptied its cache", ans.explain(b))
        # what it reserves on that GPU under the guard, beside what it would with no limit
        self.assertEqual((b.peak_reserved, b.unconstrained), (13 * GiB, 14 * GiB))
        self.assertEqual(b.need, 14 * GiB + 400 * MiB)
        b2 = batch(16 * GiB, 14 * GiB, Run(reserved=14 * GiB, needed=12 * GiB))
        ans.plan_followups(b2)
        b2.limit_run = Run(completed=False)
        ans.settle(b2)
        self.assertEqual(b2.verdict, ans.NO_HEADROOM)

    def test_tensors_alone_over_the_limit_need_no_limit_run(self):
        b = batch(16 * GiB, 14 * GiB, Run(reserved=15 * GiB, needed=14 * GiB))
        self.assertEqual(ans.plan_followups(b), [])
        self.assertEqual(b.verdict, ans.NO_HEADROOM)

    def test_out_of_memory_at_the_whole_device(self):
        b = batch(12 * GiB, 10 * GiB, Run(completed=False, reserved=11 * GiB, needed=11 * GiB))
        self.assertEqual(ans.plan_followups(b), ["need"])
        self.assertEqual(b.verdict, ans.DOES_NOT_FIT)
        b.need_run = Run(reserved=17 * GiB, needed=16 * GiB)
        self.assertEqual(b.peak_reserved, 17 * GiB)   # what it needs, from the larger device
        self.assertIn("> the whole", ans.explain(b))

    def test_another_failure_gives_no_verdict(self):
        b = batch(24 * GiB, 21 * GiB, Run(completed=False, failure="exit status 1"))
        self.assertEqual(ans.plan_followups(b), [])
        self.assertIsNone(b.verdict)
        self.assertEqual(b.failure, "exit status 1")


class LargestBatch(unittest.TestCase):
    def answer(self, points, limit=21 * GiB, near=GiB):
        bs = [batch(24 * GiB, limit, Run(reserved=p - 400 * MiB, tokens=256 * b), b=b, near=near)
              for b, p in points]
        for b in bs:
            ans.plan_followups(b)
        return ans.ModelAnswer(models.Model("GPU", 24 * GiB, "8.6"), bs)

    def test_a_line_through_the_points_and_a_run_at_its_prediction(self):
        a = self.answer([(4, 5 * GiB), (8, 9 * GiB)])      # 1 GiB + 1 GiB x batch
        self.assertEqual(ans.line_fit([(4, 5 * GiB), (8, 9 * GiB)]), (GiB, GiB))
        a.settle_batches(final=False)
        self.assertEqual(a.to_check, 20)                    # 21 GiB: batch 20
        self.assertIsNone(a.max_batch)
        # the check ran and did not fit: the line is drawn again, lower
        chk = batch(24 * GiB, 21 * GiB, Run(reserved=int(23.5 * GiB), tokens=256 * 20), b=20,
                    near=GiB)
        ans.plan_followups(chk)
        a.checks.append(chk)
        a.settle_batches(final=False)
        self.assertLess(a.to_check, 20)
        shown = a.to_check
        ok = batch(24 * GiB, 21 * GiB, Run(reserved=20 * GiB, tokens=256 * shown), b=shown,
                   near=GiB)
        ans.plan_followups(ok)
        a.checks.append(ok)
        a.settle_batches(final=True)
        self.assertEqual(a.max_batch, shown)                # only a batch a run showed
        self.assertEqual(a.max_tokens, 256 * shown)
        self.assertIn("checked by runs at", a.max_batch_why)
        # the next run's micro-batch is never above the step's batch (8)
        self.assertEqual(a.recommended, (8, 1))

    def test_one_batch_gives_no_line(self):
        a = self.answer([(8, 9 * GiB)])
        a.settle_batches(final=True)
        self.assertEqual(a.max_batch, 8)
        self.assertIn("two values", a.max_batch_why)

    def test_the_json_has_its_keys_and_no_other(self):
        a = self.answer([(4, 5 * GiB), (8, 9 * GiB)])
        a.settle_batches(final=True)
        self.assertEqual(sorted(a.json()), sorted([
            "name", "total", "limit", "peak_reserved", "peak_needed", "outside_estimate",
            "verdict", "fits", "max_batch", "max_tokens"]))


# --- the probe, on a stand-in torch -----------------------------------------------------

class FakeTensor(object):
    def __init__(self, shape, cuda=True):
        self.shape = shape
        self.is_cuda = cuda
        self.dtype = "float"

    def numel(self):
        n = 1
        for x in self.shape:
            n *= x
        return n

    def item(self):
        return 0.0


def fake_torch():
    """A stand-in torch, its hooks and its allocator's peaks; its Tensor is
    a class of its own (the probe wraps methods of the torch it is given)."""
    hooks = {}
    stats = {"reserved_bytes.all.peak": 0, "allocated_bytes.all.peak": 0}
    t = types.ModuleType("torch")
    t.__file__ = "/nonexistent/torch/__init__.py"
    t.__version__ = "0.fake"
    t.Tensor = type("Tensor", (FakeTensor,), {"item": lambda self: 0.0})
    t.bool = "bool"
    t.version = types.SimpleNamespace(cuda="12.4")
    optim_mod = types.SimpleNamespace(
        register_optimizer_step_post_hook=lambda fn: hooks.setdefault("step", fn))
    t.optim = types.SimpleNamespace()
    sys.modules["torch.optim.optimizer"] = optim_mod
    module_mod = types.SimpleNamespace(
        register_module_forward_pre_hook=lambda fn: hooks.setdefault("pre", fn),
        register_module_forward_hook=lambda fn, always_call=False: hooks.setdefault("post", fn))
    t.nn = types.SimpleNamespace(modules=types.SimpleNamespace(module=module_mod))

    def reset():
        stats["reserved_bytes.all.peak"] = 0
        stats["allocated_bytes.all.peak"] = 0
    t.cuda = types.SimpleNamespace(
        is_initialized=lambda: True, memory_stats=lambda: dict(stats),
        memory_reserved=lambda: 0, memory_allocated=lambda: 0, reset_peak_memory_stats=reset,
        mem_get_info=lambda: (1, 2), _queued_calls=[])
    t._C = types.SimpleNamespace()
    return t, hooks, stats


class Optimizer(object):
    pass


class Probe(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp()
        self.path = os.path.join(self.dir, "probe.jsonl")
        self.addCleanup(sys.modules.pop, "torch.optim.optimizer", None)

    def lines(self):
        with open(self.path) as f:
            return [json.loads(l) for l in f]

    def test_each_step_its_own_peak_and_a_stop_at_the_last(self):
        t, hooks, stats = fake_torch()
        p = probe._Probe(t, self.path, 3)
        p.start()
        opt = Optimizer()
        for step in range(1, 4):
            hooks["pre"](None, (t.Tensor([8, 128 * step]),))
            hooks["post"](None, (), None)
            stats["reserved_bytes.all.peak"] = step * 100
            stats["allocated_bytes.all.peak"] = step * 60
            if step < 3:
                hooks["step"](opt, (), {})
            else:
                with self.assertRaises(SystemExit) as e:
                    hooks["step"](opt, (), {})
                self.assertEqual(e.exception.code, 0)
        steps = [l for l in self.lines() if l["ev"] == "step"]
        self.assertEqual([s["reserved_peak"] for s in steps], [100, 200, 300])
        self.assertEqual([s["shape"] for s in steps], [[8, 128], [8, 256], [8, 384]])
        self.assertEqual(stats["reserved_bytes.all.peak"], 0)    # reset after each step
        end = [l for l in self.lines() if l["ev"] == "end"]
        self.assertEqual((end[0]["why"], end[0]["steps"], end[0]["max_reserved"]),
                         ("steps", 3, 300))

    def test_another_optimizer_of_the_same_step_is_not_a_step(self):
        t, hooks, stats = fake_torch()
        p = probe._Probe(t, self.path, 0)
        p.start()
        first, second = Optimizer(), Optimizer()
        for _ in range(2):
            hooks["step"](first, (), {})
            hooks["step"](second, (), {})
        self.assertEqual(p.steps, 2)

    def test_the_scripts_own_reads_are_sites_pytorchs_are_not(self):
        t, hooks, stats = fake_torch()
        p = probe._Probe(t, self.path, 0)
        p.start()
        x = t.Tensor([1])
        x.item()
        x.item()
        t.Tensor([1], cuda=False).item()        # a CPU tensor's value is real
        t.cuda.mem_get_info()
        p._end("exit")
        sites = self.lines()[-1]["sites"]
        kinds = sorted((s["kind"], s["op"], s["count"]) for s in sites)
        self.assertEqual(kinds, [("device", "mem_get_info", 1), ("value", "item", 1),
                                 ("value", "item", 1)])     # two lines, one call each
        self.assertTrue(all(s["file"] == __file__ for s in sites))


if __name__ == "__main__":
    unittest.main()
