"""gpuguard.adapters.hf: the Hugging Face ``Trainer`` splits its batches
into micro-batches when libgpuguard.so advises a smaller batch.

    from gpuguard.adapters.hf import GpuguardTrainer
    trainer = GpuguardTrainer(model=model, args=args, train_dataset=...)

or, for any Trainer already built (a subclass of your own, TRL's
SFTTrainer, ...)::

    from gpuguard.adapters.hf import guard_trainer
    trainer = guard_trainer(SFTTrainer(...))

The Trainer calls ``training_step`` once per batch of the dataloader
(``gradient_accumulation_steps`` times per optimizer step). The guarded step
runs the batch whole until the shim advises a smaller batch, then as 2, 4,
... pieces, each its own forward and backward, so one piece's activations
are freed before the next piece runs. The dataloader,
``per_device_train_batch_size``, ``gradient_accumulation_steps`` and so the
samples per optimizer step (times the world size) stay exactly as
configured: the gradient is the batch's, the learning-rate schedule and the
step count unchanged.

- Loss scaling follows the Trainer's own rule. Where it divides the loss by
  ``gradient_accumulation_steps`` (a mean over the batch: a model without
  loss kwargs or no ``num_items_in_batch``, and no ``compute_loss_func``),
  each piece's loss is multiplied by len(piece) / len(batch), whatever
  ``compute_loss`` computes (a subclass's own included). Where the loss is
  already a sum divided by ``num_items_in_batch`` (the item count of the
  whole accumulated batch), the pieces' losses simply add up. The step
  returns the batch's loss.
- Distributed: every piece but the last runs under
  ``accelerator.no_sync(model)``, so gradients are synchronized once per
  batch as before; every rank agrees on the split (one all-reduce per
  batch, the guard's).
- DeepSpeed (and SageMaker model parallelism) count backward calls
  themselves: there the adapter leaves the step alone and says so once.
- The guard registers with the shim at the first training step, with that
  batch's size; ``trainer.gpuguard.guard`` is the ``gpuguard.Guard`` (its
  ``history`` lists the splits).

Importing this module imports nothing from transformers; ``GpuguardTrainer``
is built from ``transformers.Trainer`` on first use.
"""

import functools
import importlib
import sys

from .trainer import DEFAULT_SIGNAL
from ._adapt import NoSync, Splitter

__all__ = ["GpuguardTrainer", "guard_trainer", "available"]

_class = None
_MISSING = object()


def available():
    """True when transformers can be imported."""
    try:
        importlib.import_module("transformers")
    except ImportError:
        return False
    return True


def _unsupported(trainer):
    """Why the step must stay whole, or None."""
    if getattr(trainer, "is_deepspeed_enabled", False):
        return "DeepSpeed counts backward calls for its accumulation"
    module = sys.modules.get("transformers.trainer")
    smp = getattr(module, "is_sagemaker_mp_enabled", None)
    if callable(smp) and smp():
        return "SageMaker model parallelism runs its own micro-batches"
    return None


def _no_sync(trainer, model):
    accelerator = getattr(trainer, "accelerator", None)
    if accelerator is not None and hasattr(accelerator, "no_sync"):
        return functools.partial(accelerator.no_sync, model)
    return getattr(model, "no_sync", None)


def _weighted(compute_loss, weight):
    """compute_loss with its loss multiplied by `weight`."""
    @functools.wraps(compute_loss)
    def weighted(model, inputs, *args, **kwargs):
        out = compute_loss(model, inputs, *args, **kwargs)
        if isinstance(out, tuple):  # return_outputs=True: (loss, outputs)
            return (out[0] * weight,) + tuple(out[1:])
        return out * weight
    return weighted


def _training_step(trainer, original, model, inputs, *args, **kwargs):
    """The Trainer's training_step, run piece by piece once advised."""
    state = trainer.gpuguard
    why = _unsupported(trainer)
    if why:
        state.warn_once("unsupported", "gpuguard: %s: the Hugging Face adapter does not "
                        "split batches", why)
        return original(model, inputs, *args, **kwargs)
    accum = getattr(getattr(trainer, "args", None), "gradient_accumulation_steps", 1)
    pieces = state.pieces(inputs, accum)
    if len(pieces) == 1:
        return original(model, pieces[0].data, *args, **kwargs)
    num_items = args[0] if args else kwargs.get("num_items_in_batch")
    mean = ((not getattr(trainer, "model_accepts_loss_kwargs", False) or num_items is None)
            and getattr(trainer, "compute_loss_func", None) is None)
    no_sync = _no_sync(trainer, model)
    # Whatever compute_loss the trainer has (a subclass's own included) is
    # the one scaled, through an instance attribute for the step's duration.
    compute_loss = trainer.compute_loss
    saved = trainer.__dict__.get("compute_loss", _MISSING)
    total = None
    try:
        for mb in pieces:
            if mean:
                trainer.compute_loss = _weighted(compute_loss, mb.weight)
            with NoSync(None if mb.last else no_sync):
                loss = original(model, mb.data, *args, **kwargs)
            total = loss if total is None else total + loss
    finally:
        if saved is _MISSING:
            trainer.__dict__.pop("compute_loss", None)
        else:
            trainer.compute_loss = saved
    return total


def guard_trainer(trainer, guard=None, min_batch_size=1, signal=DEFAULT_SIGNAL):
    """Make `trainer` (a transformers.Trainer, any subclass) split its
    batches when advised; returns it. `guard`: a gpuguard.Guard to use
    instead of the one made at the first step; `min_batch_size`: the
    smallest piece; `signal`: as for gpuguard.Guard."""
    if "gpuguard" in trainer.__dict__:
        return trainer  # already guarded
    trainer.gpuguard = Splitter(guard, min_batch_size, signal)
    trainer.training_step = functools.partial(_training_step, trainer, trainer.training_step)
    return trainer


def _build():
    try:
        from transformers import Trainer
    except ImportError as e:
        raise ImportError(
            "gpuguard.adapters.hf needs transformers (pip install transformers): %s" % e)

    class GpuguardTrainer(Trainer):
        """transformers.Trainer whose batches are split into micro-batches
        when libgpuguard.so advises it (see gpuguard.adapters.hf).
        Keyword arguments gpuguard (a Guard), gpuguard_min_batch_size."""

        def __init__(self, *args, **kwargs):
            guard = kwargs.pop("gpuguard", None)
            min_batch_size = kwargs.pop("gpuguard_min_batch_size", 1)
            super(GpuguardTrainer, self).__init__(*args, **kwargs)
            guard_trainer(self, guard=guard, min_batch_size=min_batch_size)

    GpuguardTrainer.__module__ = __name__
    return GpuguardTrainer


def __getattr__(name):
    global _class
    if name == "GpuguardTrainer":
        if _class is None:
            _class = _build()
        return _class
    if name == "GpuguardCallback":
        raise AttributeError(
            "gpuguard.adapters.hf.GpuguardCallback is gone: it changed the batch size and "
            "accumulation, which freed no memory until the dataloader was rebuilt and changed "
            "the samples per step; use GpuguardTrainer or guard_trainer(trainer)")
    raise AttributeError("module %r has no attribute %r" % (__name__, name))


def _reset():
    """Forget the built class (tests swap transformers)."""
    global _class
    _class = None
