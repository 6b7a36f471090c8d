#!/usr/bin/env python3
"""gpuguard demo: a training run that outgrows its GPU, without and with the guard.

    GG_BUILD=build python3 tools/demo/demo.py [--simulate | --real | --rig] [--out DIR]

`make demo` runs this. The same trainer runs twice as a child process:

  1. without gpuguard: its activation memory grows with the sequence length
     (a curriculum: 32 tokens longer every step) until a step no longer fits
     and it dies of "CUDA out of memory", partway through;
  2. under LD_PRELOAD=libgpuguard.so with the Python helper: the trainer
     runs each batch through gpuguard.Guard.run, whose batch boundaries tell
     the shim where each step ends (gpuguard_step). From the trend of the
     steps' peaks the shim forecasts the step that would enter the near-miss
     zone and advises a smaller batch at the boundary before it, so neither
     a near miss nor an OOM ever happens; from the next step on each batch
     of the (unchanged) loader runs as 2, then 4 micro-batches whose
     gradients add up to the batch's, so the effective batch is kept, and
     the run finishes every step.

Then tools/bin/gpuguard-report reads the guarded run's journal, and its
--recommend --out writes the policy of a third run, the same trainer under
it, which starts from the recommended batch and meets no advice.

Without a GPU (or without PyTorch) the GPU is the fake one of tests/fake (an
RTX 3090, 24 GiB) and "PyTorch" is libtorchlike.so, a caching allocator like
PyTorch's, driven through ctypes. With `nvidia-smi` and a PyTorch that sees
CUDA, the trainer is a small real PyTorch model on the real GPU instead, on a
budget of at most 24 GiB (PyTorch's per-process memory fraction for the
unguarded run, a gpuguard policy for the guarded one). With --rig (`make demo
TORCH=real`) the same real PyTorch model runs on the fake RTX 3090: Debian's
PyTorch 2.6 CUDA build in the rig of tests/torch (`make torch-rig`), its
caching allocator, its OOM, its autograd; the unguarded run dies when the
fake device is full, the guarded one runs under the shipped
policy/rtx-3090.ini, and the third under the recommended one, as the
simulated story does; what the runs in the chroot say of its paths (their
journals, the policy) is said of the host's.

Journals and the HTML report go to DIR (default $GG_BUILD/demo). Exit status:
0 when the story went as it should (the unguarded run died of OOM, the
guarded one finished), 1 otherwise. Standard library only.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
PYHELPER = os.path.join(ROOT, "tools", "python")
REPORT = os.path.join(ROOT, "tools", "bin", "gpuguard-report")
POLICY_DIR = os.path.join(ROOT, "policy")

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30

# ---- the story's numbers (the simulated run) ---------------------------------
#
# An RTX 3090 (24 GiB) under policy/rtx-3090.ini: headroom 10%, so the limit is
# 21.6 GiB, and near_miss 5%, so the near-miss zone starts at 20.4 GiB used.
#   CUDA context                         0.5 GiB  (PyTorch never sees it)
#   weights, gradients, Adam's 2 moments 4 x 1.5 GiB, allocated once
#   activations: 12 layers x 96 KiB per sample per token, plus one layer's
#     worth of backward workspace, freed after every step
#   sequence length: 128 at step 1, 32 more every step, 992 at step 28
#     (7 epochs of 4 steps)
# Peak device use per step = 6.5 GiB + batch x seq x 1.125 MiB x 13/12, so
# each step's peak is 1.2 GiB above the last at batch 32, as wide as the
# whole near-miss zone:
#   batch 32: seq 352 (step 8)  -> 19.9 GiB (below the zone)
#             seq 384 (step 9)  -> 21.1 GiB (near miss, under the limit)
#             seq 448 (step 11) -> 23.6 GiB (fits the card, just)
#             seq 480 (step 12) -> 24.8 GiB (OOM)
#   batch 16: seq 704 (step 19) -> 19.9 GiB, seq 736 (step 20) -> 20.5 GiB (zone)
#   batch  8: seq 992 (step 28) -> 15.9 GiB
# The forecast sees steps 1-8 on a line and advises at the end of step 8, a
# step before the near miss of step 9; then steps 9-19 at batch 16, before
# step 20.
FAKE_DEVICE = "NVIDIA GeForce RTX 3090,24GiB,8.6"
FAKE_PLAN = {
    "context": 512 * MiB,
    "state": [("weights", 1536 * MiB), ("gradients", 1536 * MiB),
              ("Adam exp_avg", 1536 * MiB), ("Adam exp_avg_sq", 1536 * MiB)],
    "layers": 12,
    "per_token_layer": 96 * KiB,
    "seq_first": 128,
    "seq_step": 32,
    "epochs": 7,
    "steps_per_epoch": 4,
    "batch_size": 32,
}


def fmt(n):
    """Bytes as PyTorch and the shim print them: 1.2 GiB, 512.0 MiB."""
    n = float(n)
    for unit, size in (("TiB", 1 << 40), ("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if abs(n) >= size:
            return "%.1f %s" % (n / size, unit)
    return "%d B" % n


# =============================================================================
# The trainer (the child process): the same code for both runs.
# =============================================================================

class OutOfMemoryError(RuntimeError):
    """What torch.OutOfMemoryError is to PyTorch, for the simulated run."""


class FakeTorch(object):
    """The model on libtorchlike.so: every tensor is a tl_malloc'd block."""

    def __init__(self, plan, build):
        import ctypes
        self.ctypes = ctypes
        self.plan = plan
        lib = ctypes.CDLL(os.path.join(build, "fake", "libtorchlike.so"))
        lib.tl_malloc.argtypes = [ctypes.c_size_t, ctypes.POINTER(ctypes.c_void_p)]
        lib.tl_malloc.restype = ctypes.c_int
        lib.tl_free.argtypes = [ctypes.c_void_p]
        lib.tl_free.restype = None
        lib.tl_empty_cache.restype = None
        for name in ("tl_reserved", "tl_max_reserved", "tl_allocated"):
            getattr(lib, name).restype = ctypes.c_ulonglong
        lib.tl_last_error.restype = ctypes.c_char_p
        self.lib = lib
        self.OOM = OutOfMemoryError
        self.state = [self.alloc(size) for _, size in plan["state"]]
        self.step_peak = 0

    def alloc(self, size):
        p = self.ctypes.c_void_p()
        rc = self.lib.tl_malloc(size, self.ctypes.byref(p))
        if rc == 2:  # cudaErrorMemoryAllocation after the flush-and-retry
            raise OutOfMemoryError(self.lib.tl_last_error().decode())
        if rc != 0:
            raise RuntimeError(self.lib.tl_last_error().decode() or "CUDA error %d" % rc)
        return p.value

    def layer(self, batch, seq):
        return self.alloc(batch * seq * self.plan["per_token_layer"])

    def micro_batch(self, batch, seq, weight):
        """Forward through every layer (activations kept for backward),
        backward with one layer's workspace, then everything freed."""
        acts = []
        try:
            for _ in range(self.plan["layers"]):
                acts.append(self.layer(batch, seq))
            acts.append(self.layer(batch, seq))  # backward workspace
            self.step_peak = max(self.step_peak, self.lib.tl_reserved())
        finally:
            for p in reversed(acts):
                self.lib.tl_free(p)

    def optimizer_step(self):
        time.sleep(0.01)  # the compute of a step, for a readable timeline

    def zero_grad(self):
        pass

    def empty_cache(self):
        self.lib.tl_empty_cache()

    def take_peak(self):
        peak, self.step_peak = self.step_peak, 0
        return peak


