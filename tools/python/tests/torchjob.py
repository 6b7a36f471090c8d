"""Real-PyTorch training jobs for the helper's end-to-end tests
(tests/e2e/test_helper_torch.py), run by a Python that has torch (Debian's
/usr/bin/python3: torch 1.13 on CPU), usually under LD_PRELOAD of the shim
on the fake GPU:

    torchjob.py JOB OUT.json [ARG]    JOB: micro, run, inert, backward, dist,
                                      dist-run, shape, hf, lightning (ARG "real": the
                                      installed library instead of the
                                      stand-ins), readme (ARG: a file holding a
                                      README loop)

The model and its gradients are real (a small MLP on the CPU, autograd, SGD
with momentum). Its device memory is the fake GPU's, through libtorchlike.so
(a caching allocator like PyTorch's, $GG_TORCHLIKE): the weights hold a
fixed amount for the whole run, and every forward pass allocates activations
in proportion to the length of its input, at a per-sample size that grows
with the batch number (a curriculum), then gives them back. So the near
misses, the advice and the refusals are the real shim's, and a smaller piece
really needs less memory. A failed allocation raises torch's OOM error, as
PyTorch does.

Each job also trains a copy of the same model, from the same start, on
whole batches without any pressure (the reference), and writes both
parameter sets to OUT.json with what the guard did.

The environment chooses the pressure: GG_PLAN (a name in PLANS, or "none"),
and for distributed jobs RANK, WORLD_SIZE and GG_INIT (a file for
init_process_group's file:// rendezvous) unless torchrun set MASTER_ADDR.
"""

import copy
import ctypes
import json
import os
import sys
import time

import torch

import standins

BATCHES = 8          # batches per run
BATCH = 32           # samples per batch (per rank)
FEATURES = 8
MiB = 1 << 20

# name: (weights held, MiB of activations per sample at each batch). With the
# shipped policies: RTX 3090 (24 GiB) limit 21.6 GiB, near-miss zone from
# 20.4 GiB; RTX 3060 (12 GiB) limit 10.8 GiB, zone from 10.2 GiB.
PLANS = {
    # 3090: 12 GiB + 32 x 270 MiB = 20.4+ GiB at batch 4 (a near miss, then
    # 2 x 16), 12 GiB + 16 x 540 MiB at batch 7 (near miss again, then 4 x 8)
    "near": (12 << 30, [200, 200, 200, 270, 270, 270, 540, 540]),
    # 3090: 12 GiB + 32 x 320 MiB = 22 GiB at batch 4: refused (OOM, then
    # 2 x 16); 12 GiB + 16 x 640 MiB at batch 7: refused again (then 4 x 8)
    "refuse": (12 << 30, [200, 200, 200, 320, 320, 320, 640, 640]),
    # the same stories at half the size, for a 12 GiB RTX 3060 (on a 3090
    # they are far from its line)
    "near-small": (6 << 30, [100, 100, 100, 136, 136, 136, 272, 272]),
    "refuse-small": (6 << 30, [100, 100, 100, 160, 160, 160, 320, 320]),
    # the shape job's: 12 GiB of weights, activations by tokens (TokenModel)
    "shape": (12 << 30, [0] * BATCHES),
    # "near" for the adapters' batches of 16 (two per optimizer step)
    "near-16": (12 << 30, [400, 400, 400, 540, 540, 540, 1080, 1080]),
}


def oom_error(message):
    cls = getattr(torch, "OutOfMemoryError", None) or getattr(torch.cuda, "OutOfMemoryError",
                                                                None)
    return (cls or RuntimeError)(message)


