"""Real PyTorch on the fake GPU: run a script in the rig's chroot (tests/torch/rig),
under the shim or not, and read what it printed and what the shim left; and
`tests/torch/rig run` (main() here): a user's own command, from the directory
it is started in, under the installed gpuguard.

The rig holds Debian's PyTorch 2.6 CUDA build; each test session copies
into it, under /tmp, the shim and the fake CUDA stack built from the
checkout ($GG_BUILD), the Python helper and tests/torch/scripts. A run is
``chroot ROOT env -i ... python3 SCRIPT`` with /proc mounted in a private
mount namespace, the fakes first on LD_LIBRARY_PATH (they take the place of
libcudart.so.12, libcuda.so.1, NVML, cuBLAS and cuDNN), and the run's own
directory for journals and traces. Scripts print ``RESULT {json}`` lines.
"""
import atexit
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
BUILD = os.environ.get("GG_BUILD") or os.path.join(ROOT, "build")
if not os.path.isabs(BUILD):
    BUILD = os.path.join(ROOT, BUILD)
SANITIZE = os.environ.get("GG_SANITIZE", "")
RIG = os.path.join(HERE, "rig")

GiB = 1 << 30
MiB = 1 << 20
RTX3090 = "NVIDIA GeForce RTX 3090,24GiB,8.6"
RTX5090 = "NVIDIA GeForce RTX 5090,32GiB,12.0"

HOW = ("no real-PyTorch rig: `make torch-rig` builds it once (3-4 min, 3.7 GB under "
       "/var/cache/gpuguard, needs root and Debian's archive)")

_rig = None


