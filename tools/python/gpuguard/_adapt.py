"""What the trainer adapters share (no framework imported here)."""

import logging

from . import _split
from .trainer import DEFAULT_SIGNAL, Guard

log = logging.getLogger("gpuguard")


class Splitter(object):
    """The guard of one adapter: created at the first training batch (from
    that batch's length) unless one was given, and asked for the pieces of
    every batch."""

    def __init__(self, guard=None, min_batch_size=1, signal=DEFAULT_SIGNAL):
        if int(min_batch_size) < 1:
            raise ValueError("gpuguard: min_batch_size must be at least 1")
        self.guard = guard
        self.min_batch_size = int(min_batch_size)
        self.signal = signal
        self.owns_guard = False
        self._warned = set()
        self._closed_history = []

    @property
    def history(self):
        """The splits so far (see gpuguard.Guard.history), those of guards
        already closed included."""
        return self._closed_history + (list(self.guard.history) if self.guard is not None else [])

    def pieces(self, batch, grad_accum):
        """The micro-batches of `batch` (a batch boundary of the guard)."""
        if self.guard is None:
            n = _split.batch_length(batch) or 1
            self.guard = Guard(n, max(1, int(grad_accum or 1)),
                               min_batch_size=min(self.min_batch_size, n), signal=self.signal)
            self.owns_guard = True
        return self.guard.microbatches(batch)

    def warn_once(self, key, message, *args):
        if key not in self._warned:
            self._warned.add(key)
            log.warning(message, *args)

    def close(self):
        if self.owns_guard and self.guard is not None:
            self._closed_history += self.guard.history
            self.guard.close()
            self.guard = None
            self.owns_guard = False


class NoSync(object):
    """Runs the enclosed forward and backward without gradient
    synchronization: `context()` (a no_sync-like factory) when there is one,
    else nothing."""

    def __init__(self, context):
        self._context = context
        self._cm = None

    def __enter__(self):
        if self._context is not None:
            self._cm = self._context()
            self._cm.__enter__()
        return self

    def __exit__(self, *exc):
        if self._cm is not None:
            return self._cm.__exit__(*exc)
        return False
