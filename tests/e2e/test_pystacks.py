"""Python stacks end to end: a near miss, a refusal and the peak sites name the
script's file, line and function on every CPython 3.10-3.13 present, from the
main thread and a worker thread, through the shim under a real LD_PRELOAD;
an unsupported Python gets native frames and one error; native frames are
named only by a symbol they lie inside."""
import json
import os
import subprocess

from gg import FAKE, SHIM, GiB, Case, base_env, sanitizer_preload
from test_pyframes import SUPPORTED, interpreters, vstr

POLICY = """\
[gpu]
match = *
[memory]
headroom = 2 GiB
near_miss = 1 GiB
mode = enforce
[trainer]
signal = none
"""

# The trainer: each allocation is made from a known line of a known function
# (the fake caching allocator is called through ctypes, which releases the
# GIL, as PyTorch's ops do). Prints where each call was made from.
TRAINER = r'''
import ctypes, json, os, sys, threading
tl = ctypes.CDLL(os.path.join(FAKE, "libtorchlike.so"))
where = {}

def here():
    """This line's caller: file, the next line, its qualified name (3.11+;
    3.10's code objects have only the plain name)."""
    f = sys._getframe(1)
    return [f.f_code.co_filename, f.f_lineno + 1,
            getattr(f.f_code, "co_qualname", f.f_code.co_name)]

class Model:
    def forward(self, gib, tag):
        p = ctypes.c_void_p()
        where[tag] = here()
        return tl.tl_malloc(ctypes.c_size_t(int(gib * (1 << 30))), ctypes.byref(p))

def worker_step(gib, out):
    p = ctypes.c_void_p()
    where["worker"] = here()
    out.append(tl.tl_malloc(ctypes.c_size_t(int(gib * (1 << 30))), ctypes.byref(p)))

m = Model()
rc = [m.forward(20, "peak"), m.forward(1.5, "near_miss")]   # 21.5 GiB: a near miss
out = []
t = threading.Thread(target=worker_step, args=(1, out)); t.start(); t.join()  # 22.5: refused
rc += out
print("RESULT " + json.dumps({"rc": rc, "where": where}))
'''


def first_py(event, key="pystack"):
    py = event.get(key) or []
    return [py[0]["file"], py[0]["line"], py[0]["func"]] if py else None


class PythonLines(Case):
    def run_trainer(self, python):
        script = os.path.join(self.tmp, "train.py")
        with open(script, "w") as f:
            f.write("FAKE = %r\n" % FAKE + TRAINER)
        env = base_env(devices="NVIDIA GeForce RTX 3090,24GiB,8.6")
        env.pop("PYTHONPATH", None)
        run = self.run_prog([python, script], env=env,
                            policy=self.write_policy("p.ini", POLICY))
        self.assertEqual(run.rc, 0, run.err)
        return run, json.loads(run.out.split("RESULT ", 1)[1])

    def test_every_supported_cpython(self):
        found, _ = interpreters()
        ran = []
        for path, version, _about in found:
            if not SUPPORTED[0] <= version[:2] <= SUPPORTED[1]:
                continue
            with self.subTest(python=vstr(version)):
                run, res = self.run_trainer(path)
                where = res["where"]
                self.assertEqual(res["rc"], [0, 0, 2])  # the worker's 1 GiB is refused
                (nm,) = run.of("near_miss")
                self.assertEqual(first_py(nm), where["near_miss"])
                # the caching allocator frees its cache and retries: refused twice
                refused = run.of("refused")[0]
                self.assertEqual(first_py(refused), where["worker"])  # a worker thread
                funcs = [f["func"] for f in refused["pystack"]]
                self.assertIn("_bootstrap", funcs[-1])  # the thread's own frames, to its start
                summary = run.summary()
                top = summary["peak_sites"][0]
                self.assertEqual(first_py(top), where["peak"])
                self.assertEqual(top["bytes"], 20 * GiB)
                self.assertIsNotNone(first_py(summary, "peak_pystack"))
                # native frames below: the caching allocator's
                self.assertEqual(nm["stack"][0]["sym"], "seg_alloc")
                ran.append(vstr(version))
        print("\n  pystacks: Python lines checked through the shim on %s" % (ran or "none"))
        self.assertTrue(ran, "no CPython 3.10-3.13 found")

    def test_unsupported_cpython_native_frames_and_one_error(self):
        found, _ = interpreters()
        old = [(p, v) for p, v, _ in found if v[:2] < SUPPORTED[0] and v[:2] >= (3, 6)]
        if not old:
            self.skipTest("no CPython 3.6-3.9 found (pyenv provides them in CI)")
        path, version = old[-1]
        run, res = self.run_trainer(path)
        self.assertEqual(res["rc"], [0, 0, 2])
        (nm,) = run.of("near_miss")
        self.assertEqual(nm["pystack"], [])
        self.assertEqual(nm["stack"][0]["sym"], "seg_alloc")
        errors = [e["message"] for e in run.of("error") if "Python frames" in e["message"]]
        self.assertEqual(len(errors), 1, run.of("error"))
        self.assertIn("not supported", errors[0])

    def test_no_python_no_frames(self):
        run = self.script("alloc:20G", "alloc:1.5G", policy=self.write_policy("p.ini", POLICY))
        (nm,) = run.of("near_miss")
        self.assertEqual(nm["pystack"], [])
        self.assertEqual(nm["thread"], "script")
        self.assertEqual(nm["stack"][0]["sym"], "main")

    def test_python_off(self):
        found, _ = interpreters()
        ok = [p for p, v, _ in found if SUPPORTED[0] <= v[:2] <= SUPPORTED[1]]
        if not ok:
            self.skipTest("no CPython 3.10-3.13 found")
        script = os.path.join(self.tmp, "train.py")
        with open(script, "w") as f:
            f.write("FAKE = %r\n" % FAKE + TRAINER)
        for env_value, policy_value in (("0", "yes"), (None, "no")):
            env = base_env(devices="NVIDIA GeForce RTX 3090,24GiB,8.6")
            env.pop("PYTHONPATH", None)
            if env_value:
                env["GPUGUARD_PYTHON"] = env_value
            pol = self.write_policy("p.ini", POLICY + "[journal]\npython = %s\n" % policy_value)
            run = self.run_prog([ok[0], script], env=env, policy=pol)
            (nm,) = run.of("near_miss")
            self.assertEqual(nm["pystack"], [])


class NativeNames(Case):
    def test_no_symbol_it_does_not_lie_inside(self):
        # Python's own frames through libffi: every named frame's offset
        # lies within its symbol (elfsym), and C++ names are demangled.
        run = self.script("alloc:20G", "alloc:1.5G", policy=self.write_policy("p.ini", POLICY))
        (nm,) = run.of("near_miss")
        for f in nm["stack"]:
            if f["sym"]:
                self.assertFalse(f["sym"].startswith("_Z"), f)
