"""gpuguard-preflight on real PyTorch: will it fit, answered with
no GPU, no driver and no network, with the user's own unmodified script.

The rig stands in for a GPU-less machine with PyTorch's CUDA build: gpuguard
is installed (`make install DESTDIR=...`) into the session's directory in the
chroot, and its gpuguard-preflight runs there as a user would run it, with a
plain environment (no fakes on any path: it brings its own simulated GPU from
<prefix>/lib/gpuguard/sim). Each answer is checked against the thing itself:
the script run normally (its own max_memory_reserved() at the same step), and
run under gpuguard-run --mode enforce on a simulated GPU of each model with
the same memory outside PyTorch a real one holds.
"""
import json
import os
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torchrig  # noqa: E402
from torchrig import BUILD, ROOT, SANITIZE, TorchCase  # noqa: E402

MODEL_24 = "NVIDIA GeForce RTX 3090,24GiB,8.6"
MODEL_16 = "Tesla T4,16GiB,7.5"
MODEL_12 = "NVIDIA GeForce RTX 3060,12GiB,8.6"

#: A small transformer language model (pf_lm.py's defaults: 2 layers of 256).
SMALL_LM = ["--seq", "256", "--dim", "256", "--layers", "2", "--vocab", "8000"]
#: A larger one, whose batches reach 12-24 GiB.
LARGE_LM = ["--seq", "1024", "--dim", "1024", "--layers", "8", "--heads", "16",
            "--vocab", "32000"]

_installed = {}


def installed():
    """gpuguard installed into the session's directory of the rig (once):
    its prefix as the chroot names it."""
    s = torchrig.session()
    if "prefix" not in _installed:
        dest = os.path.join(s.host_dir, "inst")
        make = subprocess.run(
            ["make", "-s", "--no-print-directory", "install", "DESTDIR=" + dest,
             "PREFIX=/usr/local", "BUILD=" + os.path.relpath(BUILD, ROOT), "SANITIZE=" + SANITIZE],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True,
            timeout=900)
        if make.returncode != 0:
            raise AssertionError("make install failed:\n" + make.stdout)
        subprocess.run(["chmod", "-R", "a+rX", dest], check=True)
        _installed["prefix"] = s.dir + "/inst/usr/local"
    return _installed["prefix"]


def user_env(home, **extra):
    """A user's plain environment in the chroot: no fakes on any path."""
    s = torchrig.session()
    env = {"PATH": "/usr/bin:/bin", "HOME": home, "LANG": "C.UTF-8",
           "PYTHONPATH": s.dir + "/scripts", "PYTHONDONTWRITEBYTECODE": "1"}
    if SANITIZE == "1":  # the simulated GPU was built with ASan: its runtime goes first
        env["LD_PRELOAD"] = ":".join(s.sanitizers)
        env["ASAN_OPTIONS"] = "detect_leaks=0:verify_asan_link_order=0"
        env["UBSAN_OPTIONS"] = "halt_on_error=1:print_stacktrace=1"
    env.update({k: str(v) for k, v in extra.items()})
    return env


def in_rig(argv, cwd, env):
    s = torchrig.session()
    return ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
            'mount -t proc proc "$0/proc" && exec chroot "$0" "$@"', s.root,
            "/bin/sh", "-c", 'cd "$0" && exec "$@"', cwd,
            "/usr/bin/env", "-i"] + ["%s=%s" % kv for kv in sorted(env.items())] + list(argv)


class Preflight(object):
    """One gpuguard-preflight command's outcome."""

    def __init__(self, proc, took):
        self.rc = proc.returncode
        self.out = proc.stdout
        self.err = proc.stderr
        self.took = took
        self.json = None
        if self.out.lstrip().startswith("{"):
            self.json = json.loads(self.out)

    def model(self, name):
        found = [m for m in self.json["models"] if m["name"] == name.split(",")[0]]
        assert found, self.out
        return found[0]


