"""The core guard: the ledger, the journal and the lifecycle, end to end
through the fake CUDA stack under a real LD_PRELOAD."""
import json
import os
import stat

from gg import (API, FAKE, GiB, MiB, SCRIPT, Case, base_env)


class ScriptedSequence(Case):
    CMDS = ["alloc:1G", "alloc:1G", "alloc:1G", "free:0", "alloc:2G", "freeall", "meminfo"]

    def test_exact_peak_and_counts(self):
        run = self.script(*self.CMDS)
        self.assertEqual(run.rc, 0, run.err)
        s = run.summary()
        self.assertEqual(s["peak"], 4 * GiB)
        self.assertEqual(s["allocs"], 4)
        self.assertEqual(s["frees"], 4)
        self.assertEqual(s["live_bytes"], 0)
        self.assertEqual(s["live_allocs"], 0)
        self.assertEqual(s["ooms"], 0)
        self.assertEqual(s["peak_used"], 4 * GiB)
        self.sanitizer_clean(run)

    def test_output_and_status_unchanged(self):
        cmds = self.CMDS[:-1]  # not meminfo: the default policy virtualizes it, by design
        plain = self.script(*cmds, "exit:7", preload=False)
        guarded = self.script(*cmds, "exit:7")
        self.assertEqual(plain.rc, 7)
        self.assertEqual(guarded.rc, 7)
        self.assertEqual(plain.out, guarded.out)
        self.assertEqual(plain.err, "")
        self.assertEqual(len(self.shim_lines(guarded)), 1)  # the summary line, nothing else

    def test_start_event(self):
        run = self.script("alloc:1M", "freeall")
        start = run.one("start")
        self.assertEqual(start["pid"], int(run.files[0].rsplit(".", 2)[-2]))
        self.assertEqual(start["comm"], "script")
        self.assertIsNone(start["rank"])
        dev = start["devices"][0]
        self.assertEqual(dev["name"], "NVIDIA GeForce RTX 3090")
        self.assertEqual(dev["total"], 24 * GiB)
        self.assertEqual(dev["cc"], "8.6")
        self.assertEqual(run.events[0]["ev"], "start")
        self.assertEqual(run.events[-1]["ev"], "summary")

    def test_samples_follow_the_timeline(self):
        # a timeline point each time the use moved by 1% of the device, at
        # most a few a second: one tick (0.5 s) apart, each move is a point
        run = self.script("alloc:1G", "sleep:700", "alloc:1G", "sleep:700", "free:0",
                          "sleep:700", "free:1")
        currents = [e["current"] for e in run.of("sample")]
        self.assertEqual(currents, [GiB, 2 * GiB, GiB, 0])
        # within one tick, the extremes: up to 2 GiB and back to nothing
        run = self.script("alloc:1G", "alloc:1G", "freeall")
        currents = [e["current"] for e in run.of("sample")]
        self.assertEqual(currents, [2 * GiB, 0])
        # a move under 1% of total is not a sample
        run = self.script("alloc:100M", "freeall")
        self.assertEqual(run.of("sample"), [])

    def test_every_runtime_allocation_api(self):
        cmds = []
        for api in ("malloc", "async", "async_ptsz", "pool", "managed", "pitch"):
            cmds.append(f"api:{api}:64M")
        run = self.script(*cmds, "freeall")
        self.assertEqual(run.rc, 0, run.out + run.err)
        self.assertNotIn("error", run.out)
        s = run.summary()
        self.assertEqual(s["allocs"], 6)
        self.assertEqual(s["frees"], 6)
        # the three stream-ordered ones went back to their pool, which still
        # holds them on the device (released at the next synchronisation)
        self.assertEqual((s["live_bytes"], s["allocated"]), (3 * 64 * MiB, 0))
        self.assertEqual(s["pool_reserved"], 3 * 64 * MiB)
        self.assertGreaterEqual(s["peak"], 6 * 64 * MiB)
        run = self.script(*cmds, "freeall", "sync")
        s = run.summary()
        self.assertEqual((s["live_bytes"], s["allocated"], s["pool_reserved"]), (0, 0, 0))

    def test_rank_in_name_and_event(self):
        run = self.script("alloc:1M", "freeall", RANK="3")
        self.assertEqual(len(run.files), 1)
        self.assertIn(".rank3.", os.path.basename(run.files[0]))
        self.assertEqual(run.one("start")["rank"], 3)


class EdgeCalls(Case):
    def test_null_free_zero_size_and_bogus_free_unchanged(self):
        cmds = ["free0", "alloc:0", "bogusfree", "alloc:1M", "freeall"]
        plain = self.script(*cmds, preload=False)
        guarded = self.script(*cmds)
        self.assertEqual(plain.out, guarded.out)
        s = guarded.summary()
        self.assertEqual(s["allocs"], 1)
        self.assertEqual(s["frees"], 1)
        self.assertEqual(s["unknown_frees"], 0)  # the bogus free failed in the runtime

    def test_error_codes_reach_the_caller(self):
        # the fake fails the 2nd and 4th allocation with an unknown error code
        kw = dict(FAKECUDA_FAIL_ALLOC="2,4", FAKECUDA_FAIL_ERROR="999")
        cmds = ["alloc:1M"] * 5 + ["freeall"]
        plain = self.script(*cmds, preload=False, **kw)
        guarded = self.script(*cmds, **kw)
        self.assertEqual(plain.out, guarded.out)
        self.assertIn("error 999", guarded.out)
        s = guarded.summary()
        self.assertEqual(s["allocs"], 3)
        self.assertEqual(s["ooms"], 0)  # only the out-of-memory code is an OOM
        self.assertEqual(s["live_bytes"], 0)


