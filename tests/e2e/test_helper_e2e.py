"""The Python helper (tools/python/gpuguard) end to end: a trainer under the
real shim on the fake GPU, with libtorchlike.so as its "PyTorch"; and the
demo (tools/demo/demo.py) that tells the same story."""
import json
import os
import re
import subprocess
import sys

from gg import BUILD, FAKE, GiB, MiB, ROOT, SANITIZE, Case

DEMO = os.path.join(ROOT, "tools", "demo", "demo.py")
INERT = "gpuguard: libgpuguard.so is not preloaded; the guard is inert"

# limit 22 GiB, near-miss zone from 20.8 GiB used (5% of 24 GiB = 1.2 GiB)
POLICY = """\
[gpu]
match = NVIDIA GeForce RTX 3090*
[memory]
headroom = 2 GiB
near_miss = 5%
mode = enforce
[trainer]
signal = SIGUSR2
[journal]
stacks = near_miss
"""

# A trainer in the shape of the helper's docstring. 0.5 GiB of context,
# 6 GiB of weights and optimizer state, then per micro-batch 13 blocks of
# batch x seq x 96 KiB (12 layers + backward workspace), freed after it:
# batch 32 peaks at 21.1 GiB at seq 384 (near miss, under the limit) and would
# need 23.6 GiB at seq 448 (refused); batch 16 peaks at 21.1 GiB at seq 768;
# batch 8 needs 16.3 GiB at seq 1024.
TRAINER = """\
import ctypes, json, os, sys
import gpuguard

lib = ctypes.CDLL(os.path.join({fake!r}, "libtorchlike.so"))
lib.tl_malloc.argtypes = [ctypes.c_size_t, ctypes.POINTER(ctypes.c_void_p)]
lib.tl_free.argtypes = [ctypes.c_void_p]
lib.tl_last_error.restype = ctypes.c_char_p

out = {{"accepted": [], "ooms": [], "steps": 0, "samples": 0, "advice_seen": []}}
guard = gpuguard.Guard(batch_size=32, grad_accum=1, signal={signal!r})
out["active"] = guard.active
out["signal"] = guard.signal


def alloc(n):
    p = ctypes.c_void_p()
    rc = lib.tl_malloc(n, ctypes.byref(p))  # TRAINER-ALLOC
    if rc:
        raise MemoryError(lib.tl_last_error().decode())
    return p.value


state = [alloc(1536 << 20) for _ in range(4)]
batch, accum = guard.batch_size, guard.grad_accum
for seq in {schedule!r}:
    lib.tl_empty_cache()
    for _ in range(2):
        for _ in range(accum):
            acts = []
            try:
                for _ in range(13):
                    acts.append(alloc(batch * seq * 96 * 1024))
            except MemoryError as e:
                out["ooms"].append(str(e))
            for p in reversed(acts):
                lib.tl_free(p)
            out["samples"] += batch
        out["steps"] += 1
        if guard.shrink_requested:
            out["advice_seen"].append(guard.advice())
            batch, accum = guard.accept()
            lib.tl_empty_cache()
            out["accepted"].append([seq, batch, accum])
out["stats"] = guard.stats()
print("RESULT " + json.dumps(out))
"""

SCHEDULE = [256, 320, 384, 448, 512, 640, 768, 896, 1024]

PROBE = """\
import json, warnings
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import gpuguard
    g = gpuguard.Guard(8, grad_accum=2)
    shrink = g.shrink_requested
    accepted = g.accept()
print("RESULT " + json.dumps({"active": g.active, "warnings": [str(w.message) for w in caught],
    "categories": [w.category.__name__ for w in caught], "shrink": shrink,
    "accept": accepted, "stats": g.stats(), "advice": g.advice(), "signal": g.signal}))
"""


def result(run):
    for line in run.out.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise AssertionError("no RESULT line; rc %s, stderr:\n%s" % (run.rc, run.err))


