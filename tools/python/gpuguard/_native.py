"""The C API of libgpuguard.so, seen through ctypes.

The shim exports five functions (include/gpuguard.h) that every version has
(FUNCTIONS) and, in newer versions, more (OPTIONAL: ``gpuguard_step``,
``gpuguard_policy``, ``gpuguard_step_shape`` and ``gpuguard_step_needed``,
``gpuguard_uncaught``, and the torch instrumentation's ``gpuguard_torch_*``
and ``gpuguard_backward`` with their structures). When
it is preloaded they are in the process's global scope and
``ctypes.CDLL(None)`` finds them; when it is not, the lookup fails and the
helper stays inert. A shim without an optional function is still the shim:
calling that function through Native is then a no-op that returns False.

Tests replace the library with ``set_library(obj)``: any object whose
attributes ``gpuguard_stats``, ``gpuguard_advice``, ``gpuguard_ack``,
``gpuguard_set_batch`` and ``gpuguard_note`` (and optionally
``gpuguard_step``) behave like the C functions (ctypes callbacks, or plain
Python callables that take the same arguments: the out-parameters arrive as
ctypes pointers). ``set_library(None)`` makes the shim look absent;
``reset_library()`` goes back to the real lookup.
"""

import ctypes

__all__ = [
    "GpuguardStats", "GpuguardAdvice", "GpuguardPolicy", "GpuguardPrediction", "PyFrame",
    "TorchRequest",
    "TorchTensor", "TorchView", "TORCH_FN", "Native", "FUNCTIONS", "OPTIONAL", "load",
    "set_library", "reset_library",
]

FUNCTIONS = ("gpuguard_stats", "gpuguard_advice", "gpuguard_ack",
             "gpuguard_set_batch", "gpuguard_note")

#: Functions of newer shims; an older shim without them is still the shim.
OPTIONAL = ("gpuguard_step", "gpuguard_policy", "gpuguard_torch_attach",
            "gpuguard_torch_detach", "gpuguard_torch_view", "gpuguard_backward",
            "gpuguard_torch_raise", "gpuguard_step_shape", "gpuguard_step_needed",
            "gpuguard_uncaught", "gpuguard_predict", "gpuguard_set_batch_why")
#: Called with the GIL held (it takes a reference to a Python object).
_WITH_GIL = ("gpuguard_torch_raise",)


class GpuguardStats(ctypes.Structure):
    """struct gpuguard_stats, field for field."""
    _fields_ = [
        ("dev", ctypes.c_int),
        ("name", ctypes.c_char * 256),
        ("total", ctypes.c_ulonglong),
        ("limit", ctypes.c_ulonglong),
        ("used", ctypes.c_ulonglong),
        ("current", ctypes.c_ulonglong),
        ("peak", ctypes.c_ulonglong),
        ("peak_used", ctypes.c_ulonglong),
        ("allocs", ctypes.c_ulonglong),
        ("frees", ctypes.c_ulonglong),
        ("near_misses", ctypes.c_ulonglong),
        ("refusals", ctypes.c_ulonglong),
        ("ooms", ctypes.c_ulonglong),
    ]


class GpuguardAdvice(ctypes.Structure):
    """struct gpuguard_advice, field for field."""
    _fields_ = [
        ("seq", ctypes.c_uint),
        ("dev", ctypes.c_int),
        ("batch_size", ctypes.c_int),
        ("grad_accum", ctypes.c_int),
        ("reason", ctypes.c_char * 32),
    ]


class GpuguardPrediction(ctypes.Structure):
    """struct gpuguard_prediction, field for field."""
    _fields_ = [
        ("bytes", ctypes.c_ulonglong),
        ("margin", ctypes.c_ulonglong),
        ("line", ctypes.c_ulonglong),
        ("steps", ctypes.c_ulonglong),
        ("most_tokens", ctypes.c_ulonglong),
        ("beyond", ctypes.c_int),
        ("quadratic", ctypes.c_int),
        ("max_tokens", ctypes.c_ulonglong),
    ]


class GpuguardPolicy(ctypes.Structure):
    """struct gpuguard_policy, field for field."""
    _fields_ = [
        ("batch_size", ctypes.c_int),
        ("grad_accum", ctypes.c_int),
        ("min_batch_size", ctypes.c_int),
        ("apply_batch", ctypes.c_int),
        ("file", ctypes.c_char * 4096),
    ]


class PyFrame(ctypes.Structure):
    """struct gpuguard_pyframe: one Python frame."""
    _fields_ = [
        ("file", ctypes.c_char_p),
        ("func", ctypes.c_char_p),
        ("line", ctypes.c_int),
    ]


class TorchRequest(ctypes.Structure):
    """struct gpuguard_torch_request: what the shim asks of the
    instrumentation (gpuguard.torch_instrument)."""
    _fields_ = [
        ("seq", ctypes.c_uint),
        ("dev", ctypes.c_int),
        ("why", ctypes.c_char * 16),
        ("request", ctypes.c_ulonglong),
        ("history", ctypes.c_int),
    ]


