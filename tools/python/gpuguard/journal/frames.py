"""Native and Python frames in PyTorch's terms: what a frame is (PyTorch's
caching allocator, its dispatcher, an ATen op, an autograd node, autograd's
engine, the Python interpreter, a frame without a symbol), the op and node
names (`at::_ops::mm::call` -> aten::mm, `torch::autograd::generated::
MmBackward0::apply` -> MmBackward0), and a stack's readable view: native and
Python frames merged in call order, runs collapsed to one line each.

The merge rule (py-spy's --native and pystack's, reduced to what a journal
keeps): the Python frames go where the first native frame of the
interpreter is (libpython's or the python executable's: _PyEval_EvalFrameDefault
and the calls that enter it); the native frames from there outward are the
interpreter running those Python frames and read as one line. Since CPython
3.11 one eval-loop frame runs several Python frames, so a Python frame cannot
be matched to its own native frame; a C extension that calls back into Python
(between two Python frames) is counted in that line, not placed between them.
A native stack cut before the interpreter (the shim keeps 32 frames) has its
Python frames after its last frame.

Only stacks through PyTorch (a frame of libtorch* or libc10*) get this view;
any other stack reads as the shim wrote it. Standard library only.
"""

import re

from .stacks import basename, frame_key, frame_label, pyframe_key, pyframe_label
from .values import as_int, as_str

MAX_FRAMES = 128            # native frames looked at per stack
MAX_PYFRAMES = 128          # Python frames looked at per stack

# kinds of view entries
ALLOC, OP, DISPATCH, NODE, ENGINE, INTERP, NOSYM, NATIVE, TORCH, OTHER, PY = (
    "alloc", "op", "disp", "node", "engine", "interp", "nosym", "native", "torch", "other", "py")

ALLOC_RE = re.compile(r"CUDACachingAllocator|CUDAMallocAsyncAllocator|c10::cuda::MemPool|"
                      r"ExpandableSegment")
OP_RE = re.compile(r"^at::_ops::(\w+)::call$")
NODE_RE = re.compile(r"^torch::autograd::(?:generated::)?(\w+)::apply$")
ENGINE_RE = re.compile(r"^torch::autograd::(?:Engine::|python::PythonEngine::|Node::operator|"
                       r"call_function|(?:\(anonymous namespace\)::)?validate_outputs)")
DISPATCH_RE = re.compile(
    r"^(?:c10::(?:Dispatcher|impl::|BoxedKernel|KernelFunction|OperatorHandle|TypedOperatorHandle|"
    r"callUnboxedKernelFunction|detail::)|at::_ops::\w+::redispatch$|"
    r"torch::autograd::VariableType::|torch::ADInplaceOrView::|torch::TraceType::|"
    r"(?:at|torch)::functionalization::|at::(?:\(anonymous namespace\)::)+(?:\w+::)*wrapper_)")
NATIVE_RE = re.compile(r"^at::(?:native|meta)::(?:\(anonymous namespace\)::)?(\w+)")
TORCH_SYM_RE = re.compile(r"^(?:at|c10|torch)::")

# The last part of at::_ops::<name>_<overload> that starts the overload name
# (the op's name is the part before it): mul_Tensor -> mul, sum_dim_IntList ->
# sum, to_dtype_layout -> to, empty_memory_format -> empty, fill__Scalar -> fill_.
OVERLOAD_WORDS = frozenset((
    "out", "dim", "dims", "dimname", "int", "dtype", "self", "other", "device", "memory", "names",
    "correction", "start", "generator", "vec", "using", "src", "value", "default", "input",
    "float", "list", "str", "symint", "layout", "mode", "source", "reduce", "stable", "low"))
# Ops that only make the tensor another op asked for (named only when no other is)
FACTORY = frozenset(("empty", "empty_strided", "empty_like", "new_empty", "new_empty_strided",
                     "empty_permuted", "empty_generic"))
# (with a global forward hook, as gpuguard-run's, _call_impl runs the
# forward inside a closure of its own: "inner", "_call_impl" before 3.11)
NN_CALL = frozenset(("Module._call_impl", "Module._wrapped_call_impl",
                     "Module._call_impl.<locals>.inner", "inner"))
