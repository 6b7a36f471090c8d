"""Trainer adapters: ``gpuguard.adapters.hf`` (Hugging Face Trainer) and
``gpuguard.adapters.lightning`` (Lightning). Both split each training batch
into micro-batches inside the training step when the shim advises a smaller
batch; the dataloader, the batch size, the accumulation and so the samples
per optimizer step stay as configured.

Both modules import nothing heavy: ``hf.GpuguardTrainer`` is built on first
use from ``transformers.Trainer`` (``hf.guard_trainer(trainer)`` needs no
import at all), ``lightning.GpuguardCallback`` from
``lightning.pytorch.Callback`` / ``pytorch_lightning.Callback``; using them
without the framework installed raises ImportError. ``available()`` in each
says whether the framework can be imported.

The adapters live in flat modules of the gpuguard package (``_hf``,
``_lightning``, installed as plain files) and are registered here under
their public names, so both ``import gpuguard.adapters.hf`` and
``from gpuguard.adapters import hf`` work.
"""

import sys

from . import _hf as hf
from . import _lightning as lightning

sys.modules[__name__ + ".hf"] = hf
sys.modules[__name__ + ".lightning"] = lightning

__all__ = ["hf", "lightning"]
