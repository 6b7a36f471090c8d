"""gpuguard-report --recommend [--out DIR]: from the trainer's (batch, peak)
points (`batch` events, `step` peaks), the batch and accumulation for the
next run per GPU model, written as policy files that gpuguard-check lints
clean and picks for the GPU. Journals built in the shim's shape
(shimlike.py), from a trainer whose process peak is a known function of its
batch, so the recommendation's error is measured against the truth."""
import configparser
import io
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest
from contextlib import redirect_stderr, redirect_stdout

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import shimlike  # noqa: E402
from test_report import load_report  # noqa: E402

rpt = load_report()
GiB, MiB = shimlike.GiB, shimlike.MiB
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
BUILD = os.environ.get("GG_BUILD") or os.path.join(ROOT, "build")
CHECK = os.path.join(BUILD, "gpuguard-check")
FAKE = os.path.join(BUILD, "fake")

RTX = "NVIDIA GeForce RTX 3090"
TOTAL = 24 * GiB
HEADROOM = 2 * GiB
LIMIT = TOTAL - HEADROOM                 # 22 GiB
NEAR = TOTAL * 5 // 100                  # 5%: near misses from 20.8 GiB used
CONTEXT = 512 * MiB                      # device use that is not the process's
PIECE = 256 * MiB


def linear(b):
    """Weights and optimizer state, plus activations per sample."""
    return 6 * GiB + b * 5 * GiB // 4


def quadratic(b):
    """Attention-like: activations grow faster than the batch."""
    return 6 * GiB + b * GiB + b * b * 3 * GiB // 100


