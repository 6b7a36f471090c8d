"""gpuguard-preflight: "will it fit?", answered before launch, with the
user's own script and real PyTorch, on a simulated GPU of each model
(docs/preflight.md). console() is what tools/bin/gpuguard-preflight runs.

Which runs it makes, and why. PyTorch's caching allocator decides from the
sizes asked for, not from values; the device's total memory enters its
decisions only where memory runs out (it empties its cache and retries) and
in a few sizes PyTorch picks from the device (cuBLASLt's workspace is 1 MiB
below 24 GiB on Ampere, 4 MiB above; cuBLAS's 32 MiB on Hopper; by compute
capability). So each GPU model gets a run on a simulated device of exactly
that model (name, total memory, compute capability), with what a real GPU
holds outside PyTorch charged to it (the CUDA context, each cuBLAS handle's
own memory): when that run stays under the policy's limit, it is the answer
(a run under the limit would have made the same calls). Only near the edge
does a model get more runs: under the limit itself (gpuguard's enforce mode:
PyTorch may stay under it by emptying its cache), and, when the model's whole
memory is too small, on a larger simulated device of the same model, to say
what the script needs.
"""
import argparse
import json
import os
import shutil
import sys
import tempfile
import time

from .. import __version__ as VERSION
from ..report.formatting import fmt_bytes
from . import answer as ans
from . import models as gpu_models
from . import runner

TiB = 1 << 40
#: Rounds of runs at the batch the line predicts, at most.
CHECK_ROUNDS = 3

EXIT_FITS, EXIT_NOT_ALL, EXIT_USAGE, EXIT_NO_ANSWER = 0, 1, 2, 3


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="gpuguard-preflight",
        usage="gpuguard-preflight [OPTIONS] -- CMD [ARGS...]",
        description="Will it fit? Runs CMD unmodified for a few optimizer steps on a simulated "
                    "GPU of each model, with real PyTorch and no GPU, and says per model the "
                    "peak PyTorch reserved, what a real GPU adds, whether it fits under the "
                    "policy's limit and the largest batch that does. The script's writes go "
                    "to a throwaway layer; it has no network.",
        epilog="exit status: 0 every model fits, 1 some model does not (or only without the "
               "policy's headroom), 2 bad usage, 3 no answer (the script failed otherwise, no "
               "PyTorch CUDA build, no throwaway layer). docs/preflight.md says what it "
               "measures, what it estimates and what it cannot see.")
    p.add_argument("--gpu", action="append", default=[], metavar="MODEL",
                   help="a GPU model: a policy's model (rtx-3090, h100-80gb, ...) or "
                        "\"NAME,MEMORY,CC\" (e.g. \"NVIDIA GeForce RTX 3090,24GiB,8.6\"); "
                        "repeat for more (default: the models of the policies)")
    p.add_argument("--steps", type=int, default=20, metavar="N",
                   help="optimizer steps to run, then stop the script (default 20; 0: let it "
                        "run to its end)")
    p.add_argument("--time", type=float, default=600, metavar="SECONDS",
                   help="stop a run after this long, whatever its step (default 600)")
    p.add_argument("--batch", metavar="B,...",
                   help="run the command once per value, {batch} in it replaced by the value")
    p.add_argument("--policy", metavar="DIR",
                   help="the policies whose limits apply (default: the installed ones)")
    p.add_argument("--out", metavar="DIR",
                   help="write the next run's policy files there (as gpuguard-report "
                        "--recommend --out does): for GPUGUARD_POLICY=DIR")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.add_argument("--jobs", type=int, default=0, metavar="N",
                   help="runs at once (default: the CPUs, at most 4)")
    p.add_argument("--keep", metavar="DIR",
                   help="keep each run's journal, output and figures in DIR")
    p.add_argument("--version", action="version", version="gpuguard-preflight " + VERSION)
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="CMD",
                   help="the command to run, after --: python train.py ARGS")
    opts = p.parse_args(argv)
    cmd = opts.command
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        p.error("no command to run (gpuguard-preflight [OPTIONS] -- CMD [ARGS...])")
    opts.command = cmd
    if opts.steps < 0 or opts.time <= 0:
        p.error("--steps must be 0 or more and --time positive")
    opts.batches = [None]
    if opts.batch:
        try:
            opts.batches = sorted({int(x) for x in opts.batch.split(",") if x.strip()})
        except ValueError:
            p.error("--batch takes whole numbers separated by commas, e.g. 8,16")
        if not opts.batches or min(opts.batches) < 1:
            p.error("--batch takes positive whole numbers")
        if not any("{batch}" in a for a in cmd):
            p.error("--batch needs {batch} in the command, where each value goes")
    elif any("{batch}" in a for a in cmd):
        p.error("the command has {batch} but no --batch values to put there")
    return opts, p


