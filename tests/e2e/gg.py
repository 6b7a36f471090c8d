"""Shared helpers for the end-to-end tests: run a program under the shim, on
the fake GPU, and read what the shim left behind."""
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("GG_BUILD") or os.path.join(ROOT, "build")
SANITIZE = os.environ.get("GG_SANITIZE", "")
SHIM = os.path.join(BUILD, "libgpuguard.so")
FAKE = os.path.join(BUILD, "fake")
PROGS = os.path.join(BUILD, "tests", "progs")
SCRIPT = os.path.join(PROGS, "script")
API = os.path.join(PROGS, "api")
CHECK = os.path.join(BUILD, "gpuguard-check")
POLICY_DIR = os.path.join(ROOT, "policy")
PYHELPER = os.path.join(ROOT, "tools", "python")

GiB = 1 << 30
MiB = 1 << 20
RTX3090 = "NVIDIA GeForce RTX 3090,24GiB,8.6"


def sanitizer_preload():
    """Under ASan the sanitizer runtime must be loaded before anything else."""
    if SANITIZE != "1":
        return []
    out = subprocess.run(["cc", "-print-file-name=libasan.so"], stdout=subprocess.PIPE, text=True)
    return [out.stdout.strip()]


def base_env(devices=RTX3090, **extra):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("GPUGUARD_", "FAKECUDA_")) and k not in ("LD_PRELOAD", "RANK")}
    env["FAKECUDA_DEVICES"] = devices
    env["LD_LIBRARY_PATH"] = FAKE + (":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
    env["PYTHONPATH"] = PYHELPER
    if SANITIZE == "1":
        env["ASAN_OPTIONS"] = "detect_leaks=0:verify_asan_link_order=0"
        env["UBSAN_OPTIONS"] = "halt_on_error=1:print_stacktrace=1"
    env.update({k: str(v) for k, v in extra.items()})
    return env


class Run:
    """The outcome of one program run: exit code, output, journal events."""

    def __init__(self, proc, journal_dir):
        self.rc = proc.returncode
        self.out = proc.stdout
        self.err = proc.stderr
        self.dir = journal_dir
        self.files = sorted(f for f in glob.glob(os.path.join(journal_dir, "gpuguard.*.jsonl"))
                            if not os.path.islink(f))
        self.events = []
        for f in self.files:
            with open(f) as fh:
                self.events += [json.loads(line) for line in fh if line.strip()]

    def of(self, ev):
        return [e for e in self.events if e["ev"] == ev]

    def one(self, ev):
        found = self.of(ev)
        assert len(found) == 1, f"expected one {ev} event, got {len(found)}: {self.err}"
        return found[0]

    def summary(self, dev=0):
        return self.one("summary")["devices"][dev]


class Case(unittest.TestCase):
    """A test with its own temporary working directory."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="gg-test-")
        self.addCleanup(shutil.rmtree, self.tmp, ignore_errors=True)

    def run_prog(self, argv, preload=True, env=None, cwd=None, timeout=300, policy=None, **extra):
        env = dict(env or base_env(**extra))
        if policy is not None:
            env["GPUGUARD_POLICY"] = policy
        if preload:
            env["LD_PRELOAD"] = ":".join(sanitizer_preload() + [SHIM])
        cwd = cwd or tempfile.mkdtemp(prefix="run-", dir=self.tmp)
        proc = subprocess.run(argv, cwd=cwd, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, timeout=timeout)
        return Run(proc, cwd)

    def script(self, *cmds, **kw):
        return self.run_prog([SCRIPT, *cmds], **kw)

    def api(self, *args, **kw):
        return self.run_prog([API, *args], **kw)

    def python(self, code, **kw):
        return self.run_prog([sys.executable, "-c", code], **kw)

    def write_policy(self, name, text):
        d = os.path.join(self.tmp, "policy")
        os.makedirs(d, exist_ok=True)
        path = os.path.join(d, name)
        with open(path, "w") as f:
            f.write(text)
        return path

    def sanitizer_clean(self, run):
        """No sanitizer report in the run's stderr."""
        for marker in ("ERROR: AddressSanitizer", "runtime error:", "ThreadSanitizer"):
            self.assertNotIn(marker, run.err)

    def shim_lines(self, run):
        return [l for l in run.err.splitlines() if l.startswith("gpuguard:")]