# PyTorch's own libraries: libtorch.so, libtorch_cpu.so.2.6, libc10_cuda.so, ...
TORCH_LIB_RE = re.compile(r"^lib(?:torch|c10)(?:_[a-z_]+)?\.so")
TORCH_PKG_RE = re.compile(r"[/\\](?:site|dist)-packages[/\\]torch[/\\]")
AUTOGRAD_THREAD = "pt_autograd_"


def base_name(sym):
    """A demangled symbol's qualified name: no arguments, no return type
    (`void at::native::f<T>(int)` -> at::native::f<T>)."""
    sym = as_str(sym, "")
    depth = 0
    i = 0
    n = len(sym)
    cut = n
    space = -1
    while i < n:
        c = sym[i]
        if c == "(" and sym.startswith("(anonymous namespace)", i):
            i += len("(anonymous namespace)")
            continue
        if c == "<":
            depth += 1
        elif c == ">":
            depth = max(depth - 1, 0)
        elif c == "(" and depth == 0:
            if sym.startswith("operator", max(i - 8, 0)) and sym[i:i + 2] == "()":
                i += 2
                continue
            cut = i
            break
        elif c == " " and depth == 0:
            space = i
        i += 1
    name = sym[:cut]
    if 0 <= space < cut:
        name = name[space + 1:]
    return name


def aten_name(ops_name):
    """`at::_ops::<name>` without its overload: mul_Tensor -> mul."""
    parts = ops_name.split("_")
    for i in range(1, len(parts)):
        p = parts[i]
        if not "".join(parts[:i]).strip("_"):
            continue
        if p[:1].isupper() or p in OVERLOAD_WORDS:
            return "_".join(parts[:i])
    return ops_name


def native_name(fn):
    """An at::native kernel's op: structured_sum_out -> sum, addmm_out_cuda -> addmm."""
    if fn.startswith("structured_"):
        fn = fn[len("structured_"):]
    for suffix in ("_out_cuda", "_cuda", "_out", "_kernel"):
        if fn.endswith(suffix) and len(fn) > len(suffix):
            fn = fn[:-len(suffix)]
            break
    return fn


def is_torch_module(mod):
    """One of PyTorch's libraries, its Python bindings (libtorch_python) aside."""
    return bool(TORCH_LIB_RE.match(mod or "")) and not mod.startswith("libtorch_python")


def is_pytorch(stack):
    """Does a native stack run through PyTorch (a frame of libtorch*.so or
    libc10*.so)?"""
    for fr in stack:
        if TORCH_LIB_RE.match(basename(fr.get("module"))):
            return True
    return False


def classify(fr):
    """(kind, name) of one native frame."""
    mod = basename(fr.get("module"))
    sym = as_str(fr.get("sym"))
    if mod.startswith(("libpython", "python")):
        return INTERP, None
    if not sym:
        if mod.startswith("libc10_cuda"):
            return ALLOC, None
        return NOSYM, mod
    name = base_name(sym)
    if mod.startswith("libc10_cuda") or ALLOC_RE.search(name):
        return ALLOC, None
    m = OP_RE.match(name)
    if m:
        return OP, aten_name(m.group(1))
    m = NODE_RE.match(name)
    if m:
        return NODE, m.group(1)
    if ENGINE_RE.match(name):
        return ENGINE, None
    if DISPATCH_RE.match(name):
        return DISPATCH, None
    m = NATIVE_RE.match(name)
    if m:
        return NATIVE, native_name(m.group(1))
    if is_torch_module(mod) and TORCH_SYM_RE.match(name):
        return TORCH, None
    return OTHER, None


def is_torch_file(path):
    return bool(TORCH_PKG_RE.search(as_str(path, "")))


def is_nn_call(fr):
    """A Python frame of torch.nn.Module's call machinery (module.py's
    _call_impl and _wrapped_call_impl, between every two forwards)."""
    return (as_str(fr.get("func")) in NN_CALL
            and as_str(fr.get("file"), "").replace("\\", "/").endswith("torch/nn/modules/module.py"))


