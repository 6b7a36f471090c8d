"""The parts of PyTorch's instrumentation that need no PyTorch
(tests/torch has the rest, on real PyTorch): gpuguard's sitecustomize chains
to the one it hides and waits for `torch`; GPUGUARD_TORCH=0, an unset one or
GPUGUARD_MODE=off leave Python alone; a program that never imports torch
imports nothing of gpuguard's; a `torch` imported late gets the hooks once
the shim is preloaded, with its own loader kept; libgpuguard.so puts the
sitecustomize on PYTHONPATH when GPUGUARD_TORCH=1 asks, in Python only;
gpuguard-run instruments unless --no-torch; and the shim's side of asking
(Py_AddPendingCall into a real interpreter): requests run in the main thread
whichever thread had the incident, answers become `torch` lines, nothing is
asked after the detach, and the interpreter exits cleanly with a request
outstanding."""
import os
import shutil
import subprocess
import sys

from gg import FAKE, PYHELPER, ROOT, SHIM, Case, base_env, sanitizer_preload

SITE = os.path.join(ROOT, "tools", "site")  # gpuguard's site directory: sitecustomize, gpuguard
GPUGUARD_RUN = os.path.join(ROOT, "tools", "bin", "gpuguard-run")

USER_SITE = """\
import sys
MARK = 42
print("user sitecustomize ran", file=sys.stderr)
"""

# A stand-in for torch: just the names the instrumentation touches.
STUB_TORCH = {
    "torch/__init__.py": "from . import optim, autograd, cuda\n"
                         "from .optim import optimizer as _o\n"
                         "del _o  # as torch.optim does: the submodule's name is gone\n",
    "torch/optim/__init__.py": "from . import optimizer\ndel optimizer\n",
    "torch/optim/optimizer.py": "HOOKS = []\n"
                                "def register_optimizer_step_post_hook(hook):\n"
                                "    HOOKS.append(hook)\n",
    "torch/autograd/__init__.py": "CALLS = []\ndef backward(*a, **k):\n    CALLS.append(a)\n",
    "torch/cuda/__init__.py": "_queued_calls = []\ndef is_initialized():\n    return False\n",
}

PROBE = """\
import json, sys
def late():
    import torch
    return torch
torch = late()
ti = sys.modules.get("gpuguard.torch_instrument")
st = ti.STATE if ti else None
opt = sys.modules["torch.optim.optimizer"]
print("RESULT " + json.dumps({
    "installed": st is not None,
    "hooks": len(opt.HOOKS),
    "wrapped": hasattr(torch.autograd.backward, "_gpuguard_original"),
    "queued": len(torch.cuda._queued_calls),
    "loader": type(torch.__loader__).__name__,
    "spec_loader": type(torch.__spec__.loader).__name__,
    "watching": [type(f).__name__ for f in sys.meta_path if type(f).__name__ == "_TorchWatcher"],
}))
torch.autograd.backward(1, 2)  # the program's call goes through, arguments untouched
print("CALLS", torch.autograd.CALLS)
"""


def result(out):
    import json
    lines = [l for l in out.splitlines() if l.startswith("RESULT ")]
    return json.loads(lines[-1][7:]) if lines else None


