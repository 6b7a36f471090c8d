"""Steps end to end: steps through the shim under a real LD_PRELOAD. A
run whose step peak grows gets its first advice from the forecast, at a
boundary, before any near miss; a flat noisy run gets none; a run that keeps
64 MiB a step is found leaking, with its rate, the step it reaches the limit
and its Python line; the forecast can be switched off; the helper reports one
step per batch with real PyTorch."""
import json
import os
import subprocess
import sys

from gg import FAKE, PYHELPER, GiB, MiB, Case, base_env

POLICY = """\
[gpu]
match = NVIDIA GeForce RTX 3090*
[memory]
headroom = 10%
near_miss = 5%
mode = {mode}
[trainer]
signal = none
batch_size = 32
grad_accum = 1
[journal]
stacks = all
"""

# A trainer: each step allocates `work` bytes of activations through the
# PyTorch-like allocator (one line, so one Python line for the site), frees
# them, keeps `keep` bytes for good (the leak's line), empties the cache
# like PyTorch does under pressure, and tells the shim the step ended.
TRAINER = r'''
import ctypes, json, os, random, sys
tl = ctypes.CDLL(os.path.join(FAKE, "libtorchlike.so"))
me = ctypes.CDLL(None)
me.gpuguard_step.argtypes = [ctypes.c_ulonglong]
kept = []

def alloc(n):
    p = ctypes.c_void_p()
    rc = tl.tl_malloc(ctypes.c_size_t(int(n)), ctypes.byref(p))
    return p if rc == 0 else None

def keep_for_good(n):
    p = ctypes.c_void_p()
    tl.tl_malloc(ctypes.c_size_t(int(n)), ctypes.byref(p))  # LEAK LINE
    kept.append(p)

def train_step(work, keep):
    acts = [alloc(work / 8) for _ in range(8)]
    if keep:
        keep_for_good(keep)
    for a in acts:
        if a:
            tl.tl_free(a)
    tl.tl_empty_cache()

random.seed(1)
GiB, MiB = 1 << 30, 1 << 20
mode, steps = sys.argv[1], int(sys.argv[2])
base = 2 * GiB
for n in range(1, steps + 1):
    if mode == "grow":
        work = 8 * GiB + n * 512 * MiB
    elif mode == "flat":
        work = 12 * GiB * (1 + random.uniform(-0.03, 0.03))
    else:
        work = 3 * GiB
    train_step(work, 64 * MiB if mode == "leak" else 0)
    me.gpuguard_step(n)
print("done", steps)
'''


