"""PyTorch, instrumented without a code change (docs/trainer.md, "Without a
code change: gpuguard-run instruments PyTorch").

gpuguard-run's sitecustomize (gpuguard/_site) calls ``install(torch)`` once
the program has imported torch. In a process where libgpuguard.so is
preloaded (``ctypes.CDLL(None)`` has its functions) it installs:

- **steps**: a global optimizer step post hook
  (``torch.optim.optimizer.register_optimizer_step_post_hook``) tells the
  shim each step (``gpuguard_step``), counting the steps of the first
  optimizer that steps (one per iteration when a script has several: a GAN's
  two, a model's per-group optimizers); none while a ``gpuguard.Guard``
  exists, whose batch boundaries are the steps then (never both);
- **PyTorch's view of its memory**, asked for by the shim: a callback the
  shim calls in the main thread through ``Py_AddPendingCall``
  (``gpuguard_torch_attach``) reads ``torch.cuda.memory_stats`` and
  ``torch.cuda.memory._snapshot`` and hands the figures back
  (``gpuguard_torch_view``): a ``torch`` journal line. PyTorch's OOM observer
  (``torch._C._cuda_attach_out_of_memory_observer``, attached when CUDA
  initializes, since attaching initializes it) answers at every OOM its
  allocator raises, a refusal of gpuguard's included;
- **the tensors of the step that would overflow**: when the shim's forecast
  names a step, PyTorch's allocation history is on for that step only
  (``_record_memory_history("state", context="alloc", stacks="python")``:
  the stacks of live blocks, no event trace), and a view taken meanwhile
  carries the live blocks allocated since, by Python line;
- **a leak's tensors**: when the shim says a leak at step S, history is on
  for step S + 1 only; at the end of step S + 2 the live blocks that still
  carry their Python stacks are what step S + 1 allocated and kept, by line;
- **where backward starts**: ``torch.autograd.backward`` (which
  ``Tensor.backward`` calls) is wrapped to hand the caller's Python frames
  to the shim (``gpuguard_backward``) before the engine runs;
- **each step's input**: a global module forward pre-hook
  (``torch.nn.modules.module.register_module_forward_pre_hook``), armed at
  each step boundary and removed by its first call, so only the step's first
  module call pays: the outermost module's input (its largest tensor, keyword
  arguments included) and the batch dimension (the second for a model whose
  transformer layers take the sequence first), told before the step
  allocates (``gpuguard_step_shape``);
- **what each step's tensors needed**: at each boundary PyTorch's peak of
  allocated bytes (``allocated_bytes.all.peak``) is told to the shim
  (``gpuguard_step_needed``) and the peak counters reset, while the program
  keeps seeing its own: ``torch._C._cuda_memoryStats`` and
  ``_cuda_resetPeakMemoryStats`` (under ``torch.cuda.memory_stats``,
  ``max_memory_allocated``, ``reset_peak_memory_stats`` and the rest) are
  wrapped to report every peak since the program's own last reset; a step
  in which the program reset them itself has no need told (unknown, not
  guessed);
- **an uncaught exception**: ``sys.excepthook`` is chained to tell the shim
  what the program is dying of (``gpuguard_uncaught``) before the hook it
  replaces runs.

It never raises into the program (every hook swallows its own errors),
never changes what the program computes (it only reads PyTorch's allocator,
and turns its allocation history on for one step and off again, unless the
program had turned it on itself, before or meanwhile), never blocks (it holds
no lock of its own while PyTorch runs) and never imports torch: ``install``
is handed the module the program imported. What a signal handler raises
while a hook works (a KeyboardInterrupt, a SIGTERM handler's SystemExit, any
handler's exception) is the program's, never swallowed: a hook lets it
through, and the view hands it back to the shim, which raises it into the
program (``gpuguard_torch_raise``). Standard library only.
"""
import atexit
import ctypes
import functools
import os
import sys
import threading
import weakref

from . import _debug, _native

__all__ = ["install", "STATE", "HISTORY_MAX_ENTRIES", "TENSORS_MAX", "FRAMES_MAX"]

#: The one instrumentation of this process (None: not installed).
STATE = None

#: The alloc/free events PyTorch's history keeps, at most (a ring: the
#: latest), while it is on for a forecast's step: about 21 000 allocations.
HISTORY_MAX_ENTRIES = 65536
#: Lines of tensors per view, and Python frames per line (the shim's bounds).
TENSORS_MAX = 32
FRAMES_MAX = 16
#: Python frames of a backward call.
BACKWARD_FRAMES = 8
#: Unasked views (PyTorch's OOM observer) are thinned like the shim's
#: incidents: the first 8, then the 16th, 32nd, ...
OBSERVER_ALWAYS = 8

