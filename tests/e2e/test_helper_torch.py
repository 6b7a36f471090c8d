"""The Python helper with real PyTorch: Guard.microbatches, Guard.run, two
ranks over gloo, the trainer adapters and the README's loops.

The jobs (tools/python/tests/torchjob.py) run under the Python that has
torch (Debian's python3-torch for /usr/bin/python3: torch 1.13 on the CPU;
GG_TORCH_PYTHON overrides), preloaded with the shim, on the fake GPU: the
memory pressure comes from the shim and the fake stack (activations
allocated through libtorchlike.so in proportion to each piece), the
gradients from real torch. Every guarded run is compared with the same
model trained on whole batches without any pressure.

Without torch these tests say why and skip; CI installs it. A distributed
job that does not finish in time is a failure (a hang), never a skip.
"""
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time

from gg import (BUILD, FAKE, PYHELPER, ROOT, RTX3090, Case, base_env,
                sanitizer_preload)

TORCH_PYTHON = os.environ.get("GG_TORCH_PYTHON", "/usr/bin/python3")
JOB = os.path.join(PYHELPER, "tests", "torchjob.py")
README = os.path.join(ROOT, "README.md")
RTX3060 = "NVIDIA GeForce RTX 3060,12GiB,8.6"
INERT = "gpuguard: libgpuguard.so is not preloaded; the guard is inert"
TOLERANCE = 1e-5
HANG = 180  # seconds for a whole distributed run: far more than it needs

_probe = {}


def probe(modules):
    """None when TORCH_PYTHON imports `modules`, else why not."""
    if modules not in _probe:
        code = "import %s" % modules
        try:
            out = subprocess.run([TORCH_PYTHON, "-c", code], stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, universal_newlines=True, timeout=120)
            _probe[modules] = None if out.returncode == 0 else (
                out.stdout.strip().splitlines() or ["failed"])[-1]
        except (OSError, subprocess.SubprocessError) as e:
            _probe[modules] = str(e)
    return _probe[modules]


def need_torch(case):
    why = probe("torch, torch.distributed")
    if why is not None:
        case.skipTest("no PyTorch for %s (%s): install it with `sudo apt-get install "
                      "python3-torch` (make test does as root, CI always)" % (TORCH_PYTHON, why))


def max_diff(a, b):
    assert len(a) == len(b) and a, (len(a), len(b))
    return max(abs(x - y) for x, y in zip(a, b))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class TorchCase(Case):
    def setUp(self):
        super(TorchCase, self).setUp()
        need_torch(self)

    def env(self, plan, devices=RTX3090, preload=True, **extra):
        env = base_env(devices=devices, GG_TORCHLIKE=os.path.join(FAKE, "libtorchlike.so"),
                       GG_PLAN=plan, **extra)
        env["PYTHONUNBUFFERED"] = "1"
        if preload:
            env["LD_PRELOAD"] = ":".join(sanitizer_preload() + [os.path.join(BUILD,
                                                                             "libgpuguard.so")])
        return env

    def job(self, name, plan, devices=RTX3090, preload=True, args=(), **extra):
        """One job in one process; (its result, the run)."""
        out = os.path.join(self.tmp, "%s.json" % name)
        run = self.run_prog([TORCH_PYTHON, JOB, name, out] + list(args), preload=False,
                            env=self.env(plan, devices, preload, **extra), timeout=HANG)
        self.assertEqual(run.rc, 0, run.err)
        self.sanitizer_clean(run)
        with open(out) as f:
            return json.load(f), run

    def ranks(self, argv, envs):
        """Processes started together, one per env; one deadline for them
        all. Returns (outputs, seconds); a run past the deadline is a hang."""
        cwd = tempfile.mkdtemp(prefix="ranks-", dir=self.tmp)
        start = time.monotonic()
        procs = [subprocess.Popen(argv(i), cwd=cwd, env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, universal_newlines=True,
                                  start_new_session=True)
                 for i, env in enumerate(envs)]
        outs = []
        try:
            for p in procs:
                left = max(1, HANG - (time.monotonic() - start))
                outs.append(p.communicate(timeout=left))
        except subprocess.TimeoutExpired:
            for sig in (signal.SIGTERM, signal.SIGKILL):  # torchrun passes SIGTERM on
                for p in procs:
                    try:
                        os.killpg(p.pid, sig)
                    except OSError:
                        pass
                time.sleep(2)
            for p in procs:
                p.communicate()
            self.fail("the ranks did not finish within %d s: a hang" % HANG)
        seconds = time.monotonic() - start
        for p, (_, err) in zip(procs, outs):
            self.assertEqual(p.returncode, 0, err)
        return cwd, outs, seconds

    def two_ranks(self, name, plans, devices=(RTX3090, RTX3060)):
        """`name` on two ranks over gloo, each with its own fake GPU."""
        init = os.path.join(self.tmp, "init")
        envs = [self.env(plans[r], devices[r], RANK=r, WORLD_SIZE=2, GG_INIT=init,
                         FAKECUDA_STATE=os.path.join(self.tmp, "state%d" % r))
                for r in range(2)]
        outs = [os.path.join(self.tmp, "%s.%d.json" % (name, r)) for r in range(2)]
        cwd, _, seconds = self.ranks(lambda r: [TORCH_PYTHON, JOB, name, outs[r]], envs)
        results = []
        for path in outs:
            with open(path) as f:
                results.append(json.load(f))
        sys.stdout.write("[%s: 2 ranks in %.1f s] " % (name, seconds))
        return results, cwd, seconds

    def events(self, cwd, rank, ev):
        found = []
        for name in os.listdir(cwd):
            if name.startswith("gpuguard.") and (".rank%d." % rank) in name:
                with open(os.path.join(cwd, name)) as f:
                    found += [e for e in map(json.loads, f) if e["ev"] == ev]
        return found


