"""gpuguard.adapters.lightning: a callback for Lightning's ``Trainer``.

    from gpuguard.adapters.lightning import GpuguardCallback
    trainer = Trainer(..., callbacks=[GpuguardCallback()],
                      reload_dataloaders_every_n_epochs=1)

At ``on_train_start`` the callback starts a ``gpuguard.Guard`` (unless given
one) from the datamodule's ``batch_size`` (or the LightningModule's, or the
train dataloader's) and ``trainer.accumulate_grad_batches``. At
``on_train_batch_end``, when the shim advised a shrink, it accepts the advice
(empties PyTorch's cache, agrees across ranks, acks), sets
``trainer.accumulate_grad_batches`` (read by the fit loop at every batch, so
it applies at once) and the ``batch_size`` attribute of the datamodule and of
the LightningModule where they have one.

Limits: Lightning builds the train dataloader once per epoch at most; the new
batch size applies when it calls ``train_dataloader()`` again, which needs
``reload_dataloaders_every_n_epochs``. A callback of an unknown batch size
(no ``batch_size`` anywhere) warns and stays inert.

The class is built on first use from ``lightning.pytorch.Callback``, else
``pytorch_lightning.Callback``; importing this module imports neither.
"""

import importlib

from . import DEFAULT_SIGNAL
from ._adapt import AdapterState, log, set_attr

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


def _batch_size_of(trainer, pl_module):
    for obj in (getattr(trainer, "datamodule", None), pl_module):
        if obj is None:
            continue
        b = getattr(obj, "batch_size", None)
        if isinstance(b, int) and b > 0:
            return b
        hp = getattr(obj, "hparams", None)
        b = getattr(hp, "batch_size", None) if hp is not None else None
        if b is None and isinstance(hp, dict):
            b = hp.get("batch_size")
        if isinstance(b, int) and b > 0:
            return b
    loader = getattr(trainer, "train_dataloader", None)
    b = getattr(loader, "batch_size", None)
    if isinstance(b, int) and b > 0:
        return b
    return None


def _build():
    base = _callback_base()

    class GpuguardCallback(base):
        """Shrinks the batch and raises accumulate_grad_batches when
        libgpuguard.so advises it (see the module's documentation)."""

        def __init__(self, guard=None, min_batch_size=1, check_every=1,
                     signal=DEFAULT_SIGNAL):
            super(GpuguardCallback, self).__init__()
            self._gg = AdapterState(guard, min_batch_size, check_every, signal)

        @property
        def guard(self):
            return self._gg.guard

        @property
        def history(self):
            return self._gg.history

        def on_train_start(self, trainer, pl_module):
            if self._gg.guard is not None:
                return
            b = _batch_size_of(trainer, pl_module)
            if b is None:
                log.warning("gpuguard: no batch_size on the datamodule or the "
                            "module; the Lightning callback is inert")
                return
            accum = getattr(trainer, "accumulate_grad_batches", 1)
            self._gg.start(b, accum if isinstance(accum, int) and accum > 0 else 1)

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx,
                               *args, **kwargs):
            change = self._gg.step()
            if change is None:
                return
            (ob, oa), (nb, na) = change
            set_attr(trainer, "accumulate_grad_batches", na)
            for obj in (getattr(trainer, "datamodule", None), pl_module):
                if obj is not None and hasattr(obj, "batch_size"):
                    set_attr(obj, "batch_size", nb)
            log.warning(
                "gpuguard: shrink advised at batch %s: batch_size %d -> %d, "
                "accumulate_grad_batches %d -> %d (the batch applies when the "
                "train dataloader is reloaded)", batch_idx, ob, nb, oa, na)

        def on_train_end(self, trainer, pl_module):
            self._gg.stop()

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