class TorchTensor(ctypes.Structure):
    """struct gpuguard_torch_tensor: live blocks allocated from one line."""
    _fields_ = [
        ("bytes", ctypes.c_ulonglong),
        ("count", ctypes.c_ulonglong),
        ("op", ctypes.c_char_p),
        ("frames", ctypes.POINTER(PyFrame)),
        ("nframes", ctypes.c_int),
    ]


class TorchView(ctypes.Structure):
    """struct gpuguard_torch_view: PyTorch's caching allocator on a device."""
    _fields_ = [
        ("seq", ctypes.c_uint),
        ("dev", ctypes.c_int),
        ("why", ctypes.c_char * 16),
        ("reserved", ctypes.c_ulonglong),
        ("allocated", ctypes.c_ulonglong),
        ("inactive_split", ctypes.c_ulonglong),
        ("largest_free", ctypes.c_ulonglong),
        ("request", ctypes.c_ulonglong),
        ("seg_small", ctypes.c_ulonglong),
        ("seg_large", ctypes.c_ulonglong),
        ("seg_huge", ctypes.c_ulonglong),
        ("seg_expandable", ctypes.c_ulonglong),
        ("history", ctypes.c_int),
        ("ntensors", ctypes.c_int),
        ("tensors", ctypes.POINTER(TorchTensor)),
    ]


#: gpuguard_torch_fn: void (*)(const struct gpuguard_torch_request *)
TORCH_FN = ctypes.CFUNCTYPE(None, ctypes.POINTER(TorchRequest))

# (restype, argtypes) of each function, as in gpuguard.h.
_SIGNATURES = {
    "gpuguard_stats": (ctypes.c_int, [ctypes.c_int, ctypes.POINTER(GpuguardStats)]),
    "gpuguard_advice": (ctypes.c_int, [ctypes.POINTER(GpuguardAdvice)]),
    "gpuguard_ack": (None, [ctypes.c_uint]),
    "gpuguard_set_batch": (None, [ctypes.c_int, ctypes.c_int]),
    "gpuguard_note": (None, [ctypes.c_char_p]),
    "gpuguard_step": (None, [ctypes.c_ulonglong]),
    "gpuguard_policy": (ctypes.c_int, [ctypes.c_int, ctypes.POINTER(GpuguardPolicy)]),
    "gpuguard_torch_attach": (ctypes.c_int, [TORCH_FN]),
    "gpuguard_torch_detach": (None, []),
    "gpuguard_torch_view": (None, [ctypes.POINTER(TorchView)]),
    "gpuguard_backward": (None, [ctypes.POINTER(PyFrame), ctypes.c_int, ctypes.c_char_p]),
    "gpuguard_torch_raise": (None, [ctypes.py_object]),
    "gpuguard_step_shape": (None, [ctypes.POINTER(ctypes.c_longlong), ctypes.c_int, ctypes.c_int]),
    "gpuguard_step_needed": (None, [ctypes.c_int, ctypes.c_ulonglong]),
    "gpuguard_uncaught": (None, [ctypes.c_char_p]),
    "gpuguard_set_batch_why": (None, [ctypes.c_int, ctypes.c_int, ctypes.c_char_p]),
    "gpuguard_predict": (ctypes.c_int, [ctypes.c_int, ctypes.c_ulonglong,
                                        ctypes.POINTER(GpuguardPrediction)]),
}

STATS_FIELDS = tuple(name for name, _ in GpuguardStats._fields_)

_INT_MAX = 2 ** 31 - 1

#: What a call through Native may raise: an argument ctypes cannot convert,
#: a value out of range, a function this library object lacks.
ERRORS = (ctypes.ArgumentError, TypeError, ValueError, OverflowError, AttributeError, KeyError)


def _clamp_int(v):
    v = int(v)
    return max(-_INT_MAX - 1, min(_INT_MAX, v))


