#!/usr/bin/env python3
"""Is the output unchanged? A refactoring's proof (docs/testing.md): the same
runs, made with the shim of two trees, leave the same journals, the same
shim lines on stderr and the same report, once what differs from one run to
the next is taken out.

    tests/unchanged/unchanged.py record OUT [--root DIR] [--build DIR] [-j N] [-k NAME]
    tests/unchanged/unchanged.py compare A B
    tests/unchanged/unchanged.py [--base REV] [-j N] [-k NAME]      (make unchanged)

`record` runs every scenario below with the tree at --root (default this
one) and its build (--build, default ROOT/build): its shim, fake CUDA stack,
test programs, Python helper and gpuguard-run; the scenarios' own scripts are
always this tree's, so only the product differs. It writes, per scenario,
NAME.jsonl (the journals, normalized), NAME.err (the shim's `gpuguard:`
lines) and NAME.report (gpuguard-report's text). `compare` says which files
differ, with a diff of each. Without a command: REV (default main) is
exported (git archive) to build/unchanged/REV-SHA/src and built there once,
recorded once (build/unchanged/REV-SHA/out, kept: a second call reuses it),
then this tree is built and recorded (build/unchanged/work) and the two are
compared; the exit status is 1 when anything differs.

The scenarios: real PyTorch 2.6 on the fake GPU (the rig, tests/torch: each
run of tests/torch/scenarios.py, which the golden traces record, and the
workloads of test_torch_workloads.py), skipped, saying so, without the rig;
and programs on the fake stack alone: the scripted CUDA program, the C API
client, a program linked with -lcuda and a Python trainer with the helper
(tests/unchanged/trainer.py).

What differs from one run of the same tree to the next, and is taken out
(normalize()):
- `t`, `wall`, `duration` and every figure in microseconds (`*_us`): clocks;
- `pid`, `ppid`, `host`, thread ids, the pid in a journal's name: the process;
- `ip` of a native frame: where the loader put the module (ASLR); its module
  and offset stay;
- device UUIDs: the fake driver draws them per process;
- the directories a run was made in (the rig session's /tmp/gg-XXXX, a run's
  temporary directory, the tree's own root): named by what they are;
- `sample`, `peak` and `suppressed` events, and the samples in a summary's
  `suppressed` counts: the shim's own thread writes them at intervals of the
  clock (a sample when use moved, a peak as it grows, the budgets' counts
  once a minute), so how many a run has, and where they fall among the other
  events, depends on its speed; what they say is in the summary too (its
  peak and peak sites), which is compared;
- a `torch` event's `asked`: a moment, as `t`.
Everything else must be equal, byte for byte, after the events are written
back with sorted keys.
"""
import argparse
import concurrent.futures
import difflib
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
GiB = 1 << 30
MiB = 1 << 20
RTX3090 = "NVIDIA GeForce RTX 3090,24GiB,8.6"

# ---- what runs --------------------------------------------------------------

ENFORCE = """[gpu]
match = NVIDIA GeForce RTX 3090*
[memory]
headroom = 2 GiB
near_miss = 1 GiB
mode = enforce
[trainer]
signal = SIGUSR2
[journal]
stacks = all
"""

AUTO_TRAINER = """[gpu]
match = *
[memory]
headroom = 10%
near_miss = 5%
mode = auto
[trainer]
signal = none
batch_size = 32
grad_accum = 1
"""


def fake_scenarios():
    """(name, argv relative to the build, policy text, extra environment)."""
    return [
        ("fake-script", ["tests/progs/script", "alloc:10G", "alloc:8G", "alloc:2G", "alloc:4G",
                         "meminfo", "free:1", "api:managed:1G", "nccl:0:1M", "ncclfree",
                         "api:vmm:1G", "api:drv:1G", "api:async:512M", "pool:create:0:device",
                         "api:poolalloc:256M:0", "api:array:1024:1024", "sync", "freeall"], ENFORCE, {}),
        ("fake-advice", ["tests/progs/api", "fill", "1G", "handler", "batch", "32", "1"],
         ENFORCE, {}),
        ("fake-sites", ["tests/progs/api", "sites"], ENFORCE, {}),
        ("fake-drvprog", ["tests/progs/drvprog", "alloc:20G", "v1:512M", "alloc:2G", "pitch:4096:4096",
                          "array:1024:1024", "meminfo", "free:0", "freeall"], ENFORCE, {}),
        ("fake-trainer", ["PYTHON", os.path.join(HERE, "trainer.py"), "FAKE", "12"],
         AUTO_TRAINER, {}),
    ]


