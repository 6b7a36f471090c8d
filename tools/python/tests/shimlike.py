"""Journals built event by event in the shape the shim writes them: the
fields and their order of shim/core/events.c (start, mode, sample,
near_miss/refused/oom with pystack and, for a thread without Python frames,
thread; advice, batch, arch, summary with peak_pystack), and of
docs/journal.md for step, leak and advice's forecast; `torch` and `backward`
as docs/journal.md has them. RIG_* are native stacks as the real-PyTorch
rig's journals have them (Debian's PyTorch 2.6, tests/torch/scripts/backward.py
under the shim)."""
import json
import os

GiB = 1 << 30
MiB = 1 << 20

TORCH = "/opt/venv/lib/python3.11/site-packages/torch/lib/"


def frame(i, module, sym, off):
    return {"ip": "0x%x" % (0x7f5a00000000 + 0x1000 * i), "module": module, "sym": sym, "off": off}


ALLOC_STACK = [frame(1, TORCH + "libc10_cuda.so",
                     "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc", 420),
               frame(2, TORCH + "libtorch_cuda.so", "at::native::empty_cuda", 82),
               frame(3, TORCH + "libtorch_cuda.so", "at::native::structured_addmm_out_cuda::impl", 145),
               frame(4, "/usr/lib/libpython3.11.so.1.0", "_PyEval_EvalFrameDefault", 10291)]
ALLOC_PYSTACK = [{"file": "/home/me/model.py", "line": 88, "func": "Block.forward"},
                 {"file": "/home/me/train.py", "line": 42, "func": "train_step"}]


# Native stacks from a journal of the real-PyTorch rig (Debian's PyTorch 2.6;
# tests/torch/scripts/backward.py under the shim, near misses in observe mode):
# (ip, module in /lib/x86_64-linux-gnu, demangled symbol or None, offset).
RIG_LIB = "/lib/x86_64-linux-gnu/"


def rig_frames(rows):
    return [{"ip": ip, "module": mod if mod.startswith("/") else RIG_LIB + mod, "sym": sym, "off": off}
            for ip, mod, sym, off in rows]


