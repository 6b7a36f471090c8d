"""gpuguard-report on journals the real shim wrote on the fake GPU: the
verdict of a 4-rank job in which two ranks die at different times;
--recommend on a trainer that went 4 x 8 -> 16 x 2 (refused) -> 8 x 4,
checked against a run at the recommended batch; the peak tree and the near
misses by Python line on every CPython 3.10-3.13 present, on a C program
(no Python frames) and on the demo; steps, leaks and forecasts once the
shim writes them."""
import configparser
import html
import json
import os
import re
import subprocess
import sys

from gg import CHECK, FAKE, PYHELPER, ROOT, BUILD, SANITIZE, Case, base_env
from test_pyframes import SUPPORTED, interpreters, vstr
from test_pystacks import POLICY as PYSTACKS_POLICY
from test_pystacks import TRAINER as PYSTACKS_TRAINER

REPORT = os.path.join(ROOT, "tools", "bin", "gpuguard-report")
H100 = "NVIDIA H100 80GB HBM3"
DEVICES = ";".join("%s,80GiB,9.0" % H100 for _ in range(4))

RANK_POLICY = """\
[gpu]
match = NVIDIA H100*
[memory]
headroom = 8 GiB
near_miss = 5%
mode = enforce
[journal]
stacks = near_miss
"""

# One rank of a job: holds 40 GiB on GPU<RANK>, waits, then either frees
# everything and exits, or asks for 40 GiB more (refused: the limit is
# 72 GiB) and dies without exiting (os._exit: no summary, like a kill).
RANK = """\
import ctypes, os, sys, time
tl = ctypes.CDLL(os.path.join({fake!r}, "libtorchlike.so"))
tl.tl_malloc.argtypes = [ctypes.c_size_t, ctypes.POINTER(ctypes.c_void_p)]
tl.tl_last_error.restype = ctypes.c_char_p
rank = int(os.environ["RANK"])
assert tl.tl_set_device(rank) == 0
held = []
for _ in range(10):
    p = ctypes.c_void_p()
    assert tl.tl_malloc(4 << 30, ctypes.byref(p)) == 0
    held.append(p)
time.sleep(float(sys.argv[2]))
if sys.argv[1] == "die":
    p = ctypes.c_void_p()
    print("rc", tl.tl_malloc(40 << 30, ctypes.byref(p)), tl.tl_last_error().decode(), flush=True)
    os._exit(3)
for p in held:
    tl.tl_free(p)
print("done")
"""

# The recommendation's trainer, through the Python helper: 6 GiB of weights,
# then per micro-batch 10 blocks of batch x 128 MiB (1.25 GiB a sample).
TRAIN_POLICY = """\
[gpu]
match = NVIDIA GeForce RTX 3090*
[memory]
headroom = 2 GiB
near_miss = 5%
mode = enforce
[trainer]
signal = none
[journal]
stacks = near_miss
"""

TRAINER = """\
import ctypes, json, os, sys
import gpuguard
tl = ctypes.CDLL(os.path.join({fake!r}, "libtorchlike.so"))
tl.tl_malloc.argtypes = [ctypes.c_size_t, ctypes.POINTER(ctypes.c_void_p)]


def alloc(n):
    p = ctypes.c_void_p()
    if tl.tl_malloc(n, ctypes.byref(p)):
        raise MemoryError
    return p


def steps(batch, accum, n=3):
    for _ in range(n):
        for _ in range(accum):
            acts = []
            try:
                for _ in range(10):
                    acts.append(alloc(batch * (128 << 20)))
            finally:
                for p in acts:
                    tl.tl_free(p)


phases = json.loads(sys.argv[1])
weights = [alloc(1536 << 20) for _ in range(4)]
guard = gpuguard.Guard(batch_size=phases[0][0], grad_accum=phases[0][1], signal=None)
ran = []
for batch, accum in phases:
    guard.set_batch(batch, accum)
    tl.tl_empty_cache()
    try:
        steps(batch, accum)
        ran.append([batch, accum, "ok"])
    except MemoryError:
        ran.append([batch, accum, "refused"])
        tl.tl_empty_cache()
        batch, accum = guard.accept()
        steps(batch, accum)
        ran.append([batch, accum, "ok"])
print("RESULT " + json.dumps(ran))
"""


