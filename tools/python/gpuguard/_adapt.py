"""What the trainer adapters share (no framework imported here)."""

import logging

from . import DEFAULT_SIGNAL, Guard

log = logging.getLogger("gpuguard")


def set_attr(obj, name, value):
    """obj.name = value, also on frozen dataclasses."""
    try:
        setattr(obj, name, value)
    except Exception:
        object.__setattr__(obj, name, value)


class AdapterState(object):
    """The guard of one callback, created when training starts unless given."""

    def __init__(self, guard=None, min_batch_size=1, check_every=1,
                 signal=DEFAULT_SIGNAL):
        if int(check_every) < 1:
            raise ValueError("gpuguard: check_every must be at least 1")
        self.guard = guard
        self.min_batch_size = int(min_batch_size)
        self.check_every = int(check_every)
        self.signal = signal
        self.owns_guard = False
        self.steps = 0
        self.history = []  # one dict per accepted shrink

    def start(self, batch_size, grad_accum):
        if self.guard is None:
            self.guard = Guard(batch_size, grad_accum or 1,
                               min_batch_size=min(self.min_batch_size, batch_size),
                               signal=self.signal)
            self.owns_guard = True
        return self.guard

    def step(self):
        """(old, new) (batch, accum) pairs when a shrink was accepted at
        this step, else None. In a distributed run the check is collective,
        so every rank shrinks at the same step."""
        guard = self.guard
        if guard is None or not guard.active:
            return None
        self.steps += 1
        if self.steps % self.check_every:
            return None
        if not guard.sync_shrink_requested():
            return None
        old = (guard.batch_size, guard.grad_accum)
        adv = guard.advice()
        new = guard.accept()
        self.history.append({
            "step": self.steps,
            "old_batch_size": old[0], "old_grad_accum": old[1],
            "batch_size": new[0], "grad_accum": new[1],
            "reason": adv["reason"] if adv else None,
        })
        return old, new

    def stop(self):
        if self.owns_guard and self.guard is not None:
            self.guard.close()
            self.guard = None
            self.owns_guard = False