class FakeGPU(object):
    """Device memory through libtorchlike.so, driven like PyTorch drives its
    caching allocator."""

    def __init__(self, plan):
        self.weights, self.per_sample = PLANS[plan] if plan != "none" else (0, [0] * BATCHES)
        self.stage = 0
        self.lib = None
        if not self.weights:
            return
        lib = ctypes.CDLL(os.environ["GG_TORCHLIKE"])
        lib.tl_malloc.argtypes = [ctypes.c_size_t, ctypes.POINTER(ctypes.c_void_p)]
        lib.tl_malloc.restype = ctypes.c_int
        lib.tl_free.argtypes = [ctypes.c_void_p]
        lib.tl_last_error.restype = ctypes.c_char_p
        self.lib = lib
        self.held = self.alloc(self.weights)

    def alloc(self, size):
        p = ctypes.c_void_p()
        rc = self.lib.tl_malloc(size, ctypes.byref(p))
        if rc == 2:  # cudaErrorMemoryAllocation after the flush-and-retry
            raise oom_error(self.lib.tl_last_error().decode())
        if rc:
            raise RuntimeError("CUDA error %d: %s" % (rc, self.lib.tl_last_error().decode()))
        return p.value

    def release(self):
        """Give the held weights back (a run that ends, in a process that
        goes on)."""
        if self.lib is not None:
            self.lib.tl_free(self.held)
            self.lib.tl_empty_cache()
            self.lib = None

    def activations(self, samples):
        """A forward pass over `samples` samples at the current stage."""
        if self.lib is None or samples <= 0:
            return
        p = self.alloc(samples * self.per_sample[self.stage] * MiB)
        self.lib.tl_free(p)
        self.lib.tl_empty_cache()


class Model(torch.nn.Module):
    """An autoencoder MLP whose forward pass costs fake device memory."""

    def __init__(self, gpu):
        super(Model, self).__init__()
        self.gpu = gpu
        self.net = torch.nn.Sequential(torch.nn.Linear(FEATURES, 16), torch.nn.Tanh(),
                                       torch.nn.Linear(16, FEATURES))

    def forward(self, x):
        self.gpu.activations(len(x))
        return self.net(x)


def loss_fn(out, target):
    return torch.nn.functional.mse_loss(out, target)


def make_model(gpu, seed=0):
    torch.manual_seed(seed)
    return Model(gpu)


def make_optimizer(model):
    return torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


def rank_data(rank):
    """Batches of `rank`: BATCHES x [BATCH, FEATURES], the same in every
    process that asks."""
    g = torch.Generator().manual_seed(1000 + rank)
    return torch.randn(BATCHES, BATCH, FEATURES, generator=g)


def params(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).tolist()


def copy_of(state):
    """A model without device memory, from a state_dict."""
    model = Model(FakeGPU("none"))
    model.load_state_dict(state)
    return model


def train_reference(state, world):
    """Whole batches, no pressure, from `state`: what every guarded run must
    end with. In a distributed run DDP averages the ranks' gradients, which
    is the gradient of the mean loss over all ranks' samples."""
    model = copy_of(state)
    opt = make_optimizer(model)
    data = [rank_data(r) for r in range(world)]
    for i in range(BATCHES):
        x = torch.cat([d[i] for d in data])
        loss_fn(model(x), x).backward()
        opt.step()
        opt.zero_grad()
    return params(model)


class Context(object):
    """What a job (or a README loop) needs: the pressure, the model, the
    data, the reference."""

    def __init__(self):
        self.rank = int(os.environ.get("RANK", "0"))
        # One environment for every rank (torchrun's): VAR_RANK<r> gives rank
        # r its own plan and fake GPU, before the first CUDA call reads them.
        for var in ("GG_PLAN", "FAKECUDA_DEVICES", "FAKECUDA_STATE"):
            own = os.environ.get("%s_RANK%d" % (var, self.rank))
            if own is not None:
                os.environ[var] = own
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.plan = os.environ.get("GG_PLAN", "none")
        self.gpu = FakeGPU(self.plan)
        self.model = make_model(self.gpu)
        self.start = copy.deepcopy(self.model.state_dict())
        self.optimizer = make_optimizer(self.model)
        self.data = rank_data(self.rank)
        self.t0 = time.monotonic()

    def init_distributed(self):
        import torch.distributed as dist
        if "MASTER_ADDR" in os.environ:  # torchrun
            dist.init_process_group("gloo")
        else:
            dist.init_process_group("gloo", init_method="file://" + os.environ["GG_INIT"],
                                    rank=self.rank, world_size=self.world)
        return dist

    def loader(self):
        """The batches, in order; each one moves the pressure to its stage."""
        for i in range(BATCHES):
            self.gpu.stage = i
            yield self.data[i]

    def result(self, guard, **extra):
        out = {"rank": self.rank, "plan": self.plan, "params": params(self.model),
               "reference": train_reference(self.start, self.world),
               "active": guard.active if guard is not None else None,
               "history": guard.history if guard is not None else None,
               "ooms": guard.ooms if guard is not None else None,
               "seconds": time.monotonic() - self.t0}
        out.update(extra)
        return out