class RealTorch(object):
    """A small real model: `layers` x (Linear HxH without bias, GELU), fp32,
    Adam. Activations are batch x seq x H per saved tensor, two per layer."""

    def __init__(self, plan, build):
        import torch
        self.torch = torch
        self.OOM = getattr(torch, "OutOfMemoryError", None) or torch.cuda.OutOfMemoryError
        torch.backends.cuda.matmul.allow_tf32 = True
        if plan.get("fraction"):
            torch.cuda.set_per_process_memory_fraction(plan["fraction"], 0)
        h = plan["hidden"]
        self.hidden = h
        self.weights = [torch.nn.Parameter(torch.randn(h, h, device="cuda") / h ** 0.5)
                        for _ in range(plan["layers"])]
        self.opt = torch.optim.Adam(self.weights, lr=1e-5)

    def micro_batch(self, batch, seq, weight):
        torch = self.torch
        x = torch.randn(batch, seq, self.hidden, device="cuda")
        for w in self.weights:
            x = torch.nn.functional.gelu(x @ w)
        loss = x.square().mean() * weight
        del x
        loss.backward()

    def optimizer_step(self):
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)

    def zero_grad(self):
        self.opt.zero_grad(set_to_none=True)

    def empty_cache(self):
        self.torch.cuda.empty_cache()

    def take_peak(self):
        peak = self.torch.cuda.max_memory_reserved()
        self.torch.cuda.reset_peak_memory_stats()
        return peak