def rig_root():
    """The chroot's directory, or None when the rig is not built."""
    global _rig
    if _rig is None:
        out = subprocess.run([RIG, "path"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
        _rig = out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else ""
    return _rig or None


def soname(path):
    out = subprocess.run(["readelf", "-d", path], stdout=subprocess.PIPE, text=True)
    for line in out.stdout.splitlines():
        if "(SONAME)" in line:
            return line.rsplit("[", 1)[1].rstrip("]")
    return os.path.basename(path)


def sanitizer_libs():
    """Under ASan (SANITIZE=1 builds the fakes with it too) the host's
    sanitizer runtimes: (file, the name the fakes need)."""
    if SANITIZE != "1":
        return []
    libs = []
    for name in ("libasan.so", "libubsan.so"):
        out = subprocess.run(["cc", "-print-file-name=" + name], stdout=subprocess.PIPE, text=True)
        path = os.path.realpath(out.stdout.strip())
        if os.path.isfile(path):
            libs.append((path, soname(path)))
    return libs


class Session:
    """What a session installs into the chroot, under /tmp/gg-XXXX: lib (the
    shim and the fakes), python (the helper), scripts, policy, demo."""

    def __init__(self, root):
        self.root = root
        self.host_dir = tempfile.mkdtemp(prefix="gg-", dir=os.path.join(root, "tmp"))
        os.chmod(self.host_dir, 0o755)
        self.dir = "/" + os.path.relpath(self.host_dir, root)
        lib = os.path.join(self.host_dir, "lib")
        os.makedirs(lib)
        shutil.copy2(os.path.join(BUILD, "libgpuguard.so"), lib)
        for f in glob.glob(os.path.join(BUILD, "fake", "lib*.so*")):
            if not f.endswith(".map"):
                shutil.copy2(f, lib, follow_symlinks=False)
        self.sanitizers = []
        for f, name in sanitizer_libs():
            shutil.copy2(f, os.path.join(lib, name))
            self.sanitizers.append(self.dir + "/lib/" + name)
        shutil.copytree(os.path.join(ROOT, "tools", "python", "gpuguard"),
                        os.path.join(self.host_dir, "python", "gpuguard"),
                        ignore=shutil.ignore_patterns("__pycache__"))
        # gpuguard's site directory as installed (lib/../share/gpuguard/site):
        # the library puts it on the path of the Pythons gpuguard-run starts
        site = os.path.join(self.host_dir, "share", "gpuguard", "site")
        os.makedirs(site)
        shutil.copy2(os.path.join(ROOT, "tools", "python", "gpuguard", "_site", "sitecustomize.py"),
                     site)
        os.symlink("../../../python/gpuguard", os.path.join(site, "gpuguard"))
        shutil.copytree(os.path.join(HERE, "scripts"), os.path.join(self.host_dir, "scripts"),
                        ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copytree(os.path.join(ROOT, "policy"), os.path.join(self.host_dir, "policy"))
        shutil.copytree(os.path.join(ROOT, "tools", "demo"), os.path.join(self.host_dir, "demo"),
                        ignore=shutil.ignore_patterns("__pycache__"))
        # gpuguard-run beside lib/ and python/, as in the source tree's layout,
        # and the gpuguard-check it checks its options' values with
        os.makedirs(os.path.join(self.host_dir, "bin"))
        shutil.copy2(os.path.join(ROOT, "tools", "bin", "gpuguard-run"),
                     os.path.join(self.host_dir, "bin", "gpuguard-run"))
        if os.path.exists(os.path.join(BUILD, "gpuguard-check")):
            shutil.copy2(os.path.join(BUILD, "gpuguard-check"),
                         os.path.join(self.host_dir, "bin", "gpuguard-check"))
        self.shim = self.dir + "/lib/libgpuguard.so"
        self.gpuguard_run = self.dir + "/bin/gpuguard-run"
        atexit.register(shutil.rmtree, self.host_dir, True)

    def inside(self, host_path):
        """The chroot's name for a host path under the rig."""
        return "/" + os.path.relpath(host_path, self.root)


_session = None


def session():
    global _session
    root = rig_root()
    if root is None:
        raise unittest.SkipTest(HOW)
    if _session is None:
        _session = Session(root)
    return _session


class Run:
    """One script run: exit status, output, RESULT lines, journal events, trace."""

    def __init__(self, proc, host_dir):
        self.rc = proc.returncode
        self.out = proc.stdout
        self.err = proc.stderr
        self.dir = host_dir
        self.results = [json.loads(l[7:]) for l in self.out.splitlines() if l.startswith("RESULT ")]
        self.files = sorted(glob.glob(os.path.join(host_dir, "gpuguard.*.jsonl")))
        self.events = []
        for f in self.files:
            with open(f) as fh:
                self.events += [json.loads(l) for l in fh if l.strip()]
        self.traces = sorted(glob.glob(os.path.join(host_dir, "trace.*")))

    def result(self, kind):
        found = [r for r in self.results if r.get("kind") == kind]
        assert found, "no RESULT of kind %s in:\n%s\n%s" % (kind, self.out[-3000:], self.err[-3000:])
        return found[-1]

    def of(self, ev):
        return [e for e in self.events if e["ev"] == ev]

    def summary(self, dev=0):
        s = self.of("summary")
        assert len(s) == 1, "expected one summary, got %d: %s" % (len(s), self.err[-2000:])
        return s[0]["devices"][dev]


def command(argv, inner_dir, preload=True, devices=RTX3090, policy=None, env=None, trace=False,
            gpuguard_run=None, bind=None):
    """The host command that runs argv (the chroot's paths) in the rig, in
    inner_dir (the chroot's name for a directory under the rig), with the
    fakes in front and, when preload, the shim: the session's own files.
    gpuguard_run (a list of its options, [] for none): through the session's
    gpuguard-run instead, which preloads the shim and instruments Python.
    bind: a host directory mounted (bind) on inner_dir for the run, in its
    private mount namespace: what the command writes there is on the host."""
    s = session()
    if gpuguard_run is not None:
        preload = False
        argv = [s.gpuguard_run] + list(gpuguard_run) + ["--"] + list(argv)
    e = {
        "PATH": "/usr/bin:/bin",
        "HOME": inner_dir,
        "LANG": "C.UTF-8",
        "LD_LIBRARY_PATH": s.dir + "/lib",
        "PYTHONPATH": s.dir + "/python:" + s.dir + "/scripts",
        "PYTHONDONTWRITEBYTECODE": "1",
        "FAKECUDA_DEVICES": devices,
        "GPUGUARD_JOURNAL_DIR": inner_dir,
        "GPUGUARD_POLICY": policy or (s.dir + "/policy"),
    }
    if SANITIZE == "1":
        # PyTorch's whole process runs on ASan's allocator: each allocation
        # keeps 6 frames of its stack, not 30 (a fifth less CPU for the
        # rig's tests under ASan; what is checked is the same, and a report's
        # own stack is whole)
        e["ASAN_OPTIONS"] = "detect_leaks=0:verify_asan_link_order=0:malloc_context_size=6"
        e["UBSAN_OPTIONS"] = "halt_on_error=1:print_stacktrace=1"
    if trace:
        e["GPUGUARD_TRACE"] = inner_dir + "/trace.%p"
    # The sanitizer runtimes first, shim or not (the fakes are built with them).
    preloads = s.sanitizers + ([s.shim] if preload else [])
    if preloads:
        e["LD_PRELOAD"] = ":".join(preloads)
    e.update({k: str(v) for k, v in (env or {}).items()})
    mounts = 'mount -t proc proc "$0/proc"'
    head = [s.root]
    if bind:
        # $1 is the host directory, $0$2 its mount point in the chroot
        mounts += ' && mount --bind "$1" "$0$2" && shift 2'
        head = [s.root, bind, inner_dir]
    return ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
            mounts + ' && exec chroot "$0" "$@"'] + head + [
            "/bin/sh", "-c", 'cd "$0" && exec "$@"', inner_dir,
            "/usr/bin/env", "-i"] + ["%s=%s" % kv for kv in sorted(e.items())] + [str(a) for a in argv]


def run(script, *args, timeout=600, parent=None, **kw):
    """Run tests/torch/scripts/SCRIPT with ARGS in the chroot, in a fresh
    directory under `parent` (a host directory in the rig; default the
    session's); a Run. Keywords as command()'s."""
    s = session()
    run_dir = tempfile.mkdtemp(prefix="r-", dir=parent or s.host_dir)
    os.chmod(run_dir, 0o777)
    argv = command(["/usr/bin/python3", s.dir + "/scripts/" + script] + list(args),
                   s.inside(run_dir), **kw)
    proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          timeout=timeout)
    return Run(proc, run_dir)


def write_policy(directory, name, text):
    """A policy file in a host directory of the rig; its name inside."""
    path = os.path.join(directory, name)
    with open(path, "w") as f:
        f.write(text)
    return session().inside(path)


def verdict_problems(paths):
    """Every verdict the report gives on a moment of these journals, held to
    the figures of that moment (gpuguard.report.workload.check), and the
    text's own: a verdict of fragmentation or real demand only where its
    figures are of the failure's moment (PyTorch raising), never of a view
    read later. [] when all hold."""
    sys.path.insert(0, os.path.join(ROOT, "tools", "python"))
    from gpuguard.journal import read_journals
    from gpuguard.report.text import text_report
    from gpuguard.report.workload import check, judgements
    import argparse
    journals, _ = read_journals(paths)
    problems = []
    for j in journals:
        for judged in judgements(j):
            problems += ["%s: %s %r" % (j.path, c, judged) for c in check(judged)]
    opts = argparse.Namespace(recommend=False, depth=12, top_down=False, threshold=1.0,
                              frames=4, native=False)
    title = ""
    for line in text_report(journals, [], opts).splitlines():
        if line.startswith("   PyTorch's allocator"):
            title = line
        elif not line.startswith("     "):
            title = ""
        for word in ("real demand", "fragmentation"):
            if word not in line:
                continue
            head = line[:line.index(word)]
            if "raised" not in title and "raised OutOfMemoryError" not in head:
                problems.append("a verdict of %s not of the failure's moment: %s" % (word, line))
    return problems


class TorchCase(unittest.TestCase):
    """A test that runs real PyTorch in the rig; skipped, saying how, without
    one. After each, every verdict the report gives on the journals it made
    is held to its own figures (verdict_problems)."""

    @classmethod
    def setUpClass(cls):
        cls.sess = session()

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="t-", dir=self.sess.host_dir)
        os.chmod(self.tmp, 0o777)
        self.addCleanup(self.check_verdicts)

    def check_verdicts(self):
        paths = glob.glob(os.path.join(self.tmp, "**", "gpuguard.*.jsonl"), recursive=True)
        if paths:
            self.assertEqual(verdict_problems(paths), [])

    def write_policy(self, name, text):
        return write_policy(self.tmp, name, text)

    def torch(self, script, *args, **kw):
        """Run tests/torch/scripts/SCRIPT with ARGS in the chroot; a Run."""
        return run(script, *args, parent=self.tmp, **kw)

    def assertRan(self, run):
        self.assertEqual(run.rc, 0, "exit %d\n--- stdout\n%s\n--- stderr\n%s" %
                         (run.rc, run.out[-4000:], run.err[-4000:]))
        for marker in ("ERROR: AddressSanitizer", "runtime error:"):
            self.assertNotIn(marker, run.err)