def load_report():
    if PYHELPER not in sys.path:
        sys.path.insert(0, PYHELPER)
    from gpuguard import report
    return report


class ReportOfRealJournals(Case):
    def report(self, *args):
        return subprocess.run([sys.executable, REPORT] + list(args), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)

    def test_two_ranks_die_the_first_is_named(self):
        jobs = os.path.join(self.tmp, "job")
        os.makedirs(jobs)
        script = os.path.join(self.tmp, "rank.py")
        with open(script, "w") as f:
            f.write(RANK.format(fake=FAKE))
        policy = self.write_policy("h100.ini", RANK_POLICY)
        state = os.path.join(self.tmp, "state")

        def rank(r, how, wait):
            return self.run_prog([sys.executable, script, how, str(wait)], cwd=jobs, policy=policy,
                                 devices=DEVICES, RANK=str(r), FAKECUDA_STATE="%s%d" % (state, r))

        # rank 2 dies 0.5 s into its run; rank 3 starts after that and dies at
        # once: by its own clock it died first, by the wall clock second
        runs = [rank(0, "finish", 0), rank(1, "finish", 0), rank(2, "die", 0.5), rank(3, "die", 0)]
        for run in runs[:2]:
            self.assertEqual(run.rc, 0, run.err)
        for run in runs[2:]:
            self.assertEqual(run.rc, 3, run.err)
            self.assertIn("rc 2 CUDA out of memory. Tried to allocate 40.00 GiB", run.out)
        self.sanitizer_clean(runs[2])
        journals = sorted(f for f in os.listdir(jobs) if f.endswith(".jsonl"))
        self.assertEqual(len(journals), 4)
        with open(os.path.join(jobs, next(j for j in journals if ".rank2." in j))) as f:
            pid2 = json.loads(f.readline())["pid"]
        out = self.report(jobs)
        self.assertEqual(out.returncode, 0, out.stderr)
        lines = out.stdout.splitlines()
        self.assertEqual(lines[0], "gpuguard report: 4 journals, 4 device sections; "
                                   "12 unused devices left out (nothing allocated there)")
        # rank 2's refusal reached the program (its retry was refused too): the
        # first failure a program saw, by the wall clock
        self.assertRegex(lines[1], r"^  the first failure the program saw: rank 2 GPU2 %s \(host .*, pid %d\) at "
                                   r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d, 0\.\d\d s into the run:$" % (H100, pid2))
        self.assertRegex(lines[2], r"^    refused cudaMalloc of 40\.0 GiB with 3[12]\.\d GiB free under "
                                   r"the limit \(device used 4[01]\.\d GiB, limit 72\.0 GiB, total 80\.0 GiB\)")
        self.assertRegex(lines[3], r"^  rank 0 .* finished after ")
        self.assertRegex(lines[5], r"^  rank 2 .* killed after .* \(no summary: .*\)  GPU2 %s: .* refusals?" % H100)
        self.assertRegex(lines[6], r"^  rank 3 .* killed after .* \(no summary: .*\)  GPU3 %s: .* refusals?" % H100)
        sections = [l for l in lines if l.startswith("-- GPU")]
        self.assertEqual(sections, ["-- GPU%d %s" % (r, H100) for r in range(4)])

    def test_recommendation_from_a_real_run(self):
        policy = self.write_policy("rtx-3090.ini", TRAIN_POLICY)
        script = os.path.join(self.tmp, "train.py")
        with open(script, "w") as f:
            f.write(TRAINER.format(fake=FAKE))
        run = self.run_prog([sys.executable, script, json.dumps([[4, 8], [16, 2]])], policy=policy)
        self.assertEqual(run.rc, 0, run.err)
        ran = json.loads(run.out.split("RESULT ", 1)[1])
        self.assertEqual(ran, [[4, 8, "ok"], [16, 2, "refused"], [8, 4, "ok"]])
        self.assertTrue(run.of("refused"))
        if not run.of("batch"):
            self.skipTest("shim does not journal `batch` events yet")
        out_dir = os.path.join(self.tmp, "next")
        out = self.report("--recommend", "--out", out_dir, run.files[0])
        self.assertEqual(out.returncode, 0, out.stderr)
        cp = configparser.ConfigParser(inline_comment_prefixes=(";",), interpolation=None)
        cp.read(os.path.join(out_dir, "nvidia-geforce-rtx-3090.ini"))
        batch, accum = int(cp["trainer"]["batch_size"]), int(cp["trainer"]["grad_accum"])
        self.assertGreaterEqual(batch, 8)
        self.assertLess(batch, 16)
        self.assertGreaterEqual(batch * accum, 32)
        lint = subprocess.run([CHECK, "--lint", out_dir], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
        self.assertEqual(lint.returncode, 0, lint.stdout)
        rpt = load_report()
        [rec] = rpt.recommend(rpt.read_journals(run.files)[0])
        # the next run, with the written policy: no refusal, no near miss,
        # and the peak the fit predicted
        nxt = self.run_prog([sys.executable, script, json.dumps([[batch, accum]])], policy=out_dir)
        self.assertEqual(nxt.rc, 0, nxt.err)
        self.assertEqual(json.loads(nxt.out.split("RESULT ", 1)[1]), [[batch, accum, "ok"]])
        self.assertEqual(nxt.of("refused"), [])
        self.assertEqual(nxt.of("near_miss"), [])
        measured = nxt.summary()["peak"]
        self.assertLess(abs(rec.predicted - measured) / float(measured), 0.05,
                        (rec.predicted, measured))


def tree_of(text):
    """The peak tree's lines (title first) of a one-device text report."""
    sec = text[text.index("   Allocation sites at the peak:"):].splitlines()[1:]
    out = []
    for line in sec:
        if not line.startswith("     "):
            break
        out.append(line[5:])
    return out


def groups_of(text, title):
    """{first line under the figures: [lines]} of a kind's Python-line groups."""
    sec = text[text.index("   %s: " % title):].splitlines()[1:]
    groups, cur = [], None
    for line in sec:
        if not line.startswith("     "):
            break
        if re.match(r"^     \d+x  ", line):
            cur = []
            groups.append(cur)
        else:
            cur.append(line[9:])
    return groups


def pre_blocks(page, cls):
    return [html.unescape(b).split("\n")
            for b in re.findall(r'<pre class="%s">(.*?)</pre>' % cls, page, re.S)]


class ReportByPythonLine(Case):
    """The report by Python line, on journals the shim wrote."""

    def report(self, journal):
        page = os.path.join(self.tmp, "report.html")
        out = subprocess.run([sys.executable, REPORT, journal, "--html", page],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.assertEqual(out.returncode, 0, out.stderr)
        with open(page, encoding="utf-8") as f:
            return out.stdout, f.read()

    def test_every_supported_cpython(self):
        found, _ = interpreters()
        ran = []
        script = os.path.join(self.tmp, "train.py")
        with open(script, "w") as f:
            f.write("FAKE = %r\n" % FAKE + PYSTACKS_TRAINER)
        policy = self.write_policy("p.ini", PYSTACKS_POLICY)
        for path, version, _about in found:
            if not SUPPORTED[0] <= version[:2] <= SUPPORTED[1]:
                continue
            with self.subTest(python=vstr(version)):
                env = base_env(devices="NVIDIA GeForce RTX 3090,24GiB,8.6")
                env.pop("PYTHONPATH", None)
                run = self.run_prog([path, script], env=env, policy=policy)
                self.assertEqual(run.rc, 0, run.err)
                where = {k: "%s:%d in %s" % tuple(v)
                         for k, v in json.loads(run.out.split("RESULT ", 1)[1])["where"].items()}
                text, page = self.report(run.files[0])
                tree = tree_of(text)
                # the tree starts from the Python line of the peak allocation,
                # then its caller, then the native frames (the allocator's)
                self.assertRegex(tree[1], r"^->\d+\.\d\d%% \(21\.5 GiB\) 2 allocs: %s$"
                                 % re.escape(where["peak"]))
                self.assertIn(" in <module>", tree[2])
                self.assertIn("seg_alloc+0x", tree[3])
                self.assertNotIn("_PyEval_EvalFrameDefault", "\n".join(tree))
                (nm,) = groups_of(text, "Near misses")
                self.assertEqual(nm[0], where["near_miss"])
                self.assertRegex(nm[1], r"^  py#1 .* in <module>$")
                self.assertRegex(nm[2], r"^  #0 seg_alloc\+0x[0-9a-f]+ \(libtorchlike\.so\)$")
                (ref,) = groups_of(text, "Refused")
                self.assertEqual(ref[0], where["worker"])            # the worker thread's line
                self.assertRegex(ref[1], r"^  py#1 .*threading\.py:\d+ in ")
                # the HTML says the same
                self.assertEqual(pre_blocks(page, "tree"), [tree])
                self.assertEqual(pre_blocks(page, "group"), [nm, ref])
                ran.append(vstr(version))
        print("\n  report by Python line: checked on %s" % (ran or "none"))
        self.assertTrue(ran, "no CPython 3.10-3.13 found")

    def test_a_program_without_python(self):
        run = self.script("alloc:20G", "alloc:1.5G",
                          policy=self.write_policy("p.ini", PYSTACKS_POLICY))
        text, page = self.report(run.files[0])
        tree = tree_of(text)
        self.assertEqual(tree[1], "->100.00% (21.5 GiB) 2 allocs: (no Python frames: thread script)")
        self.assertRegex(tree[2], r"^  ->100\.00% \(21\.5 GiB\) 2 allocs: main\+0x[0-9a-f]+ \(script\)$")
        (nm,) = groups_of(text, "Near misses")
        self.assertEqual(nm[0], "(no Python frames: thread script)")
        self.assertRegex(nm[1], r"^  #0 main\+0x[0-9a-f]+ \(script\)$")
        self.assertEqual(pre_blocks(page, "group"), [nm])

    def test_the_demo_tree_starts_from_python_lines(self):
        if SANITIZE:
            self.skipTest("the demo preloads the plain shim")
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("GPUGUARD_", "FAKECUDA_")) and k != "LD_PRELOAD"}
        env["GG_BUILD"] = BUILD
        out_dir = os.path.join(self.tmp, "demo")
        demo = os.path.join(ROOT, "tools", "demo", "demo.py")
        proc = subprocess.run([sys.executable, demo, "--simulate", "--out", out_dir], cwd=self.tmp,
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              timeout=300)
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        journals = sorted((os.path.getmtime(os.path.join(out_dir, n)), os.path.join(out_dir, n))
                          for n in os.listdir(out_dir) if n.endswith(".jsonl"))
        journal = journals[0][1]    # run 2's (run 3, under the recommendation, is the later)
        text, page = self.report(journal)
        tree = tree_of(text)
        top = [l for l in tree[1:] if l.startswith("->")]
        self.assertTrue(top, tree)
        for line in top:        # every first level is a line of the demo's trainer
            self.assertRegex(line, r"allocs?: %s:\d+ in \S+$" % re.escape(demo))
        self.assertEqual(pre_blocks(page, "tree"), [tree])
        # the demo's advice comes from the forecast: no near miss to group,
        # and the verdict names the forecast first
        self.assertNotIn("   Near misses: ", text)
        self.assertRegex(text, r"forecast at step 8 .*: step 9 would peak at 21\.1 GiB")


# A trainer that reports its steps (gpuguard_step through ctypes.CDLL(None))
# and keeps 64 MiB a step (a list of tensors that grows): the leak's line is
# the one that allocates what it keeps. Its working set of 2 GiB is cached by
# the caching allocator, so the steps' live bytes grow by the leak alone.
STEPPER = """\
import ctypes, json, os, sys
tl = ctypes.CDLL(os.path.join({fake!r}, "libtorchlike.so"))
tl.tl_malloc.argtypes = [ctypes.c_size_t, ctypes.POINTER(ctypes.c_void_p)]
me = ctypes.CDLL(None)
if not hasattr(me, "gpuguard_step"):
    print("RESULT " + json.dumps({{"step": False}}))
    sys.exit(0)
kept = []


def alloc(n):
    p = ctypes.c_void_p()
    assert tl.tl_malloc(n, ctypes.byref(p)) == 0
    return p


def train_step():
    work = [alloc(256 << 20) for _ in range(8)]
    p = ctypes.c_void_p(); tl.tl_malloc(64 << 20, ctypes.byref(p)); kept.append(p)
    leak_line = sys._getframe().f_lineno - 1
    for w in work:
        tl.tl_free(w)
    return leak_line


def growing_step(step):
    # a working set of 8 GiB + 256 MiB per step, released at the step's end
    # (a sequence-length curriculum): the peak grows, live stays
    work = [alloc(256 << 20) for _ in range(32 + step)]
    for w in work:
        tl.tl_free(w)
    tl.tl_empty_cache()


line = None
for step in range(1, int(sys.argv[2]) + 1):
    if sys.argv[1] == "leak":
        line = train_step()
    else:
        growing_step(step)
    me.gpuguard_step(ctypes.c_ulonglong(step))
print("RESULT " + json.dumps({{"step": True, "leak_line": line}}))
"""

STEP_POLICY = """\
[gpu]
match = *
[memory]
headroom = 2 GiB
near_miss = 1 GiB
[trainer]
signal = none
"""


class ReportOfSteps(Case):
    """The report of steps (peaks per batch, --recommend), on journals the
    shim wrote."""

    def stepper(self, how, steps):
        """(run, result, report text) of the stepping trainer, or a skip
        saying why there is nothing to report yet."""
        script = os.path.join(self.tmp, "train.py")
        with open(script, "w") as f:
            f.write(STEPPER.format(fake=FAKE))
        run = self.run_prog([sys.executable, script, how, str(steps)],
                            devices="NVIDIA GeForce RTX 3090,24GiB,8.6",
                            policy=self.write_policy("p.ini", STEP_POLICY))
        self.assertEqual(run.rc, 0, run.err)
        res = json.loads(run.out.split("RESULT ", 1)[1])
        self.assertTrue(res["step"], "the shim does not export gpuguard_step")
        self.assertTrue(run.of("step"), "the shim exports gpuguard_step but wrote no `step` event")
        out = subprocess.run([sys.executable, REPORT, run.files[0]], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        self.assertEqual(out.returncode, 0, out.stderr)
        res["script"] = script
        return run, res, out.stdout

    def test_a_growing_step_peak_is_forecast(self):
        # 8 GiB + 256 MiB a step against a near-miss line at 21 GiB: step 52
        run, res, text = self.stepper("grow", 54)
        forecasts = [e for e in run.of("advice") if e["reason"] == "forecast"]
        self.assertTrue(forecasts, "no forecast in a run whose step peak grows linearly")
        self.assertRegex(text.splitlines()[1],
                         r"^  pid \d+ \(\S+\) GPU0 NVIDIA GeForce RTX 3090: forecast at step \d+ "
                         r"\(.*\): step \d+ would peak at [\d.]+ GiB, over the near-miss line "
                         r"\(21\.0 GiB\); would have advised \(no trainer heard it\) halving the "
                         r"batch \(never told, nor seen\), before any near miss")

    def test_steps_and_the_leak_by_its_line(self):
        run, res, text = self.stepper("leak", 80)
        script = res["script"]
        steps = [e["step"] for e in run.of("step")]
        self.assertIn("   steps        %d .. %d (%d steps, %d journaled" % (
            steps[0], steps[-1], len(steps), len(steps)), text)
        self.assertNotIn("unknown events", text)
        # 64 MiB a step kept: the shim names the leak within 50 steps, by its line
        self.assertTrue(run.of("leak"), "no leak event in 80 steps of 64 MiB each")
        self.assertRegex(text.splitlines()[1],
                         r"^  pid \d+ \(\S+\) GPU0 NVIDIA GeForce RTX 3090: leak: \+[\d.]+ MiB "
                         r"per step since step \d+ from %s:%d in train_step" % (
                             re.escape(script), res["leak_line"]))
