"""python -m gpuguard.report JOURNAL... : the gpuguard-report command."""
import sys

from .cli import console

sys.exit(console())
