"""Issue 23, the parts of PyTorch's instrumentation that need no PyTorch
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

SITE = os.path.join(PYHELPER, "gpuguard", "_site")
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
        p = self.run_it([sys.executable, "-c", self.CODE], self.env(GPUGUARD_TORCH="1"))
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn(repr([SITE, PYHELPER]), p.stdout)

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
        v = self.dry()
        self.assertEqual(v["GPUGUARD_TORCH"], "1")
        self.assertEqual(v["PYTHONPATH"], SITE + ":" + PYHELPER)
        for how in ({"opts": ["--no-torch"]}, {"env": {"GPUGUARD_TORCH": "0"}},
                    {"env": {"GPUGUARD_TORCH": " Off "}}):
            with self.subTest(how=how):
                v = self.dry(*how.get("opts", []), **how.get("env", {}))
                self.assertEqual(v["PYTHONPATH"], PYHELPER)
                self.assertNotEqual(v["GPUGUARD_TORCH"], "1")


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