def format_size(n):
    """PyTorch's format_size (c10/cuda/CUDACachingAllocator.cpp): its OOM text."""
    if n <= 1024:
        return "%d bytes" % n
    if n <= 1048576:
        return "%.2f KiB" % (n / 1024.0)
    if n <= 1073741824:
        return "%.2f MiB" % (n / 1048576.0)
    return "%.2f GiB" % (n / 1073741824.0)


# ---- tests/torch/rig run: a user's own command in the rig ----------------------

RUN_USAGE = """usage: tests/torch/rig run [--bare] [--gpu NAME,MEMORY,CC] [GPUGUARD-RUN OPTIONS] -- CMD [ARGS...]

Runs CMD (e.g. python3 train.py) in the rig: Debian's PyTorch 2.6 CUDA build on
the fake GPU, under gpuguard as installed (the shim, the Python helper and
gpuguard-run's instrumentation, the shipped policies, built from this
checkout), in the directory it is started from: that directory is mounted in
the chroot for the run, so CMD reads its files there and what it writes (its
journals too) lands there. Paths outside it do not exist in the chroot.

  --bare           without gpuguard (the fakes only): the same run, unguarded
  --gpu SPEC       the fake GPU, as FAKECUDA_DEVICES says it (default
                   "NVIDIA GeForce RTX 3090,24GiB,8.6"; several: ';'-separated)
  other options    gpuguard-run's (--policy, --mode, --headroom, --signal, ...)

Exit status: CMD's; 1 when the rig is not built; 2 on bad usage."""