class Context(object):
    def __init__(self, argv, torch, steps, batches):
        self.argv = argv
        self.torch = torch
        self.steps = steps
        self.batches = batches


def _models(opts, paths, parser):
    keys = None
    if os.path.isdir(paths.policy):
        keys = {n[:-4] for n in os.listdir(paths.policy) if n.endswith(".ini")}
    out = []
    try:
        for g in opts.gpu:
            out.append(gpu_models.parse_gpu(g))
    except ValueError as e:
        parser.error(str(e))
    if not out:
        out = gpu_models.shipped(keys or set())
        if not out:
            parser.error("no --gpu given and no known GPU model among the policies in %s" %
                         paths.policy)
    return out


class Scheduler(object):
    """Runs at most `jobs` at once; each run's result handed to a callback,
    which may queue more."""

    def __init__(self, jobs, start):
        self.jobs = jobs
        self.start = start
        self.queue = []
        self.running = []

    def add(self, spec, then):
        self.queue.append((spec, then))

    def run(self):
        while self.queue or self.running:
            while self.queue and len(self.running) < self.jobs:
                spec, then = self.queue.pop(0)
                proc, done = self.start(spec)
                self.running.append((proc, done, then))
            for item in list(self.running):
                proc, done, then = item
                if proc.poll() is not None:
                    self.running.remove(item)
                    then(done())
            time.sleep(0.05)


