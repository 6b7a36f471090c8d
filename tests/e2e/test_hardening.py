"""A bad day on a cluster: full disks, two lives in
one pid, floods, signals, small stacks, huge sizes and slow starts.

Each test runs tests/progs/harden (or script) under the shim on the fake
GPU and asserts what a week-long job needs: every journal line whole and
valid, nothing that fills a disk, no hang, no crash, no count lost.
"""
import glob
import json
import os
import random
import re
import shutil
import subprocess
import tempfile

from gg import PROGS, SANITIZE, SCRIPT, SHIM, GiB, Case, base_env, sanitizer_preload

HARDEN = os.path.join(PROGS, "harden")

POLICY = """\
[gpu]
match = NVIDIA GeForce RTX 3090*
[memory]
headroom = 10%
near_miss = 5%
mode = {mode}
[trainer]
signal = none
[journal]
stacks = all
"""


class Hard(Case):
    def harden(self, *cmds, mode="observe", timeout=120, env=None, **extra):
        policy = self.write_policy("p.ini", POLICY.format(mode=mode))
        run = self.run_prog([HARDEN, *cmds], policy=policy, env=env, timeout=timeout, **extra)
        return run

    def lines(self, run):
        """Every journal line, each checked to be one whole JSON object."""
        out = []
        for path in run.files:
            with open(path, "rb") as f:
                data = f.read()
            self.assertTrue(not data or data.endswith(b"\n"), path)
            for n, raw in enumerate(data.splitlines(), 1):
                try:
                    out.append(json.loads(raw.decode("utf-8")))
                except ValueError as e:
                    self.fail("%s:%d is not a whole JSON line (%s): %r" % (path, n, e, raw[:200]))
        return out


class FullDisk(Hard):
    """A journal that cannot take a line (a full disk; here the file
    size limit, which fails a write the same way, partway) keeps whole lines
    only; the lines lost are counted and said by the first line that fits
    again, and in the summary. Before: a torn line glued to the next."""

    def test_whole_lines_and_the_lost_said(self):
        # 20 GiB held: each 1 GiB allocation after is a near miss (~2 KB
        # with its stack); the limit lets a few through, then cuts one.
        run = self.harden("alloc:20G", "fsize:6000", "sites:40", "fsize:inf", "sites:3",
                          "freeall")
        self.assertEqual(run.rc, 0, run.err)
        events = self.lines(run)
        # the first line that fits again says how many were lost (then at
        # most once a minute: small lines may fit while big ones do not)
        lost = [e for e in events if e["ev"] == "error" and "lost" in e]
        self.assertEqual(len(lost), 1, [e["ev"] for e in events])
        self.assertGreater(lost[0]["lost"], 0)
        summary = [e for e in events if e["ev"] == "summary"][0]
        self.assertGreaterEqual(summary["lost_lines"], lost[0]["lost"])
        # the near misses: 43 counted; those written plus those lost
        near = [e for e in events if e["ev"] == "near_miss"]
        self.assertEqual(summary["devices"][0]["near_misses"], 43)
        self.assertEqual(len(near[-3:]), 3)
        self.assertLessEqual(len(near) + summary["lost_lines"], 43 + 43)
        self.assertGreaterEqual(len(near) + summary["lost_lines"], 43)
        # said once on stderr, and the total in the summary line
        said = [l for l in run.err.splitlines() if "cannot write the journal" in l]
        self.assertEqual(len(said), 1, run.err)
        self.assertIn("%d journal line" % summary["lost_lines"], run.err)

    def test_rank_only_a_plain_decimal(self):
        for value, want in (("3", 3), ("../../x", None), ("99999999999999", None), ("-1", None)):
            run = self.harden("alloc:1G", "freeall", RANK=value)
            start = [e for e in self.lines(run) if e["ev"] == "start"][0]
            self.assertEqual(start["rank"], want, value)
            errors = [l for l in run.err.splitlines() if "RANK" in l]
            self.assertEqual(len(errors), 0 if want is not None else 1, run.err)
            if want is None:
                self.assertFalse([f for f in run.files if ".rank" in os.path.basename(f)])