def write(path, result):
    with open(path, "w") as f:
        json.dump(result, f)


# --- the jobs -----------------------------------------------------------------

def job_micro(ctx):
    """microbatches() on a structured batch: a dict of tensors, a list of
    ids (a plain sequence), a constant and a scalar tensor."""
    import gpuguard
    guard = gpuguard.Guard(batch_size=BATCH)
    splits, weights, ok = [], [], True
    for i, x in enumerate(ctx.loader()):
        batch = {"x": x, "ids": list(range(i * BATCH, (i + 1) * BATCH)), "tag": "constant",
                 "scale": torch.tensor(1.0)}
        pieces = guard.microbatches(batch)
        splits.append(len(pieces))
        weights.append([mb.weight for mb in pieces])
        seen = []
        for mb in pieces:
            d = mb.data
            ok = ok and d["tag"] == "constant" and d["scale"] is batch["scale"]
            ok = ok and len(d["ids"]) == len(mb) == len(d["x"])
            seen += d["ids"]
            loss = loss_fn(ctx.model(d["x"]), d["x"]) * mb.weight
            loss.backward()
        ok = ok and seen == batch["ids"]
        ctx.optimizer.step()
        ctx.optimizer.zero_grad()
    return ctx.result(guard, splits=splits, weights=weights, structure_ok=ok)


def job_run(ctx):
    """Guard.run(): the OOMs come from the shim's refusals."""
    import gpuguard
    guard = gpuguard.Guard(batch_size=BATCH)
    calls, zeroed = [], [0]

    def step(mb):
        calls[-1].append(len(mb))
        loss = loss_fn(ctx.model(mb.data), mb.data) * mb.weight
        loss.backward()

    def zero_grad():
        zeroed[0] += 1
        ctx.optimizer.zero_grad()

    for x in ctx.loader():
        calls.append([])
        guard.run(x, step, zero_grad)
        ctx.optimizer.step()
        ctx.optimizer.zero_grad()
    return ctx.result(guard, calls=calls, zero_grad_calls=zeroed[0])


def job_inert(ctx):
    """No shim: both loops, and what they change (nothing)."""
    import warnings
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import gpuguard
        guard = gpuguard.Guard(batch_size=BATCH)
    pieces_seen, run_calls = [], []
    for x in ctx.loader():
        pieces = guard.microbatches(x)
        pieces_seen.append([(len(mb), mb.weight, mb.data is x) for mb in pieces])
        for mb in pieces:
            loss = loss_fn(ctx.model(mb.data), mb.data) * mb.weight
            loss.backward()
        ctx.optimizer.step()
        ctx.optimizer.zero_grad()
    micro_params = params(ctx.model)

    model = copy_of(ctx.start)
    opt = make_optimizer(model)

    def step(mb):
        run_calls[-1].append(mb.data is x)
        loss_fn(model(mb.data), mb.data).backward()

    for x in ctx.loader():
        run_calls.append([])
        guard.run(x, step, opt.zero_grad)
        opt.step()
        opt.zero_grad()
    return ctx.result(guard, warnings=[str(w.message) for w in caught], pieces=pieces_seen,
                      run_calls=run_calls, run_params=params(model), micro_params=micro_params)


def grads(model):
    return torch.cat([p.grad.detach().reshape(-1) for p in model.parameters()]).tolist()


def ambiguous(call):
    """What `call` raised: the UsageError's message, or None when it ran."""
    import gpuguard
    try:
        call()
    except gpuguard.UsageError as e:
        return str(e)
    return None