class HelperUnderShim(Case):
    def trainer(self, signal="SIGUSR2", schedule=SCHEDULE):
        path = os.path.join(self.tmp, "trainer.py")
        with open(path, "w") as f:
            f.write(TRAINER.format(fake=FAKE, signal=signal, schedule=schedule))
        run = self.run_prog([sys.executable, path], policy=self.write_policy("p.ini", POLICY),
                            FAKECUDA_CONTEXT_BYTES=512 * MiB)
        self.assertEqual(run.rc, 0, run.err)
        self.sanitizer_clean(run)
        return path, run, result(run)

    def test_active_under_the_shim_inert_without(self):
        run = self.python(PROBE)
        self.assertEqual(run.rc, 0, run.err)
        r = result(run)
        self.assertTrue(r["active"])
        self.assertEqual(r["warnings"], [])
        self.assertEqual(r["signal"], 12)  # SIGUSR2 handler installed
        self.assertFalse(r["shrink"])
        self.assertEqual(run.files, [])  # never touched CUDA: no journal

        run = self.python(PROBE, preload=False)
        self.assertEqual(run.rc, 0, run.err)
        r = result(run)
        self.assertFalse(r["active"])
        self.assertEqual(r["warnings"], [INERT])  # exactly one warning
        self.assertEqual(r["categories"], ["GpuguardWarning"])
        self.assertIsNone(r["signal"])             # no handler installed when inert
        self.assertFalse(r["shrink"])
        self.assertEqual(r["accept"], [8, 2])
        self.assertIsNone(r["stats"])
        self.assertIsNone(r["advice"])

    def test_advised_before_any_refusal_and_shrinks_twice(self):
        _, run, r = self.trainer()
        self.assertTrue(r["active"])
        # Shrunk at the first near miss of batch 32 (seq 384) and of batch 16
        # (seq 768); without that, seq 448 would have been refused.
        self.assertEqual(r["accepted"], [[384, 16, 2], [768, 8, 4]])
        self.assertEqual(r["ooms"], [])
        self.assertEqual(r["steps"], 2 * len(SCHEDULE))
        self.assertEqual(r["samples"], 32 * 2 * len(SCHEDULE))  # effective batch kept
        self.assertEqual([(a["seq"], a["reason"], a["batch_size"], a["grad_accum"])
                          for a in r["advice_seen"]],
                         [(1, "near_miss", 16, 2), (2, "near_miss", 8, 4)])
        advice = run.of("advice")
        self.assertEqual([(e["seq"], e["reason"], e["batch_size"], e["grad_accum"], e["signaled"])
                          for e in advice],
                         [(1, "near_miss", 16, 2, True), (2, "near_miss", 8, 4, True)])
        self.assertEqual(run.of("refused"), [])
        self.assertEqual(run.of("oom"), [])
        s = run.summary()
        self.assertEqual((s["refusals"], s["ooms"]), (0, 0))
        self.assertGreaterEqual(s["near_misses"], 2)
        self.assertLessEqual(s["peak_used"], s["limit"])
        self.assertGreater(s["peak_used"], s["limit"] - int(1.2 * GiB))  # it did get close

    def test_note_carries_the_trainers_python_stack(self):
        path, run, _ = self.trainer()
        with open(path) as f:
            line = next(i for i, l in enumerate(f, 1) if "TRAINER-ALLOC" in l)
        notes = run.of("note")
        self.assertEqual(len(notes), 2, run.err)
        order = [(e["ev"], e.get("seq")) for e in run.events if e["ev"] in ("advice", "note")]
        self.assertEqual(order, [("advice", 1), ("note", None), ("advice", 2), ("note", None)])
        for note, seq, shape in zip(notes, (1, 2), ("batch 16 x accum 2", "batch 8 x accum 4")):
            text = note["text"]
            self.assertIn("SIGUSR2 received by the trainer", text)
            self.assertIn("advice #%d (near_miss): %s" % (seq, shape), text)
            self.assertIn('File "%s", line %d, in alloc' % (path, line), text)
            self.assertIn("rc = lib.tl_malloc(n, ctypes.byref(p))", text)
        # the note follows its advice in time too
        advice = run.of("advice")
        self.assertGreaterEqual(notes[0]["t"], advice[0]["t"])

    def test_polling_without_the_signal(self):
        _, run, r = self.trainer(signal=None)
        self.assertIsNone(r["signal"])
        self.assertEqual(r["accepted"], [[384, 16, 2], [768, 8, 4]])
        self.assertEqual(r["ooms"], [])
        self.assertFalse(any(e["signaled"] for e in run.of("advice")))
        self.assertEqual(run.of("note"), [])  # no handler, no Python stack

    def test_stats_match_the_journal_summary(self):
        _, run, r = self.trainer()
        st, s = r["stats"], run.summary()
        self.assertIsNotNone(st)
        for key in ("total", "limit", "peak", "peak_used", "allocs", "frees",
                    "near_misses", "refusals", "ooms"):
            self.assertEqual(st[key], s[key], key)
        self.assertEqual(st["name"], s["name"])
        self.assertEqual(st["current"], s["live_bytes"])
        self.assertEqual(st["limit"], 22 * GiB)
        self.assertGreater(st["allocs"], 0)
        self.assertGreater(st["frees"], 0)  # accept() + tl_empty_cache gave segments back

    def test_refusal_becomes_a_clean_oom_with_advice(self):
        # Straight to seq 512 at batch 32: 26 GiB will not fit the 22 GiB limit.
        _, run, r = self.trainer(schedule=[512, 512])
        self.assertTrue(r["ooms"])
        self.assertIn("CUDA out of memory. Tried to allocate", r["ooms"][0])
        self.assertTrue(run.of("refused"))
        self.assertEqual(run.of("oom"), [])  # the guard said no before the device did
        reasons = [e["reason"] for e in run.of("advice")]
        self.assertIn("refused", reasons)
        self.assertEqual(r["accepted"][0][1:], [16, 2])
        # after the shrink the second epoch fits
        self.assertEqual(len(r["ooms"]), 1)


