#!/usr/bin/env python3
"""gpuguard on a real GPU with real PyTorch (docs/testing.md).

    python3 tests/gpu/run_gpu.py [NAME...]

Every check runs a child Python under LD_PRELOAD=$GG_BUILD/libgpuguard.so
(default build/) with a policy sized from the device's total memory, and reads
the journal it leaves:

  peak        a few training steps with PyTorch's default allocator: the
              journal's peak is torch.cuda.max_memory_reserved() exactly (the
              allocator's bytes; memory of other libraries is reported), its
              peak_used agrees with torch.cuda.mem_get_info()
  refusal     a policy that leaves less than the step needs: the step raises
              torch.OutOfMemoryError, the journal has refused and near_miss
              events whose stacks show libc10_cuda, the process carries on
  helper      the same model with gpuguard.Guard and a growing sequence
              length: advised before any refusal, shrinks, keeps its
              effective batch, finishes
  meminfo     torch.cuda.mem_get_info() answers with the policy's limit as
              the total (virtualize_meminfo = yes), the device's without
  overhead    median step time with and without the shim, several runs
              alternated; reported as a ratio, never asserted
  expandable  PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True: the journal
              sees cuMemCreate
  nccl        a one-rank NCCL all_reduce: the journal sees memory that
              PyTorch's allocator does not own (skipped without NCCL)
  instrument  gpuguard-run on tests/torch/scripts, unmodified: an OOM in
              backward named by autograd node and .backward() line with
              PyTorch's view; a kept graph is a leak with its tensors by
              line; steps from the optimizer hook
  preflight   gpuguard-preflight of an unmodified small transformer on a
              simulated GPU of this model, then the same script on the GPU:
              the predicted peak within 2% of max_memory_reserved() at the
              same step; the predicted device use against the device's
              own (recorded); the pip wheel's libraries stood in for by SONAME
  sizing      Guard.run sizing each batch by its shape: a small transformer on
              long-tailed documents, a near-miss line between the 4th and
              5th highest unsplit peaks (measured alone in observe): the
              batches that cross it split, at least 56 of 60 whole, nothing
              refused or flushed after the first 10

Prints one result line per check and "N passed, N failed"; the figures go to
$GG_BUILD/gpu-report.json. With --traces DIR every run under the shim also
records its calls (GPUGUARD_TRACE), and each passing check's runs are made
golden traces in DIR (gpu-CHECK-N.trace, tests/traces/README.md), which
`make test` replays on machines without a GPU once they are copied into
tests/traces. Without PyTorch, or without a GPU that PyTorch
sees, prints "SKIP: no PyTorch" / "SKIP: no GPU" and exits 0. Exit status 1
when a check failed. Standard library (and torch in the children).
"""

import glob
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
BUILD = os.environ.get("GG_BUILD") or "build"
if not os.path.isabs(BUILD):
    BUILD = os.path.join(ROOT, BUILD)
SHIM = os.path.join(BUILD, "libgpuguard.so")
PYHELPER = os.path.join(ROOT, "tools", "python")
POLICY_DIR = os.path.join(ROOT, "policy")
REPORT_JSON = os.path.join(BUILD, "gpu-report.json")

MiB, GiB = 1 << 20, 1 << 30
CHILD_TIMEOUT = 600

# The model of every check: `layers` x (Linear(h, h, bias=False), GELU), fp32,
# Adam. Two saved activations of batch x seq x h floats per layer.
PRELUDE = textwrap.dedent("""\
    import json, os, statistics, sys, time
    import torch

    OOM = getattr(torch, "OutOfMemoryError", None) or torch.cuda.OutOfMemoryError


    def result(**kw):
        print("RESULT " + json.dumps(kw))
        sys.stdout.flush()


    class Net(torch.nn.Module):
        def __init__(self, h, layers):
            super().__init__()
            self.h = h
            self.body = torch.nn.Sequential(*[m for _ in range(layers) for m in
                                              (torch.nn.Linear(h, h, bias=False),
                                               torch.nn.GELU())])

        def forward(self, x):
            return self.body(x)


    def make(h=1024, layers=8):
        torch.manual_seed(0)
        model = Net(h, layers).cuda()
        opt = torch.optim.Adam(model.parameters(), lr=1e-5)
        return model, opt


    def step(model, opt, batch, seq, accum=1):
        for _ in range(accum):
            x = torch.randn(batch, seq, model.h, device="cuda")
            loss = model(x).square().mean() / accum
            del x
            loss.backward()
            del loss
        opt.step()
        opt.zero_grad(set_to_none=True)


    def warm(model, opt):
        # every kernel, cuBLAS and Adam's state loaded before anything is measured
        step(model, opt, 1, 8)
        torch.cuda.synchronize()
    """)


# ---- running children ---------------------------------------------------------

class Child(object):
    """One child Python: exit code, output, RESULT, journal events."""

    def __init__(self, proc, journal_dir):
        self.rc = proc.returncode
        self.out = proc.stdout
        self.err = proc.stderr
        self.result = None
        for line in self.out.splitlines():
            if line.startswith("RESULT "):
                self.result = json.loads(line[len("RESULT "):])
        self.events = []
        self.files = sorted(glob.glob(os.path.join(journal_dir, "gpuguard.*.jsonl")))
        for path in self.files:
            with open(path) as f:
                for line in f:
                    if line.strip():
                        try:
                            self.events.append(json.loads(line))
                        except ValueError:
                            pass

    def of(self, ev):
        return [e for e in self.events if e.get("ev") == ev]

    def summary(self, dev=0):
        found = self.of("summary")
        if not found:
            raise CheckError("no summary in the journal (rc %s): %s" % (self.rc, self.tail()))
        return found[-1]["devices"][dev]

    def start(self, dev=0):
        found = self.of("start")
        if not found:
            raise CheckError("no start event in the journal (rc %s): %s" % (self.rc, self.tail()))
        return found[0]["devices"][dev]

    def need(self):
        """The RESULT, or a failure that shows why there is none."""
        if self.rc != 0 or self.result is None:
            raise CheckError("child failed (rc %s): %s" % (self.rc, self.tail()))
        return self.result

    def tail(self, n=15):
        lines = (self.err or "").strip().splitlines()
        return "\n    " + "\n    ".join(lines[-n:]) if lines else "(no stderr)"


