"""The GPU models gpuguard-preflight simulates, and what a real GPU of each
holds beyond PyTorch's allocator (docs/preflight.md).

Two tables, each figure with the public source it comes from:

- MODELS: the shipped policies' GPU models, as CUDA names them, with the
  total memory CUDA reports (what ``torch.cuda.get_device_properties(0)
  .total_memory`` says, a little below the marketed size; figures from
  PyTorch's own out-of-memory messages, "GPU 0 has a total capacity of ...",
  where one was found, else the marketed size, said as such) and compute
  capability (https://developer.nvidia.com/cuda-gpus);
- OUTSIDE: memory outside PyTorch's allocator per GPU model and CUDA
  version (the CUDA context with the kernels loaded into it, each cuBLAS
  handle's own memory, each NCCL communicator's buffers), every figure an
  estimate.

``--gpu NAME,MEMORY,CC`` (as the simulated driver takes devices:
FAKECUDA_DEVICES) names any other GPU.
"""
import fnmatch
import re

MiB = 1 << 20
GiB = 1 << 30


def gib(x):
    """x GiB in bytes, whole MiB."""
    return int(round(x * 1024)) * MiB


class Model(object):
    """A GPU model: its CUDA name, total memory (bytes), compute capability
    (e.g. "8.6"), how it was named, and where the memory figure comes from."""

    def __init__(self, name, total, cc, key=None, source=None):
        self.name = name
        self.total = int(total)
        self.cc = cc
        self.key = key or name
        self.source = source

    @property
    def device(self):
        """The simulated driver's FAKECUDA_DEVICES entry."""
        return "%s,%d,%s" % (self.name, self.total, self.cc)

    def __repr__(self):
        return "Model(%r, %d, %r)" % (self.name, self.total, self.cc)


#: key (the policy file's name without .ini), CUDA name, total, cc, source.
MODELS = [
    ("t4", "Tesla T4", gib(14.75), "7.5",
     "PyTorch's OOM message on a T4: 'GPU 0 has a total capacity of 14.75 GiB' "
     "(https://github.com/hpcaitech/Open-Sora/issues/697)"),
    ("rtx-3060-12gb", "NVIDIA GeForce RTX 3060", gib(11.76), "8.6",
     "PyTorch's OOM message on an RTX 3060 12GB: '11.76 GiB total capacity' "
     "(https://github.com/TencentARC/PhotoMaker/issues/47)"),
    ("rtx-3090", "NVIDIA GeForce RTX 3090", gib(23.70), "8.6",
     "PyTorch's OOM message on an RTX 3090: '23.70 GiB total capacity' "
     "(https://github.com/xiaoxiangAQ/GAS-Net/issues/7)"),
    ("rtx-4090", "NVIDIA GeForce RTX 4090", gib(23.64), "8.9",
     "PyTorch's OOM message on an RTX 4090: 'GPU 0 has a total capacity of 23.64 GiB' "
     "(https://github.com/ali-vilab/VGen/issues/104)"),
    ("l4", "NVIDIA L4", gib(24), "8.9",
     "marketed size, 24 GB (NVIDIA L4 datasheet); CUDA reports somewhat less"),
    ("a100-40gb", "NVIDIA A100-SXM4-40GB", gib(39.50), "8.0",
     "PyTorch's OOM message on an A100 40GB: 'GPU 0 has a total capacity of 39.50 GiB' "
     "(https://github.com/TianheWu/CoSeR/issues/10)"),
    ("a100-80gb", "NVIDIA A100-SXM4-80GB", gib(79.25), "8.0",
     "PyTorch's OOM message on an A100 80GB: '79.25 GiB total capacity' "
     "(https://github.com/levihsu/OOTDiffusion/issues/235)"),
    ("h100-80gb", "NVIDIA H100 80GB HBM3", gib(80), "9.0",
     "marketed size, 80 GB (NVIDIA H100 datasheet); CUDA reports somewhat less"),
    ("h200", "NVIDIA H200", 150109880320, "9.0",
     "cudaMemGetInfo's total on a real H200 (tests/traces/h200/run_gpu.txt: 139.80 GiB)"),
    ("rtx-5070-ti", "NVIDIA GeForce RTX 5070 Ti", gib(16), "12.0",
     "marketed size, 16 GB (NVIDIA's RTX 5070 family specifications); CUDA reports "
     "somewhat less"),
    ("rtx-5090", "NVIDIA GeForce RTX 5090", gib(31.37), "12.0",
     "PyTorch's OOM message on an RTX 5090: 'GPU 0 has a total capacity of 31.37 GiB' "
     "(https://github.com/Wan-Video/Wan2.1/issues/465)"),
    ("rtx-pro-6000", "NVIDIA RTX PRO 6000 Blackwell Workstation Edition", gib(96), "12.0",
     "marketed size, 96 GB (NVIDIA RTX PRO 6000 Blackwell datasheet); CUDA reports "
     "somewhat less"),
]