GiB = 1 << 30
_CODES_MAX = 4096
#: Module calls of a step tried for its input when they carry no tensor.
_SHAPE_TRIES = 8
#: Dimensions of a step's input told (the shim keeps 8).
_SHAPE_DIMS = 8
#: nn.Module's call plumbing: never the op.
_PLUMBING = ("_call_impl", "_wrapped_call_impl")


def _on(name):
    return os.environ.get(name, "").strip().lower() in ("1", "yes", "true", "on")


def _wanted():
    return _on("GPUGUARD_TORCH") and os.environ.get("GPUGUARD_MODE", "").strip().lower() != "off"


def install(torch):
    """Instrument `torch` (the module the program imported) when
    GPUGUARD_TORCH asks for it and libgpuguard.so is preloaded; the
    instrumentation, or None. Once per process; never raises."""
    global STATE
    try:
        if STATE is not None:
            return STATE
        if torch is None or not _wanted():
            return None
        native = _native.load()
        if native is None or not native.has("gpuguard_torch_view"):
            return None
        inst = _Instrument(torch, native)
        STATE = inst
        inst.start()
        return inst
    except Exception as exc:
        _debug.swallowed("torch_instrument.install", exc)
        return None


def _thin(n):
    return n <= OBSERVER_ALWAYS or (n & (n - 1)) == 0


def _codes(handler, depth=0):
    """The code objects a signal handler runs first: a function's, a bound
    method's, a functools.partial's, a callable object's __call__."""
    if depth > 4 or handler is None:
        return ()
    code = getattr(handler, "__code__", None)
    if code is not None:
        return (code,)
    for attr in ("__func__", "func"):
        inner = getattr(handler, attr, None)
        if inner is not None:
            return _codes(inner, depth + 1)
    call = getattr(type(handler), "__call__", None)
    return _codes(call, depth + 1) if getattr(call, "__code__", None) is not None else ()


def _from_signal(e):
    """Did a signal handler raise `e` while a hook worked? Python runs a
    handler in the main thread at its next check between bytecodes, inside
    whatever runs there: a KeyboardInterrupt (SIGINT's default handler) or a
    SystemExit (sys.exit) never comes from the hooks' own work; any other
    exception did when its traceback passes through a handler the program
    installed. Then it is the program's, never swallowed."""
    if isinstance(e, (KeyboardInterrupt, SystemExit)):
        return True
    try:
        import signal
        valid = signal.valid_signals() if hasattr(signal, "valid_signals") else range(1, signal.NSIG)
        codes = set()
        for sig in valid:
            try:
                h = signal.getsignal(sig)
            except (ValueError, OSError, RuntimeError):
                continue
            if callable(h) and h is not signal.default_int_handler:
                codes.update(_codes(h))
        tb = e.__traceback__
        while tb is not None:
            if tb.tb_frame.f_code in codes:
                return True
            tb = tb.tb_next
    except Exception as exc:
        _debug.swallowed("torch_instrument._from_signal", exc)
    return False


def _utf8(text, limit):
    return str(text)[:limit].encode("utf-8", "replace")


