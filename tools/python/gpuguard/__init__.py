"""gpuguard: the trainer's side of the GPU memory guard.

libgpuguard.so, preloaded into the training process, watches every device
allocation. When memory gets tight it journals the near miss, computes an
advice (halve the batch, double the gradient accumulation) and, when the
process has a handler for it, sends a signal (SIGUSR2 by default). This
module is that handler and the way to read and acknowledge the advice::

    import gpuguard
    guard = gpuguard.Guard(batch_size=32, grad_accum=1, min_batch_size=1)
    for batch in loader:
        ...
        if guard.shrink_requested:
            batch_size, grad_accum = guard.accept()
            loader = make_loader(batch_size)

Without the shim the guard is inert: ``guard.active`` is False, one warning
says so, and every method is a harmless no-op.

Standard library only; importing gpuguard never imports torch, transformers
or lightning (it uses torch only when the program already imported it).
"""

import os
import signal as _signal
import sys
import threading
import traceback
import warnings

from . import _native

__version__ = "0.1.0"

__all__ = ["Guard", "GpuguardWarning", "DEFAULT_SIGNAL", "NOTE_LIMIT", "__version__"]

#: The most characters of Python stack attached to the journal per signal.
NOTE_LIMIT = 8192

_INERT_MESSAGE = "gpuguard: libgpuguard.so is not preloaded; the guard is inert"


class GpuguardWarning(RuntimeWarning):
    """Raised (as a warning) when the guard cannot do its job."""


class _DefaultSignal(object):
    def __repr__(self):
        return "SIGUSR2"


#: The default of Guard(signal=...): GPUGUARD_SIGNAL when set, else SIGUSR2.
DEFAULT_SIGNAL = _DefaultSignal()


def _signal_from_name(value):
    """A signal number from a name (SIGUSR2, usr2) or number; None for none."""
    if value is None:
        return None
    if isinstance(value, int):
        return value
    text = str(value).strip()
    if text.lower() in ("none", "off", "no"):
        return None
    if text.isdigit():
        return int(text)
    name = text.upper()
    if not name.startswith("SIG"):
        name = "SIG" + name
    sig = getattr(_signal, name, None)
    if sig is None:
        raise ValueError("gpuguard: unknown signal %r" % (value,))
    return int(sig)


def _default_signal():
    env = os.environ.get("GPUGUARD_SIGNAL")
    if env is not None and env.strip():
        try:
            return _signal_from_name(env)
        except ValueError:
            pass  # the shim says so in the journal; keep the default
    sig = getattr(_signal, "SIGUSR2", None)
    return None if sig is None else int(sig)


def _signal_label(sig):
    try:
        return _signal.Signals(sig).name
    except (ValueError, AttributeError):
        return "signal %d" % sig


def _format_stack(frame, limit=NOTE_LIMIT):
    """The Python stack at `frame`, oldest call first, trimmed from the
    outermost end to about `limit` characters."""
    if frame is None:
        return "(no Python frame)\n"
    text = "".join(traceback.format_stack(frame))
    if len(text) > limit:
        cut = text[-limit:]
        nl = cut.find("\n  File ")
        if nl >= 0:
            cut = cut[nl + 1:]
        text = "  ...\n" + cut
    return text


# --- torch, when the program already uses it -------------------------------

def _torch():
    return sys.modules.get("torch")


def _empty_cache(torch):
    if torch is None:
        return
    cuda = getattr(torch, "cuda", None)
    try:
        if cuda is not None and cuda.is_initialized():
            cuda.empty_cache()
    except Exception:  # never let cache housekeeping break the trainer
        pass


def _distributed(torch):
    if torch is None:
        return None
    dist = getattr(torch, "distributed", None)
    if dist is None:
        return None
    try:
        if not dist.is_available() or not dist.is_initialized():
            return None
    except Exception:
        return None
    return dist