class MicrobatchesWithTorch(TorchCase):
    def test_split_after_the_advice_ends_with_the_unpressured_parameters(self):
        r, run = self.job("micro", "near")
        self.assertTrue(r["active"])
        # Near misses at batch 4 (32 samples) and batch 7 (16): split from the next one on.
        self.assertEqual(r["splits"], [1, 1, 1, 1, 2, 2, 2, 4])
        self.assertEqual(r["weights"][4], [0.5, 0.5])
        self.assertEqual(r["weights"][7], [0.25] * 4)
        self.assertTrue(r["structure_ok"])  # dict of tensors, ids, a constant, a scalar
        self.assertLessEqual(max_diff(r["params"], r["reference"]), TOLERANCE)
        advice = run.of("advice")
        self.assertEqual([(a["reason"], a["batch_size"]) for a in advice],
                         [("near_miss", 16), ("near_miss", 8)])
        self.assertEqual(run.one("mode")["why"], "trainer registered")
        s = run.summary()
        self.assertEqual((s["refusals"], s["ooms"]), (0, 0))
        self.assertLessEqual(s["peak_used"], s["limit"])
        sys.stdout.write("[max |param - reference| %.1e] " % max_diff(r["params"],
                                                                       r["reference"]))

    def test_run_recovers_from_refusals_with_the_unpressured_parameters(self):
        r, run = self.job("run", "refuse")
        self.assertEqual(r["ooms"], 2)  # one per growth of the curriculum, no more
        self.assertEqual(r["calls"], [[32], [32], [32], [32, 16, 16], [16, 16], [16, 16],
                                      [16, 8, 8, 8, 8], [8, 8, 8, 8]])
        self.assertEqual(r["zero_grad_calls"], 2)
        self.assertEqual([h["reason"] for h in r["history"]], ["out of memory"] * 2)
        self.assertLessEqual(max_diff(r["params"], r["reference"]), TOLERANCE)
        self.assertGreaterEqual(len(run.of("refused")), 2)
        self.assertEqual(run.of("oom"), [])  # the guard said no before the device did
        sys.stdout.write("[%d OOMs, max |param - reference| %.1e] "
                         % (r["ooms"], max_diff(r["params"], r["reference"])))

    def test_without_the_shim_nothing_changes(self):
        r, run = self.job("inert", "none", preload=False)
        self.assertFalse(r["active"])
        self.assertEqual(r["warnings"], [INERT])
        self.assertEqual(r["pieces"], [[[32, 1.0, True]]] * 8)  # the batch itself, weight 1
        self.assertEqual(r["run_calls"], [[True]] * 8)          # step once, on the batch
        self.assertEqual(r["micro_params"], r["reference"])      # bit for bit
        self.assertEqual(r["run_params"], r["reference"])
        self.assertEqual(run.files, [])


