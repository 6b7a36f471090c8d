"""gpuguard-report on journals the real shim wrote on the fake GPU: the
verdict of a 4-rank job in which two ranks die at different times, and
--recommend on a trainer that went 4 x 8 -> 16 x 2 (refused) -> 8 x 4,
checked against a run at the recommended batch."""
import configparser
import importlib.machinery
import importlib.util
import json
import os
import subprocess
import sys

from gg import CHECK, FAKE, ROOT, Case

REPORT = os.path.join(ROOT, "tools", "gpuguard-report")
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
    loader = importlib.machinery.SourceFileLoader("gpuguard_report_e2e", REPORT)
    spec = importlib.util.spec_from_loader("gpuguard_report_e2e", loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


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
        self.assertRegex(lines[1], r"^  first failure: rank 2 GPU2 %s \(host .*, pid %d\) at "
                                   r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d, 0\.\d\d s into the run:$" % (H100, pid2))
        self.assertRegex(lines[2], r"^    refused cudaMalloc of 40\.0 GiB with 3[12]\.\d GiB free under "
                                   r"the limit \(device used 4[01]\.\d GiB, limit 72\.0 GiB, total 80\.0 GiB\)")
        self.assertRegex(lines[3], r"^  rank 0 .* finished after ")
        self.assertRegex(lines[5], r"^  rank 2 .* killed after .* \(no summary\)  GPU2 %s: .* refusals?; " % H100)
        self.assertRegex(lines[6], r"^  rank 3 .* killed after .* \(no summary\)  GPU3 %s: .* refusals?; " % H100)
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
