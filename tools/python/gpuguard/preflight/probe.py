"""gpuguard-preflight's probe: what PyTorch's own allocator says, step by
step, inside the user's unmodified script (docs/preflight.md).

gpuguard's sitecustomize calls ``install(torch)`` once the script has
imported torch, when ``GPUGUARD_PREFLIGHT`` names the file to write (only
gpuguard-preflight sets it, for a run on the simulated GPU). It:

- at each **optimizer step** (a global step post hook, the first optimizer
  that steps, as gpuguard-run's instrumentation counts steps) writes the
  step's peak of PyTorch's reserved memory (``max_memory_reserved``) and of
  its tensors (``max_memory_allocated``: what they needed), then resets
  PyTorch's peak statistics so that the next step's peak is its own (the
  run's peaks are kept here: a script that reads ``max_memory_*`` sees its
  step's); at ``GPUGUARD_PREFLIGHT_STEPS`` it stops the script as Ctrl-C
  would not: ``SystemExit(0)`` from the hook, so exit handlers and the
  shim's summary run (their writes go to the throwaway layer);
- records each step's **input** (the largest tensor handed to the outermost
  module's forward: shape and elements, the size a batch's memory follows);
- records where the script **reads values** back from the GPU (``.item()``,
  ``.tolist()``, ``bool()`` of a CUDA tensor...) and where it calls ops whose
  **output shape depends on values** (``nonzero``, ``masked_select``,
  ``unique``, boolean-mask indexing): on the simulated GPU every value is
  zero, so control flow and shapes that follow them can differ from a real
  run; by the script's own line;
- records where the script asks the **device's memory** (``mem_get_info``,
  ``get_device_properties``, ``set_per_process_memory_fraction``): a script
  that sizes itself from the GPU must be run on each model;
- counts the OutOfMemoryErrors PyTorch **raised** (its OOM observer);
- writes running peaks every second from a thread, so that a run stopped by
  a time limit or killed still leaves them.

It never changes what the script computes (it wraps Python entry points and
calls them unchanged), never raises into the script except the one
SystemExit that stops it, and never imports anything but the standard
library and the torch the script imported.
"""
import atexit
import functools
import json
import os
import sys
import threading
import time

from .. import _debug

__all__ = ["install", "STATE"]

STATE = None

#: Sites (one per kind, op and line) kept, at most.
SITES_MAX = 64
#: Seconds between the sampler's lines.
SAMPLE_EVERY = 1.0

_HERE = os.path.dirname(os.path.abspath(__file__))
_PKG = os.path.dirname(_HERE) + os.sep


def install(torch):
    """Install the probe in this process (once); None when not asked for."""
    global STATE
    try:
        if STATE is not None:
            return STATE
        path = os.environ.get("GPUGUARD_PREFLIGHT", "")
        if not path or torch is None:
            return None
        try:
            steps = int(os.environ.get("GPUGUARD_PREFLIGHT_STEPS", "0") or 0)
        except ValueError:
            steps = 0
        STATE = _Probe(torch, path, max(0, steps))
        STATE.start()
        return STATE
    except Exception as exc:
        _debug.swallowed("preflight.probe.install", exc)
        return None


