"""gpuguard.trainer: the trainer's side of the GPU memory guard (the helper;
``import gpuguard`` re-exports its public names).

libgpuguard.so, preloaded into the training process, watches every device
allocation. When memory gets tight it journals the near miss, computes an
advice (halve the batch, double the gradient accumulation) and, when the
process has a handler for it, sends a signal (SIGUSR2 by default). This
module is that handler, and the way to follow the advice without changing
the training: the loader's batch stays what it is, and after an advice each
batch is split into micro-batches whose gradients add up to the batch's::

    import gpuguard
    guard = gpuguard.Guard(batch_size=32, min_batch_size=1)
    for batch in loader:
        for mb in guard.microbatches(batch):     # 1 x 32; after an advice 2 x 16; ...
            guard.backward(loss_fn(model(mb.data), mb.data))  # loss x len(mb)/len(batch)
        optimizer.step(); optimizer.zero_grad()

``Guard.run(batch, step, zero_grad)`` does the same and also survives an
out-of-memory error: it halves the micro-batch and redoes the batch. In a
torch.distributed job every rank takes the same split for every batch.

Without the shim the guard is inert: ``guard.active`` is False, one warning
says so, and nothing changes (one micro-batch of weight 1.0 per batch).

Standard library only; importing gpuguard never imports torch, transformers
or lightning (it uses torch only when the program already imported it).
"""

import atexit
import logging
import os
import signal as _signal
import sys
import threading
import traceback
import warnings
import weakref
from collections.abc import Sequence

from . import __version__, _debug, _native, _split

__all__ = ["Guard", "MicroBatch", "MicroBatches", "GpuguardWarning", "UsageError",
           "DEFAULT_SIGNAL", "NOTE_LIMIT", "__version__"]

log = logging.getLogger("gpuguard")

#: The most characters of Python stack attached to the journal per signal.
NOTE_LIMIT = 8192

_INERT_MESSAGE = "gpuguard: libgpuguard.so is not preloaded; the guard is inert"

#: True once an active Guard exists in this process: its batch boundaries
#: are the steps the shim hears of (gpuguard_step), and gpuguard-run's
#: instrumentation (torch_instrument) stops telling the optimizer's: never
#: both.
_helper_steps = False


class GpuguardWarning(RuntimeWarning):
    """Raised (as a warning) when the guard cannot do its job."""


class UsageError(RuntimeError):
    """The helper was called in a way whose meaning it cannot know (raised
    at once, never after training has silently changed)."""


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
    except Exception as exc:  # never let cache housekeeping break the trainer
        _debug.swallowed("trainer._empty_cache", exc)


def _distributed(torch):
    if torch is None:
        return None
    dist = getattr(torch, "distributed", None)
    if dist is None:
        return None
    try:
        if not dist.is_available() or not dist.is_initialized():
            return None
    except Exception as exc:  # torch's, whatever it raises: no group then
        _debug.swallowed("trainer._distributed", exc)
        return None
    return dist