def sequence_length(plan, step):
    """The curriculum: longer sequences every step."""
    return plan["seq_first"] + plan["seq_step"] * (step - 1)


def schedule_text(plan):
    total = plan["epochs"] * plan["steps_per_epoch"]
    return ("%d epochs x %d steps, sequence length %d at step 1, %d more every step, %d at step %d"
            % (plan["epochs"], plan["steps_per_epoch"], sequence_length(plan, 1),
               plan["seq_step"], sequence_length(plan, total), total))


class PlainLoop(object):
    """The loop without gpuguard (no shim, no helper): each batch runs whole,
    and an out-of-memory error ends the run. (The helper alone, without the
    shim, would halve after the OOM and redo the batch; the shim's
    forecast is what spares the OOM.)"""

    active, split = False, 1

    def __init__(self, batch_size):
        self.micro_batch_size = batch_size

    def run(self, batch, step, zero_grad):
        import gpuguard
        step(gpuguard.MicroBatch(batch, 1.0, len(batch), 0, 1))

    def advice(self):
        return None

    def stats(self):
        return None


def train(args):
    plan = json.loads(args.plan)
    build = args.build
    if not plan.get("helper", True):
        guard = PlainLoop(plan["batch_size"])
        print("no gpuguard: the plain loop, each batch whole")
    else:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import gpuguard
            guard = gpuguard.Guard(batch_size=plan["batch_size"])
        for w in caught:
            print("  %s" % w.message)
        print("gpuguard helper: %s" % ("active (libgpuguard.so is preloaded)" if guard.active
                                       else "inactive"))
    model = RealTorch(plan, build) if args.train == "real" else FakeTorch(plan, build)
    batch = list(range(plan["batch_size"]))  # the loader's batch: its samples' ids
    epochs, per_epoch = plan["epochs"], plan["steps_per_epoch"]
    total = epochs * per_epoch
    step = samples = 0
    seq = 0
    sys.stdout.flush()

    def forward_backward(mb):  # one micro-batch: the whole batch until advised
        model.micro_batch(len(mb), seq, mb.weight)
        done.append(len(mb))

    def zero_grad():  # guard.run redoes the batch: the failed attempt counts for nothing
        del done[:]
        model.zero_grad()

    for epoch in range(1, epochs + 1):
        first, shapes = step + 1, []
        peak = 0
        for _ in range(per_epoch):
            step += 1
            seq = sequence_length(plan, step)
            model.empty_cache()  # a new sequence length: drop the cached blocks of the old one
            done = []
            try:
                guard.run(batch, forward_backward, zero_grad)
            except model.OOM:
                # Without the guard there is nothing to do but die.
                print("step %d/%d (epoch %d, seq %d, batch %d x accum %d): "
                      "CUDA out of memory" % (step, total, epoch, seq, len(batch), 1))
                sys.stdout.flush()
                raise
            model.optimizer_step()
            shapes.append((guard.micro_batch_size, guard.split))  # what this step ran as
            samples += sum(done)
            peak = max(peak, model.take_peak())
            adv = guard.advice()
            if adv is not None:
                # Acted on at the next batch boundary, by guard.run itself.
                print("step %d/%d (epoch %d, seq %d): gpuguard advice #%d (%s): batch %d x "
                      "accum %d -> %d x %d, effective batch %d kept: the next steps run each "
                      "batch of %d as %d micro-batches"
                      % (step, total, epoch, seq, adv["seq"], adv["reason"],
                         guard.micro_batch_size, guard.split, adv["batch_size"],
                         adv["grad_accum"], adv["batch_size"] * adv["grad_accum"], len(batch),
                         adv["grad_accum"]))
                if args.train != "real":
                    model.empty_cache()  # Guard does this itself for real PyTorch
        shape = "%2d x %d" % shapes[-1]
        if shapes[0] != shapes[-1]:
            shape = "%2d x %d -> %s" % (shapes[0] + (shape,))
        print("epoch %d/%d  seq %4d-%-4d  steps %2d-%-2d  micro-batch x n %-16s peak reserved %s"
              % (epoch, epochs, sequence_length(plan, first), seq, first, step, shape, fmt(peak)))
        sys.stdout.flush()
    print("finished: %d/%d steps, %d samples (effective batch %d per step)"
          % (step, total, samples, samples // max(step, 1)))
    stats = guard.stats()
    if stats:
        print("guard.stats(): peak %s, device peak %s, limit %s, near misses %d, "
              "refused %d" % (fmt(stats["peak"]), fmt(stats["peak_used"]), fmt(stats["limit"]),
                              stats["near_misses"], stats["refusals"]))
    return 0


# =============================================================================
# The story (the parent process).
# =============================================================================

def say(text=""):
    print(text)
    sys.stdout.flush()


def heading(text):
    say()
    say(text)
    say("-" * len(text))


def have_real_gpu():
    """nvidia-smi works and a PyTorch that sees CUDA is importable."""
    if not shutil.which("nvidia-smi"):
        return False
    try:
        if subprocess.run(["nvidia-smi", "-L"], stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL, timeout=60).returncode != 0:
            return False
        probe = "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"
        return subprocess.run([sys.executable, "-c", probe], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, timeout=300).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def base_env(build):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("GPUGUARD_", "FAKECUDA_")) and k not in ("LD_PRELOAD", "RANK")}
    env["PYTHONPATH"] = PYHELPER + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTHONUNBUFFERED"] = "1"
    env.pop("PYTHONWARNINGS", None)
    return env


