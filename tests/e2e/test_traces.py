"""Golden traces of real PyTorch, replayed through the light fake stack under
the shim (no chroot, no GPU): what real PyTorch 2.6 does with its allocator
stays under test on every machine (tests/traces/README.md).

Each trace in tests/traces is replayed with its own device, context bytes
and policy; every call must come back as it did when it was recorded (a
refusal where there was one, the same cudaMemGetInfo answer), and the
shim's journal must say what the recorded run's said: peak, device-wide
peak, allocations, frees, near misses, refusals, out-of-memory errors, what
was still live at exit.
"""
import glob
import os
import subprocess
import sys
import types

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from gg import BUILD, ROOT, Case, base_env  # noqa: E402

TRACES = os.path.join(ROOT, "tests", "traces")
REPLAY = os.path.join(BUILD, "tests", "traces", "replay%d")


def read_header(path):
    """The header of a golden trace: a dict of its keyword lines."""
    h = {"device": [], "policy": [], "env": [], "expect": [], "torch": []}
    with open(path) as f:
        for line in f:
            line = line.rstrip("\n")
            if not line or line.startswith("#"):
                continue
            word, _, rest = line.partition(" ")
            if word in ("device", "policy", "env", "expect", "torch"):
                h[word].append(rest)
            elif word in ("source", "runtime", "context", "vaspan"):
                h[word] = rest
    return h


def fields(text):
    """'dev=0 peak=12' -> {'dev': '0', 'peak': '12'}"""
    return dict(kv.split("=", 1) for kv in text.split())


def replay(case, path):
    """Run the replayer under the shim as the trace's header says: the Run."""
    h = read_header(path)
    devices = ";".join(d.split(" ", 1)[1] for d in h["device"])
    policy_dir = os.path.join(case.tmp, "policy-" + os.path.basename(path))
    os.makedirs(policy_dir)
    for p in h["policy"]:
        f = fields(p)
        dev = int(f["dev"])
        name = h["device"][dev].split(" ", 1)[1].rsplit(",", 2)[0]
        with open(os.path.join(policy_dir, "%02d.ini" % dev), "w") as out:
            out.write("[gpu]\nmatch = %s\n[memory]\nheadroom = %s\nnear_miss = %s\nmode = %s\n" %
                      (name, f["headroom"], f["near_miss"], f["mode"]))
    extra = dict(e.split("=", 1) for e in h["env"])
    env = base_env(devices=devices, FAKECUDA_CONTEXT_BYTES=h.get("context", "0"), **extra)
    return case.run_prog([REPLAY % int(h["runtime"]), path], env=env, policy=policy_dir), h


class GoldenTraces(Case):
    def traces(self):
        found = sorted(glob.glob(os.path.join(TRACES, "*.trace")))
        self.assertTrue(found, "no golden traces in %s" % TRACES)
        return found

    def test_the_traces_cover_each_allocator_path(self):
        """What the rig recorded: PyTorch's three allocators, clean and refused,
        and the helper reacting to advice."""
        names = {os.path.basename(p)[:-len(".trace")] for p in self.traces()}
        for want in ("train-default", "train-expandable", "oom-default", "oom-expandable",
                     "oom-async", "helper-grow", "seq-grow", "doc-lengths"):
            self.assertIn(want, names)
        for p in self.traces():
            h = read_header(p)
            self.assertIn("PyTorch", h["source"])
            self.assertTrue(h["expect"])

    def test_every_trace_replays_as_recorded(self):
        for path in self.traces():
            with self.subTest(trace=os.path.basename(path)):
                run, h = replay(self, path)
                self.assertEqual(run.rc, 0, "%s\n%s" % (run.out[-3000:], run.err[-3000:]))
                self.assertRegex(run.out, r"replay: \d+ calls, 0 mismatches")
                self.sanitizer_clean(run)
                for e in h["expect"]:
                    want = fields(e)
                    got = run.summary(int(want.pop("dev")))
                    for k, v in want.items():
                        self.assertEqual(got[k], int(v), "%s: %s" % (os.path.basename(path), k))

    def test_growing_and_varying_inputs_replay_their_story(self):
        """Growing and long-tailed inputs: each step's input and need (the instrumentation's
        shape and needed lines) replayed give the shim the same story: the
        growing run's flushes step after step, then the failure that reached
        the program; the long batch forecast by its tokens before it
        allocates."""
        run, _ = replay(self, os.path.join(TRACES, "seq-grow.trace"))
        steps = run.of("step")
        self.assertEqual([e["shape"] for e in steps[:3]], [[8, 128], [8, 256], [8, 384]])
        self.assertTrue(all(e["needed"] < e["peak"] for e in steps))
        refused = run.of("refused")
        self.assertTrue(all(e["recovered"] for e in refused[:-1]))
        last = refused[-1]
        self.assertEqual((last["recovered"], last["retried"], last["step"]), (False, True, 26))
        self.assertEqual(last["shape"], [8, 26 * 128])
        run, _ = replay(self, os.path.join(TRACES, "doc-lengths.trace"))
        [fc] = [a for a in run.of("advice") if a["reason"] == "forecast"]
        self.assertEqual(fc["forecast"]["step"], 18)
        long = [e for e in run.of("refused") if e["step"] == 18]
        self.assertEqual(long[-1]["shape"], [8, 7556])
        self.assertFalse(long[-1]["recovered"])
        self.assertLess(fc["t"], long[0]["t"])

    def test_a_refusal_replays_as_a_refusal(self):
        """The replay's refusals are the shim's decisions, made again: with no
        limit the same calls all succeed, and the replayer says so."""
        path = os.path.join(TRACES, "oom-default.trace")
        h = read_header(path)
        self.assertGreater(int(fields(h["expect"][0])["refusals"]), 0)
        loose = os.path.join(self.tmp, "loose.trace")
        with open(path) as src, open(loose, "w") as out:
            for line in src:
                if line.startswith("policy "):
                    line = "policy dev=0 headroom=0 near_miss=0 mode=observe\n"
                out.write(line)
        run, _ = replay(self, loose)
        self.assertEqual(run.rc, 1)
        self.assertRegex(run.out, r"alloc cudaMalloc \S+ \S+ - refused .*: got 0, recorded 2")
        self.assertEqual(run.summary()["refusals"], 0)


