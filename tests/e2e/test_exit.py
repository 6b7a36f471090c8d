"""How a process ends, in its journal and its report: the exit
status it returns from main or passes to exit() is the summary's; SIGTERM
(the default action) leaves a `killed` line and still kills the process as
it would have; a program's own SIGTERM handler keeps the signal; a process
killed by SIGKILL leaves its peak, the sites that held it and its last step
in lines written as it went, and the report reconstructs them."""
import os
import signal
import subprocess
import sys

from gg import FAKE, PYHELPER, GiB, MiB, Case

REPORT = os.path.join(os.path.dirname(PYHELPER), "bin", "gpuguard-report")

POLICY = """\
[gpu]
match = NVIDIA GeForce RTX 3090*
[memory]
mode = observe
[trainer]
signal = none
"""

# Allocates through the fake runtime, tells steps, then ends as argv says.
PROGRAM = r'''
import ctypes, os, signal, sys, time
rt = ctypes.CDLL(os.path.join(FAKE, "libcudart.so.13"))
rt.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
me = ctypes.CDLL(None)
me.gpuguard_step.argtypes = [ctypes.c_ulonglong]
held = []

def grow(step):  # each step keeps another 1 GiB: the peak grows
    p = ctypes.c_void_p()
    assert rt.cudaMalloc(ctypes.byref(p), 1 << 30) == 0
    held.append(p)
    me.gpuguard_step(step)

how = sys.argv[1]
for step in range(1, 6):
    grow(step)
if how == "status":
    sys.exit(3)
if how == "raise":
    raise RuntimeError("the program's own error")
if how == "libc-exit":
    me.exit.argtypes = [ctypes.c_int]
    me.exit(7)  # a C library's exit(): the shim's, then libc's
if how == "term":
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(5)
if how == "term-handled":
    signal.signal(signal.SIGTERM, lambda s, f: sys.exit(9))
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(5)
if how == "kill":
    time.sleep(1.2)  # the shim's thread writes the peak as it grows
    os.kill(os.getpid(), signal.SIGKILL)
print("done", flush=True)
'''


class Exit(Case):
    def run_(self, how, **kw):
        policy = self.write_policy("p.ini", POLICY)
        return self.run_prog([sys.executable, "-c", "FAKE = %r\n" % FAKE + PROGRAM, how],
                             policy=policy, **kw)

    def report(self, run):
        out = subprocess.run([sys.executable, REPORT] + run.files, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        self.assertEqual(out.returncode, 0, out.stderr)
        return out.stdout

    def test_the_status_is_the_summarys(self):
        for how, rc, status in (("status", 3, 3), ("raise", 1, 1), ("libc-exit", 7, 7),
                                ("none", 0, 0)):
            run = self.run_(how)
            self.assertEqual(run.rc, rc, run.err)
            self.sanitizer_clean(run)
            self.assertEqual(run.one("summary")["status"], status, how)
            self.assertEqual(run.summary()["steps"], 5)
            self.assertEqual(run.summary()["step"], 5)
            text = self.report(run)
            if status:
                self.assertIn("exited with status %d after " % status, text)
            else:
                self.assertIn("finished after ", text)
                self.assertIn("(exit status 0)", text)

    def test_sigterm_is_said_and_still_kills(self):
        run = self.run_("term")
        self.assertEqual(run.rc, -signal.SIGTERM, run.err)
        killed = run.one("killed")
        self.assertEqual((killed["signal"], killed["step"]), ("SIGTERM", 5))
        self.assertEqual(run.of("summary"), [])
        self.assertIn("killed by SIGTERM after ", self.report(run))
        self.assertIn(", after step 5 (no summary)", self.report(run))
        # the program's own handler is the program's: it runs, the shim says nothing
        run = self.run_("term-handled")
        self.assertEqual(run.rc, 9, run.err)
        self.assertEqual(run.of("killed"), [])
        self.assertEqual(run.one("summary")["status"], 9)

    def test_sigkill_leaves_its_peak_sites_and_last_step(self):
        run = self.run_("kill")
        self.assertEqual(run.rc, -signal.SIGKILL, run.err)
        self.assertEqual(run.of("summary"), [])
        peaks = run.of("peak")
        self.assertTrue(peaks, "no peak line in a run killed 1.2 s after its peak")
        self.assertEqual(peaks[-1]["peak"], 5 * GiB)
        self.assertEqual(peaks[-1]["step"], 6)  # in progress: the fifth had ended
        self.assertEqual(sum(s["bytes"] for s in peaks[-1]["sites"]), 5 * GiB)
        text = self.report(run)
        self.assertIn("killed after ", text)
        self.assertIn(", after step 5 (no summary: SIGKILL, os._exit or a crash)", text)
        self.assertIn("peak 5.0 GiB", text)
        self.assertIn("   Allocation sites at the peak (the last written before the process was "
                      "killed: 5.0 GiB, step 6):", text)
        self.assertIn(" in grow\n", text)