class Figure(object):
    """One row of OUTSIDE."""

    def __init__(self, what, nbytes, source, models=("*",), cuda=None):
        self.what = what
        self.bytes = int(nbytes)
        self.source = source
        self.models = models
        self.cuda = cuda

    def matches(self, name, cuda):
        if self.cuda is not None and cuda != self.cuda:
            return False
        return any(fnmatch.fnmatchcase(name, g) for g in self.models)


H200_RUN = ("gpuguard's run of PyTorch 2.11 (CUDA 13) on a real H200, "
            "tests/traces/h200/run_gpu.txt")

#: Memory a real GPU holds for a process beyond PyTorch's caching allocator.
#: For each `what`, the first row that matches the GPU's name and the CUDA
#: major version PyTorch was built with is taken. Every figure is an
#: estimate: the context grows as kernels are loaded lazily, cuBLAS and NCCL
#: change between versions.
OUTSIDE = [
    # The CUDA context, with the kernels loaded into it so far.
    Figure("context", 626 * MiB,
           "the device's use beyond the process's own allocations: 1.07 GiB used by the "
           "device against a journal peak of 470.25 MiB, the kernels loaded lazily included "
           "(%s)" % H200_RUN, models=("NVIDIA H100*", "NVIDIA H200*"), cuda=13),
    Figure("context", 400 * MiB,
           "'The first CUDA operation will create the CUDA context which uses around 400MB if "
           "CUDA >= 11.7 is used and lazy module loading enabled (default in PyTorch)' "
           "(https://github.com/pytorch/pytorch/issues/109888); 287 MB measured with a small "
           "tensor in https://github.com/pytorch/pytorch/pull/86509"),
    # Each cuBLAS handle's own memory (one handle per thread that multiplies
    # matrices: the main thread's and autograd's).
    Figure("cublas_handle", 64 * MiB,
           "cuBLAS 13's cublasCreate allocates 64 MiB with cuMemAlloc: 128.25 MiB from "
           "libcublas.so.13 beyond max_memory_reserved() for two handles (%s)" % H200_RUN,
           cuda=13),
    Figure("cublas_handle", 0,
           "PyTorch gives each cuBLAS handle its workspace from its own allocator "
           "(https://github.com/pytorch/pytorch/pull/83461), so it is in PyTorch's peak; what "
           "cuBLAS 12 itself takes at cublasCreate has not been measured: counted 0"),
    # NCCL's buffers, per communicator.
    Figure("nccl_communicator", 544 * 1000 * 1000,
           "544 MB per communicator of 2 GPUs, 688 MB beyond 2, on 4 A100s with NVLink "
           "(https://github.com/NVIDIA/nccl/issues/964); 388 MiB beyond PyTorch for 2 ranks "
           "in %s" % H200_RUN),
]


def outside(name, cuda, what):
    """The OUTSIDE row for a GPU name, CUDA major and kind, or None."""
    for f in OUTSIDE:
        if f.what == what and f.matches(name, cuda):
            return f
    return None


_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([KMGT]?)(i?B?)\s*$", re.I)


def parse_size(text):
    """Bytes from '24GiB', '24 GiB', '24G', '25769803776' (binary units, as
    the simulated driver reads them); None when it is not a size."""
    m = _SIZE.match(text or "")
    if not m:
        return None
    scale = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}[m.group(2).upper()]
    return int(float(m.group(1)) * scale)


def parse_gpu(spec, keys=None):
    """A Model from --gpu: "NAME,MEMORY,CC" (the name may hold commas), or
    a model of MODELS by its key (rtx-3090) or CUDA name, case-insensitive.
    Raises ValueError with what is wrong."""
    spec = spec.strip()
    parts = spec.rsplit(",", 2)
    if len(parts) == 3:
        name, mem, cc = (p.strip() for p in parts)
        total = parse_size(mem)
        if not name:
            raise ValueError("--gpu %r: no name before MEMORY,CC" % spec)
        if total is None or total <= 0:
            raise ValueError("--gpu %r: %r is not a memory size (e.g. 24GiB)" % (spec, mem))
        if not re.match(r"^[0-9]+\.[0-9]+$", cc):
            raise ValueError("--gpu %r: %r is not a compute capability (e.g. 8.6)" % (spec, cc))
        return Model(name, total, cc, key=spec, source="given: %s" % spec)
    low = spec.lower()
    for key, name, total, cc, source in MODELS:
        if low in (key, name.lower()) and (keys is None or key in keys):
            return Model(name, total, cc, key=key, source=source)
    known = ", ".join(k for k, _, _, _, _ in MODELS if keys is None or k in keys)
    raise ValueError("--gpu %r: not a GPU model gpuguard knows (%s), nor NAME,MEMORY,CC "
                     "(e.g. \"NVIDIA GeForce RTX 3090,24GiB,8.6\")" % (spec, known))


def shipped(policy_keys):
    """The models of MODELS whose policy file is among policy_keys (the
    names of the policy directory's files, without .ini), in table order."""
    return [Model(name, total, cc, key=key, source=source)
            for key, name, total, cc, source in MODELS if key in policy_keys]