def job_backward(ctx):
    """guard.backward(loss) in a microbatches() loop, no weight written by
    hand: each batch's accumulated gradients against the same batch's whole
    (a second model, same start, same steps); then the calls whose piece the
    helper cannot know."""
    import threading
    import gpuguard
    guard = gpuguard.Guard(batch_size=BATCH)
    reference = copy_of(ctx.start)
    ref_opt = make_optimizer(reference)
    splits, worst = [], 0.0
    for x in ctx.loader():
        pieces = guard.microbatches(x)
        splits.append([len(mb) for mb in pieces])
        for mb in pieces:
            guard.backward(loss_fn(ctx.model(mb.data), mb.data))
        loss_fn(reference(x), x).backward()
        worst = max(worst, max(abs(a - b) for a, b in zip(grads(ctx.model), grads(reference))))
        for opt in (ctx.optimizer, ref_opt):
            opt.step()
            opt.zero_grad()
    x = ctx.data[0]
    ctx.gpu.stage = 0  # the calls below run at the first batch's pressure

    def loss():
        return loss_fn(ctx.model(x), x)

    outside = ambiguous(lambda: guard.backward(loss()))

    def copied():
        for mb in list(guard.microbatches(x)):    # a copy: the loop is the list's
            guard.backward(loss_fn(ctx.model(mb.data), mb.data))

    def elsewhere():
        errors = []
        for mb in guard.microbatches(x):
            t = threading.Thread(target=lambda: errors.append(ambiguous(lambda: guard.backward(
                loss_fn(ctx.model(mb.data), mb.data)))))
            t.start()
            t.join()
        return errors[0]

    copied_error = ambiguous(copied)
    other_thread = elsewhere()
    ctx.optimizer.zero_grad()
    return ctx.result(guard, splits=splits, max_grad_error=worst, outside=outside,
                      copied=copied_error, other_thread=other_thread)


def job_dist(ctx):
    """Two ranks, DistributedDataParallel over gloo, microbatches(); then
    the loader-rebuilding API (shrink_requested / accept) with a fresh guard."""
    import gpuguard
    from torch.nn.parallel import DistributedDataParallel as DDP
    dist = ctx.init_distributed()
    ddp = DDP(ctx.model)
    guard = gpuguard.Guard(batch_size=BATCH)
    splits = []
    for x in ctx.loader():
        pieces = guard.microbatches(x)
        splits.append(len(pieces))
        for mb in pieces:
            with ddp.no_sync() if not mb.last else _nothing():
                loss = loss_fn(ddp(mb.data), mb.data) * mb.weight
                loss.backward()
        ctx.optimizer.step()
        ctx.optimizer.zero_grad()
    result = ctx.result(guard, splits=splits)

    # The README's old loop hung here: accept() ran an all-reduce on the one
    # rank that was advised. Now shrink_requested is the collective, read by
    # every rank at every batch, and accept() agrees without communicating.
    legacy = gpuguard.Guard(batch_size=BATCH)
    accepted = []
    for i in range(3):
        ctx.gpu.stage = 3  # rank 1's near miss at a batch of 32
        ctx.gpu.activations(legacy.batch_size)
        if legacy.shrink_requested:
            accepted.append([i, list(legacy.accept())])
    result["accepted"] = accepted
    del ddp  # before its process group: DDP's reducer may wait on it when freed later
    dist.barrier()
    dist.destroy_process_group()
    return result


def job_dist_run(ctx):
    """Two ranks, Guard.run(); gradients all-reduced after each batch. One
    rank's refusals make every rank redo the batch with the same split."""
    import gpuguard
    dist = ctx.init_distributed()
    guard = gpuguard.Guard(batch_size=BATCH)
    calls = []

    def step(mb):
        calls[-1] += 1
        loss = loss_fn(ctx.model(mb.data), mb.data) * mb.weight
        loss.backward()

    for x in ctx.loader():
        calls.append(0)
        guard.run(x, step, ctx.optimizer.zero_grad)
        for p in ctx.model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= ctx.world
        ctx.optimizer.step()
        ctx.optimizer.zero_grad()
    splits = [1] * BATCHES
    for change in guard.history:
        for b in range(change["batch"] - 1, BATCHES):
            splits[b] = change["split"]
    result = ctx.result(guard, calls=calls, splits=splits)
    dist.barrier()
    dist.destroy_process_group()
    return result


# --- batches sized by their shape -----------------------------------------------