class PreflightCase(TorchCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.prefix = installed()

    def setUp(self):
        super().setUp()
        self.home = os.path.join(self.tmp, "user")
        os.makedirs(self.home)
        os.chmod(self.home, 0o777)
        self.inner_home = self.sess.inside(self.home)

    def preflight(self, gpus, script, *args, options=(), timeout=900, **env):
        argv = [self.prefix + "/bin/gpuguard-preflight"] + list(options)
        for g in gpus:
            argv += ["--gpu", g]
        argv += ["--", "python3", self.sess.dir + "/scripts/" + script] + list(args)
        start = time.monotonic()
        proc = subprocess.run(in_rig(argv, self.inner_home, user_env(self.inner_home, **env)),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              universal_newlines=True, timeout=timeout)
        return Preflight(proc, time.monotonic() - start)

    def normal(self, device, script, *args, **kw):
        """The script run normally on a simulated GPU of that model: its
        RESULT step lines."""
        run = self.torch(script, *args, devices=device, preload=False, **kw)
        return run

    def enforced(self, device, outside, script, *args, mode="enforce"):
        """The script under gpuguard-run --mode MODE on that model, the
        memory a real GPU holds outside PyTorch charged to it."""
        return self.torch(script, *args, devices=device, gpuguard_run=["--mode", mode, "--quiet"],
                          env={"FAKECUDA_CONTEXT_BYTES": str(outside)})


def completed(run):
    """Did a run do all its steps without an OutOfMemoryError?"""
    return run.rc == 0 and "OutOfMemoryError" not in run.err


class PeakIsPyTorchs(PreflightCase):
    """PyTorch's peak reserved, as preflight reports it, against the
    max_memory_reserved() the same script reaches run normally to the same
    step."""

    STEPS = 20

    def check(self, script, *args):
        pf = self.preflight([MODEL_24], script, *args, options=["--json", "--steps", str(self.STEPS)])
        self.assertEqual(pf.rc, 0, pf.out + pf.err)
        self.assertEqual(pf.json["steps"], self.STEPS, pf.out)
        m = pf.model(MODEL_24)
        run = self.normal(MODEL_24, script, *args)
        self.assertRan(run)
        step = [r for r in run.results if r["kind"] == "step" and r["step"] == self.STEPS][0]
        real = step["max_reserved"]
        self.assertLessEqual(abs(m["peak_reserved"] - real), 0.02 * real,
                             "preflight %d, max_memory_reserved() %d" % (m["peak_reserved"], real))
        self.assertLessEqual(m["peak_needed"], m["peak_reserved"])
        self.assertLessEqual(abs(m["peak_needed"] - step["max_allocated"]),
                             0.02 * step["max_allocated"])
        print("\n    %s %s: preflight %d B, max_memory_reserved() %d B (%.4f%%), %.1f s" % (
            script, " ".join(args), m["peak_reserved"], real,
            100.0 * (m["peak_reserved"] - real) / real, pf.took))
        return pf, m, real

    def test_mlp(self):
        self.check("pf_mlp.py", "--steps", "30")

    def test_small_transformer_at_two_batch_sizes(self):
        _, small, _ = self.check("pf_lm.py", "--batch", "4", "--steps", "30", *SMALL_LM)
        _, large, _ = self.check("pf_lm.py", "--batch", "16", "--steps", "30", *SMALL_LM)
        self.assertGreater(large["peak_reserved"], small["peak_reserved"])

    def test_gradient_accumulation_by_hand(self):
        pf, _, _ = self.check("pf_accum.py", "--steps", "30")
        # long-tailed sequence lengths: the inputs' shapes changed, and it says so
        self.assertTrue(any("shape changed between steps" in l for l in pf.json["limits"]),
                        pf.json["limits"])


class VerdictsAgreeWithEnforce(PreflightCase):
    """For three models (24, 16 and 12 GiB), preflight's verdict is what
    happens when the script runs under enforce on each (and, when it does
    not fit under the limit, on the whole device)."""

    def test_three_models(self):
        args = ["--batch", "13", "--steps", "6"] + LARGE_LM
        pf = self.preflight([MODEL_24, MODEL_16, MODEL_12], "pf_lm.py", *args,
                            options=["--json", "--steps", "6"])
        self.assertIn(pf.rc, (0, 1), pf.out + pf.err)
        verdicts = {}
        for device in (MODEL_24, MODEL_16, MODEL_12):
            m = pf.model(device)
            enforce = self.enforced(device, m["outside_estimate"], "pf_lm.py", *args)
            whole = self.enforced(device, m["outside_estimate"], "pf_lm.py", *args, mode="observe")
            expect = ("fits" if completed(enforce) else
                      "fits_without_headroom" if completed(whole) else "does_not_fit")
            verdicts[device.split(",")[1]] = m["verdict"]
            self.assertEqual(m["verdict"], expect, "%s: %s" % (device, pf.out))
            self.assertEqual(m["fits"], expect == "fits")
        print("\n    verdicts %s in %.1f s" % (verdicts, pf.took))
        # the three models do not all say the same
        self.assertGreater(len(set(verdicts.values())), 1, verdicts)

    def test_fits_only_by_pytorch_emptying_its_cache(self):
        # a batch that grows every step fills PyTorch's cache with blocks too
        # small for the next: unconstrained it reserves far more than its
        # tensors need, and under the guard's limit it empties its cache
        # and retries, and finishes (tests/torch/README.md, grow.py)
        args = ["--steps", "12", "--batch", "4", "--grow", "8", "--seq", "512", "--dim", "1024",
                "--layers", "4"]
        pf = self.preflight([MODEL_24], "grow.py", *args, options=["--steps", "0"])
        self.assertEqual(pf.rc, 0, pf.out + pf.err)
        self.assertIn("fits: PyTorch reserved", pf.out)
        self.assertIn("fits under the limit only because PyTorch emptied its cache when the "
                      "guard refused", pf.out)
        self.assertIn("runs: at the whole device, under the limit", pf.out)
        enforce = self.enforced(MODEL_24, 400 * (1 << 20), "grow.py", *args)
        self.assertTrue(completed(enforce), enforce.err[-2000:])
        self.assertEqual(enforce.result("final")["steps"], 12)


class Harmless(PreflightCase):
    def test_a_checkpoint_saved_at_the_last_step_leaves_the_users_file(self):
        ckpt = os.path.join(self.home, "ckpt.pt")
        last = os.path.join(self.home, "last.pt")
        for path in (ckpt, last):
            with open(path, "wb") as f:
                f.write(b"the user's real weights")
            os.utime(path, (1000000000, 1000000000))
        # --steps 0: to its own end, so the last step's save happens
        pf = self.preflight([MODEL_24], "pf_lm.py", "--steps", "3", "--ckpt", "ckpt.pt",
                            "--save-at-exit", "last.pt", *SMALL_LM, options=["--steps", "0"])
        self.assertEqual(pf.rc, 0, pf.out + pf.err)
        for path in (ckpt, last):
            with open(path, "rb") as f:
                self.assertEqual(f.read(), b"the user's real weights")
            self.assertEqual(os.stat(path).st_mtime, 1000000000)
        # what it wrote is said, at the path it would have had
        self.assertIn("file %s/ckpt.pt" % self.inner_home, pf.out)
        self.assertIn("file %s/last.pt" % self.inner_home, pf.out)
        self.assertIn("discarded: your files are unchanged", pf.out)

    def test_without_a_throwaway_layer_it_refuses_to_run(self):
        # a user who is not root, in a chroot: no user namespace can be made
        # there (unshare(2): EPERM in a chroot), so no layer: nothing runs
        s = self.sess
        argv = [self.prefix + "/bin/gpuguard-preflight", "--gpu", MODEL_24, "--",
                "python3", s.dir + "/scripts/pf_lm.py", "--steps", "2", "--ckpt", "marker.pt"]
        env = user_env(self.inner_home)
        cmd = ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
               'mount -t proc proc "$0/proc" && exec chroot --userspec=nobody:nogroup "$0" "$@"',
               s.root, "/bin/sh", "-c", 'cd "$0" && exec "$@"', self.inner_home,
               "/usr/bin/env", "-i"] + ["%s=%s" % kv for kv in sorted(env.items())] + argv
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              universal_newlines=True, timeout=300)
        self.assertEqual(proc.returncode, 3, proc.stdout + proc.stderr)
        self.assertEqual(proc.stdout, "")
        self.assertIn("refused to run the script: no throwaway layer for its writes: cannot "
                      "make a user namespace as uid 65534", proc.stderr)
        self.assertIn("a chroot never allows them", proc.stderr)
        self.assertIn("Nothing ran.", proc.stderr)
        self.assertFalse(os.path.exists(os.path.join(self.home, "marker.pt")))

    def test_a_failure_that_is_not_memory_says_why_with_the_scripts_traceback(self):
        pf = self.preflight([MODEL_24], "pf_lm.py", "--steps", "5", "--fail-at", "3", *SMALL_LM)
        self.assertEqual(pf.rc, 3, pf.out + pf.err)
        self.assertIn("no verdict: the script failed (exit status 1)", pf.out)
        self.assertIn("ValueError: batch 3 has no labels", pf.out)
        self.assertIn("in check_batch", pf.out)

    def test_shapes_made_from_values_are_said(self):
        pf = self.preflight([MODEL_24], "pf_lm.py", "--steps", "3", "--mask", *SMALL_LM,
                            options=["--json"])
        self.assertEqual(pf.rc, 0, pf.out + pf.err)
        said = [l for l in pf.json["limits"] if "makes a shape from values (__getitem__" in l]
        self.assertTrue(said, pf.json["limits"])
        self.assertIn("pf_lm.py:", said[0])


