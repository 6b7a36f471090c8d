"""tests/run.py, the runner itself: tests in parallel worker processes, each
test's outcome and time, failures whole at the end, a crashed worker as one
failure, the quick tier (tests/slow.txt) and its budget, the rig's tests
counted as skipped without a rig, and the closing line CI reads.

Most cases run a copy of the runner over a small tree of made-up tests (its
ROOT is the directory above its own), so that what they assert does not
move as the real suite grows."""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import unittest

from gg import ROOT

RUNNER = os.path.join(ROOT, "tests", "run.py")
CLOSING = re.compile(r"^(\d+) passed, (\d+) failed(?:, (\d+) skipped)?$")

# Two classes that each wait for the other's mark: they pass only when they
# run at the same time, in two processes.
BARRIER = '''
import os, time, unittest
MARKS = os.environ["GG_MARKS"]
def meet(me, other):
    open(os.path.join(MARKS, me), "w").close()
    end = time.monotonic() + 60
    while not os.path.exists(os.path.join(MARKS, other)):
        if time.monotonic() > end:
            raise AssertionError("%s never ran beside %s" % (other, me))
        time.sleep(0.01)
    return os.getpid()

class Left(unittest.TestCase):
    def test_meets_right(self):
        with open(os.path.join(MARKS, "left.pid"), "w") as f:
            f.write(str(meet("left", "right")))

class Right(unittest.TestCase):
    def test_meets_left(self):
        with open(os.path.join(MARKS, "right.pid"), "w") as f:
            f.write(str(meet("right", "left")))
'''

MIXED = '''
import os, sys, unittest

class Mixed(unittest.TestCase):
    def test_a_passes(self):
        pass

    def test_b_fails(self):
        print("what the failing test printed")
        os.system("echo what its child printed")
        self.assertEqual(1, 2, "the failure's own message")

    def test_c_skips(self):
        self.skipTest("a reason to skip")

class Crash(unittest.TestCase):
    def test_a_dies(self):
        print("last words")
        sys.stdout.flush()
        os._exit(3)

    def test_b_runs_after(self):
        pass

class Broken(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        raise RuntimeError("setUpClass broke")

    def test_one(self):
        pass

    def test_two(self):
        pass
'''

LEAKS = '''
import os, unittest

class ALeaks(unittest.TestCase):
    def test_leaks(self):
        os.environ["GG_RUNNER_LEAK"] = "1"
        os.chdir("/")

class BSeesNothing(unittest.TestCase):
    def test_clean(self):
        self.assertNotIn("GG_RUNNER_LEAK", os.environ)
        self.assertNotEqual(os.getcwd(), "/")
'''

TIERS = '''
import time, unittest

class Tiers(unittest.TestCase):
    def test_listed_slow(self):
        time.sleep(1.2)

    def test_new_and_slow(self):
        time.sleep(1.2)

    def test_quick(self):
        pass
'''

STUB_RIG = '''
HOW = "no rig here (a stand-in)"
def rig_root():
    return None
'''

RIG_TESTS = '''
import unittest
class NeedsTheRig(unittest.TestCase):
    def test_one(self):
        raise AssertionError("ran without a rig")
    def test_two(self):
        raise AssertionError("ran without a rig")
'''


def closing(out):
    """The closing line's counts; it must be the last line."""
    last = out.rstrip("\n").splitlines()[-1]
    m = CLOSING.match(last)
    assert m, "the last line is not the closing line: %r" % last
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