#: The lengths of the shape job's batches ([BATCH, length, FEATURES]): mostly
#: short, two long ones. Its fake GPU holds 12 GiB of weights and 1 MiB of
#: activations per token (sample x length): on a 3090 (near-miss line 20.4
#: GiB) batches 6 and 9 whole need 24.5 and 23.9 GiB, in halves 18.3 and
#: 17.9; the rest fit whole.
SHAPE_LENGTHS = [60, 100, 80, 120, 90, 400, 70, 110, 380, 85, 95, 75]


def shape_data(rank):
    g = torch.Generator().manual_seed(2000 + rank)
    return [torch.randn(BATCH, n, FEATURES, generator=g) for n in SHAPE_LENGTHS]


class TokenModel(Model):
    """Model whose forward pass costs 1 MiB of fake device memory a token."""

    def forward(self, x):
        gpu = self.gpu
        if gpu.lib is not None:
            gpu.lib.tl_free(gpu.alloc(x.shape[0] * x.shape[1] * MiB))
            gpu.lib.tl_empty_cache()
        return self.net(x)


def job_shape(ctx):
    """Guard.run() on batches of long-tailed lengths: the shim's model sizes
    each before it runs (two ranks over gloo when WORLD_SIZE is 2, gradients
    all-reduced after each batch). The reference: the same model from the
    same start on whole batches, no pressure."""
    import gpuguard
    dist = ctx.init_distributed() if ctx.world > 1 else None
    model = TokenModel(ctx.gpu)
    model.load_state_dict(ctx.start)
    opt = make_optimizer(model)
    guard = gpuguard.Guard(batch_size=BATCH)
    data, pieces = shape_data(ctx.rank), []

    def step(mb):
        pieces[-1].append(len(mb))
        loss = loss_fn(model(mb.data), mb.data) * mb.weight
        loss.backward()

    for x in data:
        pieces.append([])
        guard.run(x, step, opt.zero_grad)
        if dist is not None:
            for p in model.parameters():
                dist.all_reduce(p.grad)
                p.grad /= ctx.world
        opt.step()
        opt.zero_grad()
    guard.finish()
    ref = copy_of(ctx.start)
    ref_opt = make_optimizer(ref)
    every = [shape_data(r) for r in range(ctx.world)]
    for i in range(len(SHAPE_LENGTHS)):
        x = torch.cat([d[i] for d in every])
        loss_fn(ref(x), x).backward()
        ref_opt.step()
        ref_opt.zero_grad()
    out = {"rank": ctx.rank, "params": params(model), "reference": params(ref),
           "pieces": pieces, "sizing": guard.sizing, "ooms": guard.ooms,
           "history": guard.history}
    if dist is not None:
        dist.barrier()
        dist.destroy_process_group()
    return out


# --- the adapters ---------------------------------------------------------------

HALF = BATCH // 2  # the adapters' loader batch: two per optimizer step (accumulation 2)


class HFModel(torch.nn.Module):
    """A model as the HF Trainer calls it: keyword inputs, a dict with the
    loss (a mean over the batch) out."""

    def __init__(self, state, gpu):
        super(HFModel, self).__init__()
        self.inner = copy_of(state)
        self.inner.gpu = gpu

    def forward(self, x, labels, stage=0):
        self.inner.gpu.stage = stage
        out = self.inner(x)
        return {"loss": loss_fn(out, labels), "logits": out}


class HFSummedModel(HFModel):
    """A model that accepts loss kwargs: its loss is a sum divided by the
    accumulated batch's item count."""

    def forward(self, x, labels, stage=0, num_items_in_batch=None):
        self.inner.gpu.stage = stage
        out = self.inner(x)
        return {"loss": ((out - labels) ** 2).sum() / num_items_in_batch, "logits": out}


def hf_samples(ctx):
    """The rank's data as HF samples, stage = the optimizer step."""
    return [{"x": ctx.data[i][j], "labels": ctx.data[i][j], "stage": i}
            for i in range(BATCHES) for j in range(BATCH)]


def hf_collate(samples):
    return {"x": torch.stack([s["x"] for s in samples]),
            "labels": torch.stack([s["labels"] for s in samples]), "stage": samples[0]["stage"]}