class _Probe(object):
    def __init__(self, torch, path, steps):
        self.torch = torch
        self.path = path
        self.stop_at = steps
        self.torch_dir = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
        self.lock = threading.Lock()
        self.fd = None
        self.steps = 0
        self._clock = None
        self.t0 = time.time()
        self.max_reserved = 0
        self.max_needed = 0
        self.peak_step = None
        self.input = None            # the step's largest input: (numel, shape)
        self.depth = 0
        self.sites = {}              # (kind, op, file, line) -> [count, first step, func]
        self.ooms = 0
        self.stopped = False
        self.ended = False
        self.dist = None

    # --- writing -------------------------------------------------------------------

    def write(self, obj):
        obj["t"] = round(time.time() - self.t0, 3)
        line = (json.dumps(obj, separators=(",", ":")) + "\n").encode("utf-8")
        with self.lock:
            if self.fd is None:
                self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC,
                                  0o644)
            os.write(self.fd, line)

    # --- installing ----------------------------------------------------------------

    def start(self):
        t = self.torch
        self.write({"ev": "start", "pid": os.getpid(), "torch": getattr(t, "__version__", None),
                    "cuda": getattr(getattr(t, "version", None), "cuda", None),
                    "python": sys.version.split()[0], "argv": list(sys.argv)})
        optim = sys.modules.get("torch.optim.optimizer")
        if optim is None and hasattr(t, "optim"):
            import importlib
            optim = importlib.import_module("torch.optim.optimizer")
        register = getattr(optim, "register_optimizer_step_post_hook", None)
        if register is not None:
            register(self._on_step)
        self._hook_inputs()
        self._wrap_reads()
        self._wrap_device_queries()
        self._observe_ooms()
        atexit.register(self._at_exit)
        th = threading.Thread(target=self._sampler, name="gpuguard-preflight", daemon=True)
        th.start()

    def _hook_inputs(self):
        modules = getattr(getattr(self.torch, "nn", None), "modules", None)
        module = getattr(modules, "module", None)
        pre = getattr(module, "register_module_forward_pre_hook", None)
        post = getattr(module, "register_module_forward_hook", None)
        if pre is None or post is None:
            return
        pre(self._on_forward_pre)
        try:
            post(self._on_forward_post, always_call=True)
        except TypeError:
            post(self._on_forward_post)

    def _on_forward_pre(self, module, args):
        try:
            self.depth += 1
            if self.depth == 1:
                best = None
                for a in args:
                    best = self._larger(best, a)
                if best is not None and (self.input is None or best[0] > self.input[0]):
                    self.input = best
        except Exception as exc:
            _debug.swallowed("preflight.probe._on_forward_pre", exc)

    def _larger(self, best, a):
        Tensor = self.torch.Tensor
        if isinstance(a, Tensor):
            n = a.numel()
            if best is None or n > best[0]:
                return (n, list(a.shape))
        elif isinstance(a, (list, tuple)):
            for x in a[:16]:
                best = self._larger(best, x)
        elif isinstance(a, dict):
            for x in list(a.values())[:16]:
                best = self._larger(best, x)
        return best

    def _on_forward_post(self, module, args, output):
        self.depth = max(0, self.depth - 1)

    # --- sites ---------------------------------------------------------------------

    def _site(self, kind, op, depth=2):
        """The script's line that called op, counted under kind; nothing
        when PyTorch (or gpuguard) called it: those calls are PyTorch's own
        business (GradScaler's inf check, the CUDA capability query)."""
        try:
            f = sys._getframe(depth)
            file = f.f_code.co_filename
            path = os.path.abspath(file) if not file.startswith("<") else file
            if path.startswith(self.torch_dir) or path.startswith(_PKG):
                return
            key = (kind, op, f.f_code.co_filename, f.f_lineno)
            s = self.sites.get(key)
            if s is None:
                if len(self.sites) >= SITES_MAX:
                    return
                s = self.sites[key] = [0, self.steps + 1, f.f_code.co_name]
            s[0] += 1
        except Exception as exc:
            _debug.swallowed("preflight.probe._site", exc)

    def _wrap(self, owner, name, kind, when):
        original = getattr(owner, name, None)
        if original is None or getattr(original, "_gpuguard_preflight", False):
            return
        site = self._site

        @functools.wraps(original)
        def wrapper(*args, **kwargs):
            try:
                if when(args, kwargs):
                    site(kind, name)
            except Exception as exc:
                _debug.swallowed("preflight.probe.wrapper", exc)
            return original(*args, **kwargs)
        wrapper._gpuguard_preflight = True
        try:
            setattr(owner, name, wrapper)
        except (AttributeError, TypeError):
            pass

    def _wrap_reads(self):
        t = self.torch
        Tensor = t.Tensor

        def cuda_self(args, kwargs):
            return bool(args) and isinstance(args[0], Tensor) and args[0].is_cuda

        def cuda_any(args, kwargs):
            return any(isinstance(a, Tensor) and a.is_cuda for a in args[:2])

        def bool_index(args, kwargs):
            if len(args) < 2:
                return False
            idx = args[1] if isinstance(args[1], tuple) else (args[1],)
            return any(isinstance(i, Tensor) and i.is_cuda and i.dtype == t.bool for i in idx)

        for name in ("item", "tolist", "__bool__", "__int__", "__float__"):
            self._wrap(Tensor, name, "value", cuda_self)
        for name in ("nonzero", "masked_select", "unique", "unique_consecutive", "argwhere"):
            self._wrap(Tensor, name, "shape", cuda_self)
            self._wrap(t, name, "shape", cuda_any)
        self._wrap(Tensor, "__getitem__", "shape", bool_index)

    def _wrap_device_queries(self):
        cuda = getattr(self.torch, "cuda", None)
        if cuda is None:
            return
        always = lambda args, kwargs: True  # noqa: E731
        for name in ("mem_get_info", "get_device_properties", "set_per_process_memory_fraction"):
            self._wrap(cuda, name, "device", always)
        memory = getattr(cuda, "memory", None)
        if memory is not None:
            for name in ("mem_get_info", "set_per_process_memory_fraction"):
                self._wrap(memory, name, "device", always)

    def _observe_ooms(self):
        cuda = getattr(self.torch, "cuda", None)
        if cuda is None:
            return

        def attach():
            try:
                self.torch._C._cuda_attach_out_of_memory_observer(self._on_oom)
            except Exception as exc:
                _debug.swallowed("preflight.probe.attach", exc)
        if cuda.is_initialized():
            attach()
            return
        queued = getattr(cuda, "_queued_calls", None)
        if isinstance(queued, list):
            queued.append((attach, []))

    def _on_oom(self, device, alloc, total, free):
        self.ooms += 1

    # --- steps ---------------------------------------------------------------------

    def _peaks(self):
        """PyTorch's peaks since the last reset: (reserved, allocated)."""
        cuda = self.torch.cuda
        if not cuda.is_initialized():
            return 0, 0
        s = cuda.memory_stats()
        return (int(s.get("reserved_bytes.all.peak", 0)), int(s.get("allocated_bytes.all.peak", 0)))

    def _on_step(self, optimizer, args, kwargs):
        try:
            if self.stopped:
                # the script caught the SystemExit that stopped it: end it here
                self._end("steps")
                os._exit(0)
            clock = self._clock() if self._clock is not None else None
            if clock is None:
                import weakref
                self._clock = weakref.ref(optimizer)
            elif clock is not optimizer:
                return
            self.steps += 1
            cuda = self.torch.cuda
            reserved, needed = self._peaks()
            now_r = int(cuda.memory_reserved()) if cuda.is_initialized() else 0
            now_a = int(cuda.memory_allocated()) if cuda.is_initialized() else 0
            if reserved > self.max_reserved or self.peak_step is None:
                self.peak_step = self.steps
            self.max_reserved = max(self.max_reserved, reserved)
            self.max_needed = max(self.max_needed, needed)
            shape = self.input[1] if self.input else None
            tokens = self.input[0] if self.input else None
            self.input = None
            self.depth = 0
            self.write({"ev": "step", "step": self.steps, "reserved_peak": reserved,
                        "needed_peak": needed, "reserved": now_r, "allocated": now_a,
                        "max_reserved": self.max_reserved, "max_needed": self.max_needed,
                        "shape": shape, "tokens": tokens})
            if cuda.is_initialized():
                cuda.reset_peak_memory_stats()
            self._note_dist()
        except Exception as exc:
            _debug.swallowed("preflight.probe._on_step", exc)
            return
        if self.stop_at and self.steps >= self.stop_at:
            self.stopped = True
            self._end("steps")
            raise SystemExit(0)

    def _note_dist(self):
        if self.dist is not None:
            return
        try:
            d = getattr(self.torch, "distributed", None)
            if d is not None and d.is_available() and d.is_initialized():
                self.dist = {"backend": str(d.get_backend()), "world": int(d.get_world_size())}
                self.write(dict(ev="dist", **self.dist))
        except Exception as exc:
            _debug.swallowed("preflight.probe._note_dist", exc)

    # --- the end -------------------------------------------------------------------

    def _running(self):
        reserved, needed = self._peaks()
        return max(self.max_reserved, reserved), max(self.max_needed, needed)

    def _end(self, why):
        if self.ended:
            return
        self.ended = True
        try:
            reserved, needed = self._running()
        except Exception as exc:
            _debug.swallowed("preflight.probe._end", exc)
            reserved, needed = self.max_reserved, self.max_needed
        sites = [{"kind": k, "op": op, "file": file, "line": line, "func": v[2], "count": v[0],
                  "first_step": v[1]} for (k, op, file, line), v in self.sites.items()]
        self.write({"ev": "end", "why": why, "steps": self.steps, "max_reserved": reserved,
                    "max_needed": needed, "peak_step": self.peak_step, "ooms_raised": self.ooms,
                    "sites": sites, "dist": self.dist})

    def _at_exit(self):
        try:
            self._end("exit")
        except Exception as exc:
            _debug.swallowed("preflight.probe._at_exit", exc)

    def _sampler(self):
        while not self.ended:
            time.sleep(SAMPLE_EVERY)
            try:
                if self.ended or not self.torch.cuda.is_initialized():
                    continue
                reserved, needed = self._running()
                self.write({"ev": "sample", "steps": self.steps, "max_reserved": reserved,
                            "max_needed": needed})
            except Exception as exc:
                _debug.swallowed("preflight.probe._sampler", exc)