class Made(unittest.TestCase):
    """The runner over a made-up tree."""

    def setUp(self):
        self.root = tempfile.mkdtemp(prefix="gg-runner-")
        self.addCleanup(shutil.rmtree, self.root, ignore_errors=True)
        os.makedirs(os.path.join(self.root, "tests", "e2e"))
        shutil.copy(RUNNER, os.path.join(self.root, "tests", "run.py"))
        self.marks = os.path.join(self.root, "marks")
        os.makedirs(self.marks)

    def write(self, rel, text):
        path = os.path.join(self.root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(textwrap.dedent(text))
        return path

    def runner(self, *args, rc=None):
        env = {k: v for k, v in os.environ.items() if not k.startswith("GG_")}
        env["GG_MARKS"] = self.marks
        env["GG_BUILD"] = os.path.join(self.root, "build")
        proc = subprocess.run([sys.executable, os.path.join(self.root, "tests", "run.py")] + list(args),
                              cwd=self.root, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, timeout=300)
        if rc is not None:
            self.assertEqual(proc.returncode, rc, proc.stdout + proc.stderr)
        return proc.stdout

    def test_tests_run_side_by_side_in_separate_processes(self):
        self.write("tests/e2e/test_barrier.py", BARRIER)
        out = self.runner("-j", "2", rc=0)
        self.assertEqual(closing(out), (2, 0, 0), out)
        with open(os.path.join(self.marks, "left.pid")) as f, \
                open(os.path.join(self.marks, "right.pid")) as g:
            self.assertNotEqual(f.read(), g.read())
        self.assertRegex(out, r"(?m)^ok +\d+\.\d\ds  test_barrier\.Left\.test_meets_right$")

    def test_failures_whole_at_the_end_a_crash_is_one_failure(self):
        self.write("tests/e2e/test_mixed.py", MIXED)
        out = self.runner("-j", "2", rc=1)
        # passed: Mixed.test_a, Crash.test_b (run again after the crash);
        # failed: Mixed.test_b, Crash.test_a, Broken's two; skipped: Mixed.test_c
        self.assertEqual(closing(out), (2, 4, 1), out)
        lines = out.splitlines()
        first_report = lines.index(next(l for l in lines if l.startswith("=" * 70)))
        per_test = lines[:first_report]
        self.assertTrue(any(re.match(r"FAIL +\d+\.\d\ds  test_mixed\.Mixed\.test_b_fails$", l)
                            for l in per_test), out)
        self.assertTrue(any(re.match(r"skip .*test_mixed\.Mixed\.test_c_skips \(a reason to skip\)$", l)
                            for l in per_test), out)
        report = "\n".join(lines[first_report:])
        for text in ("FAIL: test_mixed.Mixed.test_b_fails", "the failure's own message",
                     "what the failing test printed", "what its child printed",
                     "ERROR: test_mixed.Crash.test_a_dies", "its process exited 3", "last words",
                     "ERROR: test_mixed.Broken.test_one", "ERROR: test_mixed.Broken.test_two",
                     "setUpClass broke"):
            self.assertIn(text, report)
        self.assertNotIn("ran without", out)

    def test_a_worker_gives_back_its_environment_and_directory(self):
        self.write("tests/e2e/test_leaks.py", LEAKS)
        out = self.runner("-j", "1", rc=0)
        self.assertEqual(closing(out), (2, 0, 0), out)

    def test_k_selects_by_name(self):
        self.write("tests/e2e/test_mixed.py", MIXED)
        out = self.runner("-k", "test_a_passes", rc=0)
        self.assertEqual(closing(out), (1, 0, 0), out)

    def test_the_quick_tier_leaves_out_what_slow_txt_lists_and_warns_of_the_rest(self):
        self.write("tests/e2e/test_tiers.py", TIERS)
        self.write("tests/slow.txt", "# made up\n   1.2  test_tiers.Tiers.test_listed_slow\n")
        out = self.runner("--quick", rc=0)
        self.assertEqual(closing(out), (2, 0, 0), out)
        self.assertNotIn("test_listed_slow", out)
        warning = out[out.index("over the 1 s budget"):]
        self.assertIn("test_tiers.Tiers.test_new_and_slow", warning)
        self.assertNotIn("test_quick", warning)
        # make timings: the list written again from what was measured
        out = self.runner("--write-slow", rc=0)
        with open(os.path.join(self.root, "tests", "slow.txt")) as f:
            listed = [l.split()[1] for l in f if l.strip() and not l.startswith("#")]
        self.assertEqual(listed, ["test_tiers.Tiers.test_listed_slow",
                                  "test_tiers.Tiers.test_new_and_slow"])
        out = self.runner("--quick", rc=0)
        self.assertEqual(closing(out), (1, 0, 0), out)
        self.assertNotIn("budget", out)

    def test_unit_binaries_are_counted_by_their_own_lines(self):
        unit = self.write("build/tests/unit/test_made", "#!/bin/sh\necho 'ok   a'\necho '3 passed, 0 failed'\n")
        os.chmod(unit, 0o755)
        bad = self.write("build/tests/unit/test_dies", "#!/bin/sh\necho '1 passed, 0 failed'\nexit 2\n")
        os.chmod(bad, 0o755)
        out = self.runner("--unit", rc=1)
        self.assertEqual(closing(out), (4, 1, 0), out)
        self.assertIn("unit/test_dies: 1 passed, 1 failed (exit 2)", out)

    def test_without_a_rig_its_tests_are_skipped_and_said_above_the_closing_line(self):
        self.write("tests/torch/torchrig.py", STUB_RIG)
        self.write("tests/torch/test_torch_made.py", RIG_TESTS)
        self.write("tests/e2e/test_fine.py", LEAKS)
        out = self.runner(rc=0)
        self.assertEqual(closing(out), (2, 0, 2), out)
        above = out.rstrip("\n").splitlines()[-2]
        self.assertEqual(above, "real-PyTorch tests (tests/torch): 2 not run, no rig here (a stand-in)")


class RealTree(unittest.TestCase):
    def test_the_rigs_tests_count_as_skipped_without_the_rig(self):
        """make test where the rig is not built: the closing line counts
        every test of tests/torch as skipped, and the line above says why."""
        loader = unittest.TestLoader()
        torch_dir = os.path.join(ROOT, "tests", "torch")
        sys.path.insert(0, torch_dir)
        try:
            n = loader.discover(torch_dir, top_level_dir=torch_dir).countTestCases()
        finally:
            sys.path.remove(torch_dir)
        self.assertGreater(n, 0)
        missing = tempfile.mkdtemp(prefix="gg-norig-")
        self.addCleanup(shutil.rmtree, missing, ignore_errors=True)
        env = dict(os.environ, GG_TORCH_RIG=os.path.join(missing, "rig"))
        proc = subprocess.run([sys.executable, RUNNER, "--torch"], env=env, cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=300)
        self.assertEqual(closing(proc.stdout), (0, 0, n), proc.stdout + proc.stderr)
        above = proc.stdout.rstrip("\n").splitlines()[-2]
        self.assertTrue(above.startswith("real-PyTorch tests (tests/torch): %d not run, no real-PyTorch rig"
                                         % n), above)
        self.assertIn("make torch-rig", above)


if __name__ == "__main__":
    unittest.main()
