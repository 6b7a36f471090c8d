"""gpuguard.adapters.lightning: a Lightning callback that splits each
training batch into micro-batches when libgpuguard.so advises a smaller batch.

    from gpuguard.adapters.lightning import GpuguardCallback
    trainer = Trainer(..., callbacks=[GpuguardCallback()])

With automatic optimization, Lightning runs ``training_step`` on each batch
of the dataloader, then the backward of the loss it returns, and steps the
optimizer every ``accumulate_grad_batches`` batches. The callback wraps the
strategy's ``training_step`` (for the fit's duration): the batch runs whole
until the shim advises a smaller batch, then as 2, 4, ... pieces; every
piece but the last gets its own forward and backward inside the step (its
activations freed before the next piece runs), and the last piece's loss is
what Lightning backpropagates. Each piece's loss is scaled by
len(piece) / len(batch), so the gradient is the batch's; the value returned
to Lightning (and logged as the loss) is the whole batch's. The dataloader,
``batch_size``, ``accumulate_grad_batches`` and so the samples per optimizer
step (times the world size) stay exactly as configured.

- The backward of the earlier pieces goes through ``strategy.backward``
  (precision plugin scaling, on_before_backward / on_after_backward hooks)
  with the loss divided by ``accumulate_grad_batches`` as Lightning divides
  its own, and under ``strategy.block_backward_sync()`` together with their
  forward, so DDP synchronizes gradients once per batch, at the last piece.
- Lightning zeroes the gradients between the first step of an accumulation
  cycle and its backward; on such a batch the callback zeroes them before
  the first piece instead (through ``optimizer_zero_grad``) and lets
  Lightning's call pass.
- Every rank agrees on the split (one all-reduce per batch, the guard's).
- Manual optimization (``automatic_optimization = False``) and strategies
  that accumulate themselves (DeepSpeed) are left alone, with one warning:
  split inside your own training_step with ``gpuguard.Guard.microbatches``.
- The guard registers with the shim at the first training batch, with that
  batch's size; ``callback.guard`` is the ``gpuguard.Guard``.

The class is built on first use from ``lightning.pytorch.Callback``, else
``pytorch_lightning.Callback``; importing this module imports neither.
"""

import importlib
import inspect
from collections.abc import Mapping

from .trainer import DEFAULT_SIGNAL
from ._adapt import NoSync, Splitter

__all__ = ["GpuguardCallback", "available"]

_class = None


def _callback_base():
    errors = []
    for modname in ("lightning.pytorch", "pytorch_lightning"):
        try:
            mod = importlib.import_module(modname)
            return mod.Callback
        except (ImportError, AttributeError) as e:
            errors.append("%s: %s" % (modname, e))
    raise ImportError("gpuguard.adapters.lightning needs lightning "
                      "(pip install lightning): " + "; ".join(errors))


def available():
    """True when lightning.pytorch or pytorch_lightning can be imported."""
    try:
        _callback_base()
    except ImportError:
        return False
    return True


def _takes(fn, name):
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def _loss_of(output):
    """The loss in a training_step's output (a tensor, or a mapping's
    "loss"), or None (Lightning skips the batch)."""
    if isinstance(output, Mapping):
        return output.get("loss")
    return output


def _with_loss(output, loss):
    if isinstance(output, Mapping):
        out = dict(output)
        out["loss"] = loss
        return out
    return loss


