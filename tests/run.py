#!/usr/bin/env python3
"""Run every gpuguard test and end with the line CI reads: "N passed, N failed".

  tests/run.py            unit tests, end-to-end tests, Python helper tests, and the
                          real-PyTorch tests where the rig is built (tests/torch)
  tests/run.py --unit     only the C unit tests
  tests/run.py --e2e      only the end-to-end and Python tests
  tests/run.py --torch    only the real-PyTorch tests (tests/torch)
  tests/run.py -k NAME    only tests whose name contains NAME

The build directory comes from GG_BUILD (default build); GG_SANITIZE=1 means
the shim and the fakes were built with ASan+UBSan, so end-to-end runs preload
the sanitizer runtime ahead of the shim.
"""
import argparse
import os
import re
import subprocess
import sys
import time
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_unit(build, pattern):
    passed = failed = 0
    unit_dir = os.path.join(build, "tests", "unit")
    names = sorted(n for n in os.listdir(unit_dir) if n.startswith("test_")) if os.path.isdir(unit_dir) else []
    for name in names:
        if pattern and pattern not in name:
            continue
        path = os.path.join(unit_dir, name)
        env = dict(os.environ, GG_ROOT=ROOT)
        if os.environ.get("GG_SANITIZE") == "1":
            # Leaks are still checked, but not through thread-local storage:
            # the stack test parks threads whose dynamic TLS (libunwind's,
            # dlopen'd) LeakSanitizer's tracer cannot walk (it faults).
            supp = os.path.join(ROOT, "tests", "unit", "lsan.supp")
            env["LSAN_OPTIONS"] = f"use_tls=0:suppressions={supp}"
        start = time.monotonic()
        proc = subprocess.run([path], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              timeout=600, env=env)
        took = time.monotonic() - start
        m = None
        for line in proc.stdout.splitlines():
            m = re.fullmatch(r"(\d+) passed, (\d+) failed", line.strip()) or m
        if m is None or proc.returncode != 0:
            print(proc.stdout)
        if m is None:
            print(f"FAIL unit/{name}: exit {proc.returncode}, no result line")
            failed += 1
            continue
        p, f = int(m.group(1)), int(m.group(2))
        if proc.returncode != 0 and f == 0:
            f = 1
        passed += p
        failed += f
        print(f"{'ok  ' if not f else 'FAIL'} unit/{name}: {p} passed, {f} failed ({took:.1f}s)")
    return passed, failed


class Result(unittest.TextTestResult):
    def startTest(self, test):
        self._t0 = time.monotonic()
        super().startTest(test)


def run_python(pattern, only_torch=False):
    loader = unittest.TestLoader()
    if pattern:
        loader.testNamePatterns = [f"*{pattern}*"]
    suite = unittest.TestSuite()
    sys.path.insert(0, os.path.join(ROOT, "tests", "e2e"))
    sys.path.insert(0, os.path.join(ROOT, "tools", "python"))
    if not only_torch:
        suite.addTests(loader.discover(os.path.join(ROOT, "tests", "e2e"), top_level_dir=os.path.join(ROOT, "tests", "e2e")))
    helper_tests = os.path.join(ROOT, "tools", "python", "tests")
    if os.path.isdir(helper_tests) and not only_torch:
        suite.addTests(loader.discover(helper_tests, top_level_dir=os.path.join(ROOT, "tools", "python")))
    # Real PyTorch (tests/torch): only where the rig is built; else one line.
    torch_tests = os.path.join(ROOT, "tests", "torch")
    sys.path.insert(0, torch_tests)
    import torchrig
    if torchrig.rig_root():
        suite.addTests(loader.discover(torch_tests, top_level_dir=torch_tests))
    else:
        print("real-PyTorch tests (tests/torch): not run, " + torchrig.HOW)
    runner = unittest.TextTestRunner(stream=sys.stdout, verbosity=2, resultclass=Result)
    result = runner.run(suite)
    failed = len(result.failures) + len(result.errors) + len(result.unexpectedSuccesses)
    skipped = len(result.skipped)
    passed = result.testsRun - failed - skipped
    return passed, failed, skipped


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--unit", action="store_true")
    ap.add_argument("--e2e", action="store_true")
    ap.add_argument("--torch", action="store_true")
    ap.add_argument("-k", dest="pattern")
    args = ap.parse_args()
    both = not args.unit and not args.e2e and not args.torch
    build = os.path.join(ROOT, os.environ.get("GG_BUILD", "build"))
    os.environ["GG_BUILD"] = build
    passed = failed = skipped = 0
    if args.unit or both:
        p, f = run_unit(build, args.pattern)
        passed, failed = passed + p, failed + f
    if args.e2e or args.torch or both:
        p, f, s = run_python(args.pattern, only_torch=args.torch)
        passed, failed, skipped = passed + p, failed + f, skipped + s
    line = f"{passed} passed, {failed} failed"
    if skipped:
        line += f", {skipped} skipped"
    print(line)
    return 1 if failed or not passed else 0


if __name__ == "__main__":
    sys.exit(main())