def main(bindir, argv=None):
    opts, parser = parse_args(sys.argv[1:] if argv is None else argv)
    paths = runner.Paths(bindir, policy=opts.policy)
    missing = paths.check()
    if missing:
        sys.stderr.write("gpuguard-preflight: %s\n" % missing)
        return EXIT_NO_ANSWER
    models = _models(opts, paths, parser)
    base_env = dict(os.environ)
    cwd = os.getcwd()
    torch = runner.find_torch(opts.command, base_env)
    if torch.cuda is None and (torch.dir is not None or torch.why.endswith("has no torch")):
        sys.stderr.write("gpuguard-preflight: %s: nothing would run on a GPU (PyTorch's CUDA "
                         "build is pip's default on Linux: pip install torch)\n" % torch.why)
        return EXIT_NO_ANSWER
    cuda = torch.cuda or 12
    jobs = opts.jobs or min(4, os.cpu_count() or 1)
    workdir = tempfile.mkdtemp(prefix="gpuguard-preflight.")
    os.chmod(workdir, 0o755)
    steps = opts.steps

    def start(spec):
        return runner.start(paths, torch, spec, workdir, base_env, cwd, steps, opts.time)

    sched = Scheduler(max(1, jobs), start)
    table = {}      # (batch, model key) -> ans.Batch

    def argv_for(b):
        return [a.replace("{batch}", str(b)) for a in opts.command] if b is not None \
            else list(opts.command)

    def charges(m):
        ctx = gpu_models.outside(m.name, cuda, "context")
        blas = gpu_models.outside(m.name, cuda, "cublas_handle")
        return (ctx.bytes if ctx else 0), (blas.bytes if blas else 0)

    def fit_done(b):
        def then(r):
            b.fit = r
            d = r.device
            if d is not None:
                b.limit, b.near, b.headroom = d.limit, d.near, d.headroom
                b.total = d.total or b.total
            b.outside = ans.Outside(b.model, cuda, r.handles, r.dist)
        return then

    def on_limit(b):
        def then(r):
            b.limit_run = r
            ans.settle(b)
        return then

    def checked(b):
        def then(r):
            fit_done(b)(r)
            if b.limit is not None and not r.failure:
                ans.plan_followups(b)      # the verdict when no other run is needed
        return then

    def on_need(batches):
        def then(r):
            for b in batches:
                b.need_run = r
        return then

    for bv in opts.batches:
        for m in models:
            b = table[(bv, m.key)] = ans.Batch(m, bv)
            ctx, blas = charges(m)
            sched.add(runner.Spec(m, bv, argv_for(bv), "fit", "observe", context=ctx,
                                  cublas=blas), fit_done(b))

    def followups():
        """Runs under the limit where the fit run came near it; a run on a
        larger device where a model's whole memory was too small, shared by
        the models of one compute capability, or taken from a larger
        model's clean run of the same capability (a larger device too)."""
        needs = {}
        for b in table.values():
            if b.fit is None:
                continue
            if b.limit is None and not b.fit.failure:
                b.failure = "the run left no journal: did the script use the GPU?"
                continue
            for what in ans.plan_followups(b):
                ctx, blas = charges(b.model)
                if what == "limit":
                    sched.add(runner.Spec(b.model, b.batch, argv_for(b.batch), "limit",
                                          "enforce", context=ctx, cublas=blas), on_limit(b))
                else:
                    needs.setdefault((b.batch, b.model.cc), []).append(b)
        for (bv, cc), group in needs.items():
            donors = [o for o in table.values() if o.batch == bv and o.model.cc == cc and
                      o.fit is not None and o.fit.completed and not o.fit.flushes and
                      o.model.total > max(g.model.total for g in group)]
            if donors:
                on_need(group)(max(donors, key=lambda o: o.model.total).fit)
                continue
            m = max((g.model for g in group), key=lambda x: x.total)
            _, blas = charges(m)
            sched.add(runner.Spec(m, bv, argv_for(bv), "need", "observe",
                                  total=max(TiB, 4 * m.total), cublas=blas), on_need(group))

    began = time.monotonic()
    answers = [ans.ModelAnswer(m, [table[(bv, m.key)] for bv in opts.batches]) for m in models]
    try:
        sched.run()
        refused = [b.fit.outcome.refused for b in table.values()
                   if b.fit is not None and b.fit.outcome.refused]
        if refused:
            sys.stderr.write("gpuguard-preflight: refused to run the script: no throwaway layer "
                             "for its writes: %s\nNothing ran.\n" % refused[0])
            shutil.rmtree(workdir, ignore_errors=True)
            return EXIT_NO_ANSWER
        followups()
        sched.run()
        # The largest batch that fits is one a run showed: a batch the line
        # predicts is run (on the model, as its fit runs), then the line is
        # drawn again with it, a few rounds at most.
        for _ in range(CHECK_ROUNDS):
            for a in answers:
                a.settle_batches(final=False)
                if a.to_check is not None:
                    b = ans.Batch(a.model, a.to_check)
                    a.checks.append(b)
                    ctx, blas = charges(a.model)
                    sched.add(runner.Spec(a.model, b.batch, argv_for(b.batch), "fit", "observe",
                                          context=ctx, cublas=blas), checked(b))
            if not sched.queue:
                break
            sched.run()
    except KeyboardInterrupt:
        for proc, _, _ in sched.running:
            proc.wait()
        sys.stderr.write("gpuguard-preflight: interrupted\n")
        shutil.rmtree(workdir, ignore_errors=True)
        return 130
    took = time.monotonic() - began
    for a in answers:
        a.settle_batches(final=True)
    runs = []
    for b in list(table.values()) + [c for a in answers for c in a.checks]:
        for r in (b.fit, b.limit_run, b.need_run):
            if r is not None and all(r is not x for x in runs):
                runs.append(r)
    limits = limits_seen(answers, runs, torch, steps)
    ctx = Context(opts.command, torch, steps, opts.batches)
    written = {}
    if opts.out:
        try:
            written = ans.write_out(answers, opts.out, opts.command)
        except OSError as e:
            sys.stderr.write("gpuguard-preflight: %s: %s\n" % (e.filename, e.strerror))
            return EXIT_NO_ANSWER
    # the steps the figures cover: those of the runs the peaks come from
    measured = [b.source_run.reached for b in table.values()
                if b.source_run is not None and b.source_run.reached]
    if opts.json:
        obj = {"models": [a.json() for a in answers],
               "steps": min(measured) if measured else 0,
               "limits": limits}
        sys.stdout.write(json.dumps(obj, indent=1) + "\n")
    else:
        lines = ans.text(answers, ctx)
        lines += wrote_text(runs)
        if limits:
            lines += ["", "What it could not see:"] + ["  - " + l for l in limits]
        if written:
            lines += ["", "Policies for the next run (GPUGUARD_POLICY=%s):" % opts.out]
            lines += ["  %s: %s" % (k, v) for k, v in written.items()]
        elif opts.out:
            lines += ["", "No policy written: it needs --batch with two values that ran "
                          "(a line of the need against the batch)"]
        lines.append("")
        lines.append("%d run%s on the simulated GPU in %.1f s (%d at once)" % (
            len(runs), "" if len(runs) == 1 else "s", took, max(1, jobs)))
        sys.stdout.write("\n".join(lines) + "\n")
    if opts.keep:
        keep(runs, opts.keep)
    shutil.rmtree(workdir, ignore_errors=True)
    tops = [a.top for a in answers]
    if any(t.verdict is None for t in tops):
        return EXIT_NO_ANSWER
    return EXIT_FITS if all(t.verdict == ans.FITS for t in tops) else EXIT_NOT_ALL