def rig_scenarios():
    """(name, script, args, policy text or None for the shipped ones, env,
    through gpuguard-run)."""
    sys.path.insert(0, os.path.join(ROOT, "tests", "torch"))
    from scenarios import SCENARIOS
    out = [("rig-" + name, sc["script"], sc["args"], sc["policy"],
            {"PYTORCH_CUDA_ALLOC_CONF": sc["conf"]}, bool(sc.get("gpuguard_run")))
           for name, sc in sorted(SCENARIOS.items())]
    # test_torch_workloads.py's: unmodified scripts, the shipped policies
    out += [
        ("rig-lm-grow", "lm.py", ["--steps", "60"], None, {}, True),
        ("rig-lm-longtail", "lm.py", ["--lengths", "longtail", "--batch", "24", "--steps", "30"],
         None, {}, True),
        ("rig-lm-leak", "lm.py", ["--lengths", "fixed", "--seq", "512", "--keep", "outputs",
                                  "--steps", "30"], None, {}, True),
        ("rig-lm-recovered", "lm.py", ["--steps", "14"], None, {}, True),
        ("rig-infer", "infer.py", ["--batches", "8"], None, {}, True),
        ("rig-accum", "pf_accum.py", [], None, {}, True),
    ]
    return out


# ---- what is taken out ------------------------------------------------------

DROP_KEYS = {"t", "wall", "duration", "asked", "pid", "ppid", "host", "tid", "ip", "uuid"}
CLOCKED = {"sample", "peak", "suppressed"}


def unclocked(e):
    """A `suppressed` count without the samples the budget left out."""
    sup = e.get("suppressed")
    if isinstance(sup, dict):
        e["suppressed"] = {k: v for k, v in sup.items() if k not in CLOCKED}
    return e


def scrub(obj, paths):
    if isinstance(obj, dict):
        return {k: scrub(v, paths) for k, v in obj.items()
                if k not in DROP_KEYS and not k.endswith("_us")}
    if isinstance(obj, list):
        return [scrub(v, paths) for v in obj]
    if isinstance(obj, str):
        return scrub_text(obj, paths)
    return obj


def scrub_text(text, paths):
    for path, name in sorted(paths, key=lambda p: -len(p[0])):
        text = text.replace(path, name)
    text = re.sub(r"\bGPU-[0-9a-f]{8}-[0-9a-f-]{27}\b", "GPU-UUID", text)
    text = re.sub(r"\bgpuguard\.([\w.-]+?)\.\d+(\.\d+)?\.jsonl", r"gpuguard.\1.PID.jsonl", text)
    text = re.sub(r"\bpid \d+", "pid PID", text)
    return text


def normalize(files, paths):
    """The journals' events, one JSON object a line with sorted keys."""
    lines = []
    for f in sorted(files, key=lambda p: scrub_text(os.path.basename(p), paths)):
        lines.append("# " + scrub_text(os.path.basename(f), paths))
        with open(f) as fh:
            for raw in fh:
                if not raw.strip():
                    continue
                e = json.loads(raw)
                if e.get("ev") in CLOCKED:
                    continue
                lines.append(json.dumps(scrub(unclocked(e), paths), sort_keys=True))
    return "\n".join(lines) + "\n"


def report_text(root, files, paths):
    out = subprocess.run([sys.executable, os.path.join(root, "tools", "bin", "gpuguard-report")]
                         + sorted(files), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, timeout=300)
    text = scrub_text(out.stdout, paths)
    # the clocks, as the report prints them
    text = re.sub(r"\b\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d\b", "DATE", text)
    text = re.sub(r"\b\d+(\.\d+)? ?(s|ms|min|h)\b", "DURATION", text)
    text = re.sub(r"\b[0-9.e+-]+ steps/s\b", "RATE steps/s", text)
    text = re.sub(r"\b0x[0-9a-f]{9,}\b", "ADDRESS", text)
    text = re.sub(r"\b\d+ (lines left out by the journal's budgets)", r"N \1", text)
    text = re.sub(r"\bsample \d+(, )?", "", text)
    return "exit %d\n%s" % (out.returncode, text)


def shim_lines(err, paths):
    return "".join(scrub_text(l, paths) + "\n" for l in err.splitlines()
                   if l.startswith("gpuguard:"))


# ---- recording --------------------------------------------------------------

def write(out, name, journals, err, report):
    for ext, text in ((".jsonl", journals), (".err", err), (".report", report)):
        with open(os.path.join(out, name + ext), "w") as f:
            f.write(text)