class InjectedFaults(Case):
    def test_failed_allocations_never_enter_the_ledger(self):
        run = self.script(*(["alloc:1G"] * 6), "freeall", FAKECUDA_FAIL_ALLOC="2,5")
        self.assertEqual(run.out.count("error 2"), 2)
        s = run.summary()
        self.assertEqual(s["allocs"], 4)
        self.assertEqual(s["ooms"], 2)
        self.assertEqual(s["frees"], 4)
        self.assertEqual(s["peak"], 4 * GiB)
        self.assertEqual(len(run.of("oom")), 2)
        oom = run.of("oom")[0]
        self.assertEqual(oom["api"], "cudaMalloc")
        self.assertEqual(oom["bytes"], GiB)

    def test_real_exhaustion_is_an_oom(self):
        run = self.script("alloc:20G", "alloc:8G", "freeall", GPUGUARD_MODE="observe")
        self.assertIn("alloc 8G: error 2", run.out)
        s = run.summary()
        self.assertEqual((s["allocs"], s["ooms"], s["peak"]), (1, 1, 20 * GiB))


class Threads(Case):
    def test_16_threads_100k_operations_exact(self):
        run = self.script("threads:16:100000:1M", timeout=600)
        self.assertIn("threads: 16 x 100000 ok", run.out)
        s = run.summary()
        self.assertEqual(s["allocs"], 16 * 100001)
        self.assertEqual(s["frees"], 16 * 100001)
        self.assertEqual(s["live_bytes"], 0)
        self.assertEqual(s["live_allocs"], 0)
        self.assertGreaterEqual(s["peak"], 16 * MiB)
        self.assertLessEqual(s["peak"], 32 * MiB)
        self.assertEqual(s["peak"] % MiB, 0)

    def test_threads_with_faults(self):
        run = self.script("threads:8:1000:1M", FAKECUDA_FAIL_ALLOC="100,200,300")
        s = run.summary()
        self.assertEqual(s["ooms"], 3)
        self.assertEqual(s["allocs"] - s["frees"], s["live_allocs"])
        self.assertEqual(s["live_bytes"], s["live_allocs"] * MiB)


class Lifecycle(Case):
    def test_never_cuda_leaves_nothing(self):
        mark = os.path.join(self.tmp, "init-mark")
        for argv in (["/bin/true"], ["/bin/sh", "-c", "echo hi"],
                     ["python3", "-c", "import ctypes; print('ok')"]):
            run = self.run_prog(argv, FAKECUDA_INIT_MARK=mark)
            self.assertEqual(run.rc, 0)
            self.assertEqual(run.err, "")
            self.assertEqual(run.files, [])
            self.assertFalse(os.path.exists(mark), "CUDA was initialised")
            self.assertEqual(os.listdir(run.dir), [])

    def test_fork_child_never_writes_the_summary(self):
        run = self.script("alloc:1G", "fork", "forkexit", "freeall")
        self.assertIn("fork: child exited 0", run.out)
        self.assertEqual(len(run.files), 1)
        self.assertEqual(len(run.of("summary")), 1)
        self.assertEqual(len(self.shim_lines(run)), 1)
        s = run.summary()
        self.assertEqual((s["allocs"], s["frees"], s["peak"]), (1, 1, GiB))

    def test_fork_before_cuda_child_starts_its_own(self):
        # a child forked before any CUDA call is a process of its own
        run = self.script("fork", "alloc:1M", "freeall")
        self.assertEqual(len(run.files), 1)

    def test_quiet(self):
        run = self.script("alloc:1M", "freeall", GPUGUARD_QUIET="1")
        self.assertEqual(run.err, "")
        self.assertEqual(len(run.of("summary")), 1)

    def test_summary_line(self):
        run = self.script("alloc:1G", "freeall")
        (line,) = self.shim_lines(run)
        self.assertIn("GPU0 NVIDIA GeForce RTX 3090: peak 1.0 GiB (device 1.0 GiB) of 24.0 GiB", line)
        self.assertIn("journal ./gpuguard.script.", line)

    def test_libunwind_stays_out_of_the_global_scope(self):
        # Linked into the preloaded shim, libunwind's unversioned _Unwind_*
        # would win over libgcc_s's for the whole process and C++ unwinding
        # (pthread_exit through C++ frames) would crash. After the shim has
        # started and captured stacks, the process-wide _Unwind_Resume must
        # not come from libunwind.
        code = (
            "import ctypes, os\n"
            f"lib = ctypes.CDLL(os.path.join({FAKE!r}, 'libtorchlike.so'))\n"
            "p = ctypes.c_void_p()\n"
            "lib.tl_malloc(ctypes.c_size_t(1 << 20), ctypes.byref(p))\n"
            "libgcc = ctypes.CDLL('libgcc_s.so.1', mode=ctypes.RTLD_GLOBAL)\n"
            "addr = ctypes.cast(ctypes.CDLL(None)._Unwind_Resume, ctypes.c_void_p).value\n"
            "for line in open('/proc/self/maps'):\n"
            "    lo, hi = (int(x, 16) for x in line.split()[0].split('-'))\n"
            "    if lo <= addr < hi:\n"
            "        print('from', line.split()[-1])\n"
            "print('loaded', any('libunwind' in l for l in open('/proc/self/maps')))\n")
        run = self.python(code, policy=None, GPUGUARD_HEADROOM="0", GPUGUARD_MODE="observe")
        self.assertEqual(run.rc, 0, run.err)
        self.assertIn("from ", run.out)
        self.assertNotIn("libunwind", run.out.split("from ")[1].splitlines()[0])
        self.assertIn("loaded True", run.out)  # it is loaded, privately
        self.assertTrue(run.summary()["peak_stack"])

    def test_mode_off_is_invisible(self):
        run = self.script("alloc:1G", "freeall", GPUGUARD_MODE="off")
        self.assertEqual(run.files, [])
        self.assertEqual(run.err, "")