def user_frame(pystack):
    """(index, frame) of the innermost Python frame outside torch's own
    package (the line that asked), else of the innermost; or (None, None)."""
    first = None
    for i, fr in enumerate(pystack):
        if not isinstance(fr, dict):
            continue
        if first is None:
            first = (i, fr)
        if not is_torch_file(fr.get("file")):
            return i, fr
    return first or (None, None)


def plural_frames(n):
    return "%d frame%s" % (n, "" if n == 1 else "s")


class Entry(object):
    """One line of a readable stack: a frame, or a run of frames collapsed."""
    __slots__ = ("kind", "key", "text", "first", "n", "name", "pyindex")

    def __init__(self, kind, key, text, first=0, n=1, name=None, pyindex=None):
        self.kind, self.key, self.text = kind, key, text
        self.first, self.n, self.name, self.pyindex = first, n, name, pyindex

    def line(self):
        if self.kind == PY:
            return "py#%d %s" % (self.pyindex, self.text)
        return "#%d %s" % (self.first, self.text)


def _run(kind, first, n, extra=None):
    if kind == ALLOC:
        return Entry(ALLOC, (ALLOC,), "[PyTorch caching allocator: %s]" % plural_frames(n), first, n)
    if kind == DISPATCH:
        return Entry(DISPATCH, (DISPATCH,), "[PyTorch dispatcher: %s]" % plural_frames(n), first, n)
    if kind == ENGINE:
        return Entry(ENGINE, (ENGINE,), "[autograd engine: %s]" % plural_frames(n), first, n)
    if kind == NOSYM:
        return Entry(NOSYM, (NOSYM, extra), "[%s in %s]" % (plural_frames(n), extra), first, n)
    raise ValueError(kind)


def _op(name, first, n):
    return Entry(OP, (OP, name), "aten::%s (%s)" % (name, plural_frames(n)), first, n, name)


def _other(fr, i):
    """A frame as it is, its symbol without arguments or return type:
    `torch::autograd::InputMetadata::reduce_grad+0x70 (libtorch_cpu.so.2.6)`."""
    sym = as_str(fr.get("sym"))
    short = dict(fr, sym=base_name(sym)) if sym else fr
    return Entry(OTHER, frame_key(fr), frame_label(short), i, 1)


def _flush(frames, classes, start, end, out):
    """Frames [start, end) that no op's call frame closed: one op named by
    its at::native kernel when one names it, else runs (dispatcher,
    frames without a symbol by module) and single frames."""
    if start >= end:
        return
    named = [classes[i][1] for i in range(start, end)
             if classes[i][0] == NATIVE and classes[i][1] not in FACTORY]
    if named:
        out.append(_op(named[-1], start, end - start))
        return
    i = start
    while i < end:
        kind, extra = classes[i]
        j = i + 1
        if kind in (DISPATCH, NOSYM, ENGINE, ALLOC):
            while j < end and classes[j][0] == kind and classes[j][1] == extra:
                j += 1
            out.append(_run(kind, i, j - i, extra))
        else:
            out.append(_other(frames[i], i))
        i = j


def _internal(kind, extra):
    """May the frame belong to the op whose call frame comes further out?"""
    if kind in (DISPATCH, NATIVE, TORCH, ALLOC):
        return True
    return kind == NOSYM and is_torch_module(extra)


def native_entries(frames, classes):
    """The native frames above the interpreter as entries, innermost first:
    the caching allocator's run, each ATen op (from inside it to its
    at::_ops::<op>::call frame), autograd nodes and engine, runs of frames
    without a symbol by module, other frames as they are."""
    out = []
    n = len(frames)
    i = 0
    while i < n and classes[i][0] == ALLOC:
        i += 1
    if i:
        out.append(_run(ALLOC, 0, i))
    pending = i
    while i < n:
        kind, extra = classes[i]
        if kind == OP:
            out.append(_op(extra, pending, i + 1 - pending))
            pending = i + 1
        elif not _internal(kind, extra):
            _flush(frames, classes, pending, i, out)
            j = i + 1
            if kind == NODE:
                out.append(Entry(NODE, (NODE, extra), "%s (autograd node)" % extra, i, 1, extra))
            elif kind in (ENGINE, NOSYM):
                while j < n and classes[j][0] == kind and classes[j][1] == extra:
                    j += 1
                out.append(_run(kind, i, j - i, extra))
            else:
                out.append(_other(frames[i], i))
            pending = i = j
            continue
        i += 1
    _flush(frames, classes, pending, n, out)
    return _merge_runs(out)