def run_trainer(backend, plan, build, env, out_dir):
    """Run the trainer, relaying its progress lines; returns (rc, pid, stderr)."""
    argv = [sys.executable, os.path.abspath(__file__), "--train", backend,
            "--build", build, "--plan", json.dumps(plan)]
    with tempfile.TemporaryFile(mode="w+") as err:
        proc = subprocess.Popen(argv, cwd=out_dir, env=env, stdout=subprocess.PIPE,
                                stderr=err, text=True)
        for line in proc.stdout:
            say("  | " + line.rstrip("\n"))
        proc.wait()
        err.seek(0)
        return proc.returncode, proc.pid, err.read()


def run_next(backend, plan, build, guarded, out_dir, journal, rig=None):
    """Run 3: gpuguard-report --recommend --out writes the policy the next
    run should use; the same trainer runs under it (GPUGUARD_POLICY), and
    its helper starts from the recommended batch. rig: in the rig of
    tests/torch (the policy copied in)."""
    policy_dir = os.path.join(out_dir, "next")
    shutil.rmtree(policy_dir, ignore_errors=True)
    heading("Run 3: the next run, under the recommended policy")
    say("$ tools/bin/gpuguard-report %s --recommend --out %s"
        % (os.path.relpath(journal), os.path.relpath(policy_dir)))
    rep = subprocess.run([sys.executable, REPORT, journal, "--recommend", "--out", policy_dir],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = rep.stdout.splitlines()
    start = next((i for i, l in enumerate(lines) if l.startswith("Recommendation for")), None)
    for line in lines[start:] if start is not None else lines[-6:]:
        say(line)
    if not os.path.isdir(policy_dir):
        say("=> no policy written: the next run would start as this one did")
        return {"ok": False, "text": "no recommendation written"}
    env = dict(guarded, GPUGUARD_POLICY=policy_dir)
    say("$ GPUGUARD_POLICY=%s LD_PRELOAD=... python3 tools/demo/demo.py --train %s ...%s"
        % (os.path.relpath(policy_dir), backend, "   # in the rig" if rig else ""))
    t0 = time.time()
    if rig:
        rc, pid, err = rig_trainer(rig, plan, out_dir, guarded=True, policy_dir=policy_dir)
    else:
        rc, pid, err = run_trainer(backend, plan, build, env, out_dir)
    for line in err.splitlines():
        if line.startswith("gpuguard:"):
            say("   " + line)
    events = []
    j3 = find_journal(out_dir, pid) if pid is not None else None
    if j3:
        with open(j3) as f:
            events = [json.loads(l) for l in f if l.strip()]
    advice = [e for e in events if e["ev"] == "advice"]
    trouble = [e for e in events if e["ev"] in ("near_miss", "refused", "oom")]
    first = [e for e in events if e["ev"] == "batch"]
    started = first[0].get("batch_size") if first else None
    ok = rc == 0 and not advice and not trouble
    text = "%s (exit status %d, %.1f s), started at micro-batch %s, %d advice, %d near misses" % (
        "finished every step" if rc == 0 else "did NOT finish", rc, time.time() - t0,
        started if started is not None else "?", len(advice), len(trouble))
    say("=> " + text)
    return {"ok": ok, "text": text}


def last_error_line(stderr):
    lines = [l for l in stderr.splitlines() if l.strip()]
    for l in reversed(lines):
        if "Error" in l or "error" in l:
            return l.strip()
    return lines[-1].strip() if lines else "(no message)"


def fake_setup(build, out_dir):
    plan = dict(FAKE_PLAN)
    env = base_env(build)
    fake = os.path.join(build, "fake")
    env["FAKECUDA_DEVICES"] = FAKE_DEVICE
    env["FAKECUDA_CONTEXT_BYTES"] = str(plan["context"])
    env["LD_LIBRARY_PATH"] = fake + (":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
    guarded = dict(env)
    guarded["GPUGUARD_POLICY"] = POLICY_DIR
    total, limit, zone = 24 * GiB, 24 * GiB * 9 // 10, 24 * GiB * 85 // 100
    state = sum(size for _, size in plan["state"])
    per_token = plan["layers"] * plan["per_token_layer"]

    heading("The GPU and the job")
    say("GPU      NVIDIA GeForce RTX 3090, %s (simulated: %s, no GPU needed)"
        % (fmt(total), os.path.relpath(os.path.join(build, "fake"), ROOT)))
    say("policy   policy/rtx-3090.ini: headroom 10%% -> limit %s; near_miss 5%% -> the "
        "near-miss zone starts at %s used" % (fmt(limit), fmt(zone)))
    say("\"torch\"  libtorchlike.so, a caching allocator like PyTorch's, through ctypes")
    say("model    %s of weights, gradients and Adam state, allocated once; CUDA context %s"
        % (fmt(state), fmt(plan["context"])))
    say("         activations %s per sample per token (%d layers), freed after each step"
        % (fmt(per_token), plan["layers"]))
    say("schedule %s" % schedule_text(plan))
    say("batch    %d: peak device use %s at step 8, %s at step 9, %s at step 12"
        % (plan["batch_size"],
           *(fmt(plan["context"] + state + plan["batch_size"] * sequence_length(plan, n)
                 * per_token * 13 // 12) for n in (8, 9, 12))))
    return plan, env, guarded


def nvidia_smi_memory():
    out = subprocess.run(["nvidia-smi", "-i", "0", "--query-gpu=name,memory.total,memory.used",
                          "--format=csv,noheader,nounits"], stdout=subprocess.PIPE, text=True,
                         timeout=60).stdout.strip().splitlines()[0]
    name, total, used = [f.strip() for f in out.rsplit(",", 2)]
    return name, int(total) * MiB, int(used) * MiB


def real_setup(build, out_dir):
    name, total, used = nvidia_smi_memory()
    card = min(24 * GiB, int((total - used) * 0.8))
    scale = card / (24.0 * GiB)
    per_token = FAKE_PLAN["layers"] * FAKE_PLAN["per_token_layer"] * scale
    hidden = 2688                          # 16 bytes of state per weight: 6 GiB x scale
    layers = max(2, int(round(per_token / (8 * hidden))))  # 2 saved fp32 tensors per layer
    plan = dict(FAKE_PLAN, hidden=hidden, layers=layers, fraction=card / float(total))
    env = base_env(build)
    guarded = dict(env)
    limit = used + GiB + card * 9 // 10    # others + our context + 90% of the budget
    policy = os.path.join(out_dir, "demo-policy.ini")
    with open(policy, "w") as f:
        f.write("; written by tools/demo/demo.py: a %s budget on %s\n[gpu]\nmatch = *\n"
                "[memory]\nheadroom = %d\nnear_miss = %d\nmode = enforce\n"
                "[trainer]\nsignal = SIGUSR2\n" % (fmt(card), name, total - limit, card // 10))
    guarded["GPUGUARD_POLICY"] = policy
    real_plan = dict(plan)
    real_plan.pop("fraction")
    heading("The GPU and the job")
    say("GPU      %s, %s (%s in use before the demo)" % (name, fmt(total), fmt(used)))
    say("budget   %s: the unguarded run gets it as PyTorch's per-process memory fraction,"
        % fmt(card))
    say("         the guarded one as a policy (%s): limit %s device-wide" % (policy, fmt(limit)))
    say("model    %d x Linear(%d, %d) + GELU, fp32, Adam: %s of state"
        % (layers, hidden, hidden, fmt(16 * layers * hidden * hidden)))
    say("schedule %s, batch %d" % (schedule_text(plan), plan["batch_size"]))
    return plan, real_plan, env, guarded


def rig_setup(build, out_dir):
    """Real PyTorch 2.6 in the rig (tests/torch) on the fake RTX 3090: the
    real model sized for the simulated story's 24 GiB, with its CUDA context."""
    sys.path.insert(0, os.path.join(ROOT, "tests", "torch"))
    import torchrig
    if not torchrig.rig_root():
        say("demo: --rig needs the real-PyTorch rig: " + torchrig.HOW)
        return None
    per_token = FAKE_PLAN["layers"] * FAKE_PLAN["per_token_layer"]
    hidden = 2688                          # 16 bytes of state per weight: 6 GiB
    layers = max(2, int(round(per_token / (8 * hidden))))  # 2 saved fp32 tensors per layer
    plan = dict(FAKE_PLAN, hidden=hidden, layers=layers)
    heading("The GPU and the job")
    say("GPU      NVIDIA GeForce RTX 3090, %s (simulated by tests/fake; CUDA context %s)"
        % (fmt(24 * GiB), fmt(plan["context"])))
    say("PyTorch  Debian's python3-torch-cuda 2.6 (CUDA 12.4) in the rig of tests/torch: its own")
    say("         caching allocator, autograd and OutOfMemoryError; the kernels do not run")
    say("policy   policy/rtx-3090.ini: headroom 10%% -> limit %s; near_miss 5%% -> the "
        "near-miss zone starts at %s used" % (fmt(24 * GiB * 9 // 10), fmt(24 * GiB * 85 // 100)))
    say("model    %d x Linear(%d, %d) + GELU, fp32, Adam: %s of state"
        % (layers, hidden, hidden, fmt(16 * layers * hidden * hidden)))
    say("schedule %s, batch %d" % (schedule_text(plan), plan["batch_size"]))
    return plan, torchrig


def rig_trainer(torchrig, plan, out_dir, guarded, policy_dir=None):
    """The trainer in the rig: (rc, pid, stderr), its lines relayed. Its
    journal is copied into out_dir, and what its stderr says of the chroot's
    paths (the journal, the policy) is said of the host's. policy_dir: a
    host directory of policies, copied in for the run (else the shipped)."""
    s = torchrig.session()
    run_dir = tempfile.mkdtemp(prefix="demo-", dir=s.host_dir)
    os.chmod(run_dir, 0o777)
    places = [(s.inside(run_dir) + "/", out_dir + "/"), (s.dir + "/policy/", POLICY_DIR + "/")]
    policy = None
    if policy_dir:
        inside = os.path.join(run_dir, "policy")
        shutil.copytree(policy_dir, inside)
        policy = s.inside(inside)
        places.insert(0, (policy + "/", policy_dir.rstrip("/") + "/"))
    argv = torchrig.command(["/usr/bin/python3", s.dir + "/demo/demo.py", "--train", "real",
                             "--build", "-", "--plan", json.dumps(plan)],
                            s.inside(run_dir), preload=guarded, devices=FAKE_DEVICE, policy=policy,
                            env={"FAKECUDA_CONTEXT_BYTES": plan["context"], "PYTHONUNBUFFERED": 1})
    with tempfile.TemporaryFile(mode="w+") as err:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err, text=True)
        for line in proc.stdout:
            say("  | " + line.rstrip("\n"))
        proc.wait()
        err.seek(0)
        stderr = err.read()
    pid = None
    for name in os.listdir(run_dir):  # the journal names the pid inside the chroot
        if name.startswith("gpuguard.") and name.endswith(".jsonl"):
            shutil.copy(os.path.join(run_dir, name), out_dir)
            pid = int(name.rsplit(".", 2)[-2].split("-")[0])
    for inner, host in places:
        stderr = stderr.replace(inner, host)
    return proc.returncode, pid, stderr


def find_journal(out_dir, pid):
    for name in sorted(os.listdir(out_dir)):
        if name.startswith("gpuguard.") and name.endswith(".%d.jsonl" % pid):
            return os.path.join(out_dir, name)
    return None


def batches(first, advised):
    """The batch sizes the advice led through: 32, 16, 8."""
    seen = [first]
    for a in advised:
        if 0 < a["batch_size"] < seen[-1]:
            seen.append(a["batch_size"])
    return seen


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--simulate", action="store_true", help="the fake GPU even when a real one is here")
    ap.add_argument("--real", action="store_true", help="insist on the real GPU and PyTorch")
    ap.add_argument("--rig", action="store_true",
                    help="real PyTorch 2.6 on the fake GPU, in the rig of tests/torch (make torch-rig)")
    ap.add_argument("--out", help="where the journals go (default $GG_BUILD/demo)")
    ap.add_argument("--train", choices=("fake", "real"), help=argparse.SUPPRESS)
    ap.add_argument("--build", help=argparse.SUPPRESS)
    ap.add_argument("--plan", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.train:
        return train(args)

    build = os.environ.get("GG_BUILD") or "build"
    if not os.path.isabs(build) and os.path.isdir(os.path.join(ROOT, build)):
        build = os.path.join(ROOT, build)  # make runs us from the root; anyone else may not
    build = os.path.abspath(build)
    shim = os.path.join(build, "libgpuguard.so")
    real = args.real or (not args.simulate and not args.rig and have_real_gpu())
    needed = [shim] + ([] if real or args.rig else [os.path.join(build, "fake", "libtorchlike.so")])
    missing = [p for p in needed if not os.path.exists(p)]
    if missing:
        say("demo: missing %s; run `make demo` (it builds them)" % ", ".join(missing))
        return 1
    out_dir = os.path.abspath(args.out or os.path.join(build, "demo"))
    os.makedirs(out_dir, exist_ok=True)
    for name in os.listdir(out_dir):  # journals of an earlier demo
        if name.startswith("gpuguard.") and name.endswith(".jsonl"):
            os.unlink(os.path.join(out_dir, name))

    say("gpuguard demo: a training run that outgrows its GPU")
    say("=" * 51)
    say("The same trainer runs twice. Its activation memory grows with the batch and with the")
    say("sequence length, which grows every step. Without gpuguard it dies of an OOM partway;")
    say("with gpuguard, which sees each step's peak on a rising line, it is told a step before")
    say("the near-miss zone to halve its batch: it splits each batch into micro-batches (same")
    say("samples per step) and finishes.")
    rig = None
    if args.rig:
        got = rig_setup(build, out_dir)
        if got is None:
            return 1
        plan, rig = got
        guarded_plan, env, guarded = plan, {}, {}
        backend = "real"
    elif real:
        plan, guarded_plan, env, guarded = real_setup(build, out_dir)
        backend = "real"
    else:
        plan, env, guarded = fake_setup(build, out_dir)
        guarded_plan = plan
        backend = "fake"
    guarded["LD_PRELOAD"] = shim
    guarded["GPUGUARD_JOURNAL_DIR"] = out_dir
    total_steps = plan["epochs"] * plan["steps_per_epoch"]

    heading("Run 1: without gpuguard")
    say("$ python3 tools/demo/demo.py --train %s ...   # the trainer: batch %d"
        % (backend, plan["batch_size"]))
    t0 = time.time()
    bare = dict(plan, helper=False)
    if rig:
        rc1, _, err1 = rig_trainer(rig, bare, out_dir, guarded=False)
    else:
        rc1, _, err1 = run_trainer(backend, bare, build, env, out_dir)
    died = rc1 not in (0, None) and "out of memory" in err1
    if died:
        say("=> it died: %s" % last_error_line(err1))
        say("   exit status %d after %.1f s; everything since the last checkpoint is lost" % (rc1, time.time() - t0))
    elif rc1 == 0:
        say("=> it finished without an OOM: the demo's numbers do not fit this GPU's story")
    else:
        say("=> it failed, but not with an OOM (exit %s):" % rc1)
        for line in err1.strip().splitlines()[-8:]:
            say("   " + line)

    heading("Run 2: the same trainer under gpuguard")
    say("$ LD_PRELOAD=%s python3 tools/demo/demo.py --train %s ...%s"
        % (os.path.relpath(shim, ROOT), backend, "   # in the rig" if rig else ""))
    say("  the trainer already does: guard = gpuguard.Guard(batch_size=%d)"
        % plan["batch_size"])
    say("  and for each batch: guard.run(batch, forward_backward, zero_grad), which splits")
    say("  the batch into micro-batches once advised (the loader's batch stays %d)"
        % plan["batch_size"])
    t0 = time.time()
    if rig:
        rc2, pid2, err2 = rig_trainer(rig, guarded_plan, out_dir, guarded=True)
    else:
        rc2, pid2, err2 = run_trainer(backend, guarded_plan, build, guarded, out_dir)
    shim_lines = [l for l in err2.splitlines() if l.startswith("gpuguard:")]
    finished = rc2 == 0
    say("=> %s (exit status %d, %.1f s); gpuguard's lines on stderr (the helper's, the "
        "shim's summary):"
        % ("it finished every step" if finished else "it did NOT finish", rc2, time.time() - t0))
    for line in shim_lines:
        say("   " + line)
    if not finished:
        for line in err2.strip().splitlines()[-8:]:
            say("   " + line)

    journal = find_journal(out_dir, pid2)
    advised = []
    if journal:
        with open(journal) as f:
            events = [json.loads(l) for l in f if l.strip()]
        incidents = [e for e in events if e["ev"] in ("near_miss", "refused", "oom")]
        advised = [e for e in events if e["ev"] == "advice"]
        first_incident = min([e["t"] for e in incidents] or [float("inf")])
        advised_first = bool(advised) and advised[0]["t"] <= first_incident

        heading("Post-mortem: tools/bin/gpuguard-report %s" % os.path.relpath(journal))
        html = os.path.join(out_dir, "report.html")
        rep = subprocess.run([sys.executable, REPORT, journal, "--html", html],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        say(rep.stdout.rstrip())
        if rep.returncode == 0 and os.path.exists(html):
            say()
            say("(timeline: %s)" % os.path.relpath(html))
    else:
        advised_first = False
        say()
        say("demo: the guarded run left no journal in %s" % out_dir)

    next_run = None
    if journal:
        next_run = run_next(backend, guarded_plan, build, guarded, out_dir, journal, rig)

    heading("Verdict")
    say("without gpuguard: %s" % ("died of CUDA out of memory" if died else "did not die of an OOM (unexpected)"))
    forecast = advised[0].get("forecast") if advised and advised[0]["reason"] == "forecast" else None
    say("with gpuguard:    %s; batch %s; %d advice (%s), %s"
        % ("finished all %d steps" % total_steps if finished else "did not finish",
           " -> ".join(str(b) for b in batches(plan["batch_size"], advised)),
           len(advised),
           ", ".join(a["reason"] for a in advised) or "none",
           "the first before any near miss, refusal or OOM" if advised_first
           else "none before the trouble"))
    if forecast:
        say("                  the first at the end of step %d: step %d would peak at %s, in "
            "the near-miss zone" % (forecast["step"] - 1, forecast["step"],
                                               fmt(forecast["bytes"])))
    if next_run is not None:
        say("next run:         %s" % next_run["text"])
    # Simulated, the numbers are exact: the first advice must be the
    # forecast. A real GPU's steps may be noisier: any advice in time will do.
    ok = died and finished and advised_first and (real or forecast is not None)
    if next_run is not None and not real:
        ok = ok and next_run["ok"]
    say("story: %s" % ("as expected" if ok else "NOT as expected"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