# the forward's Linear in Attention.forward: aten::linear -> aten::addmm
RIG_FORWARD = rig_frames([
    ('0x7fb0e34cee83', 'libc10_cuda.so.2.6', None, 306819),
    ('0x7fb0e34d3655', 'libc10_cuda.so.2.6', None, 325205),
    ('0x7fb0e34d5519', 'libc10_cuda.so.2.6', None, 333081),
    ('0x7fb0e34d5aef', 'libc10_cuda.so.2.6', None, 334575),
    ('0x7fb0d790a32d', 'libtorch_cpu.so.2.6', None, 82879277),
    ('0x7fb0d790b320', 'libtorch_cpu.so.2.6', None, 82883360),
    ('0x7fb0d7906ac7', 'libtorch_cpu.so.2.6', 'at::detail::empty_generic(c10::ArrayRef<long>, c10::Allocator*, c10::DispatchKeySet, c10::ScalarType, std::optional<c10::MemoryFormat>)', 39),
    ('0x7fb0cf5213e9', 'libtorch_cuda.so.2.6', 'at::detail::empty_cuda(c10::ArrayRef<long>, c10::ScalarType, std::optional<c10::Device>, std::optional<c10::MemoryFormat>)', 153),
    ('0x7fb0cf5215b2', 'libtorch_cuda.so.2.6', 'at::detail::empty_cuda(c10::ArrayRef<long>, std::optional<c10::ScalarType>, std::optional<c10::Layout>, std::optional<c10::Device>, std::optional<bool>, std::optional<c10::MemoryFormat>)', 130),
    ('0x7fb0cf52170a', 'libtorch_cuda.so.2.6', 'at::detail::empty_cuda(c10::ArrayRef<long>, c10::TensorOptions const&)', 250),
    ('0x7fb0d15d6898', 'libtorch_cuda.so.2.6', None, 1172138136),
    ('0x7fb0d16269d4', 'libtorch_cuda.so.2.6', None, 1172466132),
    ('0x7fb0d7ef10f7', 'libtorch_cpu.so.2.6', 'at::meta::structured_addmm::meta(at::Tensor const&, at::Tensor const&, at::Tensor const&, c10::Scalar const&, c10::Scalar const&)', 407),
    ('0x7fb0d162bbb3', 'libtorch_cuda.so.2.6', None, 1172487091),
    ('0x7fb0d162bc74', 'libtorch_cuda.so.2.6', None, 1172487284),
    ('0x7fb0d874ebbb', 'libtorch_cpu.so.2.6', 'at::_ops::addmm::redispatch(c10::DispatchKeySet, at::Tensor const&, at::Tensor const&, at::Tensor const&, c10::Scalar const&, c10::Scalar const&)', 171),
    ('0x7fb0db4b0041', 'libtorch_cpu.so.2.6', None, 145424449),
    ('0x7fb0db4b0ab6', 'libtorch_cpu.so.2.6', None, 145427126),
    ('0x7fb0d87bf51f', 'libtorch_cpu.so.2.6', 'at::_ops::addmm::call(at::Tensor const&, at::Tensor const&, at::Tensor const&, c10::Scalar const&, c10::Scalar const&)', 495),
    ('0x7fb0d7ee58ac', 'libtorch_cpu.so.2.6', None, 89020588),
    ('0x7fb0d7ee6913', 'libtorch_cpu.so.2.6', 'at::native::linear(at::Tensor const&, at::Tensor const&, std::optional<at::Tensor> const&)', 2227),
    ('0x7fb0d93e47aa', 'libtorch_cpu.so.2.6', None, 111036330),
    ('0x7fb0d87a542e', 'libtorch_cpu.so.2.6', 'at::_ops::linear::call(at::Tensor const&, at::Tensor const&, std::optional<at::Tensor> const&)', 494),
    ('0x7fb0e270b087', 'libtorch_python.so.2.6', None, 9482375),
    ('0x5883cc', '/usr/bin/python3.13', None, 5800908),
    ('0x546dab', '/usr/bin/python3.13', '_PyObject_MakeTpCall', 635),
    ('0x5637bc', '/usr/bin/python3.13', '_PyEval_EvalFrameDefault', 9692),
    ('0x5ccc49', '/usr/bin/python3.13', None, 6081609),
    ('0x56510d', '/usr/bin/python3.13', '_PyEval_EvalFrameDefault', 16173),
    ('0x5ccc49', '/usr/bin/python3.13', None, 6081609),
    ('0x56510d', '/usr/bin/python3.13', '_PyEval_EvalFrameDefault', 16173),
    ('0x6905af', '/usr/bin/python3.13', None, 6882735),
])
RIG_FORWARD_PYSTACK = [
    {"file": "/usr/lib/python3/dist-packages/torch/nn/modules/linear.py", "line": 125, "func": "Linear.forward"},
    {"file": "/usr/lib/python3/dist-packages/torch/nn/modules/module.py", "line": 1750, "func": "Module._call_impl"},
    {"file": "/usr/lib/python3/dist-packages/torch/nn/modules/module.py", "line": 1739, "func": "Module._wrapped_call_impl"},
    {"file": "/home/me/model.py", "line": 24, "func": "Attention.forward"},
    {"file": "/usr/lib/python3/dist-packages/torch/nn/modules/module.py", "line": 1750, "func": "Module._call_impl"},
    {"file": "/usr/lib/python3/dist-packages/torch/nn/modules/module.py", "line": 1739, "func": "Module._wrapped_call_impl"},
    {"file": "/home/me/model.py", "line": 44, "func": "Block.forward"},
    {"file": "/usr/lib/python3/dist-packages/torch/nn/modules/module.py", "line": 1750, "func": "Module._call_impl"},
    {"file": "/usr/lib/python3/dist-packages/torch/nn/modules/module.py", "line": 1739, "func": "Module._wrapped_call_impl"},
    {"file": "/usr/lib/python3/dist-packages/torch/nn/modules/container.py", "line": 250, "func": "Sequential.forward"},
    {"file": "/usr/lib/python3/dist-packages/torch/nn/modules/module.py", "line": 1750, "func": "Module._call_impl"},
    {"file": "/usr/lib/python3/dist-packages/torch/nn/modules/module.py", "line": 1739, "func": "Module._wrapped_call_impl"},
    {"file": "/home/me/model.py", "line": 56, "func": "Model.forward"},
    {"file": "/usr/lib/python3/dist-packages/torch/nn/modules/module.py", "line": 1750, "func": "Module._call_impl"},
    {"file": "/usr/lib/python3/dist-packages/torch/nn/modules/module.py", "line": 1739, "func": "Module._wrapped_call_impl"},
    {"file": "/home/me/train.py", "line": 29, "func": "main"},
    {"file": "/home/me/train.py", "line": 43, "func": "<module>"}]