def _merge_runs(out):
    """A run of frames without a symbol in PyTorch's own libraries between
    two runs of the engine or the dispatcher belongs to them."""
    merged = []
    for e in out:
        if (len(merged) >= 2 and e.kind in (ENGINE, DISPATCH) and merged[-2].kind == e.kind
                and merged[-1].kind == NOSYM and is_torch_module(merged[-1].key[1])):
            mid = merged.pop()
            prev = merged.pop()
            e = _run(e.kind, prev.first, prev.n + mid.n + e.n)
        merged.append(e)
    return merged


class View(object):
    """A stack in PyTorch's terms: entries innermost first, the line it is
    grouped under, the op and autograd node that asked."""

    def __init__(self, entries, user, line, op, node, backward, head=None, looked=True):
        self.head = head or line[1]       # the line's label without the node
        self.looked = looked              # did the shim look for Python frames
        self.entries = entries
        self.user = user                  # index in entries of the line's Python frame, or None
        self.line = line                  # (key, label)
        self.op = op                      # e.g. "aten::mm", or None
        self.node = node                  # e.g. "MmBackward0", or None
        self.backward = backward          # the backward site it is tied to, or None

    @property
    def through_cache(self):
        """Was it asked by PyTorch's caching allocator (a segment of its
        cache, not a tensor)?"""
        return any(e.kind == ALLOC for e in self.entries)

    @property
    def in_backward(self):
        """Did autograd's threads allocate it (no Python frames)?"""
        return self.line[0][0] == "backward"

    @property
    def where(self):
        """The line, and the op when the line does not say it already; a
        stack with neither Python frames nor autograd's: its op (else its
        first named frame past the allocator) and its thread."""
        label = self.line[1]
        if self.line[0][0] in ("thread", "none"):
            named = [e.text for e in self.entries if e.kind in (OTHER, NODE)]
            rest = [e.text for e in self.entries if e.kind != ALLOC] or [e.text for e in self.entries]
            first = self.op or (named or rest or [None])[0]
            if first is None:
                return None
            return "%s %s" % (first, label) if self.looked and self.line[0][0] == "thread" else first
        if self.op and self.op not in label:
            return "%s, %s" % (label, self.op)
        return label

    def _upto(self, nframes):
        if self.user is None:
            return len(self.entries)
        end = self.user + 1
        callers = 0
        while end < len(self.entries) and self.entries[end].kind == PY and callers < nframes - 1:
            end += 1
            callers += 1
        return end

    def lines(self, nframes):
        """The stack as lines: what ran inside the line (allocator, ops,
        PyTorch's own Python frames), the line, then nframes - 1 of its
        Python callers; without Python frames, every entry."""
        return [e.line() for e in self.entries[:self._upto(nframes)]]

    def stack_lines(self, nframes):
        """lines() led, for a stack without Python frames, by what it is:
        the backward it ran for, or its thread."""
        lead = []
        if self.user is None and (self.in_backward or (self.looked and self.line[0][0] == "thread")):
            lead = [self.line[1]]
        return lead + self.lines(nframes)

    def group_key(self, nframes):
        """What tells two stacks under one line apart: the first nframes
        entries inside the line (the allocator's aside: every stack has it),
        then nframes - 1 of its callers."""
        if self.user is None:
            inner = [e.key for e in self.entries if e.kind not in (ALLOC, INTERP)]
            return (self.line[0],) + tuple(inner[:nframes])
        inner = [e.key for e in self.entries[:self.user] if e.kind != ALLOC]
        callers = [e.key for e in self.entries[self.user + 1:self._upto(nframes)]]
        return (self.line[0],) + tuple(inner[:nframes]) + tuple(callers)

    def path(self, top_down=False):
        """(lead, path) of (key, label) levels for the peak tree: the line,
        its Python callers outward, then what ran inside it from the
        allocation out (top-down: reversed); without Python frames, the
        line leads and every entry follows. The caching allocator's run, at
        every PyTorch allocation, is no level of its own."""
        levels = [(e.key, e.text) for e in self.entries
                  if e.kind != ALLOC and (e.kind != INTERP or self.user is None)]
        if self.user is None:
            return [self.line], (levels[::-1] if top_down else levels)
        entries = self.entries
        user = (entries[self.user].key, entries[self.user].text)
        inner = [(e.key, e.text) for e in entries[:self.user] if e.kind != ALLOC]
        callers = [(e.key, e.text) for e in entries[self.user + 1:] if e.kind == PY]
        if top_down:
            return [], callers[::-1] + [user] + inner[::-1]
        return [], [user] + callers + inner