def trainer(phases, peak_of=linear, steps=True, pid=4242, rank=0, name=RTX, total=TOTAL,
            headroom=HEADROOM, finish=True, dev=0):
    """A run in the shim's shape: per step the process climbs from its
    weights to peak_of(batch) in 256 MiB allocations (a sample each, more
    than 1% of total) and back. An allocation that would cross the limit
    is refused; the shim advises, the trainer acks at once, which ends the
    phase: a `batch` event carries its peak. `steps`: a `step` line per
    step (the shim's gpuguard_step)."""
    near = total * 5 // 100
    limit = total - headroom
    p = shimlike.Process([shimlike.device(dev, name, total, headroom, near, cc="8.6")],
                         pid=pid, rank=rank)
    t, step, seq = 1.0, 0, 0
    cur = peak = 0
    for i, (b, a, nsteps) in enumerate(phases):
        p.batch(t, dev, b, a, peak)
        if i == 0:
            p.mode(t, dev)
        peak = 0
        refused = False
        for _ in range(nsteps):
            step += 1
            cur = 6 * GiB
            step_peak = cur
            while cur < peak_of(b):
                t += 0.01
                nbytes = min(PIECE, peak_of(b) - cur)
                if cur + CONTEXT + nbytes > limit:
                    p.incident("refused", t, dev, nbytes, cur + CONTEXT)
                    seq += 1
                    p.advice(t + 1e-4, seq, dev, b // 2, -(-b * a // (b // 2)), "refused")
                    refused = True
                    break
                cur += nbytes
                step_peak = max(step_peak, cur)
                peak = max(peak, cur)
                p.sample(t, dev, cur, cur + CONTEXT)
            cur = 6 * GiB
            t += 0.5
            p.sample(t, dev, cur, cur + CONTEXT)
            if steps:
                p.step(t, step, dev, step_peak, step_peak + CONTEXT, cur)
            if refused:
                break
        t += 1.0
    if finish:
        p.summary(t)
    return p


class Base(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="gg-recommend-")
        self.addCleanup(shutil.rmtree, self.tmp)

    def report(self, *args):
        out, err = io.StringIO(), io.StringIO()
        with redirect_stdout(out), redirect_stderr(err):
            rc = rpt.main(list(args))
        self.assertEqual(rc, 0, err.getvalue())
        return out.getvalue()

    def recommend(self, *processes):
        journals, failed = rpt.read_journals([p.write(self.tmp) for p in processes])
        self.assertEqual(failed, [])
        return rpt.recommend(journals)

    def policy(self, path):
        cp = configparser.ConfigParser(inline_comment_prefixes=(";",), interpolation=None)
        with open(path) as f:
            cp.read_string(f.read())
        return cp

    def lint(self, directory):
        if not os.access(CHECK, os.X_OK):
            self.skipTest("%s is not built (make): cannot lint the written policy" % CHECK)
        return subprocess.run([CHECK, "--lint", directory], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, universal_newlines=True)


REFUSED_RUN = [(4, 8, 5), (16, 2, 5), (8, 4, 5)]


def growing(b, step):
    """A run whose activations grow with the step (a sequence length that
    grows) as well as with the batch, like the demo's."""
    return 6 * GiB + b * (120 * MiB + 40 * MiB * step)


def growing_trainer(phases, last_step, peak_of=growing):
    """The demo's story in the shim's shape: the trainer told its batch
    before the shim started (no batch event opens the first phase); each
    step is a `step` line; a forecast advice moves it to the next phase,
    whose `batch` event says the batch that ended (was_batch_size)."""
    p = shimlike.Process([shimlike.device(0, RTX, TOTAL, HEADROOM, NEAR, cc="8.6")])
    t, seq, step = 1.0, 0, 0
    peak = 0
    for i, (b, a, until) in enumerate(phases):
        if i:
            seq += 1
            p.advice(t, seq, 0, b, a, "forecast", forecast={"step": step + 1,
                                                          "bytes": peak_of(phases[i - 1][0], step + 1)})
            p.batch(t + 1e-3, 0, b, a, peak, was=phases[i - 1][:2])
            peak = 0
        else:
            p.mode(t, 0)
        while step < min(until, last_step):
            step += 1
            t += 0.5
            sp = peak_of(b, step)
            peak = max(peak, sp)
            p.sample(t, 0, sp, sp + CONTEXT)
            p.step(t, step, 0, sp, sp + CONTEXT, 6 * GiB)
    p.batch(t + 1, 0, phases[-1][0], phases[-1][1], peak, was=phases[-1][:2])
    p.summary(t + 2)
    return p


def capped(b, step):
    """A growing sequence's step peaks as PyTorch's cache reserves them: up
    to the limit's neighbourhood and held there, whatever the batch."""
    return min(20 * GiB, 6 * GiB + 30 * MiB * step * step + 10 * MiB * b)


def squared(b, step):
    """Step peaks that grow with the step's square: a fit of the batch
    terms through them predicts the batch the run finished with over the
    line."""
    return 6 * GiB + 30 * MiB * step * step


class FinishedRun(Base):
    """A run that finished (at batch 2, advised down from 4 and
    8 as its sequence grew) whose step peaks are the cache's, near the
    limit whatever the batch: --recommend proposes a batch the run
    survived and says why no larger one, never a fit that calls a batch
    it finished over the line."""

    def test_the_batch_it_survived(self):
        for peak_of in (capped, squared):
            with self.subTest(peak_of=peak_of.__name__):
                run = growing_trainer([(8, 1, 6), (4, 2, 14), (2, 4, 30)], 30, peak_of=peak_of)
                [r] = self.recommend(run)
                self.assertEqual((r.batch, r.accum), (2, 4))
                self.assertIn("the largest batch this run finished", r.why)
                self.assertIn("which it survived; no larger one is proposed: ", r.why)
                out = self.report("--recommend", run.write(self.tmp))
                self.assertIn("%s: each batch of 8 as 4 micro-batches of at most 2 (effective 8)"
                              % RTX, out)
                self.assertNotIn("predicted not to fit", out)
                self.assertNotIn("even batch 1", out)

    def test_a_fit_the_run_contradicts_is_refused(self):
        run = growing_trainer([(8, 1, 6), (4, 2, 14), (2, 4, 30)], 30, peak_of=squared)
        [r] = self.recommend(run)
        self.assertIsNone(r.model)
        self.assertRegex(r.refused_fit, r"predicts batch 2 over \S+ GiB at its steps 15-30, "
                                        r"which it finished")

    def test_the_batch_gpuguard_run_saw(self):
        """No batch events (an unmodified script under gpuguard-run): the
        batch is its steps' inputs' batch dimension; one batch is no fit,
        and the report says so."""
        p = shimlike.Process([shimlike.device(0, RTX, TOTAL, HEADROOM, NEAR, cc="8.6")])
        p.mode(1.0, 0)
        t = 1.0
        for step in range(1, 21):
            t += 0.5
            peak = 6 * GiB + 16 * step * 40 * MiB
            p.sample(t, 0, peak, peak + CONTEXT)
            p.step(t, step, 0, peak, peak + CONTEXT, 6 * GiB, shape=[16, 256 * step],
                   tokens=16 * 256 * step, batch=16, needed=peak - GiB)
        p.summary(t + 1)
        [r] = self.recommend(p)
        self.assertIsNone(r.batch)
        self.assertEqual([(b, source) for b, _, source in r.points], [(16, "steps")])
        out = self.report("--recommend", p.write(self.tmp))
        self.assertIn("%s: no recommendation: 1 fitted point (16: 18.5 GiB) is not enough to fit "
                      "peak = fixed + per sample x batch" % RTX, out)


class GrowingRun(Base):
    """A run that grows as it halves its batch: on the demo's journal
    --recommend once proposed batch 16 x 2 although the same run had to
    leave 16 for 8 at step 19: a fit on batch alone, of a run that also
    grows every step, without its first phase (no batch event before the
    first allocation)."""

    PHASES = [(32, 1, 8), (16, 2, 19), (8, 4, 28)]

    def test_the_first_phase_is_named_by_the_next_batch_event(self):
        [r] = self.recommend(growing_trainer(self.PHASES, 28))
        self.assertIn(32, [b for b, _, _ in r.points])

    def test_fit_with_the_step_and_never_a_batch_advised_off(self):
        [r] = self.recommend(growing_trainer(self.PHASES, 28))
        self.assertIsNotNone(r.model)                      # the step is a variable
        self.assertEqual(r.steps, (1, 28))
        self.assertEqual(r.advised_off, (16, 19))
        self.assertLess(r.batch, 16)
        # the largest batch whose truth at the run's last step stays under the cap
        want = max(b for b in range(1, 16) if growing(b, 28) <= r.cap)
        self.assertEqual(r.batch, want)
        self.assertGreaterEqual(r.predicted, growing(r.batch, 28))     # errs high
        self.assertLess(r.predicted - growing(r.batch, 28), 64 * MiB)  # by little
        self.assertEqual(r.accum, -(-32 // r.batch))

    def test_what_the_recommendation_covers_is_said(self):
        out = self.report("--recommend", growing_trainer(self.PHASES, 28).write(self.tmp))
        lines = out.splitlines()
        i = lines.index("Recommendation for the next run (--recommend):")
        self.assertRegex(lines[i + 2], r"^    why: fit peak = 6\.00 GiB \+ batch x \(120\.00 MiB "
                                       r"\+ 40\.00 MiB x step\) from 28 step lines at batches "
                                       r"8, 16, 32; predicted .* at step 28 <= limit")
        self.assertRegex(lines[i + 3], r"^    covers: steps 1-28, this run's; batch \d+ reaches "
                                       r".* at step \d+ \(.* a step\); batch 16 was advised off "
                                       r"at step 19$")

    def test_the_trend_is_per_batch_phase(self):
        # one line per phase, each with its own slope (40 MiB per sample per
        # step: 1.25 GiB, 640 MiB, 320 MiB a step), not one line across them
        path = growing_trainer(self.PHASES, 28).write(self.tmp)
        page = os.path.join(self.tmp, "r.html")
        out = self.report(path, "--html", page)
        self.assertRegex(out, r"trend +over steps \d+ \.\. 28, at batch 8 x accum 4 \(least "
                              r"squares\): peak \+320 MiB/step")
        with open(page) as f:
            titles = re.findall(r'class="trend-peak"><title>([^<]*)</title>', f.read())
        self.assertEqual(len(titles), 3, titles)
        self.assertIn("peak trend over steps 1 .. 8, batch 32 x accum 1: +1.2 GiB per step",
                      titles)
        self.assertIn("peak trend over steps 9 .. 19, batch 16 x accum 2: +640 MiB per step",
                      titles)
        self.assertTrue(titles[2].endswith("batch 8 x accum 4: +320 MiB per step"), titles)

    def test_a_flat_run_keeps_the_batch_fit(self):
        # steps that do not grow within a batch: the batch alone explains the peak
        [r] = self.recommend(growing_trainer(self.PHASES, 28, peak_of=lambda b, s: linear(b)))
        self.assertIsNone(r.model)
        self.assertIsNotNone(r.line)


class Recommend(Base):
    def test_refused_phase_then_smaller_batch(self):
        run = trainer(REFUSED_RUN)
        path = run.write(self.tmp)
        out_dir = os.path.join(self.tmp, "next")
        out = self.report("--recommend", "--out", out_dir, path)
        [r] = rpt.recommend(rpt.read_journals([path])[0])
        # the points: batch 4 from its batch event, batch 8 from its steps;
        # batch 16 was refused after asking for what took the device past the limit
        self.assertEqual([(b, p) for b, p, _ in r.points], [(4, linear(4)), (8, linear(8))])
        self.assertEqual(r.bounds, [(16, 22 * GiB + PIECE - CONTEXT)])
        self.assertEqual(r.line, (6 * GiB, 5 * GiB / 4))
        self.assertEqual(r.other, CONTEXT)
        self.assertEqual(r.cap, LIMIT - NEAR - CONTEXT)
        # the largest batch whose predicted peak stays out of the near-miss zone
        self.assertEqual(r.batch, 11)
        self.assertGreaterEqual(r.batch, 8)
        self.assertLess(r.batch, 16)
        self.assertEqual(r.accum, 3)
        self.assertGreaterEqual(r.batch * r.accum, 32)
        self.assertLessEqual(r.predicted, LIMIT - NEAR - CONTEXT)
        self.assertEqual(r.predicted, linear(r.batch))             # the truth, exactly
        self.assertLessEqual(linear(r.batch + 1), LIMIT - NEAR - CONTEXT + 5 * GiB // 4)
        self.assertGreater(linear(r.batch + 1), LIMIT - NEAR - CONTEXT)
        # what the user reads: after the verdict, one line why
        lines = out.splitlines()
        i = lines.index("Recommendation for the next run (--recommend):")
        # what the next run does: the loader's 32 split into 11 + 11 + 10
        self.assertEqual(lines[i + 1], "  %s: each batch of 32 as 3 micro-batches of at "
                                       "most 11 (effective 32)" % RTX)
        self.assertEqual(lines[i + 2],
                         "    why: fit peak = 6.00 GiB + 1.25 GiB x batch from 2 points "
                         "(4: 11.0 GiB, 8: 16.0 GiB), refused at 16 (needed >= 21.8 GiB); "
                         "predicted 19.75 GiB <= limit 22.0 GiB - near-miss margin 1.2 GiB - "
                         "others 512.0 MiB = 20.3 GiB")
        policy_path = os.path.join(out_dir, "nvidia-geforce-rtx-3090.ini")
        self.assertEqual(lines[i + 3], "    policy: " + policy_path)
        self.assertEqual(lines[i + 4], "  next run: GPUGUARD_POLICY=" + out_dir)
        self.assertNotIn("Advice history", out)      # --recommend: verdict, then this
        # the policy: that GPU, the run's memory settings, the batch
        cp = self.policy(policy_path)
        self.assertEqual(cp["gpu"]["match"], RTX)
        self.assertEqual(dict(cp["memory"]), {"headroom": "2 GiB", "near_miss": "5%", "mode": "auto"})
        self.assertEqual(dict(cp["trainer"]), {"batch_size": "11", "grad_accum": "3",
                                               "apply_batch": "yes"})
        lint = self.lint(out_dir)
        self.assertEqual(lint.returncode, 0, lint.stdout)
        self.assertEqual(lint.stdout.strip().splitlines()[-1], "1 file ok")
        # what it leaves to the defaults is said, and is not the batch
        self.assertIn("nvidia-geforce-rtx-3090.ini: left to defaults: enforce = runtime", lint.stdout)
        self.assertNotRegex(lint.stdout, r"[ :]batch_size =")

    def test_written_policy_is_the_one_the_gpu_gets(self):
        if not os.path.exists(os.path.join(FAKE, "libcuda.so.1")) or not os.access(CHECK, os.X_OK):
            self.skipTest("the fake CUDA stack and gpuguard-check are not built (make test builds them)")
        out_dir = os.path.join(self.tmp, "next")
        self.report("--recommend", "--out", out_dir, trainer(REFUSED_RUN).write(self.tmp))
        env = dict(os.environ, LD_LIBRARY_PATH=FAKE, FAKECUDA_DEVICES="%s,24GiB,8.6" % RTX)
        env.pop("GPUGUARD_POLICY", None)
        run = subprocess.run([CHECK, "--policy", out_dir], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, universal_newlines=True)
        self.assertEqual(run.returncode, 0, run.stdout)
        self.assertIn("policy    %s" % os.path.join(out_dir, "nvidia-geforce-rtx-3090.ini"), run.stdout)
        self.assertIn("limit     22.00 GiB: headroom 2.00 GiB; near misses above 20.80 GiB used",
                      run.stdout)
        self.assertIn("trainer   batch 11 x accum 3", run.stdout)

    def test_ack_then_set_is_one_phase(self):
        # The helper's accept() acks (a `batch` event) and then sets the same
        # values (another, whose peak is the instant between): one phase.
        run = trainer(REFUSED_RUN, steps=False)
        events = []
        for e in run.events:
            events.append(e)
            if e["ev"] == "batch":
                events.append(dict(e, t=e["t"] + 1e-5, peak=6 * GiB))
        run.events = events
        [r] = self.recommend(run)
        self.assertEqual([(b, p) for b, p, _ in r.points],
                         [(4, linear(4)), (8, linear(8) + TOTAL // 100)])
        self.assertEqual((r.batch, r.accum), (11, 3))

    def test_last_phase_without_step_events(self):
        # Without `step` lines the last phase's peak comes from its samples,
        # within 1% of total: the report adds that 1%, so it errs high.
        [r] = self.recommend(trainer(REFUSED_RUN, steps=False))
        self.assertEqual([b for b, _, _ in r.points], [4, 8])
        self.assertEqual(r.points[1], (8, linear(8) + TOTAL // 100, "samples (+1% of total)"))
        self.assertEqual(r.batch, 11)
        self.assertGreater(r.predicted, linear(11))
        self.assertLess((r.predicted - linear(11)) / float(linear(11)), 0.03)

    def test_summary_gives_the_last_phase_when_its_peak_is_the_runs(self):
        [r] = self.recommend(trainer([(4, 8, 3), (8, 4, 3)], steps=False))
        self.assertEqual(r.points, [(4, linear(4), "batch event"), (8, linear(8), "summary")])

    def test_growth_faster_than_linear(self):
        # Three fitting phases of an attention-like model: the fit lies on or
        # above every point but extrapolates a curve with a line.
        [r] = self.recommend(trainer([(2, 16, 3), (4, 8, 3), (8, 4, 3)], peak_of=quadratic))
        self.assertEqual(len(r.points), 3)
        self.assertEqual(r.batch, 11)
        self.assertEqual(r.accum, 3)
        err = (r.predicted - quadratic(r.batch)) / float(quadratic(r.batch))
        self.assertLess(abs(err), 0.05, err)
        self.assertLess(quadratic(r.batch) + CONTEXT, LIMIT)        # no refusal at that batch
        for b, p, _ in r.points:
            self.assertGreaterEqual(r.predict(b), p)

    def test_refusal_lifts_a_fit_that_is_too_low(self):
        # Batch 4 and 6 fit; batch 10 asks for more than the line through
        # them says: predictions between 6 and 10 follow the refusal.
        [r] = self.recommend(trainer([(4, 8, 2), (6, 6, 2), (10, 4, 2), (5, 7, 2)],
                                     peak_of=lambda b: 6 * GiB + b * GiB + (b > 6) * 6 * GiB))
        self.assertEqual([b for b, _ in r.bounds], [10])
        self.assertGreater(r.predict(8), r.line[0] + 8 * r.line[1])
        self.assertLess(r.batch, 10)
        self.assertLessEqual(r.predict(r.batch), r.cap)

    def test_one_point_says_what_it_needs(self):
        run = trainer([(8, 4, 4)])
        out_dir = os.path.join(self.tmp, "next")
        out = self.report("--recommend", "--out", out_dir, run.write(self.tmp))
        self.assertIn("  %s: no recommendation: 1 fitted point (8: 16.0 GiB) is not enough to fit "
                      "peak = fixed + per sample x batch: it needs phases at two batch sizes that "
                      "fitted; run some steps at another batch" % RTX, out)
        self.assertIn("  no policy written: nothing to recommend", out)
        self.assertFalse(os.path.exists(out_dir))

    def test_no_batch_events(self):
        run = trainer([(8, 4, 2)])
        run.events = [e for e in run.events if e["ev"] != "batch"]
        out = self.report("--recommend", run.write(self.tmp))
        self.assertIn("%s: no recommendation: no `batch` events and no step lines with a batch: "
                      "the trainer never told the guard its batch" % RTX, out)

    def test_ranks_pool_per_gpu_model(self):
        # rank 0 and rank 1 on RTX 3090s: one point each, two together;
        # rank 2 on an L4 with one point only
        r0 = trainer([(4, 8, 2)], pid=100, rank=0)
        r1 = trainer([(8, 4, 2)], pid=101, rank=1)
        r2 = trainer([(2, 16, 2)], pid=102, rank=2, name="NVIDIA L4", total=24 * GiB)
        out_dir = os.path.join(self.tmp, "next")
        out = self.report("--recommend", "--out", out_dir, *(p.write(self.tmp) for p in (r0, r1, r2)))
        self.assertIn("  %s: each batch of 32 as 3 micro-batches of at most 11 (effective 32)" % RTX,
                      out)
        self.assertIn("  NVIDIA L4: no recommendation: 1 fitted point", out)
        self.assertEqual(sorted(os.listdir(out_dir)), ["nvidia-geforce-rtx-3090.ini"])
        lint = self.lint(out_dir)
        self.assertEqual(lint.returncode, 0, lint.stdout)

    def test_html_carries_the_recommendation(self):
        page = os.path.join(self.tmp, "r.html")
        self.report("--recommend", "--html", page, trainer(REFUSED_RUN).write(self.tmp))
        with open(page) as f:
            text = f.read()
        self.assertIn("<h2>Recommendation</h2>", text)
        self.assertIn("each batch of 32 as 3 micro-batches of at most 11 (effective 32)", text)

    def test_out_needs_recommend(self):
        with redirect_stderr(io.StringIO()):
            with self.assertRaises(SystemExit) as cm:
                rpt.parse_args(["--out", self.tmp, "x.jsonl"])
        self.assertEqual(cm.exception.code, 2)


class PolicyText(unittest.TestCase):
    def test_sizes_as_the_policy_parser_reads_them(self):
        self.assertEqual(rpt.ini_size(TOTAL // 10, TOTAL), "10%")
        self.assertEqual(rpt.ini_size(TOTAL * 5 // 100, TOTAL), "5%")
        self.assertEqual(rpt.ini_size(2 * GiB, TOTAL), "2 GiB")      # 8.33%: not exact
        self.assertEqual(rpt.ini_size(1536 * MiB, TOTAL), "6.25%")
        self.assertEqual(rpt.ini_size(1000 * MiB, TOTAL), "1000 MiB")     # 4.069%
        self.assertEqual(rpt.ini_size(1536 * MiB, None), "1536 MiB")
        self.assertEqual(rpt.ini_size(1234567, TOTAL), "1234567")
        self.assertEqual(rpt.ini_size(80 * GiB * 7 // 100, 80 * GiB), "7%")

    def test_glob_matches_only_that_name(self):
        import fnmatch
        for name in ("NVIDIA GeForce RTX 3090", "NVIDIA H100 80GB HBM3", "Odd [GPU] *x?",
                     "Fake, Inc.; GPU #1"):
            glob = rpt.ini_glob(name)
            self.assertNotIn(",", glob)
            self.assertNotIn(";", glob)
            self.assertTrue(fnmatch.fnmatchcase(name, glob.replace("\\[", "[[]").replace(
                "\\]", "[]]").replace("\\*", "[*]").replace("\\?", "[?]")), glob)
        self.assertEqual(rpt.ini_glob("Odd [GPU] *x?"), "Odd \\[GPU\\] \\*x\\?")
        self.assertEqual(rpt.policy_file_name("NVIDIA H100 80GB HBM3"), "nvidia-h100-80gb-hbm3.ini")


if __name__ == "__main__":
    unittest.main()