class TwoLives(Hard):
    """The same pid twice (a process that execs itself, or the
    same pid in an earlier container) and two copies of the shim in one
    process. Before: `cannot create journal ... File exists`, and two copies
    counted twice into two journals."""

    def test_a_process_that_execs_itself_keeps_both_journals(self):
        run = self.harden("alloc:1G", "pid", "execself:alloc:2G,pid,freeall")
        self.assertEqual(run.rc, 0, run.err)
        pids = set(re.findall(r"^pid (\d+)$", run.out, re.M))
        self.assertEqual(len(pids), 1)  # one pid, two lives
        (pid,) = pids
        names = sorted(os.path.basename(f) for f in run.files)
        self.assertEqual(names, ["gpuguard.harden.%s-2.jsonl" % pid, "gpuguard.harden.%s.jsonl" % pid])
        self.assertNotIn("cannot create journal", run.err)
        second = [e for e in self.lines(run) if e["ev"] == "summary"]
        self.assertEqual(len(second), 1)  # the first life ended in exec, without one
        self.assertEqual(second[0]["devices"][0]["peak"], 2 * GiB)

    def test_a_second_copy_stands_aside(self):
        copy = os.path.join(self.tmp, "copy")
        os.makedirs(copy)
        shutil.copy(SHIM, copy)
        env = base_env()
        env["GPUGUARD_POLICY"] = self.write_policy("p.ini", POLICY.format(mode="enforce"))
        env["LD_PRELOAD"] = ":".join(sanitizer_preload() +
                                     [SHIM, os.path.join(copy, "libgpuguard.so")])
        cwd = tempfile.mkdtemp(dir=self.tmp)
        proc = subprocess.run([HARDEN, "alloc:1G", "alloc:2G", "alloc:30G", "freeall"], cwd=cwd,
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, timeout=60)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn("alloc 30G: error 2", proc.stdout)  # refused once, by the first copy
        journals = glob.glob(os.path.join(cwd, "gpuguard.*.jsonl"))
        self.assertEqual(len(journals), 1, journals)
        with open(journals[0]) as f:
            events = [json.loads(l) for l in f]
        dev = [e for e in events if e["ev"] == "summary"][0]["devices"][0]
        self.assertEqual((dev["allocs"], dev["frees"], dev["refusals"]), (2, 2, 1))
        self.assertEqual(len([l for l in proc.stderr.splitlines() if l.startswith("gpuguard:")]),
                         1, proc.stderr)


class Floods(Hard):
    """However many sites, retries or oscillations, the journal
    stays small: per site the first 8 lines then powers of two, per kind a
    burst then a steady rate, and what was left out counted. Before: 4 096
    sites wrote 4 096 near-miss lines, a retry loop two lines per refusal,
    an oscillation two samples per allocation."""

    def test_thousands_of_sites(self):
        run = self.harden("alloc:20G", "sites:4096", "freeall")
        self.assertEqual(run.rc, 0, run.err)
        events = self.lines(run)
        written = len([e for e in events if e["ev"] == "near_miss"])
        summary = [e for e in events if e["ev"] == "summary"][0]
        self.assertEqual(summary["devices"][0]["near_misses"], 4096)
        self.assertLessEqual(written, 300)  # the burst, and a line every 10 s after
        self.assertEqual(summary["suppressed"]["near_miss"], 4096 - written)

    def test_a_retry_loop_of_refusals(self):
        run = self.harden("alloc:20G", "refuse:20000", "freeall", mode="enforce")
        self.assertEqual(run.rc, 0, run.err)
        self.assertIn("refuse: 20000 of 20000 refused", run.out)
        events = self.lines(run)
        refused = [e for e in events if e["ev"] == "refused"]
        advice = [e for e in events if e["ev"] == "advice"]
        # a refusal and the refusal of the same call right after it are one
        # request and its retry (as PyTorch's allocator retries after its
        # flush; docs/how-it-works.md, "A failure and its retry"): 10 000
        # requests, each raised; one site: the first 8, then the 16th, 32nd,
        # ... 8192nd
        self.assertEqual([e["count"] for e in refused], list(range(1, 9)) +
                         [1 << k for k in range(4, 14)])
        self.assertTrue(all(e["retried"] and not e["recovered"] for e in refused))
        self.assertLessEqual(len(advice), 20)
        summary = [e for e in events if e["ev"] == "summary"][0]
        self.assertEqual(summary["devices"][0]["refusals"], 10000)
        self.assertEqual(summary["devices"][0]["refusals_recovered"], 0)
        self.assertEqual(summary["suppressed"]["refused"], 10000 - len(refused))
        self.assertLess(sum(os.path.getsize(f) for f in run.files), 256 << 10)

    def test_oscillation_is_a_few_samples_a_second(self):
        run = self.harden("oscillate:3000")
        self.assertEqual(run.rc, 0, run.err)
        pairs = int(re.search(r"oscillate: (\d+) pairs", run.out).group(1))
        samples = [e for e in self.lines(run) if e["ev"] == "sample"]
        self.assertGreater(pairs, 10000)
        # a tick each 0.5 s writes at most the high, the low and the now
        self.assertLessEqual(len(samples), 3 * 2 * 4 + 3)
        self.assertGreaterEqual(len(samples), 2)
        self.assertEqual({e["current"] for e in samples} - {0, 512 << 20}, set())
        times = [e["t"] for e in samples]
        self.assertEqual(times, sorted(times))
        self.assertLess(sum(os.path.getsize(f) for f in run.files), 16 << 10)


