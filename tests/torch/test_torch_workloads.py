"""The workloads users run, on real PyTorch 2.6, as unmodified scripts
(no `import gpuguard`) under gpuguard-run with the shipped policies, read as
a user reads the report. A sequence that grows (the default allocator, and
expandable segments): the failure that ended the run leads, its cache
flushes are counted and `expandable_segments:True` proposed, the forecast
comes at least 3 steps before the end, no leak is said, advice names the
script's own batch. Long-tailed lengths: the step whose shape broke the run
and the largest that fits. A real leak, by its line, at the rate one step
keeps. Counts that equal what the script did. A run PyTorch always
recovered. Killed runs (SIGKILL, SIGTERM) and an uncaught OOM. An inference
loop, two optimizers, a DataLoader, the cache emptied every step. The
program's own peak statistics, the same with and without the
instrumentation (which resets them every step). Every verdict of every
journal is held to its figures (torchrig.verdict_problems, after each test).
"""
import os
import re
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from torchrig import ROOT, TorchCase, command, session  # noqa: E402
from test_torch_instrument import line_of  # noqa: E402

REPORT = os.path.join(ROOT, "tools", "bin", "gpuguard-report")
GiB = 1 << 30


class Workloads(TorchCase):
    def lm(self, *args, env=None, plain=False):
        kw = {"preload": False} if plain else {"gpuguard_run": []}
        return self.torch("lm.py", *args, env=env, **kw)

    def report(self, run, *args):
        self.assertTrue(run.files, run.err[-3000:])
        out = subprocess.run([sys.executable, REPORT] + list(args) + run.files,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)
        self.assertEqual(out.returncode, 0, out.stderr)
        return out.stdout

    def verdict(self, text):
        return text.split("=" * 20)[0]

    def growing(self, env=None):
        """The sequence grows by 256 tokens a step at batch 16 until the
        device's 24 GiB no longer hold a step (observe: nothing refused)."""
        run = self.lm("--steps", "60", env=env)
        self.assertEqual(run.rc, 1, run.err[-2000:])  # it dies of the OOM, uncaught
        self.assertIn("torch.OutOfMemoryError", run.err)
        return run, run.result("oom")

    def check_growing(self, run, died, expandable):
        end = died["step"]
        [summary] = run.of("summary")
        self.assertEqual(summary["status"], 1)
        self.assertTrue(summary["uncaught"].startswith("torch.OutOfMemoryError: CUDA out of memory"))
        dev = summary["devices"][0]
        # counts: the steps that ended, each failure PyTorch retried once
        self.assertEqual(dev["steps"], died["steps"])
        self.assertEqual(dev["step"], died["steps"])
        self.assertEqual(dev["ooms"] + dev["refusals"], died["retries"])
        self.assertEqual(dev["ooms"] - dev["ooms_recovered"], died["ooms"])
        self.assertEqual(summary["backward_calls"], died["backwards"])
        # the forecast: the tensors' need, at least 3 steps before the end
        fc = [a for a in run.of("advice") if a["reason"] == "forecast"]
        self.assertTrue(fc, "no forecast")
        steps = [e["step"] for e in run.of("step") if e["t"] <= fc[0]["t"]]
        self.assertGreaterEqual(end - steps[-1], 3, (fc[0], end))
        self.assertLessEqual(fc[0]["forecast"]["step"], end)
        # advice in the script's terms: its batch of 16 halved, heard by no one
        self.assertTrue(all(a["batch_size"] == 8 and a["grad_accum"] == 2 for a in run.of("advice")))
        self.assertTrue(all(a["heard"] is False for a in run.of("advice")))
        self.assertEqual(dev["advice"], 0)
        # no leak: what grows is the input
        self.assertEqual(run.of("leak"), [])
        text = self.report(run)
        v = self.verdict(text)
        self.assertNotIn("leak", v)
        m = re.search(r"the failure that ended the run: pid \d+ \(python3\) GPU0 .* in step "
                      r"(\d+) \(input \[16, (\d+)\]\):", v)
        self.assertTrue(m, v)
        self.assertEqual(int(m.group(1)), end)
        self.assertEqual(int(m.group(2)), 256 * end)
        self.assertIn("died of torch.OutOfMemoryError after ", v)
        self.assertIn("would have advised batch 8 x accum 2", v)
        if not expandable:
            self.assertGreater(dev["ooms_recovered"], 0)
            m = re.search(r"cache flushes: (\d+) failures PyTorch recovered from by emptying its "
                          r"cache and retrying .* in (\d+) steps", v)
            self.assertTrue(m, v)
            self.assertEqual(int(m.group(1)), dev["ooms_recovered"] + dev["refusals_recovered"])
            self.assertEqual(int(m.group(2)), dev["flush_steps"])
            self.assertIn("why: the step's input grows", v)
            self.assertIn("`PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`", v)
            self.assertIn("blocks too small", v)
        return text

    def test_a_growing_sequence(self):
        run, died = self.growing()
        text = self.check_growing(run, died, expandable=False)
        self.assertIn("   inputs       [16, 256] at step 1 .. ", text)
        self.assertIn("(growing with the step); batch 16", text)

    def test_a_growing_sequence_with_expandable_segments(self):
        run, died = self.growing(env={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"})
        self.check_growing(run, died, expandable=True)
        # its live bytes grow with the input, the cache keeps them mapped: a
        # suspicion the check cleared, no leak
        checks = [v for v in run.of("torch") if v["why"] == "leak"]
        self.assertTrue(checks)
        self.assertTrue(all(v["kept"] == 0 for v in checks), checks)

    def test_long_tailed_documents(self):
        run = self.lm("--lengths", "longtail", "--batch", "24", "--steps", "30")
        self.assertEqual(run.rc, 1, run.err[-2000:])
        died = run.result("oom")
        self.assertEqual(died["step"], 18)
        v = self.verdict(self.report(run))
        m = re.search(r"step 18 broke the run: input 24 x 7556 \((\S+ ?\S*) tokens\), "
                      r"([\d.]+)x the longest before it", v)
        self.assertTrue(m, v)
        self.assertEqual(int(m.group(1).replace(" ", "")), 24 * 7556)
        longest = max(r["tokens"] for r in run.results if r.get("kind") == "step")
        self.assertAlmostEqual(float(m.group(2)), 24 * 7556 / longest, delta=0.05)
        m = re.search(r"shapes vary; needed = \S+ \S+ \+ \S+ \S+ x tokens over (\d+) steps "
                      r"\(R\u00b2 ([\d.]+)\)", v)
        self.assertTrue(m, v)
        self.assertGreaterEqual(float(m.group(2)), 0.9)
        m = re.search(r"the largest input that fits under the limit: 24 x (\d+) \(", v)
        self.assertTrue(m, v)
        self.assertGreater(int(m.group(1).replace(" ", "")), 2000)  # every finished step's did
        self.assertLess(int(m.group(1).replace(" ", "")), 7556)
        # no trend per step through random lengths
        self.assertNotIn("   trend ", self.report(run))

    def test_a_real_leak_by_its_line(self):
        run = self.lm("--lengths", "fixed", "--seq", "512", "--keep", "outputs", "--steps", "30")
        self.assertEqual(run.rc, 0, run.err[-2000:])
        leaks = run.of("leak")
        self.assertTrue(leaks)
        self.assertTrue(all(e["confirmed"] for e in leaks))
        # one step's logits: 16 x 512 x 8000 floats
        self.assertEqual(leaks[0]["rate"], 16 * 512 * 8000 * 4)
        v = self.verdict(self.report(run))
        m = re.search(r"leak: \+250 MiB per step since step \d+: 250 MiB a step kept in 1 tensor, "
                      r"most from \S*/lm\.py:(\d+) in forward", v)
        self.assertTrue(m, v)
        self.assertEqual(int(m.group(1)), line_of("lm.py", "return self.head(self.encoder("))

    def test_a_flat_run_and_its_counts(self):
        """399 steps (their lines thinned past 100): the report's counts are
        the script's."""
        run = self.lm("--lengths", "fixed", "--seq", "64", "--steps", "399", "--vocab", "512",
                      "--dim", "64", "--layers", "1")
        self.assertEqual(run.rc, 0, run.err[-2000:])
        final = run.result("final")
        self.assertLess(len(run.of("step")), 399)
        text = self.report(run)
        self.assertIn("   steps        1 .. 399 (399 steps, %d journaled" % len(run.of("step")), text)
        self.assertRegex(text, r"backward     %d calls: backward of " % final["backwards"])
        self.assertEqual(run.of("leak"), [])
        self.assertEqual([a for a in run.of("advice") if a["reason"] == "forecast"], [])

    def test_a_run_pytorch_always_recovered(self):
        """Growing for 14 steps: the cache fills and PyTorch empties it and
        retries, every time with success; the program never saw a failure."""
        run = self.lm("--steps", "14")
        self.assertEqual(run.rc, 0, run.err[-2000:])
        final = run.result("final")
        dev = run.summary()
        self.assertGreater(final["retries"], 0)
        self.assertEqual(final["ooms"], 0)
        self.assertEqual(dev["ooms_recovered"] + dev["refusals_recovered"], final["retries"])
        self.assertEqual(dev["ooms"] + dev["refusals"], final["retries"])
        self.assertEqual(run.of("summary")[0]["status"], 0)
        v = self.verdict(self.report(run))
        self.assertNotIn("first failure", v)
        self.assertNotIn("ended the run", v)
        self.assertIn("no failure reached the program: every refusal and OOM was recovered by a "
                      "cache flush", v)
        self.assertIn("finished after ", v)
        self.assertRegex(v, r"\d+ OOMs? \((all )?recovered by a cache flush\)")
        # --recommend on the finished run: one batch seen (its inputs'), no
        # fit, and why; never a batch it finished "predicted not to fit"
        rec = self.report(run, "--recommend")
        self.assertIn("NVIDIA GeForce RTX 3090: no recommendation: 1 fitted point (16: ", rec)
        self.assertIn("is not enough to fit", rec)
        self.assertNotIn("predicted", rec)

    def test_an_uncaught_oom_and_killed_runs(self):
        # killed: a flat run slowed to let the shim's thread write as it goes
        for sig in (signal.SIGKILL, signal.SIGTERM):
            s = session()
            run_dir = os.path.join(self.tmp, "k%d" % sig)
            os.makedirs(run_dir)
            os.chmod(run_dir, 0o777)
            argv = command(["/usr/bin/python3", s.dir + "/scripts/lm.py", "--lengths", "fixed",
                            "--seq", "1024", "--steps", "400", "--sleep", "0.05"],
                           s.inside(run_dir), gpuguard_run=[])
            proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True)
            seen = 0
            for line in proc.stdout:
                if line.startswith("RESULT ") and '"kind": "step"' in line:
                    seen += 1
                    if seen == 30:
                        break
            time.sleep(0.6)  # a tick of the shim's thread after the peak
            pid = subprocess.run(["pgrep", "-n", "-f", "scripts/lm.py --lengths fixed --seq 1024"],
                                 stdout=subprocess.PIPE, text=True).stdout.split()
            self.assertTrue(pid)
            os.kill(int(pid[-1]), sig)
            proc.communicate(timeout=60)
            journals = [os.path.join(run_dir, f) for f in os.listdir(run_dir)
                        if f.endswith(".jsonl")]
            self.assertEqual(len(journals), 1)
            out = subprocess.run([sys.executable, REPORT] + journals, stdout=subprocess.PIPE,
                                 text=True, timeout=120).stdout
            if sig == signal.SIGTERM:
                self.assertRegex(out, r"killed by SIGTERM after .*, after step \d+ \(no summary\)")
            else:
                self.assertRegex(out, r"killed after .*, after step \d+ \(no summary: SIGKILL")
            m = re.search(r"after step (\d+)", out)
            self.assertGreaterEqual(int(m.group(1)), 29)
            self.assertRegex(out, r"peak [\d.]+ GiB of limit")
            self.assertIn("the last written before the process was killed", out)
            self.assertRegex(out, r"\S*/lm\.py:\d+ in (LM\.)?forward")

    def test_ordinary_loops(self):
        """An inference loop (no optimizer: no steps), two optimizers, a
        DataLoader with workers, the cache emptied every step: each runs as
        it would, with its steps counted once and no leak said for growth."""
        run = self.torch("infer.py", "--batches", "8", gpuguard_run=[])
        self.assertEqual(run.rc, 0, run.err[-2000:])
        self.assertEqual(run.of("step"), [])
        for args, want in ((["--optimizers", "2"], 12), (["--loader"], 12),
                           (["--empty-cache"], 12)):
            run = self.lm("--steps", "12", "--grow", "128", *args)
            self.assertEqual(run.rc, 0, (args, run.err[-2000:]))
            self.assertEqual([e["step"] for e in run.of("step")], list(range(1, want + 1)), args)
            self.assertEqual(run.of("leak"), [], args)
            self.assertEqual(run.summary()["steps"], want)

    def test_an_inference_loop_is_advised_in_its_batch(self):
        # the weights fit; the first forward's hidden activations (59 392 x
        # 4 096 floats) come near
        policy = self.write_policy("tight.ini", "[gpu]\nmatch = *\n[memory]\n"
                                   "headroom = 22.8 GiB\nnear_miss = 256 MiB\nmode = observe\n"
                                   "[trainer]\nsignal = none\n")
        run = self.torch("infer.py", "--batches", "4", gpuguard_run=[], policy=policy)
        self.assertEqual(run.rc, 0, run.err[-2000:])
        advice = run.of("advice")
        self.assertTrue(advice)
        self.assertEqual((advice[0]["batch_size"], advice[0]["grad_accum"]), (29696, 2))
        self.assertFalse(advice[0]["heard"])
        v = self.verdict(self.report(run))
        self.assertIn("would have advised batch 29696 x accum 2 (near_miss; 1 advice in all), but "
                      "no trainer heard it", v)

    def test_the_programs_own_peaks_are_kept(self):
        """A script that reads and resets PyTorch's peak statistics sees the
        same numbers with the instrumentation (which resets them at every
        step to know each step's need) as without it."""
        args = ("--lengths", "grow", "--grow", "64", "--steps", "12", "--peaks")
        plain = self.lm(*args, plain=True)
        ran = self.lm(*args)
        self.assertEqual(plain.rc, 0, plain.err[-2000:])
        self.assertEqual(ran.rc, 0, ran.err[-2000:])
        got = [r for r in ran.results if r["kind"] == "peaks"]
        want = [r for r in plain.results if r["kind"] == "peaks"]
        self.assertEqual(len(got), len(want))
        self.assertEqual(got, want)
        # and it did reset them: each step's need told, but for the steps in
        # which the program reset them itself (the 7th and the 13th: after
        # the 6th's and the 12th's boundary), whose need is not known
        told = [e["step"] for e in ran.of("step") if "needed" in e]
        self.assertEqual(told, [n for n in range(1, 13) if n not in (7,)])