def wrote_text(runs):
    """What the script wrote, in its first run's throwaway layer."""
    fit = [r for r in runs if r.spec.kind == "fit"]
    if not fit:
        return []
    r = fit[0]
    w = [x for x in r.outcome.written if not x["path"].startswith(r.dir)]
    out = ["", "What the script wrote (in the throwaway layer, discarded: your files are "
               "unchanged):"]
    if not w:
        out.append("  nothing")
    for x in w[:20]:
        size = " (%s)" % fmt_bytes(x["bytes"]) if x["what"] == "file" else ""
        out.append("  %s %s%s" % (x["what"], x["path"], size))
    if len(w) > 20:
        out.append("  ... %d more" % (len(w) - 20))
    return out


def limits_seen(answers, runs, torch, steps):
    """What this preflight could not see, said per thing found."""
    out = []
    if torch.cuda is None:
        out.append("which CUDA the command's PyTorch links could not be told (%s): the "
                   "simulated CUDA 12 libraries were preloaded" % torch.why)
    fit = [r for r in runs if r.spec.kind == "fit"]
    first = fit[0] if fit else None
    if first is not None:
        seen = set()
        for s in first.sites:
            key = (s["kind"], s["file"], s["line"])
            if key in seen:
                continue
            seen.add(key)
            where = "%s:%s" % (s["file"], s["line"])
            if s["kind"] == "value":
                out.append("%s reads a value back from the GPU (%s, %d times): on the "
                           "simulated GPU it is 0; control flow that depends on it (early "
                           "stopping, skipped steps) may differ from a real run" % (
                               where, s["op"], s["count"]))
            elif s["kind"] == "shape":
                out.append("%s makes a shape from values (%s, %d times): on the simulated "
                           "GPU values are 0, so that shape (and the memory it takes) may "
                           "differ from a real run" % (where, s["op"], s["count"]))
            elif s["kind"] == "device":
                out.append("%s asks the device (%s): a script that sizes itself from the "
                           "GPU's memory sizes itself from the simulated one's" % (
                               where, s["op"]))
        shapes = [tuple(x.get("shape") or ()) for x in first.steps if x.get("shape")]
        if len(set(shapes)) > 1:
            small = min(shapes, key=lambda t: _prod(t))
            large = max(shapes, key=lambda t: _prod(t))
            out.append("the input's shape changed between steps ([%s] to [%s]): the peak is "
                       "that of the largest input in these %d steps; real data may bring a "
                       "larger one later" % (", ".join(map(str, small)),
                                             ", ".join(map(str, large)), len(first.steps)))
        if steps and first.completed and first.reached < steps and first.outcome.status == 0:
            out.append("the script ended after %d optimizer steps, before the %d asked for" %
                       (first.reached, steps))
        if first.completed and not first.steps:
            out.append("no optimizer step was seen (an inference loop, or no "
                       "torch.optim optimizer): the peak is the whole run's")
        if first.dist:
            out.append("torch.distributed with %s: NCCL cannot run on the simulated GPU; "
                       "each communicator's buffers are estimated" % first.dist.get("backend"))
        for note in first.outcome.notes:
            out.append(note)
    if any(r.outcome.timed_out for r in runs):
        out.append("a run was stopped by the time limit (--time) before its steps")
    out.append("memory outside PyTorch (the CUDA context, cuBLAS handles, NCCL) is estimated "
               "from published figures, not measured: a real GPU's driver and libraries differ")
    out.append("kernels do not run on the simulated GPU: which cuDNN algorithm (and workspace) "
               "a real GPU picks, and memory its kernels load lazily, are not seen")
    out.append("PyTorch's peak statistics were reset at each step boundary, to measure each "
               "step's own peak (max_memory_reserved() in the script saw its step's)")
    return out


def _prod(t):
    n = 1
    for x in t:
        n *= x
    return n


def keep(runs, outdir):
    os.makedirs(outdir, exist_ok=True)
    for i, r in enumerate(runs, 1):
        name = "%02d-%s-%s%s" % (i, r.spec.kind, r.spec.model.key.replace("/", "_")[:40],
                                 "-b%d" % r.spec.batch if r.spec.batch is not None else "")
        name = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
        shutil.copytree(r.dir, os.path.join(outdir, name))


def console(bindir, argv=None):
    try:
        sys.stdout.reconfigure(errors="replace")
    except AttributeError:
        pass
    return main(bindir, argv)
