"""Policies and headroom: INI policies per GPU model, the enforced
headroom line, near misses, cudaMemGetInfo virtualization, gpuguard-check."""
import os
import subprocess
import time

from gg import (CHECK, FAKE, POLICY_DIR, SCRIPT, GiB, MiB, Case, base_env)

HEADROOM_2G = """\
; a 24 GiB card with 2 GiB kept free
[gpu]
match = NVIDIA GeForce RTX 3090*
[memory]
headroom = 2 GiB
near_miss = 5%
mode = enforce
[journal]
stacks = near_miss
"""


class Headroom(Case):
    def setUp(self):
        super().setUp()
        self.policy = self.write_policy("rtx-3090.ini", HEADROOM_2G)

    def test_refused_exactly_past_the_line(self):
        run = self.api("fill", "1G", policy=self.policy)
        self.assertIn("fill: 22 ok, then error 2", run.out)  # cudaErrorMemoryAllocation
        s = run.summary()
        self.assertEqual(s["refusals"], 1)
        self.assertEqual(s["peak"], 22 * GiB)
        self.assertEqual(s["limit"], 22 * GiB)
        (refused,) = run.of("refused")
        self.assertEqual((refused["api"], refused["bytes"]), ("cudaMalloc", GiB))
        self.assertEqual((refused["used"], refused["limit"], refused["total"]),
                         (22 * GiB, 22 * GiB, 24 * GiB))

    def test_refusal_looks_like_the_runtime_oom(self):
        plain = self.api("fill", "1G", preload=False, devices="NVIDIA GeForce RTX 3090,22GiB,8.6")
        guarded = self.api("fill", "1G", policy=self.policy)
        self.assertIn("fill: failed pointer NULL", plain.out)
        self.assertIn("fill: failed pointer NULL", guarded.out)

    def test_no_false_near_miss_after_a_free(self):
        # the free path must not read the device before the real free
        run = self.script("nccl:0:1M", "ncclfree", "alloc:10G", "alloc:8G", "sleep:5", "free:1",
                          "nccl:0:3G", "ncclfree", "freeall", policy=self.policy)
        self.assertEqual(run.of("near_miss"), [])
        self.assertEqual(run.of("advice"), [])
        self.assertEqual(run.summary()["peak_used"], 18 * GiB)

    def test_managed_memory_is_counted_not_refused(self):
        run = self.script("alloc:20G", "api:managed:3G", "freeall", policy=self.policy)
        self.assertNotIn("error", run.out)
        s = run.summary()
        self.assertEqual((s["refusals"], s["peak"]), (0, 23 * GiB))

    def test_near_misses_before_the_line(self):
        # near_miss 5% of 24 GiB = 1.2 GiB: the zone starts below 3.2 GiB free
        run = self.api("fill", "1G", policy=self.policy)
        s = run.summary()
        self.assertEqual(s["near_misses"], 2)  # the 21st and 22nd GiB
        used = [e["used"] for e in run.of("near_miss")]
        self.assertEqual(used, [21 * GiB, 22 * GiB])

    def test_second_process_is_refused_at_the_same_device_wide_line(self):
        state = os.path.join(self.tmp, "device-state")
        env = base_env(FAKECUDA_STATE=state, GPUGUARD_POLICY=self.policy)
        holder = subprocess.Popen([SCRIPT, "alloc:10G", "print:held", "sleep:4000", "freeall"],
                                  env=env, stdout=subprocess.PIPE, text=True, cwd=self.tmp)
        self.addCleanup(holder.kill)
        self.assertEqual(holder.stdout.readline().strip(), "held")
        run = self.api("fill", "1G", env=env)
        self.assertIn("fill: 12 ok, then error 2", run.out)
        self.assertEqual(run.one("refused")["used"], 22 * GiB)
        holder.wait(timeout=30)

    def test_meminfo_reads_the_limit(self):
        run = self.script("alloc:5G", "meminfo", "freeall", policy=self.policy)
        self.assertIn(f"meminfo free={17 * GiB} total={22 * GiB}", run.out)

    def test_meminfo_never_wraps(self):
        # over the line (managed memory is never refused), free reads 0,
        # never a huge number
        run = self.script("api:managed:23G", "meminfo", "freeall", policy=self.policy)
        self.assertIn(f"meminfo free=0 total={22 * GiB}", run.out)

    def test_meminfo_not_virtualized_when_off(self):
        path = self.write_policy("plain.ini", HEADROOM_2G + "virtualize_meminfo = no\n"
                                 .replace("virtualize", "[memory]\nvirtualize"))
        run = self.script("meminfo", policy=path)
        self.assertIn(f"total={24 * GiB}", run.out)

    def test_observe_never_refuses(self):
        run = self.api("fill", "1G", policy=self.policy, GPUGUARD_MODE="observe")
        self.assertIn("fill: 24 ok, then error 2", run.out)  # the device's own OOM
        s = run.summary()
        self.assertEqual((s["refusals"], s["ooms"]), (0, 1))
        self.assertTrue(any(e.get("over_limit") for e in run.of("near_miss")))

    def test_mode_off_counts_nothing(self):
        # Off in a policy is off: not a line, not a file, not a word.
        path = self.write_policy("off.ini", HEADROOM_2G.replace("mode = enforce", "mode = off"))
        run = self.script("alloc:1G", "freeall", policy=path)
        self.assertEqual(run.rc, 0, run.err)
        self.assertEqual(run.files, [])
        self.assertEqual(run.err, "")

    def test_headroom_from_the_environment(self):
        run = self.api("fill", "1G", policy=self.policy, GPUGUARD_HEADROOM="4GiB")
        self.assertIn("fill: 20 ok, then error 2", run.out)
        run = self.api("fill", "1G", policy=self.policy, GPUGUARD_HEADROOM="50%")
        self.assertIn("fill: 12 ok, then error 2", run.out)

    def test_pytorch_like_allocator_frees_cache_and_retries(self):
        code = (
            "import ctypes, os\n"
            f"lib = ctypes.CDLL(os.path.join({FAKE!r}, 'libtorchlike.so'))\n"
            "lib.tl_last_error.restype = ctypes.c_char_p\n"
            "p, q = ctypes.c_void_p(), ctypes.c_void_p()\n"
            "G = 1 << 30\n"
            "assert lib.tl_malloc(ctypes.c_size_t(10 * G), ctypes.byref(p)) == 0\n"
            "lib.tl_free(p)  # cached, still reserved\n"
            "assert lib.tl_malloc(ctypes.c_size_t(14 * G), ctypes.byref(q)) == 0\n"
            "r = lib.tl_malloc(ctypes.c_size_t(10 * G), ctypes.byref(p))\n"
            "print('second', r, lib.tl_last_error().decode())\n")
        run = self.python(code, policy=self.policy)
        self.assertEqual(run.rc, 0, run.err)
        self.assertIn("second 2 CUDA out of memory. Tried to allocate 10.00 GiB", run.out)
        s = run.summary()
        # two requests refused: 14 GiB once (cache freed, retried, granted:
        # recovered), 10 GiB twice (its retry refused too: the same request,
        # raised to the caller)
        self.assertEqual(s["refusals"], 2)
        self.assertEqual(s["refusals_recovered"], 1)
        refused = run.of("refused")
        self.assertEqual([(e["bytes"] >> 30, e["retried"], e["recovered"]) for e in refused],
                         [(14, True, True), (10, True, False)])
        self.assertEqual(refused[0]["freed"], 10 << 30)  # the flush: the cached 10 GiB
        self.assertEqual(s["allocs"], 2)
        self.assertEqual(s["frees"], 1)
        self.assertEqual(s["ooms"], 0)