def _all_reduce_max(torch, dist, values):
    """`values` (ints) reduced element-wise with MAX over every rank of the
    default process group. Collective: every rank must call it."""
    device = "cpu"
    try:
        backend = str(dist.get_backend()).lower()
    except (RuntimeError, ValueError) as exc:  # no backend named: the CPU's tensor
        _debug.swallowed("trainer._all_reduce_max", exc)
        backend = ""
    if "nccl" in backend:
        device = "cuda:%d" % torch.cuda.current_device()
    t = torch.tensor([int(v) for v in values], dtype=torch.int64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return [int(v) for v in t.tolist()]


def _oom_classes(torch):
    found = []
    for owner in (torch, getattr(torch, "cuda", None)):
        cls = getattr(owner, "OutOfMemoryError", None)
        if isinstance(cls, type) and cls not in found:
            found.append(cls)
    return tuple(found)


def _is_oom(exc):
    """torch.OutOfMemoryError (2.x), torch.cuda.OutOfMemoryError (1.13+), or
    the RuntimeError older versions raise ("CUDA out of memory. ...")."""
    classes = _oom_classes(_torch())
    if classes and isinstance(exc, classes):
        return True
    return isinstance(exc, RuntimeError) and str(exc).startswith("CUDA out of memory")


def _oom_error(message):
    """An exception of the type torch raises for an OOM, carrying `message`."""
    classes = _oom_classes(_torch())
    return (classes[0] if classes else RuntimeError)(message)


def _device():
    """The CUDA device this process computes on: torch's current one when
    torch has initialized CUDA, else 0."""
    torch = _torch()
    try:
        if torch is not None and torch.cuda.is_initialized():
            return int(torch.cuda.current_device())
    except Exception as exc:  # torch's, whatever it raises: device 0
        _debug.swallowed("trainer._device", exc)
    return 0


def _ceil_div(a, b):
    return -(-a // b)


def _reason(why):
    """The `batch` event's reason for a change of the split the helper
    describes as `why`."""
    text = why or ""
    if text == "shape":
        return "shape"
    if text.startswith("policy"):
        return "policy"
    if "out of memory" in text:
        return "oom"
    return "advice" if text else None


def _grouped(n):
    """7556 -> '7 556': a number as the lines print it."""
    return "{:,}".format(int(n)).replace(",", " ")


def _gib(n):
    return "%.1f GiB" % (n / float(1 << 30))


class MicroBatch(object):
    """One piece of a batch.

    data: the piece (same structure as the batch).
    weight: len(piece) / len(batch): scale the piece's mean loss by it and the
        accumulated gradient is the whole batch's.
    index, count: which piece of how many; ``last`` is True for the final one
        (DistributedDataParallel: run the others under ``model.no_sync()``).
    """

    __slots__ = ("data", "weight", "size", "index", "count")

    def __init__(self, data, weight, size, index, count):
        self.data = data
        self.weight = weight
        self.size = size
        self.index = index
        self.count = count

    def __len__(self):
        return self.size

    @property
    def last(self):
        return self.index == self.count - 1

    def __repr__(self):
        return "<gpuguard.MicroBatch %d/%d size=%d weight=%.4g>" % (
            self.index + 1, self.count, self.size, self.weight)


class _Running(object):
    """The piece each thread's loop is on: what guard.backward(loss) scales
    by. Keyed by thread, so a backward called from another thread than the
    loop's finds no piece rather than the loop's."""

    __slots__ = ("_by_thread", "_lock")

    def __init__(self):
        self._by_thread = {}
        self._lock = threading.Lock()

    def get(self):
        return self._by_thread.get(threading.get_ident())

    def swap(self, mb):
        """Makes `mb` (or None) this thread's piece; returns the one before."""
        ident = threading.get_ident()
        with self._lock:
            before = self._by_thread.get(ident)
            if mb is None:
                self._by_thread.pop(ident, None)
            else:
                self._by_thread[ident] = mb
            return before

    def walk(self, pieces):
        """Yields the pieces, each this thread's running piece while the
        loop's body runs; none once the loop ends, breaks or is consumed at
        once (a copy made with list() gives its loop no piece)."""
        ident = threading.get_ident()
        before = self.swap(None)
        try:
            for mb in pieces:
                self.swap(mb)
                yield mb
                self.swap(None)
        finally:
            # A generator closed by the garbage collector may run this on
            # another thread: only the loop's own thread is put back.
            if threading.get_ident() == ident:
                self.swap(before)


class MicroBatches(Sequence):
    """The pieces of one batch, as microbatches() returns them: a sequence of
    MicroBatch (len(), indexing). Looping over it makes each piece, in turn,
    the one guard.backward(loss) scales by on the loop's thread."""

    __slots__ = ("_pieces", "_running")

    def __init__(self, pieces, running):
        self._pieces = list(pieces)
        self._running = running

    def __len__(self):
        return len(self._pieces)

    def __getitem__(self, i):
        return self._pieces[i]

    def __iter__(self):
        return self._running.walk(self._pieces)

    def __repr__(self):
        return "<gpuguard.MicroBatches %d pieces: %s>" % (
            len(self._pieces), ", ".join(str(mb.size) for mb in self._pieces))


class Guard(object):
    """The trainer's handle on libgpuguard.so.

    batch_size: the loader's batch size (per rank). microbatches() and run()
        never change it; they split each batch into pieces of at most
        micro_batch_size samples once the shim advised a smaller batch.
    grad_accum: loader batches accumulated per optimizer step by the trainer
        itself (1 when every batch is a step); told to the shim.
    min_batch_size: no piece is made smaller than this.
    signal: the signal the shim sends with an advice (a number, a name, or
        None for no handler: the guard polls for the advice instead). The
        default is GPUGUARD_SIGNAL when set, else SIGUSR2. The handler is
        installed only from the main thread, and chains to the Python
        handler it replaces.
    size_by_shape: size each batch by its shape before it runs, once the
        shim's model of the run can predict it (docs/trainer.md, "Sizing
        each batch by its shape"); False: the split follows the advice only.

    Creating a Guard registers the trainer with the shim
    (gpuguard_set_batch): under ``mode = auto`` the process is enforced from
    then on, because it can now react to advice.

    In a torch.distributed job (the default process group initialized) the
    guard keeps the ranks in step: microbatches() and run() agree on the
    split with one small all-reduce per batch, and reading shrink_requested
    is a collective too. Every rank must make the same calls in the same
    order (as the same training loop on every rank does); a rank without the
    shim takes part all the same and follows the others' split.
    """

    def __init__(self, batch_size, grad_accum=1, min_batch_size=1,
                 signal=DEFAULT_SIGNAL, size_by_shape=True):
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
        self._split = 1          # pieces per batch (microbatches / run)
        self._batches = 0        # batch boundaries passed
        self._steps = 0          # steps told to the shim (gpuguard_step)
        self._peers = None       # distributed: is any rank's guard active? None: not asked yet
        self._agreed = None      # (batch, advice seq) of the last shrink_requested agreement
        self._flag = False
        self._closed = False
        self._lock = threading.RLock()
        self._signum = None
        self._handler = None
        self._previous = None
        self._installed = False
        #: One dict per change of the split: batch (1-based), split,
        #: micro_batch_size, reason.
        self.history = []
        #: Out-of-memory errors that run() caught and recovered from.
        self.ooms = 0
        self._running = _Running()  # per thread, the piece a loop is on (backward())
        self._said_bare = False  # run() said once that it halves without the shim
        #: How the batches ran, counted when each ends: whole, split_by_shape
        #: (the shim's model predicted the batch whole would cross the
        #: near-miss line), split (by an advice, the policy or an earlier OOM,
        #: before the model had data), redone (after an out-of-memory error).
        self.sizing = {"whole": 0, "split_by_shape": 0, "split": 0, "redone": 0}
        self._this = None        # how the batch in progress runs (a key of sizing)
        self._predicted = False  # the model sized a batch: say the counts at exit
        self._said_beyond = False
        self._by_shape = bool(size_by_shape)
        # The last batch's step is told at exit too (the next boundary never comes).
        ref = weakref.ref(self)
        atexit.register(lambda: ref() is not None and ref().finish())
        self._native = _native.load()
        if self._native is None:
            warnings.warn(_INERT_MESSAGE, GpuguardWarning, stacklevel=2)
            return
        self._native.set_batch(self._batch, self._accum)
        global _helper_steps
        _helper_steps = True  # the helper's boundaries win over the optimizer hook's
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
            except Exception as exc:  # a handler must not raise into the training loop
                _debug.swallowed("trainer.Guard._on_signal", exc)
        previous = self._previous
        if callable(previous):
            previous(signum, frame)

    def _signal_note(self, signum, frame):
        head = "gpuguard: %s received by the trainer" % _signal_label(signum)
        try:
            adv = self._native.advice()
        except _native.ERRORS as exc:
            _debug.swallowed("trainer.Guard._signal_note", exc)
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
    def split(self):
        """Pieces per batch that microbatches() and run() make now."""
        return self._split

    @property
    def micro_batch_size(self):
        """The largest piece of a full batch now."""
        return _ceil_div(self._batch, self._split)

    @property
    def signal(self):
        """The signal the guard handles, or None."""
        return self._signum if self._installed else None

    def advice(self):
        """The pending advice as a dict (seq, dev, batch_size, grad_accum,
        reason), or None."""
        if not self.active:
            return None
        try:
            return self._native.advice()
        except _native.ERRORS as exc:
            _debug.swallowed("trainer.Guard.advice", exc)
            return None

    def stats(self, dev=0):
        """The shim's figures for device `dev` as a dict, or None."""
        if not self.active:
            return None
        try:
            return self._native.stats(dev)
        except _native.ERRORS as exc:
            _debug.swallowed("trainer.Guard.stats", exc)
            return None

    # --- ranks --------------------------------------------------------------

    def _agree(self, values):
        """`values` reduced with MAX over every rank, or None when this is
        no distributed job, or when no rank's guard is active (learned at
        the first agreement, by every rank alike, so all stop asking
        together). Collective in a distributed job."""
        torch = _torch()
        dist = _distributed(torch)
        if dist is None or self._peers is False:
            return None
        out = _all_reduce_max(torch, dist, [1 if self.active else 0] + list(values))
        self._peers = bool(out[0])
        return out[1:] if self._peers else None

    @staticmethod
    def _rank():
        dist = _distributed(_torch())
        try:
            return dist.get_rank() if dist is not None else 0
        except (RuntimeError, ValueError) as exc:  # no default group after all
            _debug.swallowed("trainer.Guard._rank", exc)
            return 0

    # --- micro-batches --------------------------------------------------------

    def step(self):
        """A training step ended (after optimizer.step()): tells the shim
        (gpuguard_step), which keeps each step's peak for its forecast and
        leak checks. microbatches() and run() call it at every batch
        boundary themselves; a hand-written loop that uses neither calls it.
        A no-op without the shim, or with a shim that predates
        gpuguard_step."""
        self._steps += 1
        if self.active:
            try:
                # gpuguard-run's instrumentation, when the program runs under
                # it: the step's need, and its input hook for the next step
                inst = getattr(sys.modules.get(__package__ + ".torch_instrument"), "STATE", None)
                if inst is not None:
                    inst.boundary()
                self._native.step(self._steps)
            except Exception as exc:  # the instrumentation's (torch's) or the shim's: never the loop's
                _debug.swallowed("trainer.Guard.step", exc)

    def _boundary(self, batch=None):
        """A batch boundary: the single place where the previous batch's
        step ends and an advice takes effect. Returns the split for the
        batch that starts now, agreed with every rank: the one its shape
        asks for once the shim's model can predict it, else as advised."""
        with self._lock:
            if self._batches:
                self.step()  # gpuguard_step: the previous batch, its optimizer step included
                self._count_batch()
            self._batches += 1
            want, why = self._split, None
            if self._batches == 1 and self.active:
                want, why = self._policy_split()
            adv = self.advice()
            self._flag = False
            if adv is not None:
                want = max(want, self._split_for(adv["batch_size"], halve=False))
                self._native.ack(adv["seq"])
                why = "advice #%d, %s" % (adv["seq"], adv["reason"])
            sized = self._size_by_shape(batch) if batch is not None else None
            if sized is not None:
                # The model knows the batch that caused an advice: the batch
                # now runs as its own shape asks, whole when it fits.
                want, why = sized[0], "shape"
            agreed = self._agree([want])
            if agreed is not None and agreed[0] > want:
                want, why = agreed[0], why if why == "shape" and sized[0] > 1 else (
                    why or "another rank was advised")
            self._this = ("whole" if want == 1 else
                          "split_by_shape" if why == "shape" else "split")
            if sized is not None:
                self._tell_shape(sized[2], want)
                if sized[0] > 1:
                    self._say_shape(sized, want)
            if want != self._split:
                self._set_split(want, why)
            elif adv is not None:
                # Nothing left to shrink; the ack made the advised batch the
                # shim's current one: tell it what really runs.
                self._native.set_batch(self.micro_batch_size, self._accum * self._split)
                _empty_cache(_torch())
            return self._split

    def _policy_split(self):
        """The split the first batch starts with: one piece, or, when the
        device's policy says apply_batch (a policy gpuguard-report
        --recommend wrote from an earlier run), pieces of at most its
        batch_size when the script's batch is larger."""
        try:
            pol = self._native.policy(_device())
        except _native.ERRORS as exc:
            _debug.swallowed("trainer.Guard._policy_split", exc)
            pol = None
        if not pol or not pol["apply_batch"] or not 0 < pol["batch_size"] < self.micro_batch_size:
            return self._split, None
        return (max(self._split, _ceil_div(self._batch, pol["batch_size"])),
                "policy %s: batch_size %d x grad_accum %d" % (
                    pol["file"] or "(built-in)", pol["batch_size"], pol["grad_accum"]))

    def _split_for(self, advised, halve):
        """The split for pieces of at most `advised` samples (halving the
        current piece when `halve`, or when `advised` is unknown), never
        below min_batch_size and never fewer pieces than now."""
        micro = self.micro_batch_size
        target = micro // 2 if halve or advised <= 0 else micro
        if advised > 0:
            target = min(target, advised)
        target = max(target, min(self._min, micro), 1)
        return max(self._split, _ceil_div(self._batch, target))

    def _set_split(self, split, why):
        self._split = split
        micro = self.micro_batch_size
        if self.active:
            self._native.set_batch(micro, self._accum * split, _reason(why))
        _empty_cache(_torch())
        self.history.append({"batch": self._batches, "split": split,
                             "micro_batch_size": micro, "reason": why})
        if why != "shape":  # a split by shape is said per batch (_say_shape)
            log.warning("gpuguard: from batch %d on, each batch of %d is split into %d "
                        "micro-batches of at most %d (%s)", self._batches, self._batch,
                        split, micro, why)

    # --- sizing each batch by its shape ---------------------------------------

    def _size_by_shape(self, batch):
        """(pieces, prediction, shape, tokens) for `batch` from the shim's
        model of the run (gpuguard_predict): one piece when the whole batch
        is predicted under the near-miss line, else the fewest pieces whose
        largest is; None when there is no model yet (or no shim that has
        one, or nothing in the batch to measure): the split then stays as
        advised. The input's shape is told to the shim here (the step's
        tokens, what the model learns from)."""
        if not self._by_shape or not self.active or not self._native.has("gpuguard_predict"):
            return None
        try:
            shape = _split.input_shape(batch)   # batch first, as batch_length counts it
            if not shape or not shape[0]:
                return None
            n = shape[0]
            tokens = 1
            for d in shape:
                tokens *= d
            dev = _device()
            whole = self._native.predict(dev, tokens)
            cap = whole["max_tokens"] if whole is not None else 0   # the policy's
            if whole is None or not (whole["model"] or cap > 0):
                self._native.shape(shape, 0)
                return None
            self._predicted = True
            model = whole["model"]
            need = whole["bytes"] + whole["margin"] if model else 0
            pieces, most = 1, max(1, _ceil_div(n, self._min))
            last = None
            over = lambda need, t: need > whole["line"] or 0 < cap < t  # noqa: E731
            while over(need, tokens * _ceil_div(n, pieces) // n) and pieces < most:
                pieces += 1
                size = _ceil_div(n, pieces)
                if size == last:
                    continue
                last = size
                if model:
                    p = self._native.predict(dev, tokens * size // n)
                    if p is None or not p["model"]:
                        break
                    need = p["bytes"] + p["margin"]
            if model:
                self._make_room(dev, need, whole["line"])
            return pieces, whole, shape, tokens
        except _native.ERRORS as exc:
            _debug.swallowed("trainer.Guard._size_by_shape", exc)
            return None

    def _tell_shape(self, shape, pieces):
        """The shim hears the shape of the pieces that run (the split every
        rank agreed on): the step's input, what its peak follows."""
        try:
            self._native.shape((_ceil_div(shape[0], pieces),) + tuple(shape[1:]), 0)
        except _native.ERRORS as exc:
            _debug.swallowed("trainer.Guard._tell_shape", exc)

    def _make_room(self, dev, need, line):
        """Empties PyTorch's cache before a batch whose predicted peak,
        beside the cache's idle blocks, would reach the line: the blocks a
        run of other shapes left may not fit this one's tensors (the cache's
        layout, not their demand), and PyTorch would free them only after a
        failed allocation (a refusal, or a real OOM it recovers from)."""
        try:
            held = self._native.stats(dev)   # the process's bytes: the cache's reserved, cheaply
        except _native.ERRORS as exc:
            _debug.swallowed("trainer.Guard._make_room", exc)
            held = None
        if held is not None and held["current"] + need <= line:
            return  # even a cache of nothing but idle blocks leaves room
        torch = _torch()
        cuda = getattr(torch, "cuda", None)
        try:
            if cuda is None or not cuda.is_initialized():
                return
            # memory_stats() builds a dict of every counter: only near the line
            idle = int(cuda.memory_reserved(dev)) - int(cuda.memory_allocated(dev))
        except Exception as exc:  # torch's, whatever it raises: nothing emptied
            _debug.swallowed("trainer.Guard._make_room", exc)
            return
        if idle > 0 and need + idle > line:
            _empty_cache(torch)

    def _say_shape(self, sized, pieces):
        """One line per batch split by its shape; once, that a batch lies
        beyond every input the model has seen."""
        mine, p, shape, tokens = sized
        more = " (%d here, more on another rank)" % mine if pieces > mine else ""
        if not p["model"] or p["bytes"] + p["margin"] <= p["line"]:  # the policy's cap
            log.warning("gpuguard: batch %d: %s tokens, over the policy's max_tokens %s: "
                        "%d pieces%s", self._batches, " x ".join(_grouped(d) for d in shape),
                        _grouped(p["max_tokens"]), pieces, more)
            return
        log.warning("gpuguard: batch %d: %s tokens, predicted %s%s over the %s line: %d pieces%s",
                    self._batches, " x ".join(_grouped(d) for d in shape), _gib(p["bytes"]),
                    " + %s margin" % _gib(p["margin"]) if p["bytes"] <= p["line"] else "",
                    _gib(p["line"]), pieces, more)
        if p["beyond"] and not self._said_beyond:
            self._said_beyond = True
            log.warning("gpuguard: batch %d is larger than any the run has seen (%s tokens, "
                        "the largest so far %s): split by the prediction plus a margin of %s "
                        "for the extrapolation", self._batches, _grouped(tokens),
                        _grouped(p["most_tokens"]), _gib(p["margin"]))

    def _count_batch(self):
        if self._this is not None:
            self.sizing[self._this] += 1
            self._this = None

    def _say_sizing(self):
        if not self._predicted:
            return
        n = sum(self.sizing.values())
        log.warning("gpuguard: %d batches: %d whole, %d split by their shape, %d redone after "
                    "a refusal or an out-of-memory error, %d split as advised",
                    n, self.sizing["whole"], self.sizing["split_by_shape"],
                    self.sizing["redone"], self.sizing["split"])

    def _pieces(self, batch, split):
        parts = _split.split(batch, split)
        if len(parts) == 1:
            return MicroBatches([MicroBatch(batch, 1.0, parts[0][1], 0, 1)], self._running)
        n = float(sum(size for _, size in parts))
        return MicroBatches([MicroBatch(data, size / n, size, i, len(parts))
                             for i, (data, size) in enumerate(parts)], self._running)

    def microbatches(self, batch):
        """The pieces to run for `batch`: a MicroBatches, a sequence of
        MicroBatch. While a ``for`` loop over it runs a piece's body,
        ``guard.backward(loss)`` on the loop's thread scales by that piece's
        weight.

        The batch is split along its first dimension: tensors (anything with
        a shape), and nested dicts, lists and tuples of them; a list or tuple
        with no tensor inside is a sequence of samples; other values go to
        every piece. One piece (the batch itself, weight 1.0) until the shim
        advises a smaller batch; then 2, 4, ... pieces, each with
        ``weight = len(piece) / len(batch)``, so that the sum of
        ``loss * mb.weight`` over the pieces has the gradient of the whole
        batch's mean loss.

        Each call is a batch boundary: the previous batch's step ends
        (gpuguard_step), and a pending advice is applied here and only here
        (acked, torch's CUDA cache emptied). In a torch.distributed job every
        rank calls it for every batch: one all-reduce (MAX) of the split
        makes every rank split alike, whichever rank was advised.
        """
        return self._pieces(batch, self._boundary(batch))

    def run(self, batch, step, zero_grad):
        """Runs ``step(mb)`` (forward and backward of one micro-batch) for
        every piece of `batch`, as microbatches() splits it.

        On an out-of-memory error (a refusal by the shim or a real one:
        torch.OutOfMemoryError, torch.cuda.OutOfMemoryError, or the
        RuntimeError "CUDA out of memory" of older torch) it calls
        ``zero_grad()``, halves the piece, and runs the whole batch again;
        the split that worked stays for the following batches. At
        min_batch_size (or when the batch cannot be split further) the error
        is raised. Any other exception goes through untouched.

        In a torch.distributed job the ranks agree on the outcome of every
        attempt (one all-reduce): when any rank ran out of memory every rank
        zeroes its gradients and redoes the batch with the same smaller
        split, and when one gives up every rank raises. So `step` must not
        synchronize the ranks itself before the batch's last piece (with
        DistributedDataParallel: every piece but ``mb.last`` under
        ``model.no_sync()``; an OOM inside the last piece's synchronizing
        backward strands the other ranks in DDP's all-reduce).

        Without the shim it still halves on an out-of-memory error, as
        Accelerate's find_executable_batch_size does, and says once that it
        runs without the shim's foresight (no forecast, no headroom: only
        the real OOM).

        ``step`` may call ``guard.backward(loss)``: the loss scaled by the
        running micro-batch's weight, then its backward.
        """
        pieces = self.microbatches(batch)
        while True:
            need = fatal = None
            try:
                for mb in pieces:
                    step(mb)
            except Exception as e:
                if not _is_oom(e):
                    raise
                self._say_bare()
                self.ooms += 1
                need = self._split_after_oom(batch, len(pieces))
                if need is None:
                    fatal = e  # raised once the other ranks know
            # The failed attempt's frames (and their tensors) are gone here.
            local = [need or 0, 1 if fatal is not None else 0,
                     self._rank() + 1 if fatal is not None else 0]
            agreed = self._agree(local)
            need, gave_up, rank = agreed if agreed is not None else local
            if gave_up:
                if fatal is not None:
                    raise fatal
                raise _oom_error("gpuguard: rank %d ran out of memory at its smallest "
                                 "micro-batch; every rank stops" % (rank - 1))
            if not need:
                return
            zero_grad()
            self._this = "redone"
            self._set_split(need, "out of memory" if need == local[0]
                            else "another rank ran out of memory")
            pieces = self._pieces(batch, self._split)

    def _say_bare(self):
        if not self.active and not self._said_bare:
            self._said_bare = True
            log.warning("gpuguard: out of memory without the shim (libgpuguard.so is not "
                        "preloaded): halving the micro-batch on the real OOM only, with no "
                        "forecast and no headroom")

    def backward(self, loss, mb=None, **kwargs):
        """``loss.backward(**kwargs)`` of one micro-batch, the loss scaled by
        the micro-batch's weight, so that the pieces' gradients add up to the
        whole batch's mean loss, as Accelerate's ``backward`` divides by the
        accumulation. The piece is ``mb`` when given, else the one this
        thread's ``for mb in guard.microbatches(batch)`` loop (or run()) is
        on. Anywhere else (outside both, or on another thread than the
        loop's) the weight is unknown and it raises UsageError, at the first
        such call, split or not: a guess would train on a loss as many times
        too large as there are pieces. The manual form,
        ``(loss * mb.weight).backward()``, stays valid."""
        if mb is None:
            mb = self._running.get()
            if mb is None:
                raise UsageError(
                    "gpuguard: guard.backward(loss) was called outside a `for mb in "
                    "guard.microbatches(batch)` loop (or guard.run()) on this thread, so the "
                    "piece's weight is unknown; call it inside the loop, or pass the piece: "
                    "guard.backward(loss, mb)")
        weight = mb.weight
        return (loss * weight if weight != 1.0 else loss).backward(**kwargs)

    def finish(self):
        """The run's last batch ended: its step is told to the shim, which
        otherwise hears of a step only at the next batch's boundary. Called
        by close() and at exit; idempotent."""
        with self._lock:
            if self._batches > self._steps:
                self.step()
            if self._this is not None:
                self._count_batch()
                self._say_sizing()

    def _split_after_oom(self, batch, pieces):
        """The split to retry with after an OOM (a pending advice is acked:
        this shrink answers it), or None when no smaller piece is possible."""
        with self._lock:
            adv = self.advice()
            self._flag = False
            if adv is not None:
                self._native.ack(adv["seq"])
            n = _split.batch_length(batch)
            if n is None or pieces >= n:
                return None
            split = self._split_for(adv["batch_size"] if adv else 0, halve=True)
            return split if split > self._split else None

    # --- trainers that rebuild their loader ----------------------------------

    @property
    def shrink_requested(self):
        """True when an advice waits (or the shim's signal arrived): the
        trainer should call accept() and rebuild its loader.

        In a torch.distributed job reading it is a collective (one
        all-reduce): True on every rank when any rank was advised, and the
        ranks agree there on the batch accept() will return. So read it at
        the same point on every rank, once per batch, as a training loop
        does; accept() itself never communicates and may be called anywhere.
        """
        local = False
        wanted, seq = self._batch, None
        if self.active:
            local = self._flag
            adv = self.advice()
            if adv is not None:
                local, seq = True, adv["seq"]
                wanted = self._accepted_batch(adv)
        agreed = self._agree([1 if local else 0, -wanted])  # MAX of -b: the smallest b
        if agreed is None:
            self._agreed = None
            return local
        self._agreed = (-agreed[1], seq)
        return bool(agreed[0])

    def sync_shrink_requested(self):
        """shrink_requested, by its explicit name: agreed over every rank in
        a distributed job (collective), the local value otherwise."""
        return self.shrink_requested

    def _accepted_batch(self, adv):
        advised = adv["batch_size"]
        if advised <= 0:  # the shim did not know the batch: halve
            advised = self._batch // 2
        return min(self._batch, max(self._min, advised))

    def accept(self):
        """Shrink as advised; returns (batch_size, grad_accum) to run now.

        Reads the pending advice, acks it, keeps batch x accum at least the
        effective batch the guard started with, empties PyTorch's cache
        (when torch is loaded and CUDA initialized) and tells the shim the
        new values. In a distributed job it takes the batch every rank
        agreed on when shrink_requested was last read, so every rank returns
        the same values; it never communicates itself."""
        with self._lock:
            agreed, self._agreed = self._agreed, None
            adv = self.advice()
            cur_b, cur_a = self._batch, self._accum
            if agreed is not None:
                new_b = max(1, min(cur_b, agreed[0]))
                if adv is not None and adv["seq"] != agreed[1]:
                    adv = None  # came after the agreement: left for the next one
            elif adv is not None:
                new_b = self._accepted_batch(adv)
            else:
                new_b = cur_b
            if new_b == cur_b:
                new_a = cur_a
            else:
                new_a = max(1, _ceil_div(self._effective, new_b))
                if adv is not None and adv["batch_size"] == new_b:
                    new_a = max(new_a, adv["grad_accum"])
            if adv is not None or new_b != cur_b:
                _empty_cache(_torch())
            if self.active:
                if adv is not None:
                    self._native.ack(adv["seq"])
                if adv is not None or (new_b, new_a) != (cur_b, cur_a):
                    self._native.set_batch(new_b, new_a)
            self._batch, self._accum = new_b, new_a
            self._flag = False
            return new_b, new_a

    def set_batch(self, batch_size, grad_accum=1):
        """Tell the guard (and the shim) that the trainer now runs this
        batch; batch x accum becomes the effective batch to keep, and the
        split starts again from one piece."""
        batch_size, grad_accum = int(batch_size), int(grad_accum)
        if batch_size < 1 or grad_accum < 1:
            raise ValueError("gpuguard: batch_size and grad_accum must be at least 1")
        with self._lock:
            self._batch, self._accum = batch_size, grad_accum
            self._effective = batch_size * grad_accum
            self._split = 1
            if self.active:
                self._native.set_batch(batch_size, grad_accum)

    def note(self, text):
        """Attach text to the journal (a `note` event)."""
        if self.active:
            self._native.note(str(text))

    def close(self):
        """Put back the signal handler the guard replaced; the guard is
        inert afterwards (in a distributed job it still takes part in the
        ranks' agreement, so no other rank waits for it)."""
        if self._closed:
            return
        self.finish()
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
        return "<gpuguard.Guard %s batch_size=%d grad_accum=%d split=%d>" % (
            "active" if self.active else "inert", self._batch, self._accum, self._split)
