"""Safe by default: `mode = auto` observes until a trainer registers,
then enforces; `observe` changes nothing the process sees."""
import os

from gg import FAKE, GiB, Case, POLICY_DIR

# A Python program that allocates through the PyTorch-like allocator and
# registers as a trainer (gpuguard_set_batch) halfway, the way the helper does.
REGISTER_MIDWAY = """\
import ctypes, os, sys
tl = ctypes.CDLL(os.path.join({fake!r}, "libtorchlike.so"))
p = ctypes.c_void_p()
def alloc(gib):
    return tl.tl_malloc(ctypes.c_size_t(int(gib * (1 << 30))), ctypes.byref(p))
print("before", alloc(10), alloc(10))
me = ctypes.CDLL(None)
me.gpuguard_set_batch(8, 1)
print("after", alloc(2))
"""


class SafeByDefault(Case):
    def test_shipped_policies_never_refuse_a_job_that_fits(self):
        # The RTX 3090 policy's limit is 90% of 24 GiB (21.6 GiB): 22 GiB
        # fits on the device, so without a trainer nothing is refused.
        self.assertTrue(os.path.isfile(os.path.join(POLICY_DIR, "rtx-3090.ini")))
        run = self.script("alloc:10G", "alloc:10G", "alloc:2G", "meminfo", "freeall")
        self.assertEqual(run.rc, 0, run.err)
        self.assertNotIn("error", run.out)
        # the device's own answer, not the policy's limit
        self.assertIn(f"meminfo free={2 * GiB} total={24 * GiB}", run.out)
        start = run.one("start")
        self.assertTrue(start["devices"][0]["policy"].endswith("rtx-3090.ini"))
        self.assertEqual(start["devices"][0]["mode"], "auto")
        self.assertEqual(run.of("refused"), [])
        self.assertEqual(run.of("mode"), [])
        # the near misses are still journaled, past the line too
        nm = run.of("near_miss")
        self.assertGreaterEqual(len(nm), 1)
        self.assertTrue(nm[-1].get("over_limit"))
        s = run.summary()
        self.assertEqual((s["refusals"], s["peak"]), (0, 22 * GiB))

    def test_four_ranks_that_fit_all_finish(self):
        # Four processes, one GPU each, each allocating 22 GiB of 24.
        state = os.path.join(self.tmp, "state")
        runs = [self.script("alloc:10G", "alloc:10G", "alloc:2G", "freeall",
                            RANK=str(r), FAKECUDA_STATE=f"{state}{r}") for r in range(4)]
        for run in runs:
            self.assertEqual(run.rc, 0, run.err)
            self.assertIn("script: done", run.out)
            self.assertEqual(run.summary()["refusals"], 0)

    def test_trainer_told_before_cuda_is_enforced_from_the_start(self):
        run = self.api("fill", "1G", "batch", "8", "1")
        self.assertIn("fill: 21 ok, then error 2", run.out)  # the 21.6 GiB line
        (mode,) = run.of("mode")
        self.assertEqual(mode, {**mode, "dev": 0, "mode": "enforce",
                                "why": "trainer registered"})
        self.assertLess(run.events.index(mode), run.events.index(run.of("refused")[0]))

    def test_trainer_registered_midway_is_enforced_from_then_on(self):
        run = self.python(REGISTER_MIDWAY.format(fake=FAKE))
        self.assertEqual(run.rc, 0, run.err)
        # 20 GiB before registration are admitted; 2 more after it are not
        self.assertIn("before 0 0", run.out)
        self.assertIn("after 2", run.out)
        names = [e["ev"] for e in run.events]
        self.assertLess(names.index("mode"), names.index("refused"))
        self.assertEqual(run.one("mode")["why"], "trainer registered")

    def test_no_trainer_no_enforcement_even_when_asked_to_watch_closely(self):
        # The same program without the registration: nothing is refused.
        code = REGISTER_MIDWAY.format(fake=FAKE).replace("me.gpuguard_set_batch(8, 1)\n", "")
        run = self.python(code)
        self.assertIn("after 0", run.out)
        self.assertEqual(run.of("mode"), [])

    def test_enforce_asked_for_is_enforced_without_a_trainer(self):
        run = self.script("alloc:10G", "alloc:10G", "alloc:2G", GPUGUARD_MODE="enforce")
        self.assertIn("alloc 2G: error 2", run.out)
        self.assertEqual(run.one("start")["devices"][0]["mode"], "enforce")
        self.assertEqual(run.of("mode"), [])

    def test_observe_leaves_meminfo_untouched(self):
        run = self.script("alloc:1G", "meminfo", GPUGUARD_MODE="observe")
        self.assertIn(f"meminfo free={23 * GiB} total={24 * GiB}", run.out)

    def test_auto_is_the_default_of_a_policy_that_names_no_mode(self):
        path = self.write_policy("plain.ini", "[memory]\nheadroom = 2 GiB\n")
        run = self.script("alloc:23G", "meminfo", policy=path)
        self.assertNotIn("error", run.out)
        self.assertIn(f"total={24 * GiB}", run.out)
        self.assertEqual(run.one("start")["devices"][0]["mode"], "auto")

    def test_registration_under_a_broken_policy_stays_observe(self):
        path = self.write_policy("bad.ini", "[memory]\nheadroom = lots\n")
        run = self.api("fill", "1G", "batch", "8", "1", policy=path)
        self.assertIn("fill: 24 ok, then error 2", run.out)  # the device's own end
        self.assertEqual(run.of("mode"), [])

    def test_run_and_check_know_auto(self):
        from gg import CHECK, ROOT
        import subprocess
        run_tool = os.path.join(ROOT, "tools", "bin", "gpuguard-run")
        out = subprocess.run([run_tool, "-n", "--mode", "auto", "--", "true"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("GPUGUARD_MODE=auto", out.stdout)
        bad = subprocess.run([run_tool, "--mode", "enforcing", "--", "true"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.assertEqual(bad.returncode, 2)
        self.assertIn("auto, enforce, observe or off", bad.stderr)
        from gg import base_env
        env = base_env()
        listing = subprocess.run([CHECK, "--policy", POLICY_DIR], env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.assertIn("mode      auto: observe until a trainer registers", listing.stdout)
        lint = subprocess.run([CHECK, "--lint", self.write_policy("a.ini", "[memory]\nmode = auto\n")],
                              stdout=subprocess.PIPE, text=True)
        self.assertEqual(lint.returncode, 0, lint.stdout)
