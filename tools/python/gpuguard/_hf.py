"""gpuguard.adapters.hf: a callback for the Hugging Face ``Trainer``.

    from gpuguard.adapters.hf import GpuguardCallback
    trainer = Trainer(..., callbacks=[GpuguardCallback()])

At ``on_train_begin`` the callback starts a ``gpuguard.Guard`` from
``args.per_device_train_batch_size`` and ``args.gradient_accumulation_steps``
(unless given one). At ``on_step_end``, when the shim advised a shrink, it
accepts the advice (empties PyTorch's cache, agrees across ranks, acks) and
writes the new values into ``args.per_device_train_batch_size`` and
``args.gradient_accumulation_steps``, and logs it on the ``gpuguard`` logger.
It does not stop training.

Limits: the Trainer builds its dataloader and its accumulation schedule once
per ``train()`` call, so the new values apply only when it builds them again
(the next ``train()``, e.g. resumed from a checkpoint, or a restart by
``auto_find_batch_size``). Until then the shim's headroom is the hard line:
in enforce mode an allocation past the limit becomes a clean
``torch.OutOfMemoryError``, which ``auto_find_batch_size`` handles.

The class is built on first use from ``transformers.TrainerCallback``;
importing this module imports nothing from transformers.
"""

import importlib

from . import DEFAULT_SIGNAL
from ._adapt import AdapterState, log, set_attr

__all__ = ["GpuguardCallback", "available"]

_class = None


def available():
    """True when transformers can be imported."""
    try:
        importlib.import_module("transformers")
    except ImportError:
        return False
    return True


def _build():
    try:
        from transformers import TrainerCallback
    except ImportError as e:
        raise ImportError(
            "gpuguard.adapters.hf needs transformers (pip install transformers): %s" % e)

    class GpuguardCallback(TrainerCallback):
        """Shrinks per_device_train_batch_size / gradient_accumulation_steps
        when libgpuguard.so advises it (see the module's documentation)."""

        def __init__(self, guard=None, min_batch_size=1, check_every=1,
                     signal=DEFAULT_SIGNAL):
            self._gg = AdapterState(guard, min_batch_size, check_every, signal)

        @property
        def guard(self):
            return self._gg.guard

        @property
        def history(self):
            return self._gg.history

        def on_train_begin(self, args, state, control, **kwargs):
            self._gg.start(int(args.per_device_train_batch_size),
                           int(getattr(args, "gradient_accumulation_steps", 1) or 1))
            return control

        def on_step_end(self, args, state, control, **kwargs):
            change = self._gg.step()
            if change is None:
                return control
            (ob, oa), (nb, na) = change
            set_attr(args, "per_device_train_batch_size", nb)
            set_attr(args, "gradient_accumulation_steps", na)
            log.warning(
                "gpuguard: shrink advised at step %s: per_device_train_batch_size "
                "%d -> %d, gradient_accumulation_steps %d -> %d (applies when the "
                "Trainer builds its dataloader again)",
                getattr(state, "global_step", "?"), ob, nb, oa, na)
            return control

        def on_train_end(self, args, state, control, **kwargs):
            self._gg.stop()
            return control

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
    """Forget the built class (tests swap transformers)."""
    global _class
    _class = None