class BackwardWithTorch(TorchCase):
    """guard.backward(loss) in a `for mb in guard.microbatches(batch)` loop
    scales by the piece the loop is on: the accumulated gradients are the
    whole batch's, however the batch was split; where the piece cannot be
    known it raises at the first call."""

    def policy(self, batch):
        path = os.path.join(self.tmp, "batch%d.ini" % batch)
        with open(path, "w") as f:
            f.write("[trainer]\nbatch_size = %d\napply_batch = yes\n" % batch)
        return path

    def check(self, r, splits):
        self.assertEqual(r["splits"], splits)
        self.assertLess(r["max_grad_error"], TOLERANCE)
        self.assertLessEqual(max_diff(r["params"], r["reference"]), TOLERANCE)
        for key in ("outside", "copied", "other_thread"):
            self.assertIsNotNone(r[key], key)
            self.assertIn("guard.backward(loss, mb)", r[key])
        sys.stdout.write("[max |grad - whole batch's| %.1e] " % r["max_grad_error"])

    def test_split_by_an_advice_into_two_then_four(self):
        r, run = self.job("backward", "near")
        self.check(r, [[32]] * 4 + [[16, 16]] * 3 + [[8] * 4])
        self.assertEqual([a["reason"] for a in run.of("advice")], ["near_miss"] * 2)

    def test_split_by_a_policy_into_uneven_pieces(self):
        for batch, pieces in ((16, [16, 16]), (11, [11, 11, 10]), (8, [8] * 4)):
            # near-small on a 24 GiB GPU: device memory in use, far from the line
            r, _ = self.job("backward", "near-small", GPUGUARD_POLICY=self.policy(batch))
            self.check(r, [pieces] * 8)

    def test_one_piece_without_the_shim(self):
        r, run = self.job("backward", "none", preload=False)
        self.assertFalse(r["active"])
        self.check(r, [[32]] * 8)
        self.assertEqual(run.files, [])


class RanksWithTorch(TorchCase):
    def test_two_ranks_split_alike_and_end_equal(self):
        (r0, r1), cwd, seconds = self.two_ranks("dist", ["near-small", "near-small"])
        # Only rank 1 (12 GiB) gets near misses; both take its split, batch by batch.
        self.assertEqual(r0["splits"], [1, 1, 1, 1, 2, 2, 2, 4])
        self.assertEqual(r1["splits"], r0["splits"])
        self.assertEqual([h["reason"] for h in r1["history"]],
                         ["advice #1, near_miss", "advice #2, near_miss"])
        self.assertEqual([h["reason"] for h in r0["history"]],
                         ["another rank was advised"] * 2)
        self.assertEqual(self.events(cwd, 0, "advice"), [])
        self.assertEqual(len(self.events(cwd, 1, "advice")), 3)
        self.assertLessEqual(max_diff(r0["params"], r1["params"]), TOLERANCE)
        self.assertLessEqual(max_diff(r0["params"], r0["reference"]), TOLERANCE)
        # shrink_requested / accept(): the advised rank and the other agree, no hang
        self.assertEqual(r1["accepted"], [[0, [16, 2]]])
        self.assertEqual(r0["accepted"], r1["accepted"])
        self.assertLess(seconds, HANG)

    def test_two_ranks_run_redo_together(self):
        (r0, r1), cwd, _ = self.two_ranks("dist-run", ["refuse-small", "refuse-small"])
        self.assertEqual(r1["ooms"], 2)
        self.assertEqual(r0["ooms"], 0)
        self.assertEqual(r0["splits"], [1, 1, 1, 2, 2, 2, 4, 4])
        self.assertEqual(r1["splits"], r0["splits"])
        self.assertEqual([h["reason"] for h in r0["history"]],
                         ["another rank ran out of memory"] * 2)
        self.assertGreaterEqual(len(self.events(cwd, 1, "refused")), 2)
        self.assertEqual(self.events(cwd, 0, "refused"), [])
        self.assertLessEqual(max_diff(r0["params"], r1["params"]), TOLERANCE)
        self.assertLessEqual(max_diff(r0["params"], r0["reference"]), TOLERANCE)