def _all_reduce_int(torch, value, op):
    """`value` reduced with ReduceOp.`op` over every rank, or None when the
    process is not part of an initialized process group. Collective: every
    rank must call it."""
    dist = _distributed(torch)
    if dist is None:
        return None
    device = "cpu"
    try:
        backend = str(dist.get_backend()).lower()
    except Exception:
        backend = ""
    if "nccl" in backend:
        device = "cuda:%d" % torch.cuda.current_device()
    t = torch.tensor([int(value)], dtype=torch.int64, device=device)
    dist.all_reduce(t, op=getattr(dist.ReduceOp, op))
    return int(t.item())


class Guard(object):
    """The trainer's handle on libgpuguard.so.

    batch_size, grad_accum: what the trainer runs now (told to the shim).
    min_batch_size: accept() never goes below it.
    signal: the signal the shim sends with an advice (a number, a name, or
        None for no handler: poll ``shrink_requested`` instead). The default
        is GPUGUARD_SIGNAL when set, else SIGUSR2. The handler is installed
        only from the main thread, and chains to the Python handler it
        replaces.
    """

    def __init__(self, batch_size, grad_accum=1, min_batch_size=1,
                 signal=DEFAULT_SIGNAL):
        batch_size, grad_accum, min_batch_size = (
            int(batch_size), int(grad_accum), int(min_batch_size))
        if batch_size < 1:
            raise ValueError("gpuguard: batch_size must be at least 1")
        if grad_accum < 1:
            raise ValueError("gpuguard: grad_accum must be at least 1")
        if min_batch_size < 1:
            raise ValueError("gpuguard: min_batch_size must be at least 1")
        self._batch = batch_size
        self._accum = grad_accum
        self._min = min_batch_size
        self._effective = batch_size * grad_accum
        self._flag = False
        self._closed = False
        self._lock = threading.RLock()
        self._signum = None
        self._handler = None
        self._previous = None
        self._installed = False
        self._native = _native.load()
        if self._native is None:
            warnings.warn(_INERT_MESSAGE, GpuguardWarning, stacklevel=2)
            return
        self._native.set_batch(self._batch, self._accum)
        if isinstance(signal, _DefaultSignal):
            sig = _default_signal()
        else:
            sig = _signal_from_name(signal)
        if sig is not None:
            self._install(sig)

    # --- signal -------------------------------------------------------------

    def _install(self, sig):
        if threading.current_thread() is not threading.main_thread():
            return  # Python allows handlers only there; polling still works
        handler = self._on_signal
        try:
            previous = _signal.getsignal(sig)
            _signal.signal(sig, handler)
        except (ValueError, OSError, RuntimeError, TypeError):
            return
        self._signum = sig
        self._handler = handler
        self._previous = previous
        self._installed = True

    def _on_signal(self, signum, frame):
        if not self._closed:
            self._flag = True
            try:
                self._native.note(self._signal_note(signum, frame))
            except Exception:
                pass  # a handler must not raise into the training loop
        previous = self._previous
        if callable(previous):
            previous(signum, frame)

    def _signal_note(self, signum, frame):
        head = "gpuguard: %s received by the trainer" % _signal_label(signum)
        try:
            adv = self._native.advice()
        except Exception:
            adv = None
        if adv is not None:
            head += "; advice #%d (%s): batch %d x accum %d" % (
                adv["seq"], adv["reason"], adv["batch_size"], adv["grad_accum"])
        return (head + "\nPython stack (most recent call last):\n"
                + _format_stack(frame))

    # --- state --------------------------------------------------------------

    @property
    def active(self):
        """True when the shim is preloaded and the guard is not closed."""
        return self._native is not None and not self._closed

    @property
    def batch_size(self):
        return self._batch

    @property
    def grad_accum(self):
        return self._accum

    @property
    def min_batch_size(self):
        return self._min

    @property
    def effective_batch_size(self):
        """batch_size x grad_accum that accept() keeps at least."""
        return self._effective

    @property
    def signal(self):
        """The signal the guard handles, or None."""
        return self._signum if self._installed else None

    @property
    def shrink_requested(self):
        """True when the shim's signal arrived or an advice waits for its
        ack (so polling works without the signal). Local to this process:
        in a distributed run see sync_shrink_requested()."""
        if not self.active:
            return False
        if self._flag:
            return True
        try:
            return self._native.advice() is not None
        except Exception:
            return False

    def sync_shrink_requested(self):
        """shrink_requested agreed over every rank (True on all ranks when
        any rank was advised) when torch.distributed is initialized, else
        the local value. Collective: call it on every rank at the same step,
        then call accept() on every rank when it says True."""
        local = self.shrink_requested
        if self._native is None:
            return False
        agreed = _all_reduce_int(_torch(), 1 if local else 0, "MAX")
        return local if agreed is None else bool(agreed)

    def advice(self):
        """The pending advice as a dict (seq, dev, batch_size, grad_accum,
        reason), or None."""
        if not self.active:
            return None
        try:
            return self._native.advice()
        except Exception:
            return None

    def stats(self, dev=0):
        """The shim's figures for device `dev` as a dict, or None."""
        if not self.active:
            return None
        try:
            return self._native.stats(dev)
        except Exception:
            return None

    # --- actions ------------------------------------------------------------

    def accept(self):
        """Shrink as advised; returns (batch_size, grad_accum) to run now.

        Reads the pending advice, empties PyTorch's cache (when torch is
        loaded and CUDA initialized), agrees with every rank on the smallest
        batch when torch.distributed is initialized (collective: every rank
        must call accept() at the same step), keeps batch x accum at least
        the effective batch the guard started with, acks the advice and
        tells the shim the new values."""
        if not self.active:
            self._flag = False
            return self._batch, self._accum
        with self._lock:
            torch = _torch()
            adv = self._native.advice()
            cur_b, cur_a = self._batch, self._accum
            new_b = cur_b
            if adv is not None:
                advised = adv["batch_size"]
                if advised <= 0:  # the shim did not know the batch: halve
                    advised = cur_b // 2
                new_b = min(cur_b, max(self._min, advised))
                _empty_cache(torch)
            agreed = _all_reduce_int(torch, new_b, "MIN")
            if agreed is not None:
                new_b = max(1, min(new_b, agreed))
                if adv is None and new_b != cur_b:
                    _empty_cache(torch)
            if new_b == cur_b:
                new_a = cur_a
            else:
                new_a = max(1, -(-self._effective // new_b))
                if adv is not None and adv["batch_size"] == new_b:
                    new_a = max(new_a, adv["grad_accum"])
            if adv is not None:
                self._native.ack(adv["seq"])
            if adv is not None or (new_b, new_a) != (cur_b, cur_a):
                self._native.set_batch(new_b, new_a)
            self._batch, self._accum = new_b, new_a
            self._flag = False
            return new_b, new_a

    def set_batch(self, batch_size, grad_accum=1):
        """Tell the guard (and the shim) that the trainer now runs this
        batch; batch x accum becomes the effective batch to keep."""
        batch_size, grad_accum = int(batch_size), int(grad_accum)
        if batch_size < 1 or grad_accum < 1:
            raise ValueError("gpuguard: batch_size and grad_accum must be at least 1")
        with self._lock:
            self._batch, self._accum = batch_size, grad_accum
            self._effective = batch_size * grad_accum
            if self.active:
                self._native.set_batch(batch_size, grad_accum)

    def note(self, text):
        """Attach text to the journal (a `note` event)."""
        if self.active:
            self._native.note(str(text))

    def close(self):
        """Put back the signal handler the guard replaced; the guard is
        inert afterwards."""
        if self._closed:
            return
        self._closed = True
        if not self._installed:
            return
        self._installed = False
        if threading.current_thread() is not threading.main_thread():
            return
        try:
            if _signal.getsignal(self._signum) == self._handler:
                previous = self._previous
                if previous is None:  # installed from C: cannot be restored
                    previous = _signal.SIG_DFL
                _signal.signal(self._signum, previous)
        except (ValueError, OSError, RuntimeError, TypeError):
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __repr__(self):
        return "<gpuguard.Guard %s batch_size=%d grad_accum=%d>" % (
            "active" if self.active else "inert", self._batch, self._accum)
