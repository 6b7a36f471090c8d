"""The instrumentation on real PyTorch 2.6: unmodified scripts (no `import gpuguard`)
run through gpuguard-run, which instruments Python. A growing run gets a
forecast and its step's tensors by line; steps come from the optimizer hook
(and from the helper alone when it is in use); an OOM in backward gets the
`.backward()` line and PyTorch's view at the refusal; a fragmented cache is
called fragmentation with its largest free block; a flat run records no
view and never turns PyTorch's history on; results are the same bits with
and without the instrumentation; torch without CUDA, a late import and
child processes (fork and spawn) all run as they would."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from torchrig import GiB, MiB, TorchCase  # noqa: E402

TOTAL = 24 * GiB
SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts")

# grow.py's defaults: a batch of 4 that grows by 4 a step; its step peaks
# rise by about 40 MB a step, from 72 MiB at step 1 (measured on the rig).
GROW_STEPS = 12


def policy(limit, near_miss, mode="observe"):
    return """[gpu]
match = *
[memory]
headroom = %d
near_miss = %d
mode = %s
[trainer]
signal = none
""" % (TOTAL - limit, near_miss, mode)


def line_of(script, text):
    """The line number of the first line of scripts/SCRIPT holding text."""
    with open(os.path.join(SCRIPTS, script)) as f:
        for n, line in enumerate(f, 1):
            if text in line:
                return n
    raise AssertionError("%s has no line with %r" % (script, text))


class Instrumented(TorchCase):
    def run_(self, script, *args, via_run=True, **kw):
        """SCRIPT through gpuguard-run (or plain, with the shim preloaded
        and no instrumentation, when via_run is False), its instrumentation
        introspected afterwards."""
        if via_run:
            kw.setdefault("gpuguard_run", [])
        run = self.torch("introspect.py", "%s/scripts/%s" % (self.sess.dir, script), *args, **kw)
        self.assertRan(run)
        return run

    def step_needs(self):
        """Each step's device-wide need: what its tensors held at its peak
        (the step line's needed) and the device's use that is not the
        process's: what the forecast follows."""
        run = self.run_("grow.py", "--steps", str(GROW_STEPS),
                        policy=self.write_policy("wide.ini", policy(TOTAL - GiB, 0)))
        return [e["needed"] + e["peak_used"] - e["peak"] for e in run.of("step")]

    def test_a_growing_run_gets_a_forecast_and_its_steps_tensors_by_line(self):
        needs = self.step_needs()
        self.assertEqual(len(needs), GROW_STEPS)
        # the near-miss line between the needs of steps 9 and 10, the limit a
        # near-miss margin above
        line = (needs[8] + needs[9]) // 2
        margin = 64 * MiB
        run = self.run_("grow.py", "--steps", str(GROW_STEPS),
                        policy=self.write_policy("grow.ini", policy(line + margin, margin)))
        fc = [a for a in run.of("advice") if a["reason"] == "forecast"]
        self.assertTrue(fc, run.err[-2000:])
        step = fc[0]["forecast"]["step"]
        # the tensors' need is forecast a few steps ahead: named at the
        # boundary of an earlier step, whose view comes then
        steps = [e["step"] for e in run.of("step") if e["t"] <= fc[0]["t"]]
        self.assertLess(steps[-1], step)
        self.assertLessEqual(step - steps[-1], 3)
        views = run.of("torch")
        forecast = [v for v in views if v["why"] == "forecast"]
        self.assertTrue(forecast, views)
        self.assertEqual(forecast[0]["step"], steps[-1] + 1)
        # history on for the step it names only: none before it
        self.assertTrue(all("tensors" not in v for v in views if v["step"] < step), views)
        # the step's first near miss: PyTorch's live blocks at the step's peak, by line
        near = [v for v in views if v["why"] == "near_miss" and v["step"] == step]
        self.assertTrue(near, views)
        tensors = near[0]["tensors"]
        self.assertLessEqual(len(tensors), 32)
        self.assertEqual([t["bytes"] for t in tensors], sorted((t["bytes"] for t in tensors),
                                                               reverse=True))
        lines = {(os.path.basename(f["file"]), f["line"]) for t in tensors for f in t["pystack"][:1]}
        forward = line_of("grow.py", "loss = loss_fn(model(x))")
        with open(os.path.join(SCRIPTS, "model.py")) as f:
            model_lines = f.read().splitlines()
        named = [(file, n) for file, n in lines if file == "model.py"]
        self.assertTrue(named, tensors)  # the activations, by the model's lines
        for _, n in named:
            self.assertTrue(model_lines[n - 1].strip())
        stacks = [[(os.path.basename(f["file"]), f["line"]) for f in t["pystack"]] for t in tensors]
        self.assertTrue(any(("grow.py", forward) in s for s in stacks), stacks)
        # what autograd's thread allocated: under the .backward() line
        backward = line_of("grow.py", "loss.backward(")
        bw = [t for t in tensors if t["op"] == "backward"]
        self.assertTrue(bw, tensors)
        self.assertEqual(bw[0]["pystack"][0]["line"], backward)
        # history was on for that step only
        info = run.result("instrument")
        self.assertEqual(info["history_turns"], 1)
        self.assertFalse(info["history"])
        later = [v for v in views if v["step"] is not None and v["step"] > step]
        self.assertTrue(all("tensors" not in v for v in later), later)

    def test_steps_come_from_the_optimizer_hook(self):
        run = self.run_("grow.py", "--steps", "6", "--grow", "0",
                        policy=self.write_policy("wide.ini", policy(TOTAL - GiB, 0)))
        self.assertEqual([e["step"] for e in run.of("step")], [1, 2, 3, 4, 5, 6])
        self.assertEqual(run.result("instrument")["steps"], 6)

    def test_a_flat_run_records_no_view_and_no_history(self):
        run = self.run_("grow.py", "--steps", str(GROW_STEPS), "--grow", "0",
                        policy=self.write_policy("wide.ini", policy(TOTAL - GiB, 16 * MiB)))
        self.assertEqual(run.of("torch"), [])
        self.assertEqual(run.of("advice"), [])
        info = run.result("instrument")
        self.assertTrue(info["installed"])
        self.assertEqual((info["views"], info["history_turns"], info["history"]), (0, 0, False))
        # backward lines: one call site, thinned (the first 8)
        bw = run.of("backward")
        self.assertEqual([b["count"] for b in bw], list(range(1, 9)))
        self.assertEqual(bw[0]["step"], None)
        self.assertEqual(bw[1]["step"], 2)  # in progress after step 1's boundary

    def test_the_helpers_boundaries_win(self):
        """helper_train.py has a Guard and calls guard.step() after its
        optimizer: the steps are the Guard's, each once."""
        run = self.torch("helper_train.py", "--way", "step", "--steps", "5", "--grow", "0",
                         gpuguard_run=[], policy=self.write_policy("wide.ini", policy(TOTAL - GiB, 0)))
        self.assertRan(run)
        self.assertEqual([e["step"] for e in run.of("step")], [1, 2, 3, 4, 5])

    def test_an_oom_in_backward_gets_its_backward_line_and_pytorchs_view(self):
        args = ("--batch", "16", "--seq", "256", "--dim", "512", "--layers", "2")
        probe = self.torch("backward.py", *args, gpuguard_run=[],
                           policy=self.write_policy("wide.ini", policy(TOTAL - GiB, 0)))
        self.assertRan(probe)
        fwd, peak = probe.result("forward")["reserved"], probe.result("step")["max_allocated"]
        limit = (fwd + peak) // 2
        run = self.torch("backward.py", *args, gpuguard_run=[],
                         policy=self.write_policy("mid.ini", policy(limit, 0, "enforce")))
        self.assertRan(run)
        self.assertEqual(run.result("oom")["phase"], "backward")
        bw = run.of("backward")
        self.assertEqual(len(bw), 1)
        frame = bw[0]["pystack"][0]
        self.assertEqual((os.path.basename(frame["file"]), frame["line"]),
                         ("backward.py", line_of("backward.py", "loss.backward()")))
        self.assertEqual(bw[0]["thread"], "MainThread")
        refused = [e for e in run.of("refused") if e.get("thread") == "pt_autograd_0"]
        self.assertTrue(refused)
        self.assertLess(bw[0]["t"], refused[0]["t"])  # the latest backward line before it
        views = [v for v in run.of("torch") if v["why"] in ("refused", "oom")]
        self.assertEqual(len(views), 1, run.of("torch"))  # the observer's, once
        v = views[0]
        self.assertEqual(v["why"], "refused")
        self.assertEqual(v["request"], refused[-1]["bytes"])
        self.assertLessEqual(v["allocated"], v["reserved"])
        self.assertEqual(v["unallocated"], v["reserved"] - v["allocated"])
        self.assertGreater(v["t"], refused[0]["t"])

    def test_a_fragmented_cache_is_fragmentation(self):
        """A 1 GiB segment split into odd blocks, every other one freed, then
        400 MiB asked for under a limit 200 MiB above the segment: 540 MiB of
        the cache is free, but in pieces of under 100 MiB."""
        run = self.run_("frag.py", policy=self.write_policy(
            "frag.ini", policy(1024 * MiB + 200 * MiB, 0, "enforce")))
        self.assertIn("oom", [r["kind"] for r in run.results])
        views = run.of("torch")
        self.assertEqual(len(views), 1, views)
        v = views[0]
        self.assertEqual((v["why"], v["request"]), ("refused", 400 * MiB))
        self.assertTrue(v["fits_unfragmented"])
        self.assertLess(v["largest_free"], v["request"])
        self.assertGreaterEqual(v["largest_free"], 97 * MiB)
        self.assertGreater(v["unallocated"], v["request"])
        self.assertEqual(v["segments"], {"small": 0, "large": 0, "huge": 1, "expandable": 0})
        self.assertNotIn("tensors", v)  # no forecast: history never went on

    def test_results_are_the_same_with_and_without_it(self):
        """A seeded CPU run: the same losses and parameters to the bit;
        torch imported, CUDA never initialized by the instrumentation."""
        with_it = self.run_("cpu_train.py")
        without = self.run_("cpu_train.py", via_run=False, preload=False)
        self.assertEqual(with_it.result("losses"), without.result("losses"))
        info = with_it.result("instrument")
        self.assertTrue(info["installed"])
        self.assertFalse(info["cuda_initialized"])
        self.assertEqual(info["steps"], 6)  # the first optimizer's steps, not the second's
        self.assertFalse(without.result("instrument")["installed"])
        self.assertEqual(with_it.files, [])  # no CUDA, no journal

    def test_a_late_import(self):
        run = self.run_("late.py", "--steps", "4")
        self.assertEqual([e["step"] for e in run.of("step")], [1, 2, 3, 4])
        self.assertEqual(len(run.of("backward")), 4)

    def test_child_processes(self):
        run = self.torch("children.py", "--steps", "3", gpuguard_run=[],
                         policy=self.write_policy("wide.ini", policy(TOTAL - GiB, 0)))
        self.assertRan(run)
        kids = {r["how"]: r for r in run.results if r["kind"] == "child"}
        self.assertEqual(set(kids), {"fork-before", "fork-after", "spawn"})
        for how, r in kids.items():
            self.assertTrue(r["ok"], r)
            self.assertEqual(r["exitcode"], 0, r)
        # two journals: the parent's and the spawned child's (instrumented in its own right)
        self.assertEqual(len(run.files), 2, run.files)
        steps = [e["step"] for e in run.of("step")]
        self.assertEqual(sorted(steps), [1, 1, 2, 2, 3, 3])

    def test_no_torch(self):
        run = self.run_("grow.py", "--steps", "3", gpuguard_run=["--no-torch"],
                        policy=self.write_policy("wide.ini", policy(TOTAL - GiB, 0)))
        self.assertFalse(run.result("instrument")["installed"])
        self.assertEqual((run.of("step"), run.of("backward")), ([], []))