class Steps(Case):
    def trainer(self, mode, steps, **extra):
        script = os.path.join(self.tmp, "train.py")
        with open(script, "w") as f:
            f.write("FAKE = %r\n" % FAKE + TRAINER)
        policy = self.write_policy("p.ini", POLICY.format(mode=extra.pop("policy_mode", "observe")))
        run = self.run_prog([sys.executable, script, mode, str(steps)], policy=policy, **extra)
        self.assertEqual(run.rc, 0, run.err)
        return run

    def test_growth_is_forecast_before_any_near_miss(self):
        run = self.trainer("grow", 30)
        advice = run.of("advice")
        self.assertTrue(advice, run.err)
        first = advice[0]
        self.assertEqual(first["reason"], "forecast")
        idx = run.events.index(first)
        # given at a boundary: right after the step line of the step before
        steps_before = [e for e in run.events[:idx] if e["ev"] == "step"]
        self.assertTrue(steps_before)
        self.assertEqual(first["forecast"]["step"], steps_before[-1]["step"] + 1)
        self.assertEqual(run.of("near_miss")[:1] and
                         run.events.index(run.of("near_miss")[0]) < idx, False)
        self.assertEqual(run.of("refused"), [])
        # the predicted peak is that of the step that then crossed the line
        crossed = [e for e in run.of("step") if e["step"] == first["forecast"]["step"]]
        if crossed:
            self.assertLess(abs(crossed[0]["peak"] - first["forecast"]["bytes"]), 256 * MiB)

    def test_forecast_off(self):
        for extra in ({"GPUGUARD_FORECAST": "0"},):
            run = self.trainer("grow", 30, **extra)
            self.assertNotIn("forecast", [a["reason"] for a in run.of("advice")])
            self.assertTrue(run.of("near_miss"))  # the zone still warns
        pol = POLICY.format(mode="observe") + "[trainer]\n"
        self.assertIn("[trainer]", pol)

    def test_flat_noisy_run_gets_nothing(self):
        run = self.trainer("flat", 300)
        self.assertEqual(run.of("advice"), [])
        self.assertEqual(run.of("leak"), [])
        # step lines are bounded: every one of the first 100, then only moves
        lines = run.of("step")
        self.assertGreaterEqual(len(lines), 100)
        self.assertLessEqual(len(lines), 140)

    def test_leak_is_found_with_its_line(self):
        run = self.trainer("leak", 80)
        leaks = run.of("leak")
        self.assertTrue(leaks, run.err)
        first = leaks[0]
        self.assertLessEqual(first["step"], 50)
        self.assertLess(abs(first["rate"] - 64 * MiB), 64 * MiB * 0.15)
        # live grows 64 MiB a step from about 2 GiB at step 0... the working
        # set (3 GiB of activations) on top: the limit (21.6 GiB) at about
        # step (21.6 - 3 - live0) / 64 MiB
        live0 = first["live"] - first["step"] * 64 * MiB
        want = (int(24 * GiB * 0.9) - 3 * GiB - live0) // (64 * MiB)
        self.assertLess(abs(first["projected_step"] - want), 4)
        site = first["sites"][0]
        self.assertTrue(site["pystack"], site)
        self.assertEqual(site["pystack"][0]["func"], "keep_for_good")
        with open(os.path.join(self.tmp, "train.py")) as f:
            line = [i for i, l in enumerate(f.read().splitlines(), 1) if "LEAK LINE" in l][0]
        self.assertEqual(site["pystack"][0]["line"], line)
        self.assertLessEqual(len(leaks), 3)  # said again only when it changes


class HelperSteps(Case):
    """The helper's batch boundaries are steps, whatever the split, with real
    PyTorch (CPU)."""

    def test_microbatches_and_run_report_one_step_per_batch(self):
        torch_py = "/usr/bin/python3"
        probe = subprocess.run([torch_py, "-c", "import torch"], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
        if probe.returncode != 0:
            self.skipTest("no PyTorch for /usr/bin/python3 (Debian's python3-torch; "
                          "CI installs it)")
        code = r'''
import ctypes, os, torch, gpuguard
tl = ctypes.CDLL(os.path.join(%r, "libtorchlike.so"))
guard = gpuguard.Guard(batch_size=16)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
def step(mb):
    p = ctypes.c_void_p()
    tl.tl_malloc(ctypes.c_size_t(64 << 20), ctypes.byref(p))
    loss = model(mb.data).pow(2).mean() * mb.weight
    loss.backward()
    tl.tl_free(p)
for i in range(5):
    batch = torch.randn(16, 4)
    for mb in guard.microbatches(batch):
        step(mb)
    opt.step(); opt.zero_grad()
for i in range(4):
    guard.run(torch.randn(16, 4), step, opt.zero_grad)
    opt.step(); opt.zero_grad()
print("ok")
''' % FAKE
        env = base_env(PYTHONPATH=PYHELPER)
        run = self.run_prog([torch_py, "-c", code], env=env)
        self.assertEqual(run.rc, 0, run.err)
        # nine batches: each boundary ends the batch before it, so the
        # first eight are steps 1..8, and the ninth, whose next boundary
        # never comes, is told at exit (guard.finish())
        steps = [e["step"] for e in run.of("step")]
        self.assertEqual(steps, list(range(1, 10)))
