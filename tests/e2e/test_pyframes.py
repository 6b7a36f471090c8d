"""The calling thread's Python frames, read without the GIL, on every
CPython present (pyenv's and Debian's /usr/bin/python3).

Each interpreter loads build/tests/pyframes/libpyprobe.so (shim/probe/pyframes.c
behind a few functions) with ctypes, which releases the GIL for the call, and
checks file, line and function against sys._getframe() (tests/pyframes/
frames_check.py): main thread, a worker, nested functions, methods, lambdas,
generators, coroutines, __init__ shims, the depth cap, churn while other
threads run Python, every instruction of thousands of code objects, late
resolution after the code is freed. 3.9 and older (and 3.14+, should one
appear) must give no frames and one error, never a crash. An interpreter
embedded RTLD_LOCAL (tests/pyframes/embed) must be found too.
"""
import functools
import glob
import os
import subprocess
import sys
import unittest

from gg import BUILD, ROOT, SANITIZE, sanitizer_preload

PROBE = os.path.join(BUILD, "tests", "pyframes", "libpyprobe.so")
EMBED = os.path.join(BUILD, "tests", "pyframes", "embed")
HERE = os.path.join(ROOT, "tests", "pyframes")
SUPPORTED = ((3, 10), (3, 13))

ABOUT = ("import sys, sysconfig; v = sys.version_info; "
         "print(v[0], v[1], v[2], sys.implementation.name, sys.prefix, "
         "sysconfig.get_config_var('LIBDIR') or '-', "
         "sysconfig.get_config_var('INSTSONAME') or '-', "
         "sysconfig.get_config_var('Py_ENABLE_SHARED') or 0)")


def pyenv_root():
    root = os.environ.get("PYENV_ROOT")
    if not root:
        try:
            root = subprocess.run(["pyenv", "root"], stdout=subprocess.PIPE,
                                  stderr=subprocess.DEVNULL, text=True).stdout.strip()
        except OSError:
            root = ""
    return root or os.path.expanduser("~/.pyenv")


@functools.lru_cache(maxsize=None)
def interpreters():
    """[(path, version tuple, about dict)] for every distinct python3 found,
    and [(path, why skipped)]."""
    found, skipped, seen = [], [], set()
    paths = sorted(glob.glob(os.path.join(pyenv_root(), "versions", "*", "bin", "python3")))
    paths += ["/usr/bin/python3", sys.executable]
    for path in paths:
        real = os.path.realpath(path)
        if real in seen or not os.access(real, os.X_OK):
            continue
        seen.add(real)
        try:
            out = subprocess.run([path, "-c", ABOUT], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired) as e:
            skipped.append((path, "does not run: %s" % e))
            continue
        if out.returncode != 0:
            skipped.append((path, "does not run: %s" % out.stderr.strip()[-200:]))
            continue
        major, minor, micro, impl, prefix, libdir, soname, shared = out.stdout.split()
        if impl != "cpython":
            skipped.append((path, "not CPython (%s)" % impl))
            continue
        about = {"prefix": prefix, "libpython": os.path.join(libdir, soname)
                 if shared == "1" and soname != "-" else None}
        found.append((path, (int(major), int(minor), int(micro)), about))
    return found, skipped


def env():
    e = dict(os.environ)
    e.pop("PYTHONPATH", None)
    e.pop("PYTHONHOME", None)
    if SANITIZE == "1":
        # The probe is built with ASan: its runtime goes first.
        e["LD_PRELOAD"] = ":".join(sanitizer_preload())
        e["ASAN_OPTIONS"] = "detect_leaks=0:verify_asan_link_order=0"
        e["UBSAN_OPTIONS"] = "halt_on_error=1:print_stacktrace=1"
    return e


def vstr(v):
    return "%d.%d.%d" % v


class PythonFrames(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        found, skipped = interpreters()
        ran = ", ".join("%s (%s)" % (vstr(v), p) for p, v, _ in found)
        print("\n  pyframes: interpreters found: %s" % (ran or "none"))
        for path, why in skipped:
            print("  pyframes: skipped %s: %s" % (path, why))

    def run_py(self, path, script, timeout=300):
        return subprocess.run([path, os.path.join(HERE, script), PROBE], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, env=env(), timeout=timeout)

    def test_frames_on_every_supported_cpython(self):
        found, _ = interpreters()
        supported = [(p, v) for p, v, _ in found if SUPPORTED[0] <= v[:2] <= SUPPORTED[1]]
        # The interpreter running this test is one: never nothing to check.
        self.assertTrue(supported, "no CPython 3.10-3.13 found")
        for path, v in supported:
            with self.subTest(python=vstr(v), path=path):
                r = self.run_py(path, "frames_check.py")
                print("  %s" % r.stdout.strip().splitlines()[-1] if r.stdout.strip() else "")
                self.assertEqual(r.returncode, 0, r.stdout[-4000:])
                self.assertIn("0 failures", r.stdout)
                self.assertIn("0 mismatches", r.stdout)

    def test_unsupported_cpython_gives_no_frames_and_one_error(self):
        found, _ = interpreters()
        old = [(p, v) for p, v, _ in found
               if v[0] == 3 and not SUPPORTED[0] <= v[:2] <= SUPPORTED[1]]
        if not old:
            self.skipTest("no CPython 3.6-3.9 or 3.14+ found (pyenv provides them in CI)")
        for path, v in old:
            with self.subTest(python=vstr(v), path=path):
                r = self.run_py(path, "frames_unsupported.py")
                print("  %s" % r.stdout.strip().splitlines()[-1] if r.stdout.strip() else "")
                self.assertEqual(r.returncode, 0, r.stdout[-4000:])
                self.assertIn("is not supported (3.10-3.13 are)", r.stdout)

    def test_embedded_interpreter_loaded_rtld_local(self):
        found, _ = interpreters()
        shared = [(p, v, a) for p, v, a in found
                  if SUPPORTED[0] <= v[:2] <= SUPPORTED[1] and a["libpython"]
                  and os.path.exists(a["libpython"])]
        for p, v, a in found:
            if SUPPORTED[0] <= v[:2] <= SUPPORTED[1] and not a["libpython"]:
                print("  pyframes: embedding skipped for %s %s: no shared libpython" % (vstr(v), p))
        if not shared:
            self.skipTest("no CPython 3.10-3.13 with a shared libpython (pyenv's are)")
        for path, v, about in shared:
            with self.subTest(python=vstr(v), lib=about["libpython"]):
                e = env()
                e["PYTHONHOME"] = about["prefix"]
                r = subprocess.run([EMBED, about["libpython"], os.path.join(HERE, "embed_check.py")],
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                   env=e, timeout=120)
                print("  %s" % r.stdout.strip().splitlines()[-1] if r.stdout.strip() else "")
                self.assertEqual(r.returncode, 0, r.stdout[-4000:])
                self.assertIn("embed: CPython %s: 0 failures" % vstr(v), r.stdout)
                self.assertIn("(%s): frames on" % about["libpython"], r.stdout)
                self.assertIn("0 frames before initialize, 0 after finalize", r.stdout)


if __name__ == "__main__":
    unittest.main()
