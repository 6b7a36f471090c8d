"""One preflight run: the user's command under gpuguard-run, on a simulated
GPU of one model, in a throwaway layer (sandbox.py); and what it left: the
probe's figures (probe.py), the shim's journal, the cuBLAS handles it made,
its output, what it wrote.
"""
import json
import os
import re
import struct
import subprocess
import sys
import tempfile

from ..journal.reader import read_journals
from . import sandbox

#: The simulated libraries a PyTorch build links by name, per CUDA major:
#: preloaded so that the loader reuses them whatever the RPATH says (a
#: wheel's libtorch carries DT_RPATH to its nvidia/*/lib directories, which
#: comes before LD_LIBRARY_PATH; a library already loaded under the same
#: SONAME comes before both).
PRELOADS = ("libcudart.so.%d", "libcublas.so.%d", "libcublasLt.so.%d", "libcudnn.so.9")

#: The user's environment variables a preflight run does not keep: the
#: shim's own (the run's are set here), the simulated driver's, and the
#: real GPUs' selection.
DROPPED = re.compile(r"^(GPUGUARD_|FAKECUDA_|CUDA_VISIBLE_DEVICES$|NVIDIA_VISIBLE_DEVICES$)")

#: Set unless the user set them: libraries that would reach the network
#: use their caches instead (there is no network in the layer).
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "WANDB_MODE": "offline"}


# --- which PyTorch the command runs ------------------------------------------------------

def _python_of(argv, env):
    """The Python interpreter the command runs: argv[0] when it is one,
    else the interpreter of argv[0]'s #! line; None when neither."""
    path = argv[0]
    if os.sep not in path:
        for d in env.get("PATH", os.defpath).split(os.pathsep):
            cand = os.path.join(d or ".", path)
            if os.path.isfile(cand) and os.access(cand, os.X_OK):
                path = cand
                break
    if re.match(r"^python[0-9.]*$", os.path.basename(path)):
        return path
    try:
        with open(path, "rb") as f:
            first = f.readline(256)
    except OSError:
        return None
    m = re.match(rb"^#!\s*(\S+)(?:\s+(\S+))?", first)
    if not m:
        return None
    interp = m.group(1).decode("utf-8", "replace")
    if os.path.basename(interp) == "env" and m.group(2):
        return _python_of([m.group(2).decode("utf-8", "replace")], env)
    return interp if re.match(r"^python[0-9.]*$", os.path.basename(interp)) else None


def elf_needed(path):
    """The DT_NEEDED names of a 64-bit little-endian ELF file, and whether it
    has a DT_RPATH; ([], False) when it cannot be read."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return [], False
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        return [], False
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = []
    for i in range(shnum):
        off = shoff + i * shentsize
        if off + 64 > len(data):
            return [], False
        _, stype, _, _, soff, ssize, link, _, _, _ = struct.unpack_from("<IIQQQQIIQQ", data, off)
        sections.append((stype, soff, ssize, link))
    needed, rpath = [], False
    for stype, soff, ssize, link in sections:
        if stype != 6 or link >= len(sections):  # SHT_DYNAMIC
            continue
        stroff = sections[link][1]
        for k in range(0, ssize, 16):
            tag, val = struct.unpack_from("<qQ", data, soff + k)
            if tag == 0:
                break
            if tag == 1:  # DT_NEEDED
                end = data.index(b"\0", stroff + val)
                needed.append(data[stroff + val:end].decode("utf-8", "replace"))
            elif tag == 15:  # DT_RPATH
                rpath = True
    return needed, rpath


class Torch(object):
    """What the command's PyTorch is: where, and which CUDA it links."""

    def __init__(self):
        self.python = None
        self.dir = None
        self.cuda = None          # the CUDA major of the runtime it links (12, 13)
        self.rpath = False        # its CUDA libraries come with DT_RPATH (a wheel)
        self.why = None           # why it could not be told

    def describe(self):
        if self.cuda is None:
            return "PyTorch: %s" % (self.why or "not found")
        return "PyTorch in %s, built with CUDA %d%s" % (
            self.dir, self.cuda, " (a wheel: its libraries found by RPATH)" if self.rpath else "")