class Native(object):
    """The functions of a library object, with Python-friendly calls. A
    missing required function raises AttributeError; a missing optional one
    is left out (``has(name)`` is False)."""

    def __init__(self, lib):
        self._fn = {}
        for name in FUNCTIONS + OPTIONAL:
            fn = getattr(lib, name, None)
            if fn is None:
                if name in OPTIONAL:
                    continue
                raise AttributeError(name)
            restype, argtypes = _SIGNATURES[name]
            try:
                if name in _WITH_GIL and isinstance(fn, ctypes._CFuncPtr):
                    fn = ctypes.PYFUNCTYPE(restype, *argtypes)(ctypes.cast(fn, ctypes.c_void_p).value)
                fn.restype = restype
                fn.argtypes = argtypes
            except (AttributeError, TypeError):
                pass  # a Python stand-in: nothing to declare
            self._fn[name] = fn

    def stats(self, dev=0):
        out = GpuguardStats()
        rc = self._fn["gpuguard_stats"](_clamp_int(dev), ctypes.pointer(out))
        if rc != 0:
            return None
        d = {}
        for name in STATS_FIELDS:
            v = getattr(out, name)
            if name == "name":
                v = v.decode("utf-8", "replace")
            d[name] = v
        return d

    def advice(self):
        out = GpuguardAdvice()
        rc = self._fn["gpuguard_advice"](ctypes.pointer(out))
        if not rc:
            return None
        return {
            "seq": int(out.seq),
            "dev": int(out.dev),
            "batch_size": int(out.batch_size),
            "grad_accum": int(out.grad_accum),
            "reason": out.reason.decode("utf-8", "replace"),
        }

    def ack(self, seq):
        self._fn["gpuguard_ack"](int(seq) & 0xFFFFFFFF)

    def set_batch(self, batch_size, grad_accum, why=None):
        """gpuguard_set_batch, or with a reason (the `batch` event's: shape,
        advice, policy, oom) gpuguard_set_batch_why where the shim has it."""
        fn = self._fn.get("gpuguard_set_batch_why") if why else None
        if fn is not None:
            fn(_clamp_int(batch_size), _clamp_int(grad_accum), why.encode("ascii", "replace"))
        else:
            self._fn["gpuguard_set_batch"](_clamp_int(batch_size), _clamp_int(grad_accum))

    def note(self, text):
        if isinstance(text, str):
            text = text.encode("utf-8", "replace")
        text = bytes(text).replace(b"\0", b"")
        self._fn["gpuguard_note"](text)

    def has(self, name):
        return name in self._fn

    def step(self, step):
        """gpuguard_step(step) when the shim has it; True when called."""
        fn = self._fn.get("gpuguard_step")
        if fn is None:
            return False
        fn(max(0, int(step)) & 0xFFFFFFFFFFFFFFFF)
        return True

    def function(self, name):
        """The library's function `name` with its signature declared, or
        None when this shim does not have it (the torch instrumentation
        calls gpuguard_torch_* and gpuguard_backward through these)."""
        return self._fn.get(name)

    def predict(self, dev, tokens):
        """The shim's prediction for an input of `tokens` elements on device
        dev (gpuguard_predict) as a dict: bytes, margin, line, steps,
        most_tokens, beyond, quadratic, and model (False: no model yet, only
        line, steps and most_tokens hold). None when this shim cannot say
        (no gpuguard_predict, no such device, not active)."""
        fn = self._fn.get("gpuguard_predict")
        if fn is None:
            return None
        out = GpuguardPrediction()
        rc = fn(_clamp_int(dev), max(0, int(tokens)) & 0xFFFFFFFFFFFFFFFF, ctypes.pointer(out))
        if rc not in (0, 1):
            return None
        d = {name: int(getattr(out, name)) for name, _ in GpuguardPrediction._fields_}
        d["beyond"], d["quadratic"], d["model"] = bool(d["beyond"]), bool(d["quadratic"]), rc == 0
        return d

    def shape(self, dims, batch_dim=0):
        """gpuguard_step_shape(dims, batch_dim) when the shim has it."""
        fn = self._fn.get("gpuguard_step_shape")
        if fn is None or not dims:
            return
        n = min(len(dims), 8)
        arr = (ctypes.c_longlong * n)(*[int(d) for d in dims[:n]])
        fn(arr, n, int(batch_dim))

    def policy(self, dev=0):
        """Device dev's policy's [trainer] keys and file as a dict, or None
        (not active yet, or a shim without gpuguard_policy)."""
        fn = self._fn.get("gpuguard_policy")
        if fn is None:
            return None
        out = GpuguardPolicy()
        if fn(_clamp_int(dev), ctypes.pointer(out)) != 0:
            return None
        return {"batch_size": int(out.batch_size), "grad_accum": int(out.grad_accum),
                "min_batch_size": int(out.min_batch_size),
                "apply_batch": bool(out.apply_batch),
                "file": out.file.decode("utf-8", "replace")}


_UNSET = object()
_override = _UNSET


def set_library(lib):
    """Use `lib` (an object with the five functions, and any of OPTIONAL)
    instead of the real lookup; None makes the shim look absent."""
    global _override
    _override = lib


def reset_library():
    """Go back to looking the functions up in the process."""
    global _override
    _override = _UNSET


def _find_process_library():
    try:
        lib = ctypes.CDLL(None)
    except OSError:
        return None
    for name in FUNCTIONS:
        try:
            getattr(lib, name)
        except AttributeError:
            return None
    return lib


def load():
    """A Native for the preloaded shim (or the stand-in), or None."""
    lib = _find_process_library() if _override is _UNSET else _override
    if lib is None:
        return None
    try:
        return Native(lib)
    except AttributeError:
        return None