class CheckError(Exception):
    pass


class Skip(Exception):
    pass


class Runner(object):
    def __init__(self, tmp, traces=False):
        self.tmp = tmp
        self.n = 0
        self.traces = traces
        self.children = []  # (check's directory, child) run under the shim

    def env(self, preload, policy, extra):
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("GPUGUARD_", "FAKECUDA_"))
               and k not in ("LD_PRELOAD", "RANK", "PYTORCH_CUDA_ALLOC_CONF")}
        env["PYTHONPATH"] = PYHELPER + (os.pathsep + env["PYTHONPATH"]
                                        if env.get("PYTHONPATH") else "")
        env["PYTHONUNBUFFERED"] = "1"
        if preload:
            env["LD_PRELOAD"] = SHIM
            env["GPUGUARD_POLICY"] = policy or POLICY_DIR
        env.update({k: str(v) for k, v in (extra or {}).items()})
        return env

    def python(self, name, body, policy=None, preload=True, extra=None):
        """Run PRELUDE + body as <tmp>/<name>.py, under the shim unless told."""
        self.n += 1
        d = os.path.join(self.tmp, "%02d-%s" % (self.n, name))
        os.makedirs(d)
        path = os.path.join(d, name + ".py")
        with open(path, "w") as f:
            f.write(PRELUDE + "\n" + textwrap.dedent(body))
        env = self.env(preload, None, extra)
        if preload:
            if policy is not None:
                ppath = os.path.join(d, "policy.ini")
                with open(ppath, "w") as f:
                    f.write(policy)
                env["GPUGUARD_POLICY"] = ppath
            env["GPUGUARD_JOURNAL_DIR"] = d
            if self.traces:
                env["GPUGUARD_TRACE"] = os.path.join(d, "trace.%p")
        proc = subprocess.run([sys.executable, path], cwd=d, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, timeout=CHILD_TIMEOUT)
        child = Child(proc, d)
        child.path = path
        child.dir = d
        child.env = extra or {}
        if preload:
            self.children.append(child)
        return child


def golden_traces(children, name, out_dir, info):
    """The runs of a passing check as golden traces (tests/traces/tracefmt.py):
    one per process that left a trace and a journal."""
    made = []
    cuda_major = int(str(info.get("cuda") or "12").split(".")[0])
    for k, child in enumerate(children, 1):
        for trace in sorted(glob.glob(os.path.join(child.dir, "trace.*"))):
            pid = trace.rsplit(".", 1)[1]
            journals = [j for j in child.files if j.endswith(".%s.jsonl" % pid)]
            if not journals:
                continue
            try:
                summ = [json.loads(l) for l in open(journals[0]) if '"summary"' in l][-1]["devices"][0]
            except (OSError, ValueError, IndexError, KeyError):
                continue
            # The device held this much beside the process at its peak: the
            # context and other processes, as near as the journal can say.
            context = max(0, int(summ.get("peak_used", 0)) - int(summ.get("peak", 0)))
            out = os.path.join(out_dir, "gpu-%s-%d.trace" % (name, k))
            argv = [sys.executable, os.path.join(ROOT, "tests", "traces", "tracefmt.py"), trace,
                    journals[0], "--runtime", str(cuda_major), "--context", str(context),
                    "--source", "PyTorch %s, CUDA %s, on a real %s (tests/gpu)"
                    % (info.get("torch"), info.get("cuda"), info.get("name")),
                    "--script", "tests/gpu/run_gpu.py %s" % name, "-o", out]
            argv += ["--env", "PYTORCH_CUDA_ALLOC_CONF=%s" % child.env.get("PYTORCH_CUDA_ALLOC_CONF", "")]
            if subprocess.run(argv).returncode == 0:
                made.append(out)
    return made


def policy(headroom, near_miss, stacks="near_miss", depth=32, virtualize="yes", mode="enforce"):
    """A policy for whatever GPU this is; sizes in bytes."""
    return textwrap.dedent("""\
        ; written by tests/gpu/run_gpu.py
        [gpu]
        match = *
        [memory]
        headroom = {headroom}
        near_miss = {near_miss}
        mode = {mode}
        enforce = runtime
        virtualize_meminfo = {virtualize}
        [trainer]
        signal = SIGUSR2
        [journal]
        stacks = {stacks}
        depth = {depth}
        """).format(headroom=max(0, int(headroom)), near_miss=max(0, int(near_miss)),
                    mode=mode, virtualize=virtualize, stacks=stacks, depth=depth)


def fmt(n):
    n = float(n)
    sign = "-" if n < 0 else ""
    n = abs(n)
    for unit, size in (("GiB", GiB), ("MiB", MiB), ("KiB", 1024)):
        if n >= size:
            return "%s%.2f %s" % (sign, n / size, unit)
    return "%s%d B" % (sign, n)


def modules(stack):
    return [(f.get("module") or "") for f in stack or []]


def mentions(stack, word):
    word = word.lower()
    return any(word in (f.get("module") or "").lower() or word in (f.get("sym") or "").lower()
               for f in stack or [])


def c10(stack):
    return any("libc10_cuda" in m for m in modules(stack))