class Selection(Case):
    def test_unmatched_gpu_gets_default(self):
        run = self.script("alloc:1M", "freeall", devices="Acme Compute 9000,16GiB,9.0",
                          policy=POLICY_DIR)
        dev = run.one("start")["devices"][0]
        self.assertEqual(os.path.basename(dev["policy"]), "default.ini")
        self.assertEqual(dev["limit"], 16 * GiB - (16 * GiB) // 10)

    def test_two_models_in_one_process(self):
        devices = "NVIDIA GeForce RTX 3090,24GiB,8.6;NVIDIA A100-SXM4-80GB,80GiB,8.0"
        run = self.script("alloc:1G", "setdev:1", "alloc:2G", "freeall", devices=devices,
                          policy=POLICY_DIR)
        d0, d1 = run.one("start")["devices"]
        self.assertEqual(os.path.basename(d0["policy"]), "rtx-3090.ini")
        self.assertEqual(os.path.basename(d1["policy"]), "a100-80gb.ini")
        self.assertEqual(run.summary(0)["peak"], GiB)
        self.assertEqual(run.summary(1)["peak"], 2 * GiB)

    def test_shipped_policies_lint_clean(self):
        out = subprocess.run([CHECK, "--lint", POLICY_DIR], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
        self.assertEqual(out.returncode, 0, out.stdout)

    def test_check_lists_gpus(self):
        env = base_env(devices="NVIDIA GeForce RTX 4090,24GiB,8.9", GPUGUARD_POLICY=POLICY_DIR)
        out = subprocess.run([CHECK], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True)
        self.assertEqual(out.returncode, 0, out.stdout)
        self.assertIn("NVIDIA GeForce RTX 4090", out.stdout)
        self.assertIn("rtx-4090.ini", out.stdout)


# Each malformed policy, the line its problem is on, and a word of the message.
BAD = [
    ("[memroy]\nheadroom = 1 GiB\n", 1, "section"),
    ("[memory]\nheadrom = 1 GiB\n", 2, "headrom"),
    ("[memory]\nheadroom = 1.5 GB B\n", 2, "headroom"),
    ("[memory]\n\nheadroom = -1 GiB\n", 3, "headroom"),
    ("[memory]\nnear_miss = 120%\n", 2, "near_miss"),
    ("[memory]\nheadroom = 30 GiB\n", 2, "headroom"),  # larger than the 24 GiB device
    ("[memory]\nmode = enforcing\n", 2, "mode"),
    ("[trainer]\nsignal = SIGBOGUS\n", 2, "signal"),
    ("[journal]\ndepth = 1000\n", 2, "depth"),
    ("[memory]\nthis line has no equals sign\n", 2, ""),
]


class Malformed(Case):
    def test_each_problem_is_named_and_the_job_survives(self):
        for text, line, word in BAD:
            with self.subTest(policy=text):
                path = self.write_policy("bad.ini", "[gpu]\nmatch = NVIDIA*\n" + text)
                run = self.api("fill", "1G", policy=path)
                want = f"gpuguard: {path}:{line + 2}: "
                lines = [l for l in self.shim_lines(run) if l.startswith(want)]
                self.assertTrue(lines, f"no '{want}' in {run.err!r}")
                self.assertIn(word, lines[0])
                self.assertTrue(any(path in e["message"] for e in run.of("error")))
                # observe mode: the fill runs to the device's own end
                self.assertIn("fill: 24 ok, then error 2", run.out)
                self.assertEqual(run.one("start")["devices"][0]["mode"], "observe")
                lint = subprocess.run([CHECK, "--lint", path], stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True)
                # the headroom-larger-than-device problem needs a device: lint cannot see it
                if "30 GiB" not in text:
                    self.assertEqual(lint.returncode, 1, lint.stdout)
                    self.assertIn(f"{path}:{line + 2}:", lint.stdout)

    def test_missing_policy_file(self):
        run = self.script("alloc:1M", "freeall", policy=os.path.join(self.tmp, "nope.ini"))
        self.assertEqual(run.rc, 0)
        self.assertTrue(any("nope.ini" in l for l in self.shim_lines(run)), run.err)
        self.assertEqual(run.one("start")["devices"][0]["mode"], "observe")

    def test_bad_environment_value(self):
        run = self.script("alloc:1M", "freeall", GPUGUARD_MODE="sometimes")
        self.assertTrue(any("GPUGUARD_MODE" in l for l in self.shim_lines(run)), run.err)
        self.assertEqual(run.rc, 0)

    def test_a_policy_without_headroom_gets_the_shipped_10_percent(self):
        # before: 0 B, a limit at the device's end; lint says what is left out
        path = self.write_policy("nohr.ini", "[gpu]\nmatch = NVIDIA*\n[memory]\nmode = enforce\n")
        run = self.script("alloc:1M", "freeall", policy=path)
        dev = run.one("start")["devices"][0]
        self.assertEqual(dev["headroom"], dev["total"] // 10)
        self.assertEqual(dev["limit"], dev["total"] - dev["total"] // 10)
        lint = subprocess.run([CHECK, "--lint", path], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
        self.assertEqual(lint.returncode, 0, lint.stdout)
        self.assertIn("%s: left to defaults: headroom = 10%%, near_miss = 5%%, enforce = runtime"
                      % path, lint.stdout)
        self.assertNotIn("mode = ", lint.stdout)     # the file said it

    def test_a_bad_variable_is_blamed_not_the_policy(self):
        # the shipped policy is fine: the line that says why nothing will be
        # refused names the variable, not "policy problems"
        policy = self.write_policy("ok.ini", HEADROOM_2G)
        run = self.script("alloc:1M", "freeall", policy=policy, GPUGUARD_HEADROOM="banana")
        lines = self.shim_lines(run)
        self.assertIn("gpuguard: GPU0: GPUGUARD_HEADROOM is not valid (above); observing only, "
                      "nothing will be refused", lines)
        self.assertFalse([l for l in lines if "policy problems" in l], lines)
        self.assertEqual(run.one("start")["devices"][0]["mode"], "observe")
        # two bad variables: both counted; a bad file as well: the policy is named
        run = self.script("alloc:1M", "freeall", policy=policy, GPUGUARD_HEADROOM="banana",
                          GPUGUARD_MODE="sometimes")
        self.assertTrue([l for l in self.shim_lines(run) if " and 1 more GPUGUARD_* values are "
                         "not valid (above)" in l], self.shim_lines(run))
        bad = self.write_policy("bad.ini", HEADROOM_2G + "bogus = 1\n")
        run = self.script("alloc:1M", "freeall", policy=bad, GPUGUARD_HEADROOM="banana")
        self.assertIn("gpuguard: GPU0: policy problems above; observing only, nothing will be "
                      "refused", self.shim_lines(run))


class DriverPaths(Case):
    def setUp(self):
        super().setUp()
        self.policy = self.write_policy("rtx-3090.ini", HEADROOM_2G)

    def test_nccl_memory_is_seen_but_not_refused_by_default(self):
        # 19 + 4 GiB is past the 22 GiB line but fits the 24 GiB device
        run = self.script("alloc:19G", "nccl:0:4G", "ncclfree", "freeall", policy=self.policy)
        self.assertNotIn("error", run.out)
        s = run.summary()
        self.assertEqual(s["refusals"], 0)
        self.assertEqual(s["peak"], 19 * GiB + 4 * GiB + 1 * MiB)
        self.assertEqual(s["allocs"], 3)
        self.assertEqual(s["live_bytes"], 0)
        self.assertTrue(run.of("near_miss"))
        self.assertIn("cuMemCreate", {e["api"] for e in run.of("near_miss")})

    def test_enforce_all_refuses_nccl(self):
        path = self.write_policy("all.ini", HEADROOM_2G.replace("mode = enforce",
                                                               "mode = enforce\nenforce = all"))
        run = self.script("alloc:19G", "nccl:0:4G", "freeall", policy=path)
        self.assertEqual(run.summary()["refusals"], 1)

    def test_entry_point_allocations_are_refusable(self):
        run = self.script("alloc:20G", "api:vmm:4G", "api:drv:4G", "freeall", policy=self.policy)
        self.assertEqual(run.out.count("error 2"), 2, run.out)
        apis = [e["api"] for e in run.of("refused")]
        self.assertEqual(apis, ["cuMemCreate", "cuMemAlloc"])

    def test_runtime_allocation_is_counted_once(self):
        # cudaMalloc reaches the driver through a hooked cuMemAlloc: one count
        run = self.script("alloc:1G", "api:drv:1G", "api:vmm:1G", "freeall", policy=self.policy)
        s = run.summary()
        self.assertEqual((s["allocs"], s["frees"], s["peak"]), (3, 3, 3 * GiB))

    def test_driver_hooks_off(self):
        run = self.script("alloc:1G", "nccl:0:1G", "ncclfree", "freeall", policy=self.policy,
                          GPUGUARD_DRIVER_HOOKS="0")
        s = run.summary()
        self.assertEqual((s["allocs"], s["peak"]), (1, GiB))