def record_fake(root, build, out, name, argv, policy, env_extra):
    run_dir = tempfile.mkdtemp(prefix="unchanged-")
    try:
        pol = os.path.join(run_dir, "policy.ini")
        with open(pol, "w") as f:
            f.write(policy)
        fake = os.path.join(build, "fake")
        argv = [sys.executable if a == "PYTHON" else fake if a == "FAKE" else
                os.path.join(build, a) if a.startswith("tests/") else a for a in argv]
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("GPUGUARD_", "FAKECUDA_")) and k not in ("LD_PRELOAD", "RANK")}
        env.update({"FAKECUDA_DEVICES": RTX3090, "LD_LIBRARY_PATH": fake,
                    "PYTHONPATH": os.path.join(root, "tools", "python"),
                    "GPUGUARD_POLICY": pol, "GPUGUARD_JOURNAL_DIR": run_dir,
                    "LD_PRELOAD": os.path.join(build, "libgpuguard.so")})
        env.update(env_extra)
        proc = subprocess.run(argv, cwd=run_dir, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, timeout=300)
        files = glob.glob(os.path.join(run_dir, "gpuguard.*.jsonl"))
        paths = [(run_dir, "<RUN>"), (build, "<BUILD>"), (root, "<ROOT>"), (ROOT, "<ROOT>")]
        err = "exit %d\n%s" % (proc.returncode, shim_lines(proc.stderr, paths))
        write(out, name, normalize(files, paths), err, report_text(root, files, paths))
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


def rig_setup(root, build):
    """The rig's module, pointed at the tree under test (its shim, fakes,
    helper and gpuguard-run); None without the rig."""
    os.environ["GG_BUILD"] = build
    sys.path.insert(0, os.path.join(ROOT, "tests", "torch"))
    import torchrig
    torchrig.ROOT = root
    torchrig.BUILD = build
    if not torchrig.rig_root():
        return None
    # a session holds copies of one tree's shim, fakes and helper: a second
    # tree recorded in this process needs its own
    torchrig._session = None
    torchrig.session()  # made once, before the runs side by side
    return torchrig


def record_rig(torchrig, root, out, name, script, args, policy, env, through_run):
    s = torchrig.session()
    where = tempfile.mkdtemp(prefix="u-", dir=s.host_dir)
    os.chmod(where, 0o777)
    pol = torchrig.write_policy(where, "policy.ini", policy) if policy else None
    run = torchrig.run(script, *args, policy=pol, parent=where, env=env,
                       gpuguard_run=[] if through_run else None)
    paths = [(run.dir, "<RUN>"), (s.inside(run.dir), "<RUN>"), (where, "<DIR>"),
             (s.inside(where), "<DIR>"), (s.host_dir, "<SESSION>"), (s.dir, "<SESSION>")]
    err = "exit %d\n%s" % (run.rc, shim_lines(run.err, paths))
    write(out, name, normalize(run.files, paths), err, report_text(root, run.files, paths))


def record(out, root, build, jobs, pattern):
    os.makedirs(out, exist_ok=True)
    for f in glob.glob(os.path.join(out, "*")):
        os.unlink(f)
    todo = []
    for name, argv, policy, env in fake_scenarios():
        todo.append((name, record_fake, (root, build, out, name, argv, policy, env)))
    torchrig = rig_setup(root, build)
    if torchrig is None:
        print("unchanged: no real-PyTorch rig (make torch-rig): the rig's scenarios are not run")
    else:
        for name, script, args, policy, env, through in rig_scenarios():
            todo.append((name, record_rig, (torchrig, root, out, name, script, args, policy, env,
                                            through)))
    todo = [t for t in todo if not pattern or pattern in t[0]]
    t0 = time.time()
    failed = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = {pool.submit(fn, *a): name for name, fn, a in todo}
        for fut in concurrent.futures.as_completed(futures):
            try:
                fut.result()
            except Exception as e:  # a scenario that cannot run is a failure to say
                failed.append("%s: %r" % (futures[fut], e))
    print("unchanged: recorded %d scenarios with %s in %.0f s%s" % (
        len(todo) - len(failed), root, time.time() - t0, "".join("\n  failed " + f for f in failed)))
    return 1 if failed else 0


# ---- comparing --------------------------------------------------------------