class _Instrument(object):
    def __init__(self, torch, native):
        self.torch = torch
        self.native = native
        self.fn_step = native.function("gpuguard_step")
        self.fn_view = native.function("gpuguard_torch_view")
        self.fn_backward = native.function("gpuguard_backward")
        self.fn_attach = native.function("gpuguard_torch_attach")
        self.fn_detach = native.function("gpuguard_torch_detach")
        self.fn_raise = native.function("gpuguard_torch_raise")
        self.helper = __package__ + ".trainer"       # the module whose flag says a Guard tells steps
        self.torch_dir = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
        self.own_dir = os.path.dirname(os.path.abspath(__file__)) + os.sep
        #: Steps told to the shim by the optimizer hook.
        self.steps = 0
        self._clock = None                 # weakref of the optimizer whose steps count
        #: PyTorch's allocation history: on (by us), and how many times it was.
        self.history = False
        self.history_turns = 0
        self.user_history = False          # the program turned it on itself
        #: Views handed to the shim, and OOMs PyTorch's observer saw.
        self.views = 0
        self.ooms = 0
        self.observer = False
        self.can_ask = False
        self.backwards = 0
        self._callback = None              # the ctypes callback, alive for the process's life
        #: The frames of the latest .backward() call, innermost first, as
        #: snapshot frames ({filename, line, name}): what autograd's threads
        #: allocate is theirs.
        self.last_backward = []
        self._codes = {}                   # code -> (file, func, skip) for backward's frames
        self._sites = {}                   # (id(code), lasti, ...) -> a backward call site's frames
        self._threads = {}                 # id(thread) -> (thread, its name as bytes)
        self._attached = False
        #: Steps' inputs (the forward pre-hook) and needs (PyTorch's peaks).
        self.fn_shape = native.function("gpuguard_step_shape")
        self.fn_needed = native.function("gpuguard_step_needed")
        self.fn_uncaught = native.function("gpuguard_uncaught")
        self.shapes = 0                    # step inputs told
        self.needs = 0                     # step needs told
        self._shape_hook = None            # the armed pre-hook's handle
        self._register_pre = None
        self._shape_tries = 0
        self._dims = (ctypes.c_longlong * _SHAPE_DIMS)()  # the input's shape, for the shim
        self._batch_dims = {}              # id(module) -> (module ref, batch dimension)
        self._real_stats = None            # torch._C's own functions, when wrapped
        self._real_reset = None
        self._held = {}                    # dev -> {(stat, pool): the program's peak we reset}
        self._peak_keys = None             # the (stat, pool) pairs that have a peak
        self._reset_by_program = set()     # devices whose peaks the program reset this step
        self._ndev = None
        self._framed_before = set()        # blocks with a stack when history last went on

    # --- installing ------------------------------------------------------------

    def start(self):
        # torch.optim deletes its submodules' names: the module itself, as
        # torch's import left it in sys.modules (importing it again is free).
        optim = sys.modules.get("torch.optim.optimizer")
        if optim is None and hasattr(self.torch, "optim"):
            import importlib
            optim = importlib.import_module("torch.optim.optimizer")
        register = getattr(optim, "register_optimizer_step_post_hook", None)
        if register is not None and self.fn_step is not None:
            register(self._on_step)
        self._wrap_backward()
        self._wrap_record()
        self._watch_inputs()
        self._watch_peaks()
        self._watch_exit()
        if self.fn_attach is not None:
            self._callback = _native.TORCH_FN(self._on_request)
            self.can_ask = bool(self.fn_attach(self._callback))
            self._attached = True
            atexit.register(self.detach)
        self._observe_when_cuda_starts()

    def detach(self):
        """No call from the shim from now on (at exit: before the
        interpreter finalizes)."""
        if self._attached and self.fn_detach is not None:
            self._attached = False
            try:
                self.fn_detach()
            except Exception as exc:
                _debug.swallowed("torch_instrument.detach", exc)

    def _observe_when_cuda_starts(self):
        """PyTorch's OOM observer, attached once CUDA is initialized:
        attaching initializes CUDA, which a program that never uses it must
        not pay (nor a forked child, where CUDA cannot start)."""
        cuda = getattr(self.torch, "cuda", None)
        if cuda is None:
            return
        if cuda.is_initialized():
            self._attach_observer()
            return
        queued = getattr(cuda, "_queued_calls", None)
        if isinstance(queued, list):  # what torch.cuda._lazy_call does, without its traceback
            queued.append((self._attach_observer, []))
        else:
            cuda._lazy_call(self._attach_observer)

    def _attach_observer(self):
        try:
            attach = getattr(self.torch._C, "_cuda_attach_out_of_memory_observer", None)
            if attach is not None and not self.observer:
                attach(self._on_oom)
                self.observer = True
        except Exception as exc:
            _debug.swallowed("torch_instrument._attach_observer", exc)
            pass  # a backend without observers (cudaMallocAsync): the shim's requests remain

    def _wrap_backward(self):
        autograd = getattr(self.torch, "autograd", None)
        original = getattr(autograd, "backward", None)
        if original is None or self.fn_backward is None or \
                getattr(original, "_gpuguard_original", None) is not None:
            return
        on_backward = self._on_backward

        def backward(*args, **kwargs):
            on_backward()
            return original(*args, **kwargs)
        functools.update_wrapper(backward, original)
        backward._gpuguard_original = original
        autograd.backward = backward

    # --- steps -------------------------------------------------------------------

    def _on_step(self, optimizer, args, kwargs):
        try:
            if getattr(sys.modules.get(self.helper), "_helper_steps", False):
                return  # a Guard tells the steps: never both
            clock = self._clock() if self._clock is not None else None
            if clock is None:
                self._clock = weakref.ref(optimizer)
            elif clock is not optimizer:
                return  # another optimizer of the same iteration
            self.steps += 1
            self.boundary()
            self.fn_step(self.steps)
        except BaseException as e:
            if _from_signal(e):
                raise  # a signal handler's: the program's, as without gpuguard

    def boundary(self):
        """Just before a step boundary is told (the optimizer hook's, or a
        Guard's): what the step's tensors needed, and the input hook armed
        for the next step. Never raises."""
        for part in (self._tell_needs, self._arm_inputs):
            try:
                part()
            except BaseException as e:
                if _from_signal(e):
                    raise  # a signal handler's: the program's, as without gpuguard

    # --- each step's input ---------------------------------------------------------

    def _watch_inputs(self):
        if self.fn_shape is None:
            return
        nn_module = sys.modules.get("torch.nn.modules.module")  # torch's import made it
        self._register_pre = getattr(nn_module, "register_module_forward_pre_hook", None)
        self._arm_inputs()

    def _arm_inputs(self):
        if self._register_pre is not None and self._shape_hook is None:
            self._shape_tries = 0
            self._shape_hook = self._register_pre(self._on_forward)

    def _disarm_inputs(self):
        hook, self._shape_hook = self._shape_hook, None
        if hook is not None:
            hook.remove()

    def _on_forward(self, module, args):
        """The global forward pre-hook: the step's first module call (the
        outermost module's) gives the step's input, then the hook goes until
        the next boundary (a call with no tensor tries again, a few times)."""
        try:
            kwargs = None
            caller = sys._getframe(1)  # nn.Module._call_impl's inner(): its kwargs
            code = caller.f_code
            if code.co_name == "inner" and "kwargs" in code.co_freevars:
                kwargs = caller.f_locals.get("kwargs")
            tensor = self._largest(args, kwargs)
            self._shape_tries += 1
            if tensor is None and self._shape_tries < _SHAPE_TRIES:
                return None
            self._disarm_inputs()
            if tensor is None:
                return None
            shape = tensor.shape  # torch.Size: a tuple of ints
            n = min(len(shape), _SHAPE_DIMS)
            if not n:
                return None
            dims = self._dims
            dims[:n] = shape[:n]
            self.fn_shape(dims, n, self._batch_dim(module, n))
            self.shapes += 1
        except BaseException as e:
            if _from_signal(e):
                raise  # a signal handler's: the program's, as without gpuguard
        return None

    def _largest(self, args, kwargs):
        """The tensor with the most elements among the arguments (one level
        into lists, tuples and dicts), the first of equals."""
        Tensor = self.torch.Tensor
        if len(args) == 1 and not kwargs and type(args[0]) is Tensor:
            return args[0]  # the common case: model(x)
        best, most = None, -1
        for values in (args, kwargs.values() if isinstance(kwargs, dict) else ()):
            for v in values:
                inner = (v.values() if isinstance(v, dict) else
                         v if isinstance(v, (list, tuple)) else (v,))
                for t in inner:
                    if isinstance(t, Tensor):
                        n = t.numel()
                        if n > most:
                            best, most = t, n
        return best

    def _batch_dim(self, module, ndims):
        """The batch's dimension of the input of `module`: the second when a
        layer inside takes the sequence first (batch_first False: PyTorch's
        transformer layers, attention and RNNs by default), else the first."""
        if ndims < 2:
            return 0
        entry = self._batch_dims.get(id(module))
        if entry is not None and entry[0]() is module:
            return entry[1]
        dim = 0
        for m in module.modules():
            first = getattr(m, "batch_first", None)
            if first is False:
                dim = 1
                break
        if len(self._batch_dims) >= _CODES_MAX:
            self._batch_dims.clear()
        self._batch_dims[id(module)] = (weakref.ref(module), dim)
        return dim

    # --- what each step's tensors needed ------------------------------------------

    def _watch_peaks(self):
        """Wrap PyTorch's peak counters so the program sees its own peaks
        while the instrumentation resets them at every step."""
        C = getattr(self.torch, "_C", None)
        stats = getattr(C, "_cuda_memoryStats", None)
        reset = getattr(C, "_cuda_resetPeakMemoryStats", None)
        if stats is None or reset is None or self.fn_needed is None or \
                getattr(stats, "_gpuguard_original", None) is not None:
            return
        inst = self

        def memory_stats(device, *args, **kwargs):
            out = stats(device, *args, **kwargs)
            try:
                held = inst._held.get(int(device))
                if held and isinstance(out, dict):
                    for (name, pool), peak in held.items():
                        entry = out.get(name)
                        entry = entry.get(pool) if pool is not None and isinstance(entry, dict) \
                            else entry
                        if isinstance(entry, dict) and entry.get("peak", peak) < peak:
                            entry["peak"] = peak
            except BaseException as e:
                if _from_signal(e):
                    raise
            return out

        def reset_peaks(device, *args, **kwargs):
            try:
                dev = int(device)
                inst._held.pop(dev, None)
                inst._reset_by_program.add(dev)  # this step's own peak is lost
            except BaseException as e:
                if _from_signal(e):
                    raise
            return reset(device, *args, **kwargs)

        for wrapper, original in ((memory_stats, stats), (reset_peaks, reset)):
            functools.update_wrapper(wrapper, original)
            wrapper._gpuguard_original = original
        C._cuda_memoryStats = memory_stats
        C._cuda_resetPeakMemoryStats = reset_peaks
        self._real_stats, self._real_reset = stats, reset

    def _tell_needs(self):
        """Each device's peak of allocated bytes since the last boundary: the
        step's need; the peaks then start again (and the program's are kept
        aside, as the wrappers show them)."""
        if self._real_stats is None:
            return
        cuda = self.torch.cuda
        if not cuda.is_initialized():
            return
        if self._ndev is None:
            self._ndev = int(cuda.device_count())
        for dev in range(self._ndev):
            stats = self._real_stats(dev)
            held = self._held.get(dev)
            if held is None:
                held = self._held[dev] = {}
            keys = self._peak_keys
            if keys is None:
                keys = self._peak_keys = self._peaks_in(stats)
            get = held.get
            for key in keys:  # the program's peaks, kept as they would have been
                name, pool = key
                try:
                    peak = (stats[name] if pool is None else stats[name][pool])["peak"]
                except (KeyError, TypeError):
                    continue
                if peak > get(key, -1):
                    held[key] = peak
            self._real_reset(dev)
            if dev in self._reset_by_program:
                continue  # the program reset its peaks within the step: not known
            self.fn_needed(dev, int(stats["allocated_bytes"]["all"]["peak"]))
            self.needs += 1
        self._reset_by_program.clear()

    @staticmethod
    def _peaks_in(stats):
        """The (stat, pool) of every peak in PyTorch's nested statistics
        (pool None: a stat without pools)."""
        keys = []
        for name, entry in stats.items():
            if not isinstance(entry, dict):
                continue
            if "peak" in entry:
                keys.append((name, None))
                continue
            keys.extend((name, pool) for pool, e in entry.items()
                        if isinstance(e, dict) and "peak" in e)
        return tuple(keys)

    # --- the end ---------------------------------------------------------------------

    def _watch_exit(self):
        """Chain sys.excepthook: an uncaught exception is told to the shim
        (the summary says what the program died of) before the hook it
        replaces runs."""
        if self.fn_uncaught is None:
            return
        previous = sys.excepthook
        tell = self.fn_uncaught

        def excepthook(etype, value, tb):
            try:
                name = getattr(etype, "__qualname__", None) or getattr(etype, "__name__", "?")
                module = getattr(etype, "__module__", "") or ""
                if module and module != "builtins":
                    name = module + "." + name
                text = str(value).strip().splitlines()
                tell(_utf8("%s: %s" % (name, text[0]) if text else name, 480))
            except Exception as exc:
                _debug.swallowed("torch_instrument.excepthook", exc)
            return previous(etype, value, tb)
        sys.excepthook = excepthook

    # --- backward ------------------------------------------------------------------

    def _code(self, code):
        entry = self._codes.get(code)
        if entry is None:
            if len(self._codes) >= _CODES_MAX:
                self._codes.clear()
            file = code.co_filename
            path = os.path.abspath(file) if file and not file.startswith("<") else file
            skip = path.startswith(self.torch_dir) or path.startswith(self.own_dir)
            func = getattr(code, "co_qualname", None) or code.co_name
            entry = self._codes[code] = (_utf8(file, 1024), _utf8(func, 256), skip)
        return entry

    def _on_backward(self):
        """Called first thing by the torch.autograd.backward wrapper: the
        caller's frames to the shim. Cheap where it runs every step: the
        call site is looked up by its frames' code ids and instruction
        offsets (no line numbers, no code hashing) and its C array made
        once; the thread's name is kept by the thread object."""
        try:
            frame = sys._getframe(2)  # the wrapper's caller: Tensor.backward, or the program
            key, f, n = [], frame, 0
            while f is not None and n < 2 * BACKWARD_FRAMES:
                key.append(id(f.f_code))
                key.append(f.f_lasti)
                f = f.f_back
                n += 1
            key = tuple(key)
            site = self._sites.get(key)
            if site is None:
                site = self._sites[key] = self._site(frame)
            arr, n, self.last_backward, _ = site
            thread = threading.current_thread()
            known = self._threads.get(id(thread))
            if known is None or known[0] is not thread:
                if len(self._threads) >= 64:
                    self._threads.clear()
                known = self._threads[id(thread)] = (thread, _utf8(thread.name, 63))
            self.backwards += 1
            self.fn_backward(arr, n, known[1])
        except BaseException as e:
            if _from_signal(e):
                raise

    def _site(self, frame):
        """A call site's frames (innermost first, PyTorch's and ours left
        out), as the C array the shim takes and as snapshot frames; and the
        code objects its key names by id (kept alive with it)."""
        if len(self._sites) >= _CODES_MAX:
            self._sites.clear()
        frames, seen, codes, f = [], [], [], frame
        while f is not None and len(codes) < 2 * BACKWARD_FRAMES:
            code, line = f.f_code, f.f_lineno or 0
            codes.append(code)
            f = f.f_back
            file, func, skip = self._code(code)
            if skip or len(frames) == BACKWARD_FRAMES:
                continue
            frames.append(_native.PyFrame(file, func, line))
            seen.append({"filename": code.co_filename, "line": line,
                         "name": getattr(code, "co_qualname", None) or code.co_name})
        arr = (_native.PyFrame * max(1, len(frames)))(*frames)
        return arr, len(frames), seen, codes

    # --- PyTorch's view --------------------------------------------------------------

    def _on_request(self, req):
        """The shim's request, in the main thread with the GIL (a pending
        call): history on first, the view, history off last."""
        try:
            try:
                r = req.contents
                history, dev, seq, why, request = r.history, r.dev, r.seq, r.why, r.request
            except Exception as exc:
                _debug.swallowed("torch_instrument._on_request", exc)
                return
            # A leak's view reads what the last window left, history off: off
            # before it, and on (the next window) only after it.
            leak = why == b"leak"
            for part in (history > 0 and not leak and self._history_on,
                         history < 0 and leak and self._history_off,
                         dev >= 0 and why and not (why in (b"refused", b"oom") and self._in_observer())
                         and (lambda: self._answer(dev, seq, request, why)),
                         history > 0 and leak and self._history_on,
                         history < 0 and not leak and self._history_off):
                if part:
                    try:
                        part()  # each on its own: a backend without history still gets its view
                    except BaseException as e:
                        if _from_signal(e):
                            raise
        except BaseException as e:
            # A signal handler raised it while the view was read (the shim
            # blocks signals in this thread meanwhile, but one delivered to
            # another thread has its handler run here all the same): the
            # view is dropped, and the shim raises it into the program.
            if _from_signal(e):
                self._hand_back(e)

    def _hand_back(self, e):
        try:
            if self.fn_raise is not None:
                self.fn_raise(e)
        except Exception as exc:
            _debug.swallowed("torch_instrument._hand_back", exc)

    @staticmethod
    def _in_observer():
        """Is this request run as PyTorch's OOM observer starts (the main
        thread's own failure: the interpreter runs pending calls when a
        function starts)? Then the observer answers it, a moment later."""
        frame = sys._getframe(2)
        for _ in range(3):
            if frame is None:
                return False
            if frame.f_code is _Instrument._on_oom.__code__:
                return True
            frame = frame.f_back
        return False

    def _on_oom(self, device, alloc, total, device_free):
        """PyTorch's OOM observer: in the thread whose allocation failed,
        with the GIL, after the allocator let go of its lock."""
        try:
            self.ooms += 1
            if _thin(self.ooms):
                self._answer(int(device), 0, int(alloc))
        except BaseException as e:
            if _from_signal(e):
                raise  # out of PyTorch's OOM path, in place of its OutOfMemoryError

    def _history_enabled(self):
        enabled = getattr(self.torch._C, "_cuda_isHistoryEnabled", None)
        return enabled is not None and bool(enabled())

    def _history_on(self):
        cuda = self.torch.cuda
        if self.history or not cuda.is_initialized():
            return
        if self._history_enabled():
            self.user_history = True  # the program's own: used, never turned off
            return
        # The blocks that carry a stack already (an earlier window's): not
        # this window's, whatever a later view finds on them.
        try:
            self._framed_before = {
                b.get("address") for seg in cuda.memory._snapshot()["segments"]
                for b in seg.get("blocks", ())
                if b.get("state") == "active_allocated" and b.get("frames")}
        except Exception as exc:
            _debug.swallowed("torch_instrument._history_on", exc)
            self._framed_before = set()
        self._record(cuda)(enabled="all", context="alloc", stacks="python",
                           max_entries=HISTORY_MAX_ENTRIES)
        self.history = True
        self.history_turns += 1

    def _history_off(self):
        if self.history:
            self.history = False
            self._record(self.torch.cuda)(enabled=None)

    def _record(self, cuda):
        """PyTorch's own _record_memory_history, not the program's way to it."""
        record = cuda.memory._record_memory_history
        return getattr(record, "_gpuguard_original", record)

    def _wrap_record(self):
        """The program's own calls of _record_memory_history: history the
        program turns on, even while the instrumentation has it on for a
        forecast's step, is the program's from then on, never turned off
        at the step's end; one it turns off is off."""
        memory = getattr(getattr(self.torch, "cuda", None), "memory", None)
        original = getattr(memory, "_record_memory_history", None)
        if original is None or getattr(original, "_gpuguard_original", None) is not None:
            return
        inst = self

        def _record_memory_history(*args, **kwargs):
            try:
                on = args[0] if args else kwargs.get("enabled", "all")
                inst.user_history = on not in (None, False)
                inst.history = False  # the program's now, whoever turned it on before
            except Exception as exc:
                _debug.swallowed("torch_instrument._record_memory_history", exc)
            return original(*args, **kwargs)
        functools.update_wrapper(_record_memory_history, original)
        _record_memory_history._gpuguard_original = original
        memory._record_memory_history = _record_memory_history

    def _answer(self, dev, seq, request, why=None):
        cuda = self.torch.cuda
        if not cuda.is_initialized():
            return  # never initialize CUDA for a view
        stats = cuda.memory_stats(dev)
        view = _native.TorchView()
        view.seq = seq
        view.dev = dev
        view.reserved = int(stats.get("reserved_bytes.all.current", 0))
        view.allocated = int(stats.get("allocated_bytes.all.current", 0))
        view.inactive_split = int(stats.get("inactive_split_bytes.all.current", 0))
        view.request = max(0, int(request))
        try:
            snapshot = cuda.memory._snapshot()
            segments = [s for s in snapshot["segments"] if s.get("device") == dev]
        except Exception as exc:
            _debug.swallowed("torch_instrument._answer", exc)
            snapshot = segments = None  # a backend without snapshots: no free block is known
        keep = []
        if segments is None:
            view.largest_free = max(0, view.reserved - view.allocated)
        else:
            self._segments(view, segments)
            own = self.user_history and self._history_enabled()
            if why == b"leak":
                # history off again: the blocks that kept their Python
                # stacks are what its step allocated and never freed (with
                # the program's own history on, every block has a stack:
                # the check cannot tell, history 0 says so)
                if not own:
                    view.history = 1
                    keep = self._tensors(view, segments, None, at_peak=False)
            elif self.history or own:
                view.history = 1
                keep = self._tensors(view, segments, snapshot, at_peak=why == b"near_miss")
        self.views += 1
        self.fn_view(view)
        del keep  # what the view's pointers pointed into

    @staticmethod
    def _segments(view, segments):
        largest = 0
        for s in segments:
            if s.get("is_expandable"):
                view.seg_expandable += 1
            elif s.get("segment_type") == "small":
                view.seg_small += 1
            elif s.get("total_size", 0) >= GiB:
                view.seg_huge += 1
            else:
                view.seg_large += 1
            for b in s.get("blocks", ()):
                if b.get("state") == "inactive" and b.get("size", 0) > largest:
                    largest = b["size"]
        view.largest_free = largest

    def _op(self, frames):
        """The innermost of PyTorch's own functions in frames (innermost
        first) that the allocation happened in, as module.function
        (torch.nn.modules.linear.forward); None when the program's own line
        allocated it."""
        for f in frames:
            path = f.get("filename") or ""
            if not path.startswith(self.torch_dir):
                return None  # the program's frame comes first: its own op
            if f.get("name") in _PLUMBING:
                continue
            if path.startswith(self.torch_dir):
                mod = path[len(self.torch_dir):]
                mod = mod[:-3] if mod.endswith(".py") else mod
                mod = mod.replace(os.sep, ".")
                if mod.endswith("__init__"):
                    mod = mod[:-8].rstrip(".")
                return "torch.%s%s" % (mod + "." if mod else "", f.get("name") or "?")
        return None

    @staticmethod
    def _replay(trace, until):
        """The allocations of the history window live after trace[0..until]
        (addr -> its alloc entry), and the bytes and number of the window's
        frees of blocks allocated before it."""
        live, freed, nfreed = {}, 0, 0
        for e in trace[:until + 1]:
            action = e.get("action")
            if action == "alloc":
                live[e.get("addr")] = e
            elif action == "free_completed":
                if live.pop(e.get("addr"), None) is None:
                    freed += int(e.get("size", 0))
                    nfreed += 1
        return live, freed, nfreed

    def _window(self, view, segments, trace, at_peak):
        """What PyTorch's history recorded, at the moment that matters: the
        live blocks allocated since history went on, as their alloc entries;
        and the bytes and number of the blocks allocated before it, still
        live. At the step's peak (a near miss, whose view comes once the main
        thread runs Python again: after the backward it came in) or now."""
        end = len(trace) - 1
        live, freed, nfreed = self._replay(trace, end)
        now = {b.get("address") for s in segments for b in s.get("blocks", ())
               if b.get("state") == "active_allocated"}
        base = view.allocated - sum(int(e.get("size", 0)) for e in live.values()) + freed
        base_n = len(now - set(live)) + nfreed
        if at_peak:
            running = best = base
            best_i = -1
            for i, e in enumerate(trace):
                action = e.get("action")
                if action == "alloc":
                    running += int(e.get("size", 0))
                elif action == "free_completed":
                    running -= int(e.get("size", 0))
                else:
                    continue
                if running > best:
                    best, best_i = running, i
            live, freed, nfreed = self._replay(trace, best_i)
        return list(live.values()), max(0, base - freed), max(0, base_n - nfreed)

    def _tensors(self, view, segments, snapshot, at_peak):
        """The live blocks by the Python line that allocated them (the
        innermost frame outside PyTorch), largest first; what autograd's
        threads allocated (no Python frames) under the latest .backward()
        call, op "backward"; what was allocated before history was on as one
        entry with no frames. Returns what the view's pointers point into."""
        traces = snapshot.get("device_traces") if isinstance(snapshot, dict) else None
        trace = traces[view.dev] if isinstance(traces, list) and view.dev < len(traces) else None
        if trace:
            blocks, before, nbefore = self._window(view, segments, trace, at_peak)
        else:  # history without a trace (a leak check's, once off): the blocks now
            blocks, before, nbefore = [], 0, 0
            earlier = self._framed_before
            for s in segments:
                for b in s.get("blocks", ()):
                    if b.get("state") != "active_allocated":
                        continue
                    if b.get("frames") and b.get("address") not in earlier:
                        blocks.append(b)
                    else:
                        before += int(b.get("size", 0))
                        nbefore += 1
        groups = {}
        for b in blocks:
            size = int(b.get("size", 0))
            frames = b.get("frames") or []
            if frames:
                user = [f for f in frames
                        if not (f.get("filename") or "").startswith((self.torch_dir, self.own_dir))]
                top = user[0] if user else frames[0]
                key = (top.get("filename"), top.get("line"), top.get("name"))
                op = self._op(frames)
            else:  # autograd's threads have no Python frames: the backward they ran
                user, key, op = self.last_backward, "backward", "backward"
            g = groups.get(key)
            if g is None:
                g = groups[key] = [0, 0, user, op, 0]
            g[0] += size
            g[1] += 1
            if size > g[4]:
                g[2], g[3], g[4] = user, op, size
        rows = sorted(groups.values(), key=lambda g: -g[0])
        if nbefore:
            rows.append([before, nbefore, [], None, 0])
            rows.sort(key=lambda g: -g[0])
        rows = rows[:TENSORS_MAX]
        keep = []
        tensors = (_native.TorchTensor * max(1, len(rows)))()
        for i, (nbytes, count, frames, op, _) in enumerate(rows):
            frames = frames[:FRAMES_MAX]
            text = [(_utf8(f.get("filename") or "?", 1024), _utf8(f.get("name") or "?", 256))
                    for f in frames]
            arr = (_native.PyFrame * max(1, len(frames)))(
                *[_native.PyFrame(file, func, int(f.get("line") or 0))
                  for (file, func), f in zip(text, frames)])
            op = _utf8(op, 256) if op else None
            keep.extend((arr, text, op))  # the bytes the pointers point into
            t = tensors[i]
            t.bytes, t.count = nbytes, count
            t.op = op
            t.frames = arr
            t.nframes = len(frames)
        keep.append(tensors)
        view.tensors = tensors
        view.ntensors = len(rows)
        return keep