class Sitecustomize(Case):
    def setUp(self):
        super().setUp()
        self.user = os.path.join(self.tmp, "user")
        os.makedirs(self.user)
        with open(os.path.join(self.user, "sitecustomize.py"), "w") as f:
            f.write(USER_SITE)

    def py(self, code, pythonpath, preload=False, **env):
        e = base_env(**env)
        e["PYTHONPATH"] = ":".join(pythonpath)
        for k in ("GPUGUARD_TORCH", "GPUGUARD_MODE"):
            if k not in env:
                e.pop(k, None)
        if preload:
            e["LD_PRELOAD"] = ":".join(sanitizer_preload() + [SHIM])
        return subprocess.run([sys.executable, "-c", code], env=e, cwd=self.tmp,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)

    WHO = ("import sys, sitecustomize; print(sitecustomize.__file__, getattr(sitecustomize, 'MARK', None), "
           "[type(f).__name__ for f in sys.meta_path if type(f).__name__ == '_TorchWatcher'])")

    def test_it_chains_to_the_sitecustomize_it_hides(self):
        p = self.py(self.WHO, [SITE, PYHELPER, self.user], GPUGUARD_TORCH="1")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(p.stdout.split()[:2], [os.path.join(self.user, "sitecustomize.py"), "42"])
        self.assertIn("['_TorchWatcher']", p.stdout)
        self.assertEqual(p.stderr.count("user sitecustomize ran"), 1)

    def test_a_copy_of_itself_is_not_chained_to(self):
        copy = os.path.join(self.tmp, "copy", "gpuguard", "_site")
        shutil.copytree(SITE, copy, ignore=shutil.ignore_patterns("__pycache__"))
        p = self.py(self.WHO, [SITE, copy, PYHELPER, self.user], GPUGUARD_TORCH="1")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(p.stdout.split()[:2], [os.path.join(self.user, "sitecustomize.py"), "42"])
        self.assertIn("['_TorchWatcher']", p.stdout)  # one watcher, not two
        self.assertEqual(p.stderr.count("user sitecustomize ran"), 1)

    def test_the_users_error_is_reported_as_without_it(self):
        with open(os.path.join(self.user, "sitecustomize.py"), "w") as f:
            f.write("1 / 0\n")
        code = "print('ran')"
        without = self.py(code, [self.user])
        within = self.py(code, [SITE, PYHELPER, self.user], GPUGUARD_TORCH="1")
        self.assertEqual(within.returncode, without.returncode)
        self.assertEqual(within.stdout, without.stdout)
        self.assertIn("Error in sitecustomize", without.stderr)
        self.assertIn("ZeroDivisionError", within.stderr)
        self.assertIn("Error in sitecustomize", within.stderr)

    def test_off_unless_asked(self):
        for env in ({"GPUGUARD_TORCH": "0"}, {}, {"GPUGUARD_TORCH": "1", "GPUGUARD_MODE": "off"},
                    {"GPUGUARD_TORCH": "maybe"}):
            with self.subTest(env=env):
                p = self.py(self.WHO, [SITE, PYHELPER, self.user], **env)
                self.assertEqual(p.returncode, 0, p.stderr)
                self.assertIn(" 42 []", p.stdout)  # chained, not watching

    def test_a_program_that_never_imports_torch_imports_nothing_of_gpuguards(self):
        """No module more than without it (gpuguard, ctypes, logging,
        importlib's helpers: none), only the sitecustomize chained to."""
        code = "import json, sys; print(json.dumps(sorted(sys.modules)))"
        import json
        without = self.py(code, [self.user], preload=True)
        within = self.py(code, [SITE, PYHELPER, self.user], preload=True, GPUGUARD_TORCH="1")
        self.assertEqual(within.returncode, 0, within.stderr)
        more = set(json.loads(within.stdout)) - set(json.loads(without.stdout))
        self.assertEqual(more, set())
        self.assertEqual(within.stderr, without.stderr)

    def stub(self):
        d = os.path.join(self.tmp, "stub")
        for rel, text in STUB_TORCH.items():
            path = os.path.join(d, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                f.write(text)
        return d

    def test_torch_imported_late_gets_the_hooks_where_the_shim_is(self):
        stub = self.stub()
        p = self.py(PROBE, [SITE, PYHELPER, stub], preload=True, GPUGUARD_TORCH="1")
        self.assertEqual(p.returncode, 0, p.stderr)
        r = result(p.stdout)
        self.assertEqual(r, {"installed": True, "hooks": 1, "wrapped": True, "queued": 1,
                             "loader": "SourceFileLoader", "spec_loader": "SourceFileLoader",
                             "watching": []})
        self.assertIn("CALLS [(1, 2)]", p.stdout)
        self.assertEqual(p.stderr, "")

    def test_without_the_shim_torch_is_left_alone(self):
        stub = self.stub()
        p = self.py(PROBE, [SITE, PYHELPER, stub], GPUGUARD_TORCH="1")
        self.assertEqual(p.returncode, 0, p.stderr)
        r = result(p.stdout)
        self.assertEqual((r["installed"], r["hooks"], r["wrapped"], r["queued"], r["watching"]),
                         (False, 0, False, 0, []))
        self.assertEqual(r["loader"], "SourceFileLoader")

    def test_a_torch_that_fails_to_import_fails_as_it_would(self):
        stub = self.stub()
        with open(os.path.join(stub, "torch", "__init__.py"), "w") as f:
            f.write("raise ImportError('no CUDA build here')\n")
        code = ("try:\n    import torch\nexcept ImportError as e:\n    print('ERR', e)\n"
                "import sys; print([type(f).__name__ for f in sys.meta_path "
                "if type(f).__name__ == '_TorchWatcher'])")
        p = self.py(code, [SITE, PYHELPER, stub], preload=True, GPUGUARD_TORCH="1")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("ERR no CUDA build here", p.stdout)
        self.assertIn("['_TorchWatcher']", p.stdout)  # still waiting for a torch that imports


class PreloadAsks(Case):
    """GPUGUARD_TORCH=1 under a plain LD_PRELOAD: libgpuguard.so puts the
    sitecustomize first on PYTHONPATH, in Python only, once."""

    def env(self, **extra):
        e = base_env(**extra)
        if "PYTHONPATH" not in extra:
            e.pop("PYTHONPATH", None)
        e["LD_PRELOAD"] = ":".join(sanitizer_preload() + [SHIM])
        return e

    def run_it(self, argv, env):
        return subprocess.run(argv, env=env, cwd=self.tmp, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, timeout=60)

    CODE = "import sys; print(sys.path[1:3]); import os; print(os.environ.get('PYTHONPATH'))"

    def test_python_gets_it(self):
        """The site directory alone, first; out of the environment again, so
        that a child gets it only as the library is loaded into it."""
        p = self.run_it([sys.executable, "-c", self.CODE], self.env(GPUGUARD_TORCH="1"))
        self.assertEqual(p.returncode, 0, p.stderr)
        first = eval(p.stdout.splitlines()[0])
        self.assertEqual(first[0], SITE)
        self.assertNotIn(PYHELPER, first)
        self.assertEqual(p.stdout.splitlines()[1], "None")

    def test_not_unless_asked_and_not_twice(self):
        p = self.run_it([sys.executable, "-c", self.CODE], self.env())
        self.assertNotIn(SITE, p.stdout)
        p = self.run_it([sys.executable, "-c", self.CODE], self.env(GPUGUARD_TORCH="1", GPUGUARD_MODE="off"))
        self.assertNotIn(SITE, p.stdout)
        env = self.env(GPUGUARD_TORCH="1", PYTHONPATH="/x:" + SITE)
        p = self.run_it([sys.executable, "-c", self.CODE], env)
        self.assertEqual(p.stdout.splitlines()[-1], "/x:" + SITE)

    def test_a_program_that_is_not_python_is_left_alone(self):
        p = self.run_it(["/bin/sh", "-c", 'echo "[${PYTHONPATH-unset}]"'], self.env(GPUGUARD_TORCH="1"))
        self.assertEqual(p.stdout.strip(), "[unset]")


class GpuguardRun(Case):
    def dry(self, *opts, **env):
        e = base_env(**env)
        e.pop("PYTHONPATH", None)
        p = subprocess.run([GPUGUARD_RUN, "-n", *opts, "--", "python3", "x.py"], env=e,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=self.tmp)
        self.assertEqual(p.returncode, 0, p.stderr)
        return dict(l.split("=", 1) for l in p.stdout.splitlines() if "=" in l)

    def test_it_instruments_unless_told_not_to(self):
        """GPUGUARD_TORCH=1, and PYTHONPATH left alone: the library puts the
        site directory on each Python interpreter's path itself (CMD may be
        a shell, or a Python 2, that has no use for it)."""
        v = self.dry()
        self.assertEqual(v["GPUGUARD_TORCH"], "1")
        self.assertNotIn("PYTHONPATH", v)
        for how in ({"opts": ["--no-torch"]}, {"env": {"GPUGUARD_TORCH": "0"}},
                    {"env": {"GPUGUARD_TORCH": " Off "}}):
            with self.subTest(how=how):
                v = self.dry(*how.get("opts", []), **how.get("env", {}))
                self.assertNotIn("PYTHONPATH", v)
                self.assertNotEqual(v["GPUGUARD_TORCH"], "1")

    def test_nothing_of_the_source_tree_shadows_the_programs_modules(self):
        """A program's own `tests` package (or any name
        the source tree's tools/python holds beside gpuguard) is the one it
        imports, under gpuguard-run, while gpuguard's helper is importable."""
        mine = os.path.join(self.tmp, "mine")
        os.makedirs(os.path.join(mine, "tests"))
        with open(os.path.join(mine, "tests", "__init__.py"), "w") as f:
            f.write("MARK = 'mine'\n")
        e = base_env(PYTHONPATH=mine, GPUGUARD_LIB=SHIM)
        if sanitizer_preload():
            e["LD_PRELOAD"] = ":".join(sanitizer_preload())
        code = ("import tests, gpuguard, os; print(tests.MARK, os.path.dirname(os.path.realpath("
                "gpuguard.__file__)))")
        p = subprocess.run([GPUGUARD_RUN, "--", sys.executable, "-c", code], env=e,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=self.tmp)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(p.stdout.split(), ["mine", os.path.join(PYHELPER, "gpuguard")])


PY27 = os.path.join(os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv")), "versions",
                    "2.7.18", "bin", "python2.7")
GDB = shutil.which("gdb")


class Harmless(Case):
    """The instrumentation harms no process it was not made for
    and lets no one in: a Python 2 child of a training job, gdb
    (which embeds libpython), `python -I`/`-E` and a shell are left as they
    would be without gpuguard; a site directory another user could
    have written is never used; review risks: a find_spec("torch") in
    another thread never makes the real import go unseen, and a module of
    the program's own called gpuguard is never replaced."""

    def setUp(self):
        super().setUp()
        self.user = os.path.join(self.tmp, "user")
        os.makedirs(self.user)
        with open(os.path.join(self.user, "sitecustomize.py"), "w") as f:
            f.write(USER_SITE)

    def env(self, **extra):
        e = base_env(**extra)
        if "PYTHONPATH" not in extra:
            e.pop("PYTHONPATH", None)
        e["LD_PRELOAD"] = ":".join(sanitizer_preload() + [SHIM])
        return e

    def run_it(self, argv, env, **kw):
        return subprocess.run(argv, env=env, cwd=self.tmp, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, timeout=120, **kw)

    def test_a_python2_child_runs_as_without_gpuguard(self):
        """An instrumented Python 3 starts a Python 2.7 tool: it runs, its
        own sitecustomize is chained once, and it gets no path of ours; with
        the site directory on its path by hand, the sitecustomize is inert
        there (Python 2 has no find_spec) and still chains."""
        if not os.path.exists(PY27):
            self.skipTest(f"needs Python 2.7 at {PY27} (pyenv install 2.7.18)")
        with open(os.path.join(self.user, "sitecustomize.py"), "w") as f:
            f.write("import sys\nMARK = 42\nsys.stderr.write('user sitecustomize ran\\n')\n")
        child = ("import json, os, sys, sitecustomize; sys.stdout.write('py2 %s %s %s\\n' % ("
                 "json.dumps([1]), sitecustomize.MARK, os.environ.get('PYTHONPATH')))")
        parent = ("import subprocess, sys; r = subprocess.call([sys.argv[1], '-c', sys.argv[2]]); "
                  "sys.exit(r)")
        p = self.run_it([sys.executable, "-c", parent, PY27, child],
                        self.env(GPUGUARD_TORCH="1", PYTHONPATH=self.user))
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("py2 [1] 42 " + self.user, p.stdout)
        self.assertEqual(p.stderr.count("user sitecustomize ran"), 2)  # the parent's and the child's
        # by hand: gpuguard's directory first on a Python 2's path
        p = self.run_it([PY27, "-c", child],
                        self.env(GPUGUARD_TORCH="1", PYTHONPATH=SITE + ":" + self.user))
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("py2 [1] 42 " + self.user, p.stdout)
        self.assertEqual(p.stderr.count("user sitecustomize ran"), 1)

    def test_every_python_3_chains_the_users_sitecustomize_once(self):
        """A guard that held before: on each CPython 3.6-3.13 present, under
        the library with GPUGUARD_TORCH=1, the program's own sitecustomize
        runs once, after gpuguard's, which watches for torch."""
        import glob
        root = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
        pythons = sorted(glob.glob(os.path.join(root, "versions", "3.*", "bin", "python3")))
        pythons = [p for p in pythons if os.path.basename(os.path.dirname(os.path.dirname(p)))
                   .split(".")[1].isdigit() and 6 <= int(os.path.basename(os.path.dirname(
                       os.path.dirname(p))).split(".")[1]) <= 13]
        if not pythons:
            self.skipTest(f"no CPython 3.6-3.13 under {root} (pyenv provides them in CI)")
        code = ("import sys, sitecustomize; print(sitecustomize.MARK, [type(f).__name__ for f in "
                "sys.meta_path if type(f).__name__ == '_TorchWatcher'])")
        for py in pythons:
            with self.subTest(python=py):
                p = self.run_it([py, "-c", code], self.env(GPUGUARD_TORCH="1", PYTHONPATH=self.user))
                self.assertEqual(p.returncode, 0, p.stderr)
                self.assertEqual(p.stdout.strip(), "42 ['_TorchWatcher']", p.stderr)
                self.assertEqual(p.stderr.count("user sitecustomize ran"), 1, p.stderr)

    def test_gdb_which_embeds_python_is_left_alone(self):
        if not GDB:
            self.skipTest("needs gdb (Debian: apt-get install gdb)")
        if sanitizer_preload():
            self.skipTest("gdb under the sanitizer's runtime does not start in time: the plain "
                          "build's test")
        code = ("python import os, sys; print('PP', os.environ.get('PYTHONPATH')); "
                "print('W', [type(f).__name__ for f in sys.meta_path if type(f).__name__ == "
                "'_TorchWatcher'])")
        p = self.run_it([GDB, "-nx", "-batch", "-ex", code], self.env(GPUGUARD_TORCH="1"))
        self.assertIn("PP None", p.stdout, p.stderr)   # nothing to pass on to its inferior
        # with the directory put on its path by hand: inert there, the user's chained
        p = self.run_it([GDB, "-nx", "-batch", "-ex", code],
                        self.env(GPUGUARD_TORCH="1", PYTHONPATH=SITE + ":" + self.user))
        self.assertIn("W []", p.stdout, p.stderr)
        self.assertIn("PP " + self.user, p.stdout)
        self.assertEqual(p.stderr.count("user sitecustomize ran") + p.stdout.count(
            "user sitecustomize ran"), 1)

    def test_isolated_interpreters_and_other_programs_get_nothing(self):
        """`python -I` and `-E` ignore PYTHONPATH: the library writes none
        into their environment for their children; a shell started by an
        instrumented Python gets none either."""
        show = "import os; print(os.environ.get('PYTHONPATH'))"
        for flag in ("-I", "-E", "-sE"):
            with self.subTest(flag=flag):
                p = self.run_it([sys.executable, flag, "-c", show], self.env(GPUGUARD_TORCH="1"))
                self.assertEqual(p.stdout.strip(), "None", p.stderr)
        code = "import subprocess; subprocess.call(['/bin/sh', '-c', 'echo \"[${PYTHONPATH-unset}]\"'])"
        p = self.run_it([sys.executable, "-c", code], self.env(GPUGUARD_TORCH="1"))
        self.assertEqual(p.stdout.strip(), "[unset]", p.stderr)
        # a PYTHONPATH of the program's own stays, whole
        p = self.run_it([sys.executable, "-c", code], self.env(GPUGUARD_TORCH="1",
                                                               PYTHONPATH="/a:/b"))
        self.assertEqual(p.stdout.strip(), "[/a:/b]", p.stderr)

    def installed(self, writable_by_others):
        """libgpuguard.so installed under a prefix, its site directory (and,
        for an older gpuguard's layout, share/gpuguard/python) beside it; a
        directory another user can write, in which that user (nobody)
        planted a sitecustomize that leaves a mark."""
        prefix = os.path.join(self.tmp, "prefix")
        lib = os.path.join(prefix, "lib")
        os.makedirs(lib)
        shutil.copy2(SHIM, lib)
        site = os.path.join(prefix, "share", "gpuguard", "site")
        os.makedirs(site)
        shutil.copy2(os.path.join(SITE, "sitecustomize.py"), site)
        shutil.copytree(os.path.join(PYHELPER, "gpuguard"), os.path.join(site, "gpuguard"),
                        ignore=shutil.ignore_patterns("__pycache__"))
        self.mark = os.path.join(self.tmp, "planted-ran")
        if writable_by_others:
            share = os.path.join(prefix, "share", "gpuguard")
            os.chmod(share, 0o777)  # a shared scratch directory
            old = os.path.join(share, "python", "gpuguard", "_site")
            for d in (site, old):
                os.makedirs(d, exist_ok=True)
                planted = os.path.join(d, "sitecustomize.py")
                with open(planted, "w") as f:
                    f.write(f"open({self.mark!r}, 'w').write('ran')\n")
                os.chown(planted, 65534, 65534)
            for d in (old, os.path.dirname(old), os.path.dirname(os.path.dirname(old))):
                os.chown(d, 65534, 65534)
            with open(os.path.join(old, "..", "__init__.py"), "w") as f:
                f.write("")
        return os.path.join(lib, os.path.basename(SHIM))

    def test_a_site_directory_another_user_could_write_is_never_used(self):
        """With the library in a directory another user
        can write beside it, the sitecustomize they plant never runs; the
        shim says once, when it starts, why Python is not instrumented."""
        if os.geteuid() != 0:
            self.skipTest("needs root to plant files as another user (CI runs as root)")
        shim = self.installed(writable_by_others=True)
        e = self.env(GPUGUARD_TORCH="1", GG_FAKE_DIR=FAKE)
        e["LD_PRELOAD"] = ":".join(sanitizer_preload() + [shim])
        alloc = os.path.join(ROOT, "tests", "progs", "ctypes_alloc.py")
        p = self.run_it([sys.executable, alloc, "rt:1M", "freeall"], e)
        self.assertFalse(os.path.exists(self.mark), "the planted sitecustomize ran")
        said = [l for l in p.stderr.splitlines() if "Python is not instrumented" in l]
        self.assertEqual(len(said), 1, p.stderr)
        self.assertIn("could have been written by another user", said[0])
        # the same tree, no one else's: used
        shutil.rmtree(os.path.join(self.tmp, "prefix"))
        shim = self.installed(writable_by_others=False)
        e["LD_PRELOAD"] = ":".join(sanitizer_preload() + [shim])
        p = self.run_it([sys.executable, "-c", "import sys; print(sys.path[1])"], e)
        self.assertEqual(p.stdout.strip(), os.path.realpath(os.path.join(
            self.tmp, "prefix", "share", "gpuguard", "site")), p.stderr)

    def stub(self):
        d = os.path.join(self.tmp, "stub")
        for rel, text in STUB_TORCH.items():
            path = os.path.join(d, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                f.write(text)
        return d

    def test_a_find_spec_in_another_thread_does_not_hide_the_import(self):
        """Review risk: another thread asks the meta path's finders for
        torch itself, outside the import system's lock (as pytest's
        importer calls each finder's find_spec), while the main thread
        imports it: the import is still instrumented."""
        stub = self.stub()
        code = PROBE.replace("torch = late()", """import importlib.util, threading
asking, go = threading.Event(), threading.Event()
class Slow:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" and threading.current_thread().name == "asker":
            asking.set()
            go.wait(30)
        return None
sys.meta_path.insert(1, Slow())
def ask():
    for finder in list(sys.meta_path):
        if getattr(finder, "find_spec", None) and finder.find_spec("torch", None):
            break
t = threading.Thread(target=ask, name="asker")
t.start()
asking.wait(30)
torch = late()
go.set()
t.join()""")
        p = self.run_it([sys.executable, "-c", code],
                        self.env(GPUGUARD_TORCH="1", PYTHONPATH=SITE + ":" + stub))
        self.assertEqual(p.returncode, 0, p.stderr)
        r = result(p.stdout)
        self.assertEqual((r["installed"], r["hooks"], r["wrapped"]), (True, 1, True), p.stdout)

    def test_a_programs_own_gpuguard_module_is_never_replaced(self):
        """Review risk: the program has a module of its own called gpuguard
        (beside its script, first on sys.path): the instrumentation never
        replaces it, nor imports it, and still installs."""
        stub = self.stub()
        for imported_first in (True, False):
            with self.subTest(imported_first=imported_first):
                prog = os.path.join(self.tmp, "prog%d" % imported_first)
                os.makedirs(prog)
                with open(os.path.join(prog, "gpuguard.py"), "w") as f:
                    f.write("import sys\nMINE = True\nprint('my gpuguard imported', file=sys.stderr)\n")
                with open(os.path.join(prog, "main.py"), "w") as f:
                    f.write(("import gpuguard\n" if imported_first else "") + PROBE +
                             "import gpuguard as g2\nprint('MINE', getattr(g2, 'MINE', False))\n")
                p = self.run_it([sys.executable, os.path.join(prog, "main.py")],
                                self.env(GPUGUARD_TORCH="1", PYTHONPATH=SITE + ":" + stub))
                self.assertEqual(p.returncode, 0, p.stderr)
                self.assertIn("MINE True", p.stdout)
                self.assertEqual(p.stderr.count("my gpuguard imported"), 1)
                r = result(p.stdout)
                self.assertEqual((r["hooks"], r["wrapped"]), (1, True), p.stdout)


# A torch for the signals' tests: CUDA up, and a memory_stats that, armed,
# has the process send itself a signal while it works (as a Ctrl-C or a
# scheduler's SIGTERM arriving while the instrumentation reads PyTorch's
# view), then keeps running Python so that a handler can run inside it.
SIGNAL_TORCH = {
    "torch/__init__.py": "from . import optim, autograd, cuda\n",
    "torch/optim/__init__.py": "from . import optimizer\n",
    "torch/optim/optimizer.py": "def register_optimizer_step_post_hook(hook):\n    pass\n",
    "torch/autograd/__init__.py": "def backward(*a, **k):\n    pass\n",
    "torch/cuda/__init__.py": """\
import os
from . import memory
ARM = []
_queued_calls = []
def is_initialized():
    return True
def memory_stats(dev=None):
    if ARM:
        os.kill(os.getpid(), ARM.pop())
        for _ in range(300000):
            pass
    return {"reserved_bytes.all.current": 1 << 30, "allocated_bytes.all.current": 1 << 29}
""",
    "torch/cuda/memory.py": "def _snapshot():\n    return {'segments': []}\n",
}

# The program: a signal arrives while PyTorch's view is read (the shim asks
# for one at the near miss of its 21 GiB), or, with `self` (no shim), while
# the program reads memory_stats itself. It catches what its handlers raise.
SIGNALED = r"""
import ctypes, os, signal, sys, threading, time
how = sys.argv[1]
if "thread" in sys.argv:  # the kernel then delivers the signal to another thread
    threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
if how == "term":
    signal.signal(signal.SIGTERM, lambda s, f: sys.exit(3))
if how == "alarm":
    def timeout(s, f):
        raise TimeoutError("the program's own")
    signal.signal(signal.SIGALRM, timeout)
import torch
tl = ctypes.CDLL(os.path.join(os.environ["GG_FAKE_DIR"], "libtorchlike.so"))
p = ctypes.c_void_p()
torch.cuda.ARM.append({"int": signal.SIGINT, "term": signal.SIGTERM, "alarm": signal.SIGALRM}[how])
try:
    tl.tl_malloc(ctypes.c_size_t(21 << 30), ctypes.byref(p))
    if "self" in sys.argv:
        torch.cuda.memory_stats(0)
    for i in range(3000000):
        pass
    print("the signal was lost: training went on")
except KeyboardInterrupt:
    print("KeyboardInterrupt")
    sys.exit(5)
except TimeoutError as e:
    print("TimeoutError", e)
    sys.exit(6)
"""


class Signals(Case):
    """A signal that arrives while the instrumentation
    reads PyTorch's view keeps its meaning. A Ctrl-C's KeyboardInterrupt, a
    SIGTERM handler's sys.exit(3), a handler's own exception reach the
    program as they do without gpuguard (its own reading of memory_stats
    there): with the process's one thread (the signal waits, blocked while
    the view is read) and with another thread to take it (its handler runs
    inside the view, whose work is dropped and its exception handed back)."""

    def run_signaled(self, how, *more, shim=True):
        stub = os.path.join(self.tmp, "signal-torch")
        if not os.path.isdir(stub):
            for rel, text in SIGNAL_TORCH.items():
                path = os.path.join(stub, rel)
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "w") as f:
                    f.write(text)
        e = base_env(GPUGUARD_TORCH="1", GG_FAKE_DIR=FAKE, GPUGUARD_QUIET="1",
                     GPUGUARD_POLICY=self.write_policy("observe.ini", POLICY), PYTHONPATH=stub)
        e["GPUGUARD_JOURNAL_DIR"] = self.tmp
        if shim:
            e["LD_PRELOAD"] = ":".join(sanitizer_preload() + [SHIM])
        else:
            e.pop("LD_PRELOAD", None)
            more += ("self",)
        return subprocess.run([sys.executable, "-c", SIGNALED, how, *more], env=e, cwd=self.tmp,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              timeout=120)

    def test_signals_reach_the_program_as_without_gpuguard(self):
        for how, rc, said in (("int", 5, "KeyboardInterrupt"), ("term", 3, ""),
                              ("alarm", 6, "TimeoutError the program's own")):
            without = self.run_signaled(how, shim=False)
            self.assertEqual((without.returncode, without.stdout.strip()), (rc, said), without.stderr)
            for more in ((), ("thread",)):
                with self.subTest(how=how, threads=more):
                    p = self.run_signaled(how, *more)
                    self.assertEqual((p.returncode, p.stdout.strip()), (rc, said), p.stderr)
                    self.assertNotIn("Exception ignored", p.stderr)
                    self.assertNotIn("AddressSanitizer", p.stderr)
                    journals = [n for n in os.listdir(self.tmp) if n.endswith(".jsonl")]
                    self.assertTrue(journals)  # the shim was there, and asked


# The shim's side of asking, with a real interpreter and no torch: the
# instrumentation's part is played by ctypes.
ASKER = r'''
import ctypes, os, sys, threading
sys.path.insert(0, {helper!r})
from gpuguard import _native
me = ctypes.CDLL(None)
native = _native.load()
attach, view = native.function("gpuguard_torch_attach"), native.function("gpuguard_torch_view")
detach = native.function("gpuguard_torch_detach")
tl = ctypes.CDLL(os.path.join({fake!r}, "libtorchlike.so"))
got = []

def answer(req):
    r = req.contents
    got.append((threading.current_thread().name, r.why.decode(), r.dev, r.request, r.history))
    v = _native.TorchView(seq=r.seq, dev=r.dev, reserved=5 << 30, allocated=3 << 30,
                          largest_free=1 << 30, inactive_split=1 << 29, seg_large=7)
    view(ctypes.byref(v))

cb = _native.TORCH_FN(answer)
print("attached", attach(cb))

def alloc(n):
    p = ctypes.c_void_p()
    return tl.tl_malloc(ctypes.c_size_t(n), ctypes.byref(p))

def spin():
    for _ in range(10000):  # Python runs: the pending call comes
        pass

alloc(1 << 30)            # starts the shim
t = threading.Thread(target=alloc, args=(21 << 30,), name="worker")
t.start(); t.join()       # a near miss, on another thread
spin()
print("got", got)
me.gpuguard_step(1)       # a new step: its first near miss asks again
alloc(1 << 20)
spin()
detach()
alloc(1 << 20)
me.gpuguard_step(2)
alloc(1 << 20)            # asked of no one
spin()
print("after", len(got))
{tail}
'''

POLICY = """\
[gpu]
match = *
[memory]
headroom = 10%
near_miss = 5%
mode = observe
"""


class AskingPython(Case):
    def asker(self, tail=""):
        code = ASKER.format(helper=PYHELPER, fake=FAKE, tail=tail)
        return self.run_prog([sys.executable, "-c", code],
                             policy=self.write_policy("observe.ini", POLICY))

    def test_requests_run_in_the_main_thread_and_answers_are_torch_lines(self):
        run = self.asker()
        self.assertEqual(run.rc, 0, run.err)
        self.sanitizer_clean(run)
        self.assertIn("attached 1", run.out)
        got = [l for l in run.out.splitlines() if l.startswith("got")][0]
        self.assertIn("('MainThread', 'near_miss', 0, %d, 0)" % (21 << 30), got)
        self.assertIn("after 2", run.out)  # the next step's, then nothing after the detach
        torch = run.of("torch")
        self.assertEqual(len(torch), 2)
        first = torch[0]
        self.assertEqual((first["why"], first["step"], first["request"]), ("near_miss", None, 21 << 30))
        self.assertEqual((first["reserved"], first["unallocated"], first["largest_free"]),
                         (5 << 30, 2 << 30, 1 << 30))
        self.assertEqual(first["segments"], {"small": 0, "large": 7, "huge": 0, "expandable": 0})
        self.assertNotIn("tensors", first)
        self.assertEqual(torch[1]["step"], 2)  # in progress after the boundary of step 1
        near = [e["t"] for e in run.of("near_miss")]
        self.assertLess(near[0], first["t"])  # asked at the incident, answered after

    def test_exit_with_a_request_outstanding_is_clean(self):
        """A request queued and never run (the interpreter exits first):
        the detach at exit closes the queue; nothing runs into a finalizing
        interpreter, nothing is printed."""
        tail = ("attach(cb)\nalloc(1 << 20)\nme.gpuguard_step(3)\nalloc(1 << 20)\n"
                "import atexit; atexit.register(detach)\nos.write(1, b'exiting\\n')\n")
        run = self.asker(tail)
        self.assertEqual(run.rc, 0, run.err)
        self.assertIn("exiting", run.out)
        self.assertEqual([l for l in run.err.splitlines() if not l.startswith("gpuguard: GPU0")], [])