def compare(a, b, context=3, most=60):
    names = sorted(set(os.listdir(a)) | set(os.listdir(b)))
    differ = []
    for n in names:
        pa, pb = os.path.join(a, n), os.path.join(b, n)
        if not (os.path.exists(pa) and os.path.exists(pb)):
            differ.append(n)
            print("unchanged: %s only in %s" % (n, a if os.path.exists(pa) else b))
            continue
        with open(pa) as fa, open(pb) as fb:
            la, lb = fa.read().splitlines(), fb.read().splitlines()
        if la != lb:
            differ.append(n)
            diff = list(difflib.unified_diff(la, lb, pa, pb, lineterm="", n=context))
            print("\n".join(l[:400] for l in diff[:most]))
            if len(diff) > most:
                print("... %d more lines of diff" % (len(diff) - most))
    scen = len({n.rsplit(".", 1)[0] for n in names})
    if differ:
        print("unchanged: %d of %d files differ (%d scenarios)" % (len(differ), len(names), scen))
        return 1
    print("unchanged: the same: %d files, %d scenarios" % (len(names), scen))
    return 0


# ---- the whole check --------------------------------------------------------

def build_tree(root, jobs):
    targets = ["all", "build/tests/progs/script", "build/tests/progs/api",
               "build/tests/progs/drvprog", "build/fake/libtorchlike.so",
               "build/fake/libcuda.so.1", "build/fake/libcudart.so.12",
               "build/fake/libnvidia-ml.so.1", "build/fake/libcublas.so.12",
               "build/fake/libcublasLt.so.12", "build/fake/libcudnn.so.9",
               "build/fake/libnccllike.so"]
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
    subprocess.run(["make", "-s", "--no-print-directory", "-C", root, "-j%d" % jobs] + targets,
                   check=True, env=env)


def whole(base, jobs, pattern):
    sha = subprocess.run(["git", "-C", ROOT, "rev-parse", "--verify", base + "^{commit}"],
                         stdout=subprocess.PIPE, text=True, check=True).stdout.strip()
    top = os.path.join(ROOT, "build", "unchanged")
    base_dir = os.path.join(top, "%s-%s" % (re.sub(r"[^\w.-]", "_", base), sha[:12]))
    src = os.path.join(base_dir, "src")
    # the whole record, or one for -k alone when there is none yet
    base_out, done = os.path.join(base_dir, "out"), os.path.join(base_dir, "recorded")
    if pattern and not os.path.exists(done):
        tag = re.sub(r"[^\w.-]", "_", pattern)
        base_out = os.path.join(base_dir, "out-k-" + tag)
        done = os.path.join(base_dir, "recorded-k-" + tag)
    if not os.path.exists(done):
        if not os.path.exists(os.path.join(src, "Makefile")):
            os.makedirs(src, exist_ok=True)
            archive = subprocess.Popen(["git", "-C", ROOT, "archive", sha], stdout=subprocess.PIPE)
            subprocess.run(["tar", "-x", "-C", src], stdin=archive.stdout, check=True)
            if archive.wait() != 0:
                raise SystemExit("unchanged: git archive %s failed" % sha)
        print("unchanged: %s (%s): building in %s" % (base, sha[:12], src))
        build_tree(src, jobs)
        if record(base_out, src, os.path.join(src, "build"), jobs, pattern):
            return 1
        open(done, "w").close()
    print("unchanged: this tree: building")
    build_tree(ROOT, jobs)
    work_out = os.path.join(top, "work")
    if record(work_out, ROOT, os.path.join(ROOT, "build"), jobs, pattern):
        return 1
    if pattern:
        keep = {n for n in os.listdir(work_out)}
        tmp = tempfile.mkdtemp(prefix="unchanged-base-")
        for n in keep & set(os.listdir(base_out)):
            shutil.copy2(os.path.join(base_out, n), tmp)
        base_out = tmp
    print("unchanged: %s (%s) against this tree" % (base, sha[:12]))
    return compare(base_out, work_out)


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("command", nargs="?", choices=["record", "compare"])
    ap.add_argument("dirs", nargs="*")
    ap.add_argument("--root", default=ROOT)
    ap.add_argument("--build")
    ap.add_argument("--base", default="main")
    ap.add_argument("-j", type=int, default=os.cpu_count() or 2)
    ap.add_argument("-k", default="")
    a = ap.parse_args(argv)
    if a.command == "record":
        if len(a.dirs) != 1:
            ap.error("record OUT")
        root = os.path.abspath(a.root)
        return record(os.path.abspath(a.dirs[0]), root,
                      os.path.abspath(a.build or os.path.join(root, "build")), a.j, a.k)
    if a.command == "compare":
        if len(a.dirs) != 2:
            ap.error("compare A B")
        return compare(*a.dirs)
    return whole(a.base, a.j, a.k)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