class JournalSafety(Case):
    def test_mode_0600(self):
        run = self.script("alloc:1M", "freeall")
        mode = stat.S_IMODE(os.stat(run.files[0]).st_mode)
        self.assertEqual(mode, 0o600)

    def test_planted_symlink_is_not_followed(self):
        # the journal name is predictable: plant a symlink there
        target = os.path.join(self.tmp, "victim")
        with open(target, "w") as f:
            f.write("precious\n")
        env = base_env()
        # the child's pid is not known in advance: use a wrapper that execs
        # the program after planting the link at its own pid's name
        wrapper = os.path.join(self.tmp, "plant.sh")
        with open(wrapper, "w") as f:
            f.write('#!/bin/sh\nln -s victim "gpuguard.script.$$.jsonl"\nexec "$@"\n')
        os.chmod(wrapper, 0o755)
        run = self.run_prog([wrapper, SCRIPT, "alloc:1M", "freeall"], env=env, cwd=self.tmp)
        self.assertEqual(run.rc, 0)
        self.assertIn("script: done", run.out)
        with open(target) as f:
            self.assertEqual(f.read(), "precious\n")
        # the link is left alone (never followed, never replaced) and the
        # journal takes the next free name, the pid's second life
        names = sorted(n for n in os.listdir(self.tmp) if n.startswith("gpuguard."))
        self.assertEqual(len(names), 2, names)
        links = [n for n in names if os.path.islink(os.path.join(self.tmp, n))]
        (journal,) = [n for n in names if n not in links]
        self.assertEqual(len(links), 1, names)
        self.assertRegex(journal, r"^gpuguard\.script\.\d+-2\.jsonl$")
        with open(os.path.join(self.tmp, journal)) as f:
            self.assertEqual(json.loads(f.readline())["ev"], "start")

    def test_unwritable_dir_degrades(self):
        run = self.script("alloc:1M", "freeall", GPUGUARD_JOURNAL_DIR="/nonexistent/dir")
        self.assertEqual(run.rc, 0)
        self.assertIn("script: done", run.out)
        self.assertTrue(any("cannot create journal" in l for l in self.shim_lines(run)))


class RuntimeLoadedLocal(Case):
    def test_python_ctypes_rtld_local(self):
        # ctypes loads the PyTorch-like library RTLD_LOCAL, and with it the
        # runtime: dlsym(RTLD_NEXT) finds nothing, the shim must search.
        code = (
            "import ctypes, os\n"
            f"lib = ctypes.CDLL(os.path.join({FAKE!r}, 'libtorchlike.so'))\n"
            "p = ctypes.c_void_p()\n"
            "assert lib.tl_malloc(ctypes.c_size_t(3 << 20), ctypes.byref(p)) == 0\n"
            "lib.tl_free(p)\n"
            "lib.tl_empty_cache()\n"
            "print('ok')\n")
        run = self.python(code)
        self.assertEqual(run.rc, 0, run.err)
        s = run.summary()
        self.assertEqual(s["allocs"], 1)
        self.assertEqual(s["frees"], 1)
        self.assertEqual(s["peak"], 20 * MiB)  # a 1-10 MiB request takes a 20 MiB segment


class CApi(Case):
    def test_stats(self):
        run = self.api("stats")
        self.assertIn("stats: dev=0 name=NVIDIA GeForce RTX 3090 total=25769803776 ", run.out)
        self.assertIn(f"current={GiB} peak={GiB + 512 * MiB} allocs=2 frees=1", run.out)
        self.assertIn("stats(7): -1", run.out)

    def test_without_shim(self):
        run = self.api("stats", preload=False)
        self.assertIn("stats: no shim", run.out)