class NextRun(PreflightCase):
    def test_largest_batch_and_policies_for_the_next_run(self):
        out = os.path.join(self.tmp, "next")
        os.makedirs(out)
        os.chmod(out, 0o777)
        pf = self.preflight([MODEL_12], "pf_lm.py", "--batch", "{batch}", "--steps", "4",
                            *LARGE_LM, options=["--json", "--batch", "2,4", "--steps", "4",
                                                "--out", self.sess.inside(out)])
        self.assertIn(pf.rc, (0, 1), pf.out + pf.err)
        m = pf.model(MODEL_12)
        self.assertIsNotNone(m["max_batch"], pf.out)
        self.assertGreaterEqual(m["max_batch"], 4)
        self.assertEqual(m["max_tokens"], m["max_batch"] * 1024)
        files = os.listdir(out)
        self.assertEqual(len(files), 1, files)
        with open(os.path.join(out, files[0])) as f:
            text = f.read()
        self.assertIn("match = NVIDIA GeForce RTX 3060", text)
        self.assertIn("apply_batch = yes", text)
        # gpuguard-check --lint reads it as the shim will
        lint = subprocess.run(in_rig([self.prefix + "/bin/gpuguard-check", "--lint",
                                      self.sess.inside(out)], self.inner_home,
                                     user_env(self.inner_home)),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              universal_newlines=True)
        self.assertEqual(lint.returncode, 0, lint.stdout)
        # a run at the largest batch that fits does fit, under enforce
        run = self.enforced(MODEL_12, m["outside_estimate"], "pf_lm.py", "--batch",
                            str(m["max_batch"]), "--steps", "4", *LARGE_LM)
        self.assertTrue(completed(run), run.err[-2000:])


if __name__ == "__main__":
    unittest.main()