class RecordAndReplay(Case):
    """The loop that makes golden traces, on the fake stack: a program run
    under GPUGUARD_TRACE, its trace made golden by tracefmt.py, replayed by
    the replayer of its runtime (13 here) with the journal it had."""

    def test_record_make_golden_and_replay(self):
        policy = self.write_policy("p.ini", "[gpu]\nmatch = *\n[memory]\nheadroom = 20 GiB\n"
                                            "mode = enforce\n")
        trace = os.path.join(self.tmp, "trace.%p")
        run = self.script("alloc:1G", "api:vmm:64M", "api:dlsym:32M", "api:async:16M", "meminfo",
                          "alloc:3G", "free:0", "freeall", "sync", policy=policy,
                          GPUGUARD_TRACE=trace)
        self.assertEqual(run.rc, 0, run.err)
        self.assertIn("alloc 3G: error 2", run.out)  # refused: 1 + 3 GiB > 4 GiB - the rest
        raws = glob.glob(os.path.join(self.tmp, "trace.*"))
        self.assertEqual(len(raws), 1)
        with open(raws[0]) as f:
            raw = f.read()
        self.assertRegex(raw, r"lookup entry_v cuMemCreate \d+ 0 script\n")
        self.assertRegex(raw, r"lookup dlsym cuMemAlloc_v2 -1 0 script\n")
        self.assertRegex(raw, r"alloc cudaMalloc 0 3221225472 0 refused t=\d+\n")
        self.assertRegex(raw, r"map 0x[0-9a-f]+ 67108864 0x[0-9a-f]+ 0\n")
        golden_path = os.path.join(self.tmp, "fake.trace")
        out = subprocess.run([sys.executable, os.path.join(TRACES, "tracefmt.py"), raws[0], run.files[0],
                              "--runtime", "13", "--source", "the fake stack (not PyTorch)",
                              "-o", golden_path], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
        self.assertEqual(out.returncode, 0, out.stderr)
        with open(golden_path) as f:
            golden = f.read()
        self.assertIn("alloc cudaMalloc 0 3221225472 - refused T1", golden)
        self.assertIn("alloc cuMemCreate 0 67108864 h1 0 T1", golden)
        raw_keys = {tok for line in raw.splitlines() if line.startswith(("alloc", "free", "map"))
                    for tok in line.split() if tok.startswith("0x")}
        self.assertTrue(raw_keys)
        for key in raw_keys:  # names, not addresses
            self.assertNotRegex(golden, r"(?<![+\w])%s\b" % key)
        again, h = replay(self, golden_path)
        self.assertEqual(again.rc, 0, again.out + again.err)
        want = fields(h["expect"][0])
        want.pop("dev")
        for k, v in want.items():
            self.assertEqual(again.summary()[k], int(v), k)


class GpuRunnerTraces(Case):
    """tests/gpu/run_gpu.py --traces: a real GPU's runs become golden traces
    the same way. Its maker, fed a run of the fake stack (no GPU here)."""

    def test_a_checks_runs_become_golden_traces(self):
        sys.path.insert(0, os.path.join(ROOT, "tests", "gpu"))
        import run_gpu
        run = self.script("alloc:1G", "api:vmm:64M", "freeall",
                          GPUGUARD_TRACE=os.path.join(self.tmp, "x"), preload=True)
        self.assertEqual(run.rc, 0, run.err)
        child = types.SimpleNamespace(dir=self.tmp, files=run.files, env={})
        os.rename(os.path.join(self.tmp, "x"), os.path.join(self.tmp, "trace.%s" %
                                                            run.files[0].rsplit(".", 2)[-2]))
        out_dir = os.path.join(self.tmp, "golden")
        os.makedirs(out_dir)
        info = {"cuda": "13.0", "torch": "(none)", "name": "the fake RTX 3090"}
        made = run_gpu.golden_traces([child], "peak", out_dir, info)
        self.assertEqual(made, [os.path.join(out_dir, "gpu-peak-1.trace")])
        again, h = replay(self, made[0])
        self.assertEqual(again.rc, 0, again.out)
        self.assertEqual(h["runtime"], "13")
        self.assertIn("on a real the fake RTX 3090 (tests/gpu)", h["source"])
        self.assertEqual(again.summary()["peak"], run.summary()["peak"])