def find_torch(argv, env):
    """Which PyTorch the command's Python imports, without importing it."""
    t = Torch()
    t.python = _python_of(argv, env)
    if t.python is None:
        t.why = "%s is not a Python interpreter nor a script of one" % argv[0]
        return t
    code = ("import importlib.util as u\ns = u.find_spec('torch')\n"
            "print(s.origin if s and s.origin else '')")
    try:
        out = subprocess.run([t.python, "-c", code], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, universal_newlines=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as e:
        t.why = "cannot run %s (%s)" % (t.python, e)
        return t
    origin = out.stdout.strip()
    if out.returncode != 0 or not origin:
        t.why = "%s has no torch" % t.python
        return t
    t.dir = os.path.dirname(origin)
    lib = os.path.join(t.dir, "lib")
    for name in ("libc10_cuda.so", "libtorch_cuda.so", "libtorch_global_deps.so"):
        needed, rpath = elf_needed(os.path.join(lib, name))
        t.rpath = t.rpath or rpath
        for n in needed:
            m = re.match(r"^libcudart\.so\.(\d+)$", n)
            if m:
                t.cuda = int(m.group(1))
        if t.cuda is not None:
            break
    if t.cuda is None:
        t.why = "the torch in %s links no CUDA runtime (a CPU-only build?)" % t.dir
    return t


# --- a run -------------------------------------------------------------------------------

class Spec(object):
    """What one run is: a model (maybe made larger), a mode, outside charges."""

    def __init__(self, model, batch, argv, kind, mode, total=None, context=0, cublas=0):
        self.model = model
        self.batch = batch
        self.argv = argv
        self.kind = kind            # "fit": observe at the total; "limit": enforce; "need": large
        self.mode = mode            # gpuguard-run --mode
        self.total = total or model.total
        self.context = context      # FAKECUDA_CONTEXT_BYTES
        self.cublas = cublas        # FAKECUDA_CUBLAS_WORKSPACE

    @property
    def device(self):
        return "%s,%d,%s" % (self.model.name, self.total, self.model.cc)


class Result(object):
    """What a run left."""

    def __init__(self, spec, outcome, results):
        self.spec = spec
        self.outcome = outcome
        self.dir = results
        self.steps = []             # the probe's step lines
        self.end = None
        self.sample = None
        self.start = None
        self.dist = None
        self.journal = None
        self.device = None          # the journal's device entry
        self.handles = 0
        self.stdout = _read(os.path.join(results, "stdout"))
        self.stderr = _read(os.path.join(results, "stderr"))
        for line in _read(os.path.join(results, "probe.jsonl")).splitlines():
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            kind = ev.get("ev")
            if kind == "step":
                self.steps.append(ev)
            elif kind == "end" and self.end is None:
                self.end = ev
            elif kind == "sample":
                self.sample = ev
            elif kind == "start" and self.start is None:
                self.start = ev
            elif kind == "dist":
                self.dist = ev
        self.handles = sum(1 for l in _read(os.path.join(results, "cublas.log")).splitlines()
                           if l.startswith("cublasCreate"))
        journals, _ = read_journals([results]) if _has_journal(results) else ([], [])
        pid = self.start.get("pid") if self.start else None
        for j in journals:
            used = j.used_devices()
            if used and (self.journal is None or j.pid == pid):
                self.journal, self.device = j, used[0]

    # -- what happened --

    @property
    def reached(self):
        return len(self.steps)

    @property
    def max_reserved(self):
        vals = [e.get("max_reserved") for e in (self.end, self.sample) if e] + \
               [s.get("max_reserved") for s in self.steps[-1:]]
        vals = [v for v in vals if isinstance(v, int)]
        return max(vals) if vals else None

    @property
    def max_needed(self):
        vals = [e.get("max_needed") for e in (self.end, self.sample) if e] + \
               [s.get("max_needed") for s in self.steps[-1:]]
        vals = [v for v in vals if isinstance(v, int)]
        return max(vals) if vals else None

    @property
    def ooms_raised(self):
        n = self.end.get("ooms_raised", 0) if self.end else 0
        if not n and "OutOfMemoryError" in self.traceback:
            n = 1
        return n

    @property
    def flushes(self):
        """Allocations the simulated GPU (or the guard) refused that PyTorch
        recovered from (it empties its cache and tries again)."""
        s = self.device.summary if self.device is not None else None
        if not s:
            return 0
        return int(s.get("refusals") or 0) + int(s.get("ooms") or 0)

    @property
    def traceback(self):
        """The script's last traceback, as it printed it."""
        err = self.stderr
        at = err.rfind("Traceback (most recent call last):")
        return err[at:].strip() if at >= 0 else ""

    @property
    def completed(self):
        """It ran to the steps asked for, or to its own end, with no
        OutOfMemoryError raised."""
        o = self.outcome
        if o.refused or self.ooms_raised:
            return False
        if o.status == 0:
            return True
        return bool(o.timed_out and self.steps)

    @property
    def failure(self):
        """Why the run failed for a reason other than memory, or None."""
        o = self.outcome
        if o.refused:
            return "the throwaway layer could not be had: %s" % o.refused
        if self.ooms_raised or self.completed:
            return None
        if o.exec_failed:
            return "could not start: %s" % o.exec_failed
        if o.signal:
            return "killed by signal %d" % o.signal
        return "exit status %s" % o.status

    @property
    def peak_step(self):
        best = None
        for s in self.steps:
            if best is None or s.get("reserved_peak", 0) > best.get("reserved_peak", 0):
                best = s
        return best

    @property
    def sites(self):
        return (self.end or {}).get("sites") or []


def _read(path):
    try:
        with open(path, "r", encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def _has_journal(d):
    try:
        return any(n.startswith("gpuguard.") and n.endswith(".jsonl") for n in os.listdir(d))
    except OSError:
        return False


class Paths(object):
    """Where gpuguard's parts are: gpuguard-run, the simulated GPU, the
    policies."""

    def __init__(self, bindir, policy=None, sim=None):
        prefix = os.path.dirname(bindir)
        installed = os.path.isdir(os.path.join(prefix, "lib", "gpuguard", "sim"))
        self.run = os.path.join(bindir, "gpuguard-run")
        tree = os.path.dirname(prefix)               # tools/bin -> the checkout
        self.sim = sim or os.environ.get("GPUGUARD_SIM") or (
            os.path.join(prefix, "lib", "gpuguard", "sim") if installed else
            os.path.join(tree, os.environ.get("GG_BUILD", "build"), "fake"))
        if not os.path.isabs(self.sim):
            self.sim = os.path.join(tree, self.sim)
        self.policy = policy or (
            os.path.join(prefix, "share", "gpuguard", "policy") if installed else
            os.path.join(tree, "policy"))

    def check(self):
        """What is missing, said, or None."""
        if not os.access(self.run, os.X_OK):
            return "gpuguard-run not found beside gpuguard-preflight (%s)" % self.run
        if not os.path.isfile(os.path.join(self.sim, "libcuda.so.1")):
            return ("the simulated GPU is not in %s (make install puts it in "
                    "<prefix>/lib/gpuguard/sim; GPUGUARD_SIM names another place)" % self.sim)
        if not os.path.exists(self.policy):
            return "no policies in %s" % self.policy
        return None


def environment(base, paths, torch, spec, results, steps):
    """The command's environment for one run."""
    env = {k: v for k, v in base.items() if not DROPPED.match(k)}
    for k, v in OFFLINE.items():
        env.setdefault(k, v)
    cuda = torch.cuda or 12
    pre = [os.path.join(paths.sim, p % cuda if "%d" in p else p) for p in PRELOADS]
    pre = [p for p in pre if os.path.exists(p)]
    if env.get("LD_PRELOAD"):
        pre.append(env["LD_PRELOAD"])
    env["LD_PRELOAD"] = " ".join(pre)
    env["LD_LIBRARY_PATH"] = paths.sim + (":" + env["LD_LIBRARY_PATH"]
                                          if env.get("LD_LIBRARY_PATH") else "")
    env["FAKECUDA_DEVICES"] = spec.device
    env["FAKECUDA_CONTEXT_BYTES"] = str(int(spec.context))
    env["FAKECUDA_CUBLAS_WORKSPACE"] = str(int(spec.cublas))
    env["FAKECUDA_CUBLAS_LOG"] = os.path.join(results, "cublas.log")
    env["GPUGUARD_PREFLIGHT"] = os.path.join(results, "probe.jsonl")
    env["GPUGUARD_PREFLIGHT_STEPS"] = str(int(steps or 0))
    env["GPUGUARD_TORCH"] = "1"
    return env


def start(paths, torch, spec, workdir, base_env, cwd, steps, timeout):
    """Start one run; (its helper process, finish) where finish() waits for
    it and gives its Result."""
    results = tempfile.mkdtemp(prefix="run.", dir=workdir)
    os.chmod(results, 0o777)  # a user namespace's command writes it as the user
    env = environment(base_env, paths, torch, spec, results, steps)
    argv = [paths.run, "--mode", spec.mode, "--policy", paths.policy, "--journal-dir", results,
            "--quiet", "--"] + list(spec.argv)
    proc, finish = sandbox.start(argv, env, cwd, results, os.path.join(results, "stdout"),
                                 os.path.join(results, "stderr"), timeout=timeout,
                                 python=sys.executable)

    def done():
        return Result(spec, finish(), results)
    return proc, done
