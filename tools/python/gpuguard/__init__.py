"""gpuguard: the trainer's side of the GPU memory guard.

libgpuguard.so, preloaded into the training process, watches every device
allocation; this package is what a Python trainer adds to it::

    import gpuguard
    guard = gpuguard.Guard(batch_size=32, min_batch_size=1)
    for batch in loader:
        guard.run(batch, step, zero_grad)   # split when memory is tight

The helper lives in ``gpuguard.trainer`` (the names below are re-exported
from there on first use), the post-mortem report in ``gpuguard.report``, the
journal reader in ``gpuguard.journal``: importing the report or the journal
never loads the helper, and importing gpuguard never loads the report.

Standard library only; importing gpuguard never imports torch, transformers
or lightning (it uses torch only when the program already imported it).
"""

import sys

__version__ = "0.1.0"

__all__ = ["Guard", "MicroBatch", "MicroBatches", "GpuguardWarning", "UsageError",
           "DEFAULT_SIGNAL", "NOTE_LIMIT", "__version__"]

_FROM_TRAINER = frozenset(__all__) - {"__version__"}


def __getattr__(name):
    """gpuguard.Guard and the helper's other public names, loaded from
    gpuguard.trainer on first use (PEP 562)."""
    if name in _FROM_TRAINER:
        from . import trainer
        value = getattr(trainer, name)
        globals()[name] = value
        return value
    raise AttributeError("module %r has no attribute %r" % (__name__, name))


def __dir__():
    return sorted(set(globals()) | _FROM_TRAINER)


if sys.version_info < (3, 7):  # no module __getattr__: load the helper now
    from .trainer import (DEFAULT_SIGNAL, NOTE_LIMIT, GpuguardWarning, Guard,  # noqa: F401
                          MicroBatch, MicroBatches, UsageError)