# autograd's thread pt_autograd_0 in AddmmBackward0: aten::mm
RIG_BACKWARD = rig_frames([
    ('0x7fb0e34cee83', 'libc10_cuda.so.2.6', None, 306819),
    ('0x7fb0e34d3655', 'libc10_cuda.so.2.6', None, 325205),
    ('0x7fb0e34d5519', 'libc10_cuda.so.2.6', None, 333081),
    ('0x7fb0e34d5aef', 'libc10_cuda.so.2.6', None, 334575),
    ('0x7fb0d790a32d', 'libtorch_cpu.so.2.6', None, 82879277),
    ('0x7fb0d790b320', 'libtorch_cpu.so.2.6', None, 82883360),
    ('0x7fb0d7906ac7', 'libtorch_cpu.so.2.6', 'at::detail::empty_generic(c10::ArrayRef<long>, c10::Allocator*, c10::DispatchKeySet, c10::ScalarType, std::optional<c10::MemoryFormat>)', 39),
    ('0x7fb0cf5213e9', 'libtorch_cuda.so.2.6', 'at::detail::empty_cuda(c10::ArrayRef<long>, c10::ScalarType, std::optional<c10::Device>, std::optional<c10::MemoryFormat>)', 153),
    ('0x7fb0cf5215b2', 'libtorch_cuda.so.2.6', 'at::detail::empty_cuda(c10::ArrayRef<long>, std::optional<c10::ScalarType>, std::optional<c10::Layout>, std::optional<c10::Device>, std::optional<bool>, std::optional<c10::MemoryFormat>)', 130),
    ('0x7fb0cf52170a', 'libtorch_cuda.so.2.6', 'at::detail::empty_cuda(c10::ArrayRef<long>, c10::TensorOptions const&)', 250),
    ('0x7fb0d15d6898', 'libtorch_cuda.so.2.6', None, 1172138136),
    ('0x7fb0d161d6d4', 'libtorch_cuda.so.2.6', None, 1172428500),
    ('0x7fb0d7ef0680', 'libtorch_cpu.so.2.6', 'at::meta::structured_mm::meta(at::Tensor const&, at::Tensor const&)', 400),
    ('0x7fb0d1609b1b', 'libtorch_cuda.so.2.6', None, 1172347675),
    ('0x7fb0d1609bc7', 'libtorch_cuda.so.2.6', None, 1172347847),
    ('0x7fb0d8cfa0ad', 'libtorch_cpu.so.2.6', 'at::_ops::mm::redispatch(c10::DispatchKeySet, at::Tensor const&, at::Tensor const&)', 141),
    ('0x7fb0db7ba9db', 'libtorch_cpu.so.2.6', None, 148613595),
    ('0x7fb0db7bb03a', 'libtorch_cpu.so.2.6', None, 148615226),
    ('0x7fb0d8d448b6', 'libtorch_cpu.so.2.6', 'at::_ops::mm::call(at::Tensor const&, at::Tensor const&)', 230),
    ('0x7fb0dcc116b4', 'libtorch_cpu.so.2.6', None, 169940660),
    ('0x7fb0db2fca23', 'libtorch_cpu.so.2.6', 'torch::autograd::generated::AddmmBackward0::apply(std::vector<at::Tensor, std::allocator<at::Tensor> >&&)', 819),
    ('0x7fb0dc1a6f5b', 'libtorch_cpu.so.2.6', None, 159018843),
    ('0x7fb0dc19f32a', 'libtorch_cpu.so.2.6', 'torch::autograd::Engine::evaluate_function(std::shared_ptr<torch::autograd::GraphTask>&, torch::autograd::Node*, torch::autograd::InputBuffer&, std::shared_ptr<torch::autograd::ReadyQueue> const&)', 3578),
    ('0x7fb0dc1a0324', 'libtorch_cpu.so.2.6', 'torch::autograd::Engine::thread_main(std::shared_ptr<torch::autograd::GraphTask> const&)', 1300),
    ('0x7fb0dc197d05', 'libtorch_cpu.so.2.6', 'torch::autograd::Engine::thread_init(int, std::shared_ptr<torch::autograd::ReadyQueue> const&, bool)', 837),
    ('0x7fb0e289b056', 'libtorch_python.so.2.6', 'torch::autograd::python::PythonEngine::thread_init(int, std::shared_ptr<torch::autograd::ReadyQueue> const&, bool)', 118),
    ('0x7fb0e32e1224', 'libstdc++.so.6', None, 922148),
    ('0x7fb0e40e58bb', 'libc.so.6', None, 600251),
    ('0x7fb0e4163778', 'libc.so.6', None, 1116024),
])