# What the run copies into the chroot, built from the checkout (the rest of
# $GG_BUILD/fake comes along when it is there).
RUN_NEEDS = ["libgpuguard.so", "gpuguard-check", "fake/libcuda.so.1", "fake/libcudart.so.12",
             "fake/libnvidia-ml.so.1", "fake/libcublas.so.12", "fake/libcublasLt.so.12",
             "fake/libcudnn.so.9"]


def journals_in(directory):
    return {n for n in os.listdir(directory) if n.startswith("gpuguard.") and n.endswith(".jsonl")}


def main(argv):
    """tests/torch/rig run ...: see RUN_USAGE."""
    def usage(why):
        sys.stderr.write("rig run: %s\n%s\n" % (why, RUN_USAGE))
        return 2
    if not argv or argv[0] != "run":
        return usage("unknown command")
    args = argv[1:]
    if args[:1] in (["-h"], ["--help"]):
        print(RUN_USAGE)
        return 0
    if "--" not in args:
        return usage("no command: put it after --")
    opts, cmd = args[:args.index("--")], args[args.index("--") + 1:]
    if not cmd:
        return usage("no command after --")
    bare, devices, run_opts = False, os.environ.get("FAKECUDA_DEVICES") or RTX3090, []
    i = 0
    while i < len(opts):
        o = opts[i]
        if o == "--bare":
            bare = True
        elif o == "--gpu" and i + 1 < len(opts):
            devices = opts[i + 1]
            i += 1
        elif o.startswith("--gpu="):
            devices = o[len("--gpu="):]
        elif o == "--gpu":
            return usage("--gpu needs a SPEC")
        else:
            run_opts.append(o)
        i += 1
    if bare and run_opts:
        return usage("--bare runs without gpuguard: %s is gpuguard-run's" % run_opts[0])
    root = rig_root()
    if root is None:
        sys.stderr.write("rig run: " + HOW + "\n")
        return 1
    missing = [n for n in RUN_NEEDS if not os.path.exists(os.path.join(BUILD, n))]
    if missing and not os.environ.get("GG_BUILD"):
        # the checkout's own build: make what the run copies in
        subprocess.run(["make", "-s", "--no-print-directory", "-C", ROOT] +
                       [os.path.join("build", n) for n in missing])
        missing = [n for n in RUN_NEEDS if not os.path.exists(os.path.join(BUILD, n))]
    if missing:
        sys.stderr.write("rig run: not built in %s: %s (make builds the first two, make demo "
                         "the fakes)\n" % (BUILD, ", ".join(missing)))
        return 1
    s = session()
    here = os.getcwd()
    work = os.path.join(s.host_dir, "work")
    os.makedirs(work)
    inner = s.inside(work)
    before = journals_in(here)
    sys.stderr.write("rig run: %s, in %s (mounted at %s in the rig)%s\n" % (
        " ".join(cmd), here, inner, "; without gpuguard" if bare else
        "; under gpuguard-run %s; journals land there" % " ".join(run_opts)
        if run_opts else "; under gpuguard-run; journals land there"))
    sys.stderr.flush()
    argv = command(cmd, inner, preload=False, devices=devices,
                   env={"PYTHONPATH": s.dir + "/python"},
                   gpuguard_run=None if bare else run_opts, bind=here)
    rc = subprocess.run(argv).returncode
    new = sorted(journals_in(here) - before)
    for name in new:
        sys.stderr.write("rig run: journal %s\n" % os.path.join(here, name))
    if new:
        sys.stderr.write("rig run: read it with: %s %s --substitute-path %s %s\n" % (
            os.path.join(ROOT, "tools", "bin", "gpuguard-report"),
            os.path.join(here, new[0]) if len(new) == 1 else here, inner, here))
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