def job_hf(ctx, real=None):
    """The HF adapter on the stand-in Trainer: GpuguardTrainer with a mean
    loss; guard_trainer() on a subclass with its own compute_loss; a model
    whose loss is normalized by num_items_in_batch. Each under pressure,
    each against the reference."""
    ctx.gpu.release()  # each run below has its own
    if real:
        return job_hf_real(ctx)
    sys.modules.update(standins.transformers_modules())
    from gpuguard.adapters import hf
    hf._reset()
    from transformers import Trainer, TrainingArguments

    class OwnLoss(Trainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            out = model(**inputs)
            loss = loss_fn(out["logits"], inputs["labels"])
            return (loss, out) if return_outputs else loss

    runs = {}
    for name in ("GpuguardTrainer", "guard_trainer", "num_items"):
        gpu = FakeGPU(ctx.plan)
        model = (HFSummedModel if name == "num_items" else HFModel)(ctx.start, gpu)
        args = TrainingArguments(per_device_train_batch_size=HALF, gradient_accumulation_steps=2)
        if name == "GpuguardTrainer":
            trainer = hf.GpuguardTrainer(model=model, args=args, train_dataset=hf_samples(ctx))
        else:
            cls = OwnLoss if name == "guard_trainer" else Trainer
            trainer = hf.guard_trainer(cls(model=model, args=args,
                                           train_dataset=hf_samples(ctx)))
        trainer.train()
        guard = trainer.gpuguard.guard
        runs[name] = {"params": params(model.inner), "history": guard.history,
                      "synced": trainer.sync.synced[:-1], "samples": trainer.sync.samples[:-1],
                      "args": [args.per_device_train_batch_size,
                               args.gradient_accumulation_steps],
                      "compute_loss_restored": "compute_loss" not in trainer.__dict__}
        guard.close()
        gpu.release()
    return ctx.result(None, runs=runs)


def lit_module(ctx, gpu, as_dict):
    import lightning.pytorch as pl

    class Module(pl.LightningModule):
        def __init__(self):
            super(Module, self).__init__()
            self.inner = copy_of(ctx.start)
            self.inner.gpu = gpu

        def training_step(self, batch, batch_idx):
            x, stage = batch
            gpu.stage = stage
            loss = loss_fn(self.inner(x), x)
            return {"loss": loss, "samples": len(x)} if as_dict else loss

        def configure_optimizers(self):
            return make_optimizer(self.inner)

    return Module()


def lit_batches(ctx):
    return [(ctx.data[i][h * HALF:(h + 1) * HALF], i) for i in range(BATCHES) for h in (0, 1)]


def job_lightning(ctx, real=None):
    """The Lightning callback on the stand-in loop: a tensor loss and a
    dict output, under pressure, against the unguarded loop's result."""
    ctx.gpu.release()  # each run below has its own
    if real:
        return job_lightning_real(ctx)
    sys.modules.update(standins.lightning_modules())
    from gpuguard.adapters import lightning
    lightning._reset()
    from lightning.pytorch import Trainer
    runs = {}
    for name, as_dict in (("tensor", False), ("dict", True)):
        for guarded in (False, True):
            gpu = FakeGPU(ctx.plan if guarded else "none")
            module = lit_module(ctx, gpu, as_dict)
            callbacks = [lightning.GpuguardCallback()] if guarded else []
            trainer = Trainer(accumulate_grad_batches=2, callbacks=callbacks)
            trainer.fit(module, lit_batches(ctx))
            run = {"params": params(module.inner), "losses": trainer.losses,
                   "synced": trainer.sync.synced[:-1], "samples": trainer.sync.samples[:-1],
                   "accumulate_grad_batches": trainer.accumulate_grad_batches,
                   "patched": sorted(k for k in ("training_step", "optimizer_zero_grad")
                                     if k in trainer.strategy.__dict__
                                     or k in module.__dict__)}
            if guarded:
                run["history"] = callbacks[0].history
                run["guard_closed"] = callbacks[0].guard is None
            runs["%s-%s" % (name, "guarded" if guarded else "plain")] = run
            gpu.release()
    return ctx.result(None, runs=runs)


def job_hf_real(ctx):
    """The HF adapter on the installed transformers: the same Trainer run
    unguarded without pressure and guarded under it."""
    import tempfile
    import transformers
    from gpuguard.adapters import hf
    runs = {}
    for guarded in (False, True):
        gpu = FakeGPU(ctx.plan if guarded else "none")
        model = HFModel(ctx.start, gpu)
        params_ = inspect_params(transformers.TrainingArguments)
        kw = {"use_cpu": True} if "use_cpu" in params_ else {"no_cuda": True}
        args = transformers.TrainingArguments(
            output_dir=tempfile.mkdtemp(prefix="gg-hf-"), per_device_train_batch_size=HALF,
            gradient_accumulation_steps=2, num_train_epochs=1, learning_rate=0.05,
            lr_scheduler_type="constant", max_grad_norm=0.0, weight_decay=0.0,
            report_to=[], save_strategy="no", logging_strategy="no", seed=0,
            remove_unused_columns=False, **kw)
        trainer = transformers.Trainer(
            model=model, args=args, train_dataset=hf_samples(ctx), data_collator=hf_collate,
            optimizers=(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9), None))
        if guarded:
            hf.guard_trainer(trainer)
        trainer.train()
        run = {"params": params(model.inner), "args": [args.per_device_train_batch_size,
                                                       args.gradient_accumulation_steps]}
        if guarded:
            run["history"] = trainer.gpuguard.history
        runs["guarded" if guarded else "plain"] = run
        gpu.release()
    return ctx.result(None, runs=runs, version=transformers.__version__)