class Demo(Case):
    def test_demo_tells_the_story(self):
        if SANITIZE:
            self.skipTest("the demo preloads the plain shim")
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("GPUGUARD_", "FAKECUDA_")) and k != "LD_PRELOAD"}
        env["GG_BUILD"] = BUILD
        out_dir = os.path.join(self.tmp, "demo")
        proc = subprocess.run([sys.executable, DEMO, "--simulate", "--out", out_dir],
                              cwd=self.tmp, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, timeout=300)
        out = proc.stdout
        self.assertEqual(proc.returncode, 0, out + proc.stderr)
        # run 1 died of an OOM, partway
        self.assertIn("=> it died: OutOfMemoryError: CUDA out of memory. Tried to allocate", out)
        self.assertIn("step 12/28 (epoch 3, seq 480, batch 32 x accum 1): CUDA out of memory", out)
        self.assertIn("no gpuguard: the plain loop, each batch whole", out)
        # run 2 was advised by the forecast a step before each near miss
        # (steps 9 and 20 would have entered the zone), shrank twice and
        # finished without a near miss, by splitting each batch of the
        # loader, which stays 32
        self.assertIn("gpuguard: from batch 9 on, each batch of 32 is split into 2 micro-batches "
                      "of at most 16 (advice #1, forecast)", out)
        self.assertIn("gpuguard: from batch 20 on, each batch of 32 is split into 4 micro-batches "
                      "of at most 8 (advice #2, forecast)", out)
        self.assertIn("steps  9-12  micro-batch x n 16 x 2 ", out)
        self.assertIn("steps 17-20  micro-batch x n 16 x 2 ->  8 x 4", out)
        self.assertIn("finished: 28/28 steps, 896 samples (effective batch 32 per step)", out)
        self.assertIn("near misses 0, refused 0", out)
        self.assertIn("=> it finished every step (exit status 0", out)
        self.assertRegex(out, r"   gpuguard: GPU0 NVIDIA GeForce RTX 3090: peak [\d.]+ GiB "
                              r"\(device [\d.]+ GiB\) of 24\.0 GiB, limit 21\.6 GiB; "
                              r"0 near misses, 0 refused; journal ")
        # the report of the guarded run's journal
        self.assertIn("gpuguard report: 1 journal", out)
        self.assertIn("forecast  batch 16 x accum 2, signaled; forecast: step 9 would peak at "
                      "21.1 GiB", out)
        self.assertIn("batch 32 -> 16 -> 8; 2 advice (forecast, forecast), the first before "
                      "any near miss, refusal or OOM", out)
        self.assertNotIn("advices", out)       # the report's word, "2 advice", in the verdict
        self.assertIn("the first at the end of step 8: step 9 would peak at 21.1 GiB, in the "
                      "near-miss zone", out)
        # run 3: the recommendation is one run 2 survived (never 16, which it
        # was advised off at step 19; through its last step, 28), and the
        # next run starts from it and meets no advice at all
        # what the next run will do: the loader's batch of 32 kept, split in
        # micro-batches of at most the recommended size (effective 32, as
        # this run's), said as the helper of the next run says it
        m = re.search(r"NVIDIA GeForce RTX 3090: each batch of 32 as (\d+) micro-batches of at "
                      r"most (\d+) \(effective 32(?:; up to (\d+) would fit)?\)\n", out)
        self.assertIsNotNone(m, out)
        pieces, micro = int(m.group(1)), int(m.group(2))
        rec = int(m.group(3) or micro)
        self.assertLess(rec, 16)
        self.assertNotIn("(effective 33)", out)
        self.assertIn("covers: steps 1-28, this run's; batch %d reaches" % rec, out)
        self.assertIn("batch 16 was advised off at step 19", out)
        self.assertIn("gpuguard: from batch 1 on, each batch of 32 is split into %d micro-batches "
                      "of at most %d (policy %s" % (
                          pieces, micro,
                          os.path.join(out_dir, "next", "nvidia-geforce-rtx-3090.ini")), out)
        self.assertRegex(out, r"next run: +finished every step \(exit status 0, [\d.]+ s\), "
                              r"started at micro-batch %d, 0 advice, 0 near misses" % micro)
        self.assertTrue(out.rstrip().endswith("story: as expected"))
        # a journal per guarded run (the unguarded run leaves none), in the out dir only
        journals = [n for n in os.listdir(out_dir) if n.endswith(".jsonl")]
        self.assertEqual(len(journals), 2, journals)
        self.assertFalse([n for n in os.listdir(self.tmp) if n.endswith(".jsonl")])
        self.assertTrue(os.path.exists(os.path.join(out_dir, "report.html")))