class SizingWithTorch(TorchCase):
    """Guard.run on batches of long-tailed lengths (torchjob's shape job):
    the shim's model sizes each batch before it runs."""

    LONG = (5, 8)  # batches 6 and 9 (0-based): whole they would cross the line

    def test_long_batches_split_before_they_run_with_the_unsplit_parameters(self):
        r, run = self.job("shape", "shape")
        self.assertEqual([len(p) for i, p in enumerate(r["pieces"])],
                         [2 if i in self.LONG else 1 for i in range(12)])
        self.assertEqual([sum(p) for p in r["pieces"]], [32] * 12)   # the effective batch
        self.assertEqual(r["sizing"], {"whole": 10, "split_by_shape": 2, "split": 0,
                                       "redone": 0})
        self.assertEqual(r["ooms"], 0)
        self.assertLessEqual(max_diff(r["params"], r["reference"]), TOLERANCE)
        s = run.summary()
        self.assertEqual((s["near_misses"], s["refusals"], s["ooms"]), (0, 0, 0))
        self.assertIn("gpuguard: batch 6: 32 x 400 x 8 tokens, predicted 24.5 GiB over the "
                      "20.4 GiB line: 2 pieces", run.err)
        self.assertIn("gpuguard: 12 batches: 10 whole, 2 split by their shape", run.err)
        sys.stdout.write("[max |param - reference| %.1e] " % max_diff(r["params"],
                                                                       r["reference"]))

    def test_two_ranks_split_the_same_batches(self):
        (r0, r1), cwd, _ = self.two_ranks("shape", ["shape", "shape"], (RTX3090, RTX3090))
        want = [2 if i in self.LONG else 1 for i in range(12)]
        self.assertEqual([len(p) for p in r0["pieces"]], want)
        self.assertEqual(r1["pieces"], r0["pieces"])
        self.assertLessEqual(max_diff(r0["params"], r1["params"]), TOLERANCE)
        self.assertLessEqual(max_diff(r0["params"], r0["reference"]), TOLERANCE)
        for rank in (0, 1):
            self.assertEqual(self.events(cwd, rank, "refused"), [])


class AdaptersWithTorch(TorchCase):
    def test_hf_trainer_stand_in(self):
        r, _ = self.job("hf", "near-16")
        self.assertEqual(sorted(r["runs"]), ["GpuguardTrainer", "guard_trainer", "num_items"])
        for name, run in r["runs"].items():
            self.assertEqual([h["split"] for h in run["history"]], [2, 4], name)
            self.assertEqual(run["args"], [16, 2], name)            # as configured
            self.assertEqual(run["samples"], [32] * 8, name)        # per optimizer step
            self.assertEqual(run["synced"], [1] * 8, name)          # one synchronizing backward
            self.assertTrue(run["compute_loss_restored"], name)
            self.assertLessEqual(max_diff(run["params"], r["reference"]), TOLERANCE, name)

    def test_lightning_stand_in(self):
        r, _ = self.job("lightning", "near-16")
        for kind in ("tensor", "dict"):
            plain, guarded = r["runs"][kind + "-plain"], r["runs"][kind + "-guarded"]
            self.assertEqual([h["split"] for h in guarded["history"]], [2, 4], kind)
            self.assertEqual(guarded["accumulate_grad_batches"], 2)
            self.assertEqual(guarded["samples"], [32] * 8)
            self.assertEqual(guarded["synced"], [1] * 8)
            self.assertEqual(guarded["patched"], [])                # undone at the end
            self.assertTrue(guarded["guard_closed"])
            self.assertLessEqual(max_diff(guarded["params"], plain["params"]), TOLERANCE)
            self.assertLessEqual(max_diff(plain["params"], r["reference"]), TOLERANCE)
            # the loss Lightning sees is the whole batch's
            self.assertLessEqual(max_diff(guarded["losses"], plain["losses"]), TOLERANCE)

    def real(self, job, *modules):
        whys = [probe(m) for m in modules]
        if None not in whys:
            self.skipTest("%s: not importable by %s (%s); not packaged for Debian, the "
                          "stand-in tests cover the hooks the adapter uses"
                          % (" or ".join(modules), TORCH_PYTHON, "; ".join(whys)))
        r, _ = self.job(job, "near-16", args=["real"])
        plain, guarded = r["runs"]["plain"], r["runs"]["guarded"]
        self.assertEqual([h["split"] for h in guarded["history"]][:1], [2])
        self.assertLessEqual(max_diff(guarded["params"], plain["params"]), TOLERANCE)
        return plain, guarded

    def test_hf_trainer_real(self):
        plain, guarded = self.real("hf", "transformers")
        self.assertEqual(guarded["args"], [16, 2])

    def test_lightning_real(self):
        plain, guarded = self.real("lightning", "lightning.pytorch", "pytorch_lightning")
        self.assertEqual(guarded["accumulate_grad_batches"], 2)