def job_lightning_real(ctx):
    """The Lightning callback on the installed Lightning: the same fit
    unguarded without pressure and guarded under it."""
    try:
        import lightning.pytorch as pl
    except ImportError:
        import pytorch_lightning as pl
    from gpuguard.adapters import lightning
    runs = {}
    for guarded in (False, True):
        gpu = FakeGPU(ctx.plan if guarded else "none")
        module = lit_module(ctx, gpu, False)
        callbacks = [lightning.GpuguardCallback()] if guarded else []
        trainer = pl.Trainer(max_epochs=1, accumulate_grad_batches=2, callbacks=callbacks,
                             accelerator="cpu", devices=1, logger=False,
                             enable_checkpointing=False, enable_progress_bar=False,
                             enable_model_summary=False, num_sanity_val_steps=0)
        loader = torch.utils.data.DataLoader(lit_batches(ctx), batch_size=None, shuffle=False)
        trainer.fit(module, loader)
        run = {"params": params(module.inner),
               "accumulate_grad_batches": trainer.accumulate_grad_batches}
        if guarded:
            run["history"] = callbacks[0].history
        runs["guarded" if guarded else "plain"] = run
        gpu.release()
    return ctx.result(None, runs=runs, version=pl.__version__)


def inspect_params(cls):
    import inspect
    return inspect.signature(cls).parameters


# --- README loops ------------------------------------------------------------------

def job_readme(ctx, path):
    """A loop of the README, run as written: this prelude gives it the names
    it leaves to the reader (loader, model, loss_fn, optimizer); under
    torchrun the model is DistributedDataParallel over gloo."""
    with open(path) as f:
        code = f.read()
    model = ctx.model
    if ctx.world > 1:
        from torch.nn.parallel import DistributedDataParallel as DDP
        ctx.init_distributed()
        model = DDP(ctx.model)
    names = {"__name__": "__readme__", "loader": ctx.loader(), "model": model,
             "loss_fn": loss_fn, "optimizer": ctx.optimizer}
    exec(compile(code, path, "exec"), names)
    result = ctx.result(names.get("guard"))
    if ctx.world > 1:
        import torch.distributed as dist
        del model, names
        dist.barrier()
        dist.destroy_process_group()
    return result


class _nothing(object):
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


JOBS = {"micro": job_micro, "run": job_run, "inert": job_inert, "backward": job_backward,
        "dist": job_dist,
        "dist-run": job_dist_run, "shape": job_shape, "hf": job_hf, "lightning": job_lightning,
        "readme": job_readme}


def main(argv):
    job, out = argv[1], argv[2].replace("{rank}", os.environ.get("RANK", "0"))
    write(out, JOBS[job](Context(), *argv[3:]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