def site_split(summary):
    """Bytes at the peak: PyTorch's allocator (a libc10_cuda frame), others
    by the module of their innermost named frame, and bytes without a stack."""
    mine, others, unattributed = 0, {}, 0
    for site in summary.get("peak_sites") or []:
        stack, nbytes = site.get("stack") or [], int(site.get("bytes") or 0)
        if not stack:
            unattributed += nbytes
        elif c10(stack):
            mine += nbytes
        else:
            mod = os.path.basename(next((m for m in modules(stack) if m), "?"))
            others[mod] = others.get(mod, 0) + nbytes
    return mine, others, unattributed


# ---- the checks ------------------------------------------------------------

def check_peak(r, dev):
    """Journal peak == torch.cuda.max_memory_reserved(); peak_used agrees
    with torch.cuda.mem_get_info()."""
    total = dev["total"]
    c = r.python("peak", """
        model, opt = make(1024, 4)
        for _ in range(5):
            step(model, opt, 16, 256)
        torch.cuda.synchronize()
        free, total = torch.cuda.mem_get_info()   # the cache still holds the peak's segments
        result(max_reserved=torch.cuda.max_memory_reserved(),
               reserved=torch.cuda.memory_reserved(), free=free, total=total)
        """, policy=policy(total // 100, 0, stacks="all", depth=6))
    res = c.need()
    s = c.summary()
    mine, others, unattributed = site_split(s)
    figures = {"journal_peak": s["peak"], "max_memory_reserved": res["max_reserved"],
               "allocator_bytes_at_peak": mine, "other_bytes_at_peak": others,
               "unattributed_bytes_at_peak": unattributed, "journal_peak_used": s["peak_used"],
               "meminfo_used_after": res["total"] - res["free"], "meminfo_total": res["total"],
               "limit": s["limit"]}
    problems = []
    if s["peak"] != res["max_reserved"]:
        if unattributed:
            problems.append("journal peak %d != max_memory_reserved %d, and %d bytes at the peak "
                            "have no stack" % (s["peak"], res["max_reserved"], unattributed))
        elif mine != res["max_reserved"]:
            problems.append("PyTorch's allocator held %d bytes at the journal's peak, "
                            "max_memory_reserved is %d (journal peak %d)"
                            % (mine, res["max_reserved"], s["peak"]))
    used_after = res["total"] - res["free"]
    slack = max(256 * MiB, total // 100)
    if res["total"] != s["limit"]:
        problems.append("mem_get_info total %d != limit %d" % (res["total"], s["limit"]))
    if s["peak_used"] < s["peak"]:
        problems.append("peak_used %d < process peak %d" % (s["peak_used"], s["peak"]))
    if abs(s["peak_used"] - used_after) > slack:
        problems.append("peak_used %s vs mem_get_info's used %s after the steps: off by more "
                        "than %s" % (fmt(s["peak_used"]), fmt(used_after), fmt(slack)))
    if problems:
        raise CheckError("; ".join(problems))
    detail = "journal peak %s == max_memory_reserved %s" % (fmt(s["peak"]), fmt(res["max_reserved"]))
    if s["peak"] != res["max_reserved"]:
        detail = ("journal peak %s = max_memory_reserved %s (exact) + %s"
                  % (fmt(s["peak"]), fmt(mine),
                     ", ".join("%s from %s" % (fmt(b), m) for m, b in sorted(others.items()))))
    detail += "; peak_used %s, mem_get_info used %s" % (fmt(s["peak_used"]), fmt(used_after))
    return detail, figures


CALIBRATE = """
    model, opt = make(1024, 8)
    warm(model, opt)
    free, total = torch.cuda.mem_get_info()
    state = torch.cuda.memory_reserved()
    base = total - free - state        # context, kernels, cuBLAS, other processes
    peaks = {}
    for b in (64, 32):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        step(model, opt, b, 512)
        torch.cuda.synchronize()
        peaks[b] = torch.cuda.max_memory_reserved()
    result(base=base, state=state, peak64=peaks[64], peak32=peaks[32], total=total)
"""


def calibrate(r, cache={}):
    """The model's figures without the shim: what the device holds besides
    PyTorch, and the step's peak at batch 64 and 32 (seq 512)."""
    if "cal" not in cache:
        c = r.python("calibrate", CALIBRATE, preload=False)
        res = c.need()
        act = 2 * (res["peak64"] - res["peak32"])   # activations of batch 64 x seq 512
        if act <= 0:
            raise CheckError("calibration: batch 64 does not need more than batch 32: %r" % res)
        res["act"] = act
        res["fixed"] = res["peak64"] - act
        cache["cal"] = res
    return cache["cal"]


def check_refusal(r, dev):
    """A refused allocation is torch.OutOfMemoryError; near_miss and refused
    stacks show libc10_cuda; the process carries on."""
    cal = calibrate(r)
    total = dev["total"]
    limit = cal["base"] + cal["state"] + GiB   # batch 96 x seq 512 needs about 1.5 x act
    near = 768 * MiB
    c = r.python("refusal", """
        model, opt = make(1024, 8)
        warm(model, opt)
        caught = {}
        try:
            step(model, opt, 96, 512)
        except OOM as e:
            caught = {"type": type(e).__name__, "module": type(e).__module__,
                      "is_oom": isinstance(e, OOM), "message": str(e)[:400]}
        except Exception as e:
            caught = {"type": type(e).__name__, "module": type(e).__module__,
                      "is_oom": False, "message": str(e)[:400]}
        opt.zero_grad(set_to_none=True)
        torch.cuda.empty_cache()
        step(model, opt, 4, 64)     # still alive, still training
        torch.cuda.synchronize()
        result(caught=caught, survived=True)
        """, policy=policy(total - limit, near))
    res = c.need()
    caught = res["caught"]
    refused, near_misses = c.of("refused"), c.of("near_miss")
    figures = {"limit": limit, "near_miss": near, "act_batch64": cal["act"], "caught": caught,
               "refused_events": len(refused), "near_miss_events": len(near_misses)}
    problems = []
    if not caught:
        problems.append("the step did not raise")
    elif not caught["is_oom"] or caught["type"] != "OutOfMemoryError":
        problems.append("raised %s.%s, not torch.OutOfMemoryError: %s"
                        % (caught["module"], caught["type"], caught["message"]))
    elif "CUDA out of memory" not in caught["message"]:
        problems.append("OutOfMemoryError without PyTorch's message: %s" % caught["message"])
    if not refused:
        problems.append("no refused event")
    if not near_misses:
        problems.append("no near_miss event")
    for e in refused + near_misses:
        if not c10(e.get("stack")):
            problems.append("%s of %s without libc10_cuda in its stack: %s"
                            % (e["ev"], fmt(e["bytes"]), modules(e.get("stack"))[:6]))
            break
    if any(e.get("api") != "cudaMalloc" for e in refused):
        problems.append("refused api %s" % sorted({e.get("api") for e in refused}))
    if problems:
        raise CheckError("; ".join(problems))
    return ("torch.OutOfMemoryError (%s...); %d refused, %d near_miss, stacks in libc10_cuda; "
            "the process carried on" % (caught["message"][:48], len(refused), len(near_misses)),
            figures)


def check_helper(r, dev):
    """gpuguard.Guard: advised before any refusal, shrinks, keeps the
    effective batch, finishes."""
    cal = calibrate(r)
    total = dev["total"]
    # Peaks at batch 64: seq 256 -> fixed + act/2, 512 -> fixed + act, 768 ->
    # fixed + 1.5 act (over the limit); batch 32 at seq 768: fixed + 0.75 act.
    act, fixed = cal["act"], cal["fixed"]
    limit = cal["base"] + fixed + int(1.2 * act)
    zone = cal["base"] + fixed + int(0.875 * act)
    schedule = [256, 256, 512, 512, 768, 768]
    c = r.python("helper", """
        import gpuguard
        model, opt = make(1024, 8)
        warm(model, opt)
        guard = gpuguard.Guard(batch_size=64, grad_accum=1)
        batch, accum = guard.batch_size, guard.grad_accum
        out = {"accepted": [], "ooms": [], "steps": 0, "samples": 0, "active": guard.active}
        prev = None
        for seq in %r:
            if seq != prev:
                torch.cuda.empty_cache()
                prev = seq
            try:
                step(model, opt, batch, seq, accum)
            except OOM as e:
                out["ooms"].append(str(e)[:300])
                break
            out["steps"] += 1
            out["samples"] += batch * accum
            if guard.shrink_requested:
                batch, accum = guard.accept()
                out["accepted"].append([seq, batch, accum])
        out["stats"] = guard.stats()
        result(**out)
        """ % (schedule,), policy=policy(total - limit, limit - zone))
    res = c.need()
    advice = c.of("advice")
    trouble = [e["t"] for e in c.of("refused") + c.of("oom")]
    notes = c.of("note")
    figures = {"limit": limit, "zone_start": zone, "act_batch64": act, "fixed": fixed,
               "accepted": res["accepted"], "steps": res["steps"], "samples": res["samples"],
               "advice": [(e["seq"], e["reason"], e["batch_size"], e["grad_accum"])
                          for e in advice], "refused_or_oom_events": len(trouble),
               "peak_used": c.summary()["peak_used"]}
    problems = []
    if not res["active"]:
        problems.append("the guard is not active under the shim")
    if res["ooms"]:
        problems.append("OOM: %s" % res["ooms"][0])
    if res["steps"] != len(schedule):
        problems.append("%d of %d steps" % (res["steps"], len(schedule)))
    if not res["accepted"]:
        problems.append("never shrank")
    if res["samples"] != 64 * res["steps"]:
        problems.append("effective batch not kept: %d samples in %d steps"
                        % (res["samples"], res["steps"]))
    if any(b * a < 64 or b >= 64 for _, b, a in res["accepted"]):
        problems.append("accepted %r" % res["accepted"])
    if not advice:
        problems.append("no advice event")
    elif trouble:
        problems.append("%d refused/oom events (the first advice at %.3f s, trouble at %.3f s)"
                        % (len(trouble), advice[0]["t"], min(trouble)))
    if advice and not all(e["signaled"] for e in advice):
        problems.append("advice not signaled")
    if not any(c.path in n["text"] for n in notes):
        problems.append("no note with the trainer's Python stack")
    if problems:
        raise CheckError("; ".join(problems))
    return ("advised at seq %d (%s), batch %s, %d/%d steps, effective batch 64 kept, no refusal"
            % (res["accepted"][0][0], advice[0]["reason"],
               " -> ".join(["64"] + [str(b) for _, b, _ in res["accepted"]]),
               res["steps"], len(schedule)), figures)


def check_meminfo(r, dev):
    """cudaMemGetInfo virtualization seen by torch.cuda.mem_get_info()."""
    total = dev["total"]
    headroom = total // 4
    body = """
        torch.zeros(1, device="cuda")
        free, total = torch.cuda.mem_get_info()
        result(free=free, total=total, physical=torch.cuda.get_device_properties(0).total_memory)
        """
    on = r.python("meminfo", body, policy=policy(headroom, total // 100))
    off = r.python("meminfo-off", body, policy=policy(headroom, total // 100, virtualize="no"))
    a, b = on.need(), off.need()
    limit = on.start()["limit"]
    figures = {"limit": limit, "virtualized": a, "plain": b}
    problems = []
    if limit != total - headroom:
        problems.append("journal limit %d != total - headroom %d" % (limit, total - headroom))
    if a["total"] != limit:
        problems.append("mem_get_info total %d != limit %d" % (a["total"], limit))
    if not 0 < a["free"] <= a["total"]:
        problems.append("virtualized free %d outside (0, %d]" % (a["free"], a["total"]))
    if b["total"] != total:
        problems.append("virtualize_meminfo = no: total %d != device total %d" % (b["total"], total))
    if a["physical"] != total:
        problems.append("get_device_properties total_memory changed: %d" % a["physical"])
    if problems:
        raise CheckError("; ".join(problems))
    return ("mem_get_info total %s == limit (device %s), free %s; %s without virtualization"
            % (fmt(a["total"]), fmt(total), fmt(a["free"]), fmt(b["total"])), figures)


TIMING = """
    model, opt = make(2048, 8)
    for _ in range(30):
        step(model, opt, 8, 512)
    torch.cuda.synchronize()
    times = []
    for _ in range(%d):
        t0 = time.perf_counter()
        step(model, opt, 8, 512)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    result(median=statistics.median(times), mean=statistics.mean(times), n=len(times))
"""


def check_overhead(r, dev, steps=200, rounds=3):
    """Step time with and without the shim (the repository's policies)."""
    plain, shim = [], []
    for _ in range(rounds):
        plain.append(r.python("time-plain", TIMING % steps, preload=False).need()["median"])
        c = r.python("time-shim", TIMING % steps)
        shim.append(c.need()["median"])
    ratio = min(shim) / min(plain)
    figures = {"steps": steps, "rounds": rounds, "plain_median_s": plain, "shim_median_s": shim,
               "ratio": ratio}
    return ("step %.3f ms with the shim, %.3f ms without: ratio %.4f (best of %d runs x %d steps; "
            "not asserted)" % (min(shim) * 1e3, min(plain) * 1e3, ratio, rounds, steps), figures)


def check_expandable(r, dev):
    """expandable_segments:True allocates with cuMemCreate; the journal sees it."""
    cal = calibrate(r)
    total = dev["total"]
    headroom = total // 100
    zone = cal["base"] + 16 * MiB   # every segment PyTorch maps is a near miss
    c = r.python("expandable", """
        model, opt = make(1024, 4)
        for _ in range(3):
            step(model, opt, 16, 256)
        torch.cuda.synchronize()
        result(max_reserved=torch.cuda.max_memory_reserved(), reserved=torch.cuda.memory_reserved())
        """, policy=policy(headroom, total - headroom - zone),
        extra={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"})
    res = c.need()
    s = c.summary()
    apis = sorted({e.get("api") for e in c.of("near_miss") + c.of("refused") + c.of("oom")})
    figures = {"apis": apis, "journal_peak": s["peak"], "max_memory_reserved": res["max_reserved"],
               "near_misses": s["near_misses"], "refusals": s["refusals"]}
    if "cuMemCreate" not in apis:
        raise CheckError("no cuMemCreate in the journal (apis %s; peak %s, max_memory_reserved %s)"
                         % (apis, fmt(s["peak"]), fmt(res["max_reserved"])))
    if s["refusals"] or s["ooms"]:
        raise CheckError("%d refusals, %d OOMs under a limit far away"
                         % (s["refusals"], s["ooms"]))
    return ("journal apis %s; journal peak %s, max_memory_reserved %s"
            % (", ".join(apis), fmt(s["peak"]), fmt(res["max_reserved"])), figures)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check_nccl(r, dev):
    """A one-rank NCCL all_reduce: the journal sees memory that PyTorch's
    allocator does not own."""
    total = dev["total"]
    c = r.python("nccl", """
        import torch.distributed as dist
        if not (dist.is_available() and dist.is_nccl_available()):
            result(skip="no NCCL in this PyTorch")
            sys.exit(0)
        torch.cuda.set_device(0)
        # the store without libuv, which not every build has (Debian's has none)
        dist.init_process_group("nccl", init_method="tcp://127.0.0.1:%d?use_libuv=0", rank=0,
                                world_size=1)
        t = torch.ones(1 << 20, device="cuda")
        dist.all_reduce(t)
        torch.cuda.synchronize()
        res = dict(max_reserved=torch.cuda.max_memory_reserved(), value=t[0].item())
        dist.destroy_process_group()
        result(**res)
        """ % free_port(), policy=policy(total // 100, 0, stacks="all", depth=12))
    res = c.need()
    if "skip" in res:
        raise Skip(res["skip"])
    s = c.summary()
    mine, others, unattributed = site_split(s)
    nccl_sites = [site for site in s.get("peak_sites") or [] if mentions(site.get("stack"), "nccl")]
    figures = {"journal_peak": s["peak"], "max_memory_reserved": res["max_reserved"],
               "allocator_bytes_at_peak": mine, "other_bytes_at_peak": others,
               "nccl_bytes_at_peak": sum(int(x.get("bytes") or 0) for x in nccl_sites)}
    if s["peak"] <= res["max_reserved"]:
        raise CheckError("journal peak %s <= max_memory_reserved %s: NCCL's memory not seen "
                         "(sites: %r)" % (fmt(s["peak"]), fmt(res["max_reserved"]), others))
    return ("journal peak %s > max_memory_reserved %s; beyond PyTorch's allocator: %s%s"
            % (fmt(s["peak"]), fmt(res["max_reserved"]),
               ", ".join("%s from %s" % (fmt(b), m) for m, b in sorted(others.items())) or "-",
               "" if nccl_sites else " (no frame names NCCL)"), figures)


TORCH_SCRIPTS = os.path.join(ROOT, "tests", "torch", "scripts")
GPUGUARD_RUN = os.path.join(ROOT, "tools", "bin", "gpuguard-run")
REPORT = os.path.join(ROOT, "tools", "bin", "gpuguard-report")


def run_script(r, name, script, args, policy_text):
    """tests/torch/scripts/SCRIPT through gpuguard-run (instrumented, no
    import gpuguard): (child, its RESULT lines by kind, the report's verdict)."""
    r.n += 1
    d = os.path.join(r.tmp, "%02d-%s" % (r.n, name))
    os.makedirs(d)
    ppath = os.path.join(d, "policy.ini")
    with open(ppath, "w") as f:
        f.write(policy_text)
    env = r.env(False, None, {"GPUGUARD_LIB": SHIM})
    proc = subprocess.run([GPUGUARD_RUN, "--policy", ppath, "--journal-dir", d, sys.executable,
                           os.path.join(TORCH_SCRIPTS, script)] + list(args),
                          cwd=d, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, timeout=CHILD_TIMEOUT)
    child = Child(proc, d)
    results = {}
    child.results = []      # every RESULT line, in order
    for line in child.out.splitlines():
        if line.startswith("RESULT "):
            res = json.loads(line[len("RESULT "):])
            results[res.get("kind")] = res
            child.results.append(res)
    verdict = ""
    if child.files:
        rep = subprocess.run([sys.executable, REPORT] + child.files, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, timeout=300)
        verdict = rep.stdout.split("=" * 20)[0]
    return child, results, verdict


def check_instrument(r, dev):
    """gpuguard-run on unmodified scripts (tests/torch/scripts): an OOM in
    backward named by node and .backward() line with PyTorch's view; a kept
    graph is a leak whose tensors are named by line; steps from the
    optimizer hook. The PyTorch version's hooks, seen working."""
    total = dev["total"]

    def pol(limit, mode="observe"):
        return ("[gpu]\nmatch = *\n[memory]\nheadroom = %d\nnear_miss = 0\nmode = %s\n"
                "[trainer]\nsignal = none\n" % (total - limit, mode))
    # big enough that the device's own growth outside any call (lazy kernel
    # loading, cuBLAS's workspaces: ~100 MiB) is small beside the backward's
    args = ("--batch", "64", "--seq", "1024", "--dim", "1024", "--layers", "4", "--warm", "1")
    probe_c, probe, _ = run_script(r, "bw-probe", "backward.py", args, pol(total // 2))
    if "forward" not in probe or "step" not in probe:
        raise CheckError("backward.py did not run: %s" % probe_c.tail())
    # the device's use besides PyTorch's cache at the peak (context, libraries),
    # plus the forward's tensors and half of what backward adds to them: a
    # cache PyTorch empties and retries in cannot make room for the rest
    others = probe_c.summary()["peak_used"] - probe["step"]["max_reserved"]
    growth = probe["step"]["max_allocated"] - probe["forward"]["allocated"]
    limit = others + probe["forward"]["allocated"] + growth // 2
    c, res, verdict = run_script(r, "bw-oom", "backward.py", args, pol(limit, "enforce"))
    problems = []
    if res.get("oom", {}).get("phase") != "backward":
        problems.append("no OOM in backward: %s %s" % (res, c.tail()))
    bw, views = c.of("backward"), [v for v in c.of("torch") if v.get("why") in ("refused", "oom")]
    if not bw:
        problems.append("no backward line")
    if not any(v.get("raised") for v in views):
        problems.append("no torch view from PyTorch's OOM observer (raised)")
    if not views:
        problems.append("no torch view at the refusal")
    m = [l.strip() for l in verdict.splitlines() if " in backward of `loss.backward()` " in l
         and "Backward0` asked" in l and ("Refusal" in l or "OOM" in l)]
    if not m:
        problems.append("no backward sentence in the verdict:\n" + verdict)
    c2, res2, verdict2 = run_script(r, "leak", "grow.py",
                                    ("--steps", "24", "--grow", "0", "--keep"), pol(total // 2))
    leaks = c2.of("leak")
    lviews = [v for v in c2.of("torch") if v.get("why") == "leak"]
    steps = [e.get("step") for e in c2.of("step")]
    if steps != list(range(1, 25)):
        problems.append("steps from the optimizer hook: %s" % steps[:30])
    if not leaks:
        problems.append("no leak said: %s" % c2.tail())
    elif not lviews or not any(t.get("pystack") for t in lviews[0].get("tensors", [])):
        problems.append("no leak view with tensors by line: %s" % lviews)
    lk = [l.strip() for l in verdict2.splitlines() if "a step kept in" in l]
    if problems:
        raise CheckError("; ".join(problems))
    return ("%s | %s" % (m[0][:400], lk[0][:300] if lk else "(no leak sentence)"),
            {"backward_sentence": m[0], "leak_sentence": lk[0] if lk else None,
             "leak_rate": leaks[0].get("rate"),
             "leak_kept": sum(t["bytes"] for t in lviews[0]["tensors"] if t.get("pystack")),
             "views": len(c.of("torch")) + len(c2.of("torch"))})


PREFLIGHT = os.path.join(ROOT, "tools", "bin", "gpuguard-preflight")


def check_preflight(r, dev):
    """gpuguard-preflight against the real thing: an unmodified small
    transformer (tests/torch/scripts/pf_lm.py) preflighted on a simulated GPU
    of this GPU's model (its name, memory and compute capability), then run
    on the GPU itself: the predicted peak against max_memory_reserved() at
    the same step (within 2%), and what preflight says the device will hold
    (PyTorch's peak + its estimate of the rest) against the device's own
    used memory (recorded, not asserted: the estimate is a published
    figure). This PyTorch is a pip wheel: preflight preloads the simulated
    libraries under the wheel's SONAMEs."""
    steps = 20
    args = ["--batch", "8", "--seq", "512", "--dim", "1024", "--layers", "4", "--heads", "16",
            "--vocab", "32000", "--steps", str(steps)]
    r.n += 1
    d = os.path.join(r.tmp, "%02d-preflight" % r.n)
    os.makedirs(d)
    env = r.env(False, None, {"PYTHONPATH": TORCH_SCRIPTS, "GG_BUILD": BUILD})
    gpu = "%s,%d,%s" % (dev["name"], dev["total"], dev["cc"])
    script = os.path.join(TORCH_SCRIPTS, "pf_lm.py")
    pf = subprocess.run([sys.executable, PREFLIGHT, "--json", "--gpu", gpu, "--steps", str(steps),
                         "--", sys.executable, script] + args,
                        cwd=d, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                        timeout=CHILD_TIMEOUT)
    if pf.returncode == 3 and "refused to run" in pf.stderr:
        raise Skip("preflight refused here (%s)" % pf.stderr.strip().splitlines()[0])
    if pf.returncode not in (0, 1) or not pf.stdout.strip().startswith("{"):
        raise CheckError("preflight failed (rc %d): %s %s" % (pf.returncode, pf.stdout[-1500:],
                                                              pf.stderr[-1500:]))
    answer = json.loads(pf.stdout)
    m = answer["models"][0]
    real = subprocess.run([sys.executable, script] + args, cwd=d, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, timeout=CHILD_TIMEOUT)
    stepped = [json.loads(l[7:]) for l in real.stdout.splitlines() if l.startswith("RESULT ")]
    stepped = [x for x in stepped if x.get("kind") == "step"]
    if real.returncode != 0 or len(stepped) < steps:
        raise CheckError("the real run failed (rc %d): %s" % (real.returncode, real.stderr[-1500:]))
    at = stepped[steps - 1]
    predicted_device = m["peak_reserved"] + m["outside_estimate"]
    figures = {"preflight": m, "steps": answer["steps"], "limits": answer["limits"],
               "max_memory_reserved": at["max_reserved"], "max_memory_allocated":
               at["max_allocated"], "device_used": max(x["used"] for x in stepped),
               "predicted_device_used": predicted_device}
    off = (m["peak_reserved"] - at["max_reserved"]) / float(at["max_reserved"])
    dev_off = (predicted_device - figures["device_used"]) / float(figures["device_used"])
    figures.update(reserved_error=off, device_error=dev_off)
    problems = []
    if answer["steps"] != steps:
        problems.append("preflight measured %s steps, not %d" % (answer["steps"], steps))
    if abs(off) > 0.02:
        problems.append("peak %d vs max_memory_reserved() %d: %+.2f%%"
                        % (m["peak_reserved"], at["max_reserved"], 100 * off))
    if m["verdict"] != "fits":
        problems.append("verdict %s for a run that fits on this GPU" % m["verdict"])
    if problems:
        raise CheckError("; ".join(problems))
    return ("peak %s = max_memory_reserved() %s (%+.2f%%); device: predicted %s, used %s "
            "(%+.1f%%, the rest estimated)" % (fmt(m["peak_reserved"]), fmt(at["max_reserved"]),
                                               100 * off, fmt(predicted_device),
                                               fmt(figures["device_used"]), 100 * dev_off), figures)


def check_sizing(r, dev):
    """Each batch sized by its shape before it runs (tests/torch/scripts/
    guard_lm.py through Guard.run under gpuguard-run): a small transformer on
    long-tailed documents. First each batch's unsplit peak, whole and alone
    (observe); then a near-miss line between the 4th and 5th highest of
    those peaks, and the guarded run: every batch trains all its samples,
    the batches split are those whose unsplit peak crosses the line (at most
    one more, for the margin), at least 56 of 60 run whole, and after the
    first 10 batches nothing is refused, raised or recovered by a flush."""
    total = dev["total"]
    near = 256 * MiB
    observe = "[gpu]\nmatch = *\n[memory]\nmode = observe\n[trainer]\nsignal = none\n"
    c0, _, _ = run_script(r, "sizing-alone", "guard_lm.py", ("--way", "measure"), observe)
    alone = {x["step"]: x["max_reserved"] for x in c0.results if x.get("kind") == "alone"}
    if c0.rc != 0 or len(alone) != 60:
        raise CheckError("guard_lm.py --way measure: rc %s, %d batches: %s"
                         % (c0.rc, len(alone), c0.tail()))
    top = sorted(alone.values(), reverse=True)
    line = (top[3] + top[4]) // 2
    # the shim's line is the process's device memory: PyTorch's cache and
    # what the libraries beside it hold (the measure run's excess over its
    # cache at its peak)
    others = max(0, c0.summary()["peak"] - max(alone.values()))
    limit = line + others + near
    guarded = ("[gpu]\nmatch = *\n[memory]\nheadroom = %d\nnear_miss = %d\nmode = auto\n"
               % (total - limit, near))
    c, res, _ = run_script(r, "sizing", "guard_lm.py", ("--way", "run"), guarded)
    steps = [x for x in c.results if x.get("kind") == "step"]
    crossing = sorted(st for st, p in alone.items() if p > line)
    split = sorted(x["step"] for x in steps if x["pieces"] > 1)
    problems = []
    if c.rc != 0 or [x["step"] for x in steps] != list(range(1, 61)):
        problems.append("the run did not finish its 60 batches (rc %s): %s" % (c.rc, c.tail()))
    if any(sum(x["sizes"]) != 8 for x in steps):
        problems.append("a batch did not train its 8 samples: %s"
                        % [x for x in steps if sum(x["sizes"]) != 8][:3])
    if not set(crossing) <= set(split) or len(split) > len(crossing) + 1:
        problems.append("split %s, crossing the line %s" % (split, crossing))
    if 60 - len(split) < 56:
        problems.append("only %d of 60 batches ran whole" % (60 - len(split)))
    late, after = [], False
    for e in c.events:
        if e.get("ev") == "step":
            after = e.get("step", 0) >= 10
            if after and e.get("flushes"):
                late.append((e["step"], "flush"))
        elif e.get("ev") in ("refused", "oom") and after:
            late.append(e["ev"])
    if late:
        problems.append("after batch 10: %s" % late[:10])
    preds = [e for e in c.of("step") if "predicted" in e and e.get("needed")]
    errors = sorted(abs(e["predicted"] - (e["needed"] + e["peak_used"] - e["peak"]))
                    / float(e["needed"] + e["peak_used"] - e["peak"]) for e in preds)
    if problems:
        raise CheckError("; ".join(problems))
    figures = {"line": line, "limit": limit, "others": others, "crossing": crossing,
               "split": split, "whole": 60 - len(split), "final": res.get("final"),
               "predicted_steps": len(preds),
               "median_error": errors[len(errors) // 2] if errors else None,
               "largest_error": errors[-1] if errors else None}
    return ("%d of 60 whole, split %s (crossing %s) under a %s line; predictions: median "
            "error %s over %d steps" % (
                60 - len(split), split, crossing, fmt(line),
                "%.1f%%" % (100 * figures["median_error"]) if errors else "-", len(preds)),
            figures)


CHECKS = [
    ("peak", check_peak),
    ("refusal", check_refusal),
    ("helper", check_helper),
    ("meminfo", check_meminfo),
    ("overhead", check_overhead),
    ("expandable", check_expandable),
    ("nccl", check_nccl),
    ("instrument", check_instrument),
    ("preflight", check_preflight),
    ("sizing", check_sizing),
]


# ---- main -----------------------------------------------------------------------

PROBE = """
import json, sys
try:
    import torch
except Exception as e:
    print(json.dumps({"torch": None, "why": "%s: %s" % (type(e).__name__, e)}))
    sys.exit(0)
info = {"torch": torch.__version__, "cuda": torch.version.cuda, "available": False}
try:
    info["available"] = bool(torch.cuda.is_available())
    if info["available"]:
        p = torch.cuda.get_device_properties(0)
        info.update(name=p.name, total=int(p.total_memory), cc="%d.%d" % (p.major, p.minor),
                    count=torch.cuda.device_count())
except Exception as e:
    info["available"] = False
    info["why"] = "%s: %s" % (type(e).__name__, e)
print(json.dumps(info))
"""


def probe():
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    try:
        proc = subprocess.run([sys.executable, "-c", PROBE], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env, timeout=600)
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return {"torch": None, "why": "the probe failed"}


def main(argv):
    traces_dir = None
    if "--traces" in argv:
        i = argv.index("--traces")
        if i + 1 >= len(argv):
            print("usage: run_gpu.py [--traces DIR] [CHECK...]")
            return 2
        traces_dir = os.path.abspath(argv[i + 1])
        argv = argv[:i] + argv[i + 2:]
        os.makedirs(traces_dir, exist_ok=True)
    only = set(argv)
    info = probe()
    if not info.get("torch"):
        print("SKIP: no PyTorch (%s)" % info.get("why", ""))
        return 0
    if not info.get("available"):
        print("SKIP: no GPU (torch %s: torch.cuda.is_available() is false%s)"
              % (info["torch"], "; " + info["why"] if info.get("why") else ""))
        return 0
    print("GPU0 %s, %s, cc %s; torch %s, CUDA %s; shim %s"
          % (info["name"], fmt(info["total"]), info["cc"], info["torch"], info["cuda"], SHIM))
    if not os.path.exists(SHIM):
        print("FAIL: %s is missing (make)" % SHIM)
        print("0 passed, 1 failed")
        return 1
    tmp = tempfile.mkdtemp(prefix="gg-gpu-")
    r = Runner(tmp, traces=traces_dir is not None)
    dev = {"name": info["name"], "total": info["total"], "cc": info["cc"]}
    report = {"device": info, "shim": SHIM, "checks": []}
    passed = failed = skipped = 0
    for name, fn in CHECKS:
        if only and name not in only:
            continue
        t0 = time.time()
        try:
            detail, figures = fn(r, dev)
            status = "PASS"
            passed += 1
        except Skip as e:
            status, detail, figures = "SKIP", str(e), {}
            skipped += 1
        except CheckError as e:
            status, detail, figures = "FAIL", str(e), {}
            failed += 1
        except Exception:
            status, detail, figures = "FAIL", traceback.format_exc().strip(), {}
            failed += 1
        took = time.time() - t0
        if traces_dir and status == "PASS":
            for path in golden_traces(r.children, name, traces_dir, info):
                print("     golden trace: %s" % path)
        r.children = []
        print("%s %-10s %s (%.1f s)" % (status, name, detail, took))
        sys.stdout.flush()
        report["checks"].append({"name": name, "status": status, "detail": detail,
                                 "figures": figures, "seconds": round(took, 2)})
    report.update(passed=passed, failed=failed, skipped=skipped)
    try:
        os.makedirs(os.path.dirname(REPORT_JSON), exist_ok=True)
        with open(REPORT_JSON, "w") as f:
            json.dump(report, f, indent=2, sort_keys=True)
        print("figures: %s" % REPORT_JSON)
    except OSError as e:
        print("cannot write %s: %s" % (REPORT_JSON, e))
    if failed:
        print("children's files kept in %s" % tmp)
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    line = "%d passed, %d failed" % (passed, failed)
    if skipped:
        line += ", %d skipped" % skipped
    print(line)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