def readme_loops():
    """The README's Python blocks."""
    with open(README) as f:
        return re.findall(r"```python\n(.*?)```", f.read(), re.S)


class ReadmeLoops(TorchCase):
    """Every Python loop of the README runs as written: the job gives it the
    names it leaves to the reader (loader, model, loss_fn, optimizer)."""

    def block(self, text):
        path = os.path.join(self.tmp, "loop%d.py" % len(os.listdir(self.tmp)))
        with open(path, "w") as f:
            f.write(text)
        return path

    def test_the_readme_has_three_loops(self):
        loops = readme_loops()
        self.assertEqual(len(loops), 3, "the README's Python blocks changed: update this test")
        kinds = sorted(("torchrun" if "torchrun" in l else "run" if "guard.run(" in l
                        else "microbatches") for l in loops)
        self.assertEqual(kinds, ["microbatches", "run", "torchrun"])

    def test_single_process_loops(self):
        for loop in readme_loops():
            if "torchrun" in loop:
                continue
            plan = "refuse" if "guard.run(" in loop else "near"
            r, run = self.job("readme", plan, args=[self.block(loop)])
            self.assertTrue(r["active"])
            self.assertEqual([h["split"] for h in r["history"]], [2, 4], loop)
            self.assertLessEqual(max_diff(r["params"], r["reference"]), TOLERANCE)
            if plan == "refuse":
                self.assertEqual(r["ooms"], 2)

    def test_torchrun_loop(self):
        (loop,) = [l for l in readme_loops() if "torchrun" in l]
        path = self.block(loop)
        out = os.path.join(self.tmp, "readme.{rank}.json")
        env = self.env("none", GG_PLAN_RANK1="near-small",
                       FAKECUDA_DEVICES_RANK1=RTX3060,
                       FAKECUDA_STATE_RANK0=os.path.join(self.tmp, "state0"),
                       FAKECUDA_STATE_RANK1=os.path.join(self.tmp, "state1"),
                       OMP_NUM_THREADS=1, GG_PLAN_RANK0="near-small")
        # torchrun itself. Explicit --redirects/--tee: their default "0" breaks torch 1.13's
        # torchrun on Python 3.11 (its Std.from_str finds no zero flag and returns None).
        argv = [TORCH_PYTHON, "-m", "torch.distributed.run", "--nnodes=1", "--nproc_per_node=2",
                "--master_addr=127.0.0.1", "--master_port=%d" % free_port(),
                "--redirects=1", "--tee=2", "--log_dir=%s" % os.path.join(self.tmp, "torchrun"),
                JOB, "readme", out, path]
        self.ranks(lambda i: argv, [env])
        r0, r1 = [json.load(open(out.replace("{rank}", str(r)))) for r in (0, 1)]
        self.assertEqual([h["split"] for h in r1["history"]], [2, 4])
        self.assertEqual([(h["batch"], h["split"]) for h in r0["history"]],
                         [(h["batch"], h["split"]) for h in r1["history"]])
        self.assertEqual([h["reason"] for h in r0["history"]], ["another rank was advised"] * 2)
        self.assertLessEqual(max_diff(r0["params"], r1["params"]), TOLERANCE)
        self.assertLessEqual(max_diff(r0["params"], r0["reference"]), TOLERANCE)