def with_node(stack, node):
    """A backward stack whose autograd node is another generated one."""
    out = []
    for f in stack:
        sym = f["sym"] or ""
        if sym.startswith("torch::autograd::generated::"):
            f = dict(f, sym="torch::autograd::generated::%s::apply(std::vector<at::Tensor, "
                             "std::allocator<at::Tensor> >&&)" % node)
        out.append(f)
    return out


def device(dev, name, total, headroom, near, cc="9.0", mode="auto",
           policy="/usr/local/share/gpuguard/policy/default.ini"):
    """One entry of start.devices."""
    return {"dev": dev, "name": name, "total": total, "cc": cc, "policy": policy,
            "limit": total - headroom, "mode": mode, "headroom": headroom, "near_miss": near}


class Process(object):
    """The journal of one process, built in time order."""

    def __init__(self, devices, pid=4242, rank=None, host="node1", wall=1795000000.0,
                 comm="python3", mode="auto"):
        self.devices = {d["dev"]: d for d in devices}
        self.pid, self.rank, self.comm = pid, rank, comm
        self.peak = {}
        self.peak_used = {}
        self.counts = {}
        self.events = [{"t": 0.000021, "ev": "start", "pid": pid, "wall": wall, "comm": comm,
                        "host": host, "rank": rank, "version": "0.1.0", "mode": mode,
                        "devices": devices}]

    def _count(self, dev, key, n=1):
        c = self.counts.setdefault(dev, {})
        c[key] = c.get(key, 0) + n

    def mode(self, t, dev, mode="enforce", why="trainer registered"):
        self.events.append({"t": t, "ev": "mode", "dev": dev, "mode": mode, "why": why})

    def sample(self, t, dev, current, used):
        self.peak[dev] = max(self.peak.get(dev, 0), current)
        self.peak_used[dev] = max(self.peak_used.get(dev, 0), used)
        self.events.append({"t": t, "ev": "sample", "dev": dev, "current": current, "used": used})

    def incident(self, kind, t, dev, nbytes, used, api="cudaMalloc", count=None,
                 stack=ALLOC_STACK, pystack=ALLOC_PYSTACK, thread=None, **moment):
        """moment: the fields of the incident's own moment (reserved,
        step, shape, tokens; for a failure recovered, retried, freed,
        freed_largest)."""
        d = self.devices[dev]
        e = {"t": t, "ev": kind, "dev": dev, "api": api, "bytes": nbytes, "used": used,
             "limit": d["limit"], "total": d["total"]}
        if count:
            e["count"] = count
        e.update(moment)
        e["stack"] = stack
        e["pystack"] = pystack
        if not pystack and thread:
            e["thread"] = thread
        self.events.append(e)
        self._count(dev, {"near_miss": "near_misses", "refused": "refusals", "oom": "ooms"}[kind])

    def advice(self, t, seq, dev, batch, accum, reason, signaled=True, forecast=None):
        e = {"t": t, "ev": "advice", "seq": seq, "dev": dev, "batch_size": batch,
             "grad_accum": accum, "reason": reason, "signaled": signaled}
        if forecast is not None:
            e["forecast"] = forecast
        self.events.append(e)

    def torch(self, t, dev, why, step=None, reserved=None, allocated=None, unallocated=None,
              largest_free=None, inactive_split=0, request=None, fits=None, segments=None,
              tensors=None, raised=None, asked=None, kept=None):
        """PyTorch's caching allocator at a moment that mattered (docs/journal.md's
        `torch`, with raised, asked and kept); tensors: [(bytes,
        count, pystack, op)] or None (history off: no `tensors` key)."""
        e = {"t": t, "ev": "torch", "dev": dev, "why": why, "step": step, "reserved": reserved,
             "allocated": allocated, "unallocated": unallocated, "largest_free": largest_free,
             "inactive_split": inactive_split, "request": request, "fits_unfragmented": fits,
             "segments": segments if segments is not None else {"small": 3, "large": 12}}
        if raised:
            e["raised"] = True
        if asked is not None or raised is not None:
            e["asked"] = asked
        if kept is not None:
            e["kept"] = kept
        if tensors is not None:
            e["tensors"] = [{"bytes": b, "count": c, "pystack": py, "op": op}
                            for b, c, py, op in tensors]
        self.events.append(e)

    def backward(self, t, pystack, step=None, thread="MainThread", count=1):
        """Where .backward() was called (docs/journal.md's `backward`)."""
        self.events.append({"t": t, "ev": "backward", "thread": thread, "pystack": pystack,
                            "step": step, "count": count})

    def note(self, t, text):
        self.events.append({"t": t, "ev": "note", "text": text})

    def step(self, t, step, dev, peak, peak_used, live, **inputs):
        """inputs: the fields of the step's input and need (shape,
        tokens, batch, needed, flushes)."""
        self.peak[dev] = max(self.peak.get(dev, 0), peak)
        self.peak_used[dev] = max(self.peak_used.get(dev, 0), peak_used)
        e = {"t": t, "ev": "step", "step": step, "dev": dev, "peak": peak,
             "peak_used": peak_used, "live": live}
        e.update(inputs)
        self.events.append(e)

    def batch(self, t, dev, batch, accum, peak, was=None):
        """was: (batch, accum) of the phase that ended, when the shim knew it."""
        e = {"t": t, "ev": "batch", "dev": dev, "batch_size": batch, "grad_accum": accum}
        if was:
            e["was_batch_size"], e["was_grad_accum"] = was
        e["peak"] = peak
        self.events.append(e)

    def summary(self, t, allocs=100, live=0):
        devs = []
        for dev in sorted(self.devices):
            d = self.devices[dev]
            c = self.counts.get(dev, {})
            used = dev in self.peak
            devs.append({"dev": dev, "name": d["name"], "total": d["total"], "limit": d["limit"],
                         "peak": self.peak.get(dev, 0), "peak_used": self.peak_used.get(dev, 0),
                         "allocs": allocs if used else 0, "frees": allocs - 1 if used else 0,
                         "near_misses": c.get("near_misses", 0), "refusals": c.get("refusals", 0),
                         "ooms": c.get("ooms", 0), "live_bytes": live if used else 0,
                         "live_allocs": 1 if used else 0, "unknown_frees": 0,
                         "peak_stack": ALLOC_STACK if used else [],
                         "peak_pystack": ALLOC_PYSTACK if used else [],
                         "peak_sites": [{"stack": ALLOC_STACK, "pystack": ALLOC_PYSTACK,
                                         "bytes": self.peak[dev], "allocs": allocs}] if used else []})
        self.events.append({"t": t, "ev": "summary", "duration": t, "sites": 1, "devices": devs})

    def write(self, directory):
        name = "gpuguard.%s.%s%d.jsonl" % (
            self.comm, "" if self.rank is None else "rank%d." % self.rank, self.pid)
        path = os.path.join(directory, name)
        with open(path, "w") as f:
            for e in self.events:
                f.write(json.dumps(e, separators=(",", ":")) + "\n")
        return path