class SignalsAndStacks(Hard):
    """exit() from a signal handler that lands on a thread inside
    the shim never hangs (the exit path takes no lock that thread may hold,
    and the summary says it left the stacks out); a thread with a 16 KiB
    stack survives near misses, refusals and OOMs with stacks on. Before:
    about half of such exits hung; the small thread died of a stack
    overflow."""

    def test_exit_from_a_signal_handler_never_hangs(self):
        rng = random.Random(17)
        for _ in range(10):
            run = self.harden("peakexit:%d" % rng.randrange(0, 150), timeout=30)
            self.assertEqual(run.rc, 0, run.err)
            events = self.lines(run)
            self.assertEqual(events[-1]["ev"], "summary")

    def stack_used(self, run):
        m = re.search(r"stack used (\d+) of (\d+)", run.out)
        self.assertIsNotNone(m, run.out + run.err)
        return int(m.group(1))

    def test_a_16_kib_thread(self):
        """A thread of the smallest stack pthreads allows survives a near
        miss, a refusal and an OOM with stacks on (the journal has each),
        and what the shim adds to its stack is bounded by what the same
        calls use without it: the shim at most doubles a CUDA call's stack.
        How many bytes it adds is a figure of the machine (its compiler, its
        libc): make bench prints it."""
        if SANITIZE:
            self.skipTest("sanitizers grow every frame several times over: the plain build's test")
        base = self.stack_used(self.harden("alloc:20G", "smallstack:16", "freeall", preload=False))
        for mode, want in (("observe", "near 0 refused 2 oom 2"),
                           ("enforce", "near 0 refused 2 oom 2")):
            run = self.harden("alloc:20G", "smallstack:16", "freeall", mode=mode)
            self.assertEqual(run.rc, 0, run.err)
            self.assertIn("smallstack: " + want, run.out)
            kinds = {e["ev"] for e in self.lines(run)}
            self.assertIn("near_miss", kinds)
            self.assertIn("oom" if mode == "observe" else "refused", kinds)
            added = self.stack_used(run) - base
            self.assertLessEqual(added, base, "the shim added %d bytes to a path that uses %d "
                                 "without it" % (added, base))


class Sizes(Hard):
    """Sizes that do not fit 64 bits are refused, never wrapped:
    a request near SIZE_MAX is a refusal (not an OOM of the device), and a
    pitch whose width x height overflows is journaled with the size it
    cannot have."""

    def test_a_size_near_the_top_is_refused(self):
        run = self.harden("huge", "pitch", mode="enforce")
        self.assertEqual(run.rc, 0, run.err)
        self.assertIn("huge: 2", run.out)
        self.assertIn("pitch: 2", run.out)
        events = self.lines(run)
        refused = [e for e in events if e["ev"] == "refused"]
        self.assertEqual([e["api"] for e in refused], ["cudaMalloc", "cudaMallocPitch"])
        self.assertEqual(refused[0]["bytes"], (1 << 64) - 4096)
        self.assertEqual(refused[1]["bytes"], (1 << 64) - 1)
        dev = [e for e in events if e["ev"] == "summary"][0]["devices"][0]
        self.assertEqual((dev["refusals"], dev["ooms"]), (2, 0))


class SlowStart(Hard):
    """A start that takes long still counts every allocation that
    other threads make meanwhile: a driver that answers slowly (4 GPUs, 9 s
    each: a node without persistence mode), or 16 GPUs and a policy
    directory of 40 000 files (of which the shim reads the first 4 096).
    Before: waiting threads gave the start 20 s, then went through
    uncounted. Now they wait as long as the start moves (a stuck one, 30 s
    without a step, lets them go)."""

    def test_a_slow_driver(self):
        gpus = ";".join("NVIDIA GeForce RTX 3090,24GiB,8.6" for _ in range(4))
        env = base_env(devices=gpus, FAKECUDA_QUERY_DELAY_MS="9000")
        env["GPUGUARD_POLICY"] = self.write_policy("p.ini", POLICY.format(mode="observe"))
        run = self.run_prog([SCRIPT, "threads:4:20:1M", "freeall"], env=env, timeout=300)
        self.assertEqual(run.rc, 0, run.err)
        self.assertIn("threads: 4 x 20 ok", run.out)
        dev = run.summary(0)
        self.assertEqual((dev["allocs"], dev["frees"]), (4 * 21, 4 * 21))

    def test_nothing_uncounted(self):
        base = "/dev/shm" if os.access("/dev/shm", os.W_OK) else self.tmp
        d = tempfile.mkdtemp(prefix="gg-policies-", dir=base)
        self.addCleanup(shutil.rmtree, d, ignore_errors=True)
        gpus = 16
        names = ["Model %02d GPU" % g for g in range(gpus)]
        for i in range(40000):
            with open(os.path.join(d, "p%05d.ini" % i), "w") as f:
                own = i % 250 == 7 and i // 250 < gpus
                f.write("[gpu]\nmatch = %s\n" % (names[i // 250] if own else "Other %d" % i))
        env = base_env(devices=";".join("%s,24GiB,8.6" % n for n in names), GPUGUARD_POLICY=d)
        run = self.run_prog([SCRIPT, "threads:8:50:1M", "freeall"], env=env, timeout=600)
        self.assertEqual(run.rc, 0, run.err)
        self.assertIn("threads: 8 x 50 ok", run.out)
        dev = run.summary(0)
        self.assertEqual((dev["allocs"], dev["frees"]), (8 * 51, 8 * 51))
        self.assertEqual([x["policy"].rsplit("/", 1)[-1] for x in run.one("start")["devices"]],
                         ["p%05d.ini" % (g * 250 + 7) for g in range(gpus)])
