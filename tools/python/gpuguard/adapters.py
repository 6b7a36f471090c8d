"""Trainer adapters: ``gpuguard.adapters.hf`` (Hugging Face Trainer) and
``gpuguard.adapters.lightning`` (Lightning).

Both modules import nothing heavy: their ``GpuguardCallback`` class is built
on first use, from ``transformers.TrainerCallback`` or from
``lightning.pytorch.Callback`` / ``pytorch_lightning.Callback``; using it
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