class _Wrapped(object):
    """The fit's patches of one trainer: the strategy's training_step and
    the module's optimizer_zero_grad, as instance attributes."""

    def __init__(self, splitter, trainer, module):
        self.splitter = splitter
        self.trainer = trainer
        self.module = module
        self.strategy = trainer.strategy
        self.step = self.strategy.training_step
        self.zero = module.optimizer_zero_grad
        # Lightning 1.x passes optimizer_idx to both hooks.
        self.zero_extra = (0,) if _takes(self.zero, "optimizer_idx") else ()
        self.backward_extra = (0,) if _takes(self.strategy.backward, "optimizer_idx") else ()
        self.skip_zero = None
        self.strategy.training_step = self.training_step
        module.optimizer_zero_grad = self.optimizer_zero_grad

    def remove(self):
        self.strategy.__dict__.pop("training_step", None)
        self.module.__dict__.pop("optimizer_zero_grad", None)

    def optimizer_zero_grad(self, epoch, batch_idx, optimizer, *args, **kwargs):
        if self.skip_zero is not None and self.skip_zero == batch_idx:
            self.skip_zero = None  # zeroed before this batch's first piece
            return None
        return self.zero(epoch, batch_idx, optimizer, *args, **kwargs)

    def training_step(self, batch, *args, **kwargs):
        trainer = self.trainer
        accum = max(1, int(getattr(trainer, "accumulate_grad_batches", 1) or 1))
        pieces = self.splitter.pieces(batch, accum)
        self.skip_zero = None
        if len(pieces) == 1:
            return self.step(pieces[0].data, *args, **kwargs)
        batch_idx = args[0] if args else kwargs.get("batch_idx", 0)
        optimizers = getattr(trainer, "optimizers", None) or [None]
        optimizer = optimizers[0]
        if batch_idx % accum == 0:
            # Lightning zeroes the gradients after this step and before its
            # backward, which would lose the earlier pieces' gradients.
            self.zero(trainer.current_epoch, batch_idx, optimizer, *self.zero_extra)
            self.skip_zero = batch_idx
        done = None
        for mb in pieces[:-1]:
            with NoSync(getattr(self.strategy, "block_backward_sync", None)):
                loss = _loss_of(self.step(mb.data, *args, **kwargs))
                if loss is None:
                    continue
                loss = loss * mb.weight
                self.strategy.backward(loss / accum, optimizer, *self.backward_extra)
            done = loss.detach() if done is None else done + loss.detach()
            del loss
        last = pieces[-1]
        output = self.step(last.data, *args, **kwargs)
        loss = _loss_of(output)
        if loss is None:
            return output
        # The value is the whole batch's loss; the gradient only the last piece's.
        loss = loss * last.weight
        return _with_loss(output, loss if done is None else loss + done)


def _build():
    base = _callback_base()

    class GpuguardCallback(base):
        """Splits each training batch into micro-batches when
        libgpuguard.so advises it (see gpuguard.adapters.lightning).
        guard: a gpuguard.Guard to use instead of the one made at the first
        batch; min_batch_size: the smallest piece; signal: as for Guard."""

        def __init__(self, guard=None, min_batch_size=1, signal=DEFAULT_SIGNAL):
            super(GpuguardCallback, self).__init__()
            self._gg = Splitter(guard, min_batch_size, signal)
            self._wrapped = None

        @property
        def guard(self):
            return self._gg.guard

        @property
        def history(self):
            return self._gg.history

        def on_train_start(self, trainer, pl_module):
            if not getattr(pl_module, "automatic_optimization", True):
                self._gg.warn_once("manual", "gpuguard: manual optimization: the Lightning "
                                   "callback does not split batches; use "
                                   "gpuguard.Guard.microbatches in training_step")
                return
            if getattr(trainer.strategy, "handles_gradient_accumulation", False):
                self._gg.warn_once("strategy", "gpuguard: %s accumulates gradients itself: "
                                   "the Lightning callback does not split batches",
                                   type(trainer.strategy).__name__)
                return
            self._remove()
            self._wrapped = _Wrapped(self._gg, trainer, pl_module)

        def _remove(self):
            if self._wrapped is not None:
                self._wrapped.remove()
                self._wrapped = None

        def on_train_end(self, trainer, pl_module):
            self._remove()
            self._gg.close()

        def on_exception(self, trainer, pl_module, exception):
            self._remove()

        def teardown(self, trainer, pl_module, stage=None):
            self._remove()

    GpuguardCallback.__module__ = __name__
    return GpuguardCallback


def __getattr__(name):
    global _class
    if name == "GpuguardCallback":
        if _class is None:
            _class = _build()
        return _class
    raise AttributeError("module %r has no attribute %r" % (__name__, name))


def _reset():
    """Forget the built class (tests swap the framework)."""
    global _class
    _class = None