def build(stack, pystack, thread=None, backward=None, looked=True):
    """The View of a stack (native frames innermost first, Python frames
    innermost first, the thread's name when it had none); `backward`: the
    `backward` site autograd's threads worked for then (its phrase), when
    known; `looked`: did the shim look for Python frames."""
    frames = [f for f in stack if isinstance(f, dict)][:MAX_FRAMES]
    classes = [classify(f) for f in frames]
    merge = next((i for i, c in enumerate(classes) if c[0] == INTERP), len(frames))
    entries = native_entries(frames[:merge], classes[:merge])
    ops = [e.name for e in entries if e.kind == OP]
    node = next((e.name for e in entries if e.kind == NODE), None)
    autograd = node is not None or any(e.kind == ENGINE for e in entries)
    py = [(i, f) for i, f in enumerate(pystack[:MAX_PYFRAMES]) if isinstance(f, dict)]
    ufr = user_frame([f for _, f in py])[1]
    user = None
    for i, f in py:
        if f is not ufr and is_nn_call(f):
            continue
        if f is ufr:
            user = len(entries)
        entries.append(Entry(PY, pyframe_key(f), pyframe_label(f), pyindex=i))
    if merge < len(frames):
        tail = frames[merge:]
        others = []
        for f in tail:
            mod = basename(f.get("module"))
            if not mod.startswith(("libpython", "python")) and mod not in others:
                others.append(mod)
        text = "[Python interpreter: %s" % plural_frames(len(tail))
        if others:
            text += ", with %s" % ", ".join(others[:2]) + (", ..." if len(others) > 2 else "")
        entries.append(Entry(INTERP, (INTERP,), text + "]", merge, len(tail)))
    op = None
    if ops:
        real = [o for o in ops if o not in FACTORY]
        op = "aten::" + (real[0] if real else ops[-1])
    thread = as_str(thread)
    head = None
    if user is not None:
        line = (pyframe_key(ufr), pyframe_label(ufr))
    elif autograd or (thread or "").startswith(AUTOGRAD_THREAD):
        head = backward["phrase"] if backward else (
            "backward on thread %s" % thread if thread else "backward")
        line = (("backward", backward["key"] if backward else ("thread", thread), node),
                head + (", " + node if node else ""))
    elif not frames and not thread:
        line = (("none",), "(no stack)")
    else:
        note = "(no Python frames: thread %s)" % thread if thread and looked else "(no Python frames)"
        line = (("thread", thread), note)
    autograd = line[0][0] == "backward"
    return View(entries, user, line, op, node, backward if autograd else None,
                head if autograd else None, looked)


def backward_site(ev, source=None):
    """What a `backward` line says of where `.backward()` was called: its
    key, the caller's frame, the phrase the report uses (`backward of
    \\`loss.backward()\\` (train.py:57 in main)`; without the source text,
    `backward of train.py:57 in main`); `source(file, line)` gives the text
    of a line, or None."""
    py = ev.get("pystack")
    py = [f for f in py if isinstance(f, dict)] if isinstance(py, list) else []
    _, fr = user_frame(py)
    thread = as_str(ev.get("thread"))
    if fr is None:
        where = "thread %s" % thread if thread else "an unknown line"
        return {"key": ("thread", thread), "frame": None, "phrase": "backward called on " + where}
    loc = pyframe_label(fr)
    text = source(fr.get("file"), as_int(fr.get("line"))) if source else None
    phrase = "backward of `%s` (%s)" % (text, loc) if text else "backward of %s" % loc
    return {"key": pyframe_key(fr), "frame": fr, "phrase": phrase}
