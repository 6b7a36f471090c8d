"""The fake CUDA stack as real PyTorch needs it, checked without PyTorch
(tests/torch runs PyTorch itself where the rig is built): CUDA 12's structure
layouts written to the byte, real device limits, streams and events, copies
that give the host zeros, pointer queries, launches checked, NVML, cuBLAS and
cuDNN stand-ins. Through ctypes on the fake libraries, no shim."""
import ctypes
import os
import subprocess
import sys
import unittest

from gg import FAKE, RTX3090

HERE = os.path.dirname(os.path.abspath(__file__))

PROBE = r"""
import ctypes, json, os, sys
fake = sys.argv[1]
rt = ctypes.CDLL(os.path.join(fake, "libcudart.so.12"))
out = {}
CANARY = 0x5A

def buffer(n, extra=64):
    b = (ctypes.c_ubyte * (n + extra))(*([CANARY] * (n + extra)))
    return b

# cudaDeviceProp of CUDA 12: 1032 bytes, nothing past them written
props = buffer(1032)
out["props_rc"] = rt.cudaGetDeviceProperties_v2(props, 0)
raw = bytes(props)
out["props_tail_intact"] = all(x == CANARY for x in raw[1032:])
out["name"] = raw[:256].split(b"\0")[0].decode()
i32 = lambda off: int.from_bytes(raw[off:off + 4], "little", signed=True)
u64 = lambda off: int.from_bytes(raw[off:off + 8], "little")
out["total"] = u64(288)
out["cc"] = [i32(360), i32(364)]
out["sms"] = i32(388)
out["warp"] = i32(308)
out["threads_per_block"] = i32(320)
out["threads_per_sm"] = i32(624)
out["l2"] = i32(616)
out["pci_bus"] = i32(584)
out["smem_optin"] = u64(696)

# cudaPointerAttributes of CUDA 12: 24 bytes
p = ctypes.c_void_p()
out["malloc_rc"] = rt.cudaMalloc(ctypes.byref(p), 1 << 20)
attrs = buffer(24)
out["attr_rc"] = rt.cudaPointerGetAttributes(attrs, p)
raw = bytes(attrs)
out["attr_tail_intact"] = all(x == CANARY for x in raw[24:])
out["attr_type"] = int.from_bytes(raw[0:4], "little")        # cudaMemoryTypeDevice = 2
host = buffer(64)
out["attr_host_rc"] = rt.cudaPointerGetAttributes(attrs, host)
out["attr_host_type"] = int.from_bytes(bytes(attrs)[0:4], "little")  # unregistered = 0

# copies: the device is not backed, the host gets zeros
dst = (ctypes.c_ubyte * 16)(*([7] * 16))
out["d2h_rc"] = rt.cudaMemcpy(dst, p, 16, 2)                 # cudaMemcpyDeviceToHost
out["d2h"] = list(dst)
src = (ctypes.c_ubyte * 16)(*range(16))
h2h = (ctypes.c_ubyte * 16)()
out["h2h_rc"] = rt.cudaMemcpy(h2h, src, 16, 4)               # cudaMemcpyDefault
out["h2h"] = list(h2h)

# streams and events
s = ctypes.c_void_p()
out["stream_rc"] = rt.cudaStreamCreateWithPriority(ctypes.byref(s), 1, -9)
prio = ctypes.c_int(1)
rt.cudaStreamGetPriority(s, ctypes.byref(prio))
out["priority"] = prio.value                                 # clamped to the greatest, -5
lo, hi = ctypes.c_int(), ctypes.c_int()
rt.cudaDeviceGetStreamPriorityRange(ctypes.byref(lo), ctypes.byref(hi))
out["range"] = [lo.value, hi.value]
st = ctypes.c_int(7)
out["capturing_rc"] = rt.cudaStreamIsCapturing(s, ctypes.byref(st))
out["capturing"] = st.value
a, b = ctypes.c_void_p(), ctypes.c_void_p()
rt.cudaEventCreate(ctypes.byref(a)); rt.cudaEventCreate(ctypes.byref(b))
rt.cudaEventRecord(a, s); rt.cudaEventRecord(b, s)
ms = ctypes.c_float(-1)
out["elapsed_rc"] = rt.cudaEventElapsedTime(ctypes.byref(ms), a, b)
out["elapsed_ok"] = 0 <= ms.value < 1000
out["query_rc"] = rt.cudaStreamQuery(s)
out["destroy_rc"] = rt.cudaStreamDestroy(s)
out["destroyed_query_rc"] = rt.cudaStreamQuery(s)

# launches: checked as the runtime checks them, run as no-ops
class Dim3(ctypes.Structure):
    _fields_ = [("x", ctypes.c_uint), ("y", ctypes.c_uint), ("z", ctypes.c_uint)]
rt.cudaLaunchKernel.argtypes = [ctypes.c_void_p, Dim3, Dim3, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
fn = ctypes.cast(rt.cudaMalloc, ctypes.c_void_p)             # any host function will do
out["launch_rc"] = rt.cudaLaunchKernel(fn, Dim3(80, 1, 1), Dim3(256, 1, 1), None, 0, None)
out["launch_big_rc"] = rt.cudaLaunchKernel(fn, Dim3(1, 1, 1), Dim3(2048, 1, 1), None, 0, None)
n = ctypes.c_int()
out["occ_rc"] = rt.cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(ctypes.byref(n), fn, 512, 0, 0)
out["occupancy"] = n.value                                   # 1536 / 512 on an 8.6
bus = ctypes.create_string_buffer(32)
rt.cudaDeviceGetPCIBusId(bus, 32, 0)
out["bus"] = bus.value.decode()
out["capture_rc"] = rt.cudaStreamBeginCapture(None, 0)

# NVML, as PyTorch's OOM path asks it
nvml = ctypes.CDLL(os.path.join(fake, "libnvidia-ml.so.1"))
out["nvml_init"] = nvml.nvmlInit_v2()
dev = ctypes.c_void_p()
out["nvml_by_bus"] = nvml.nvmlDeviceGetHandleByPciBusId_v2(bus.value, ctypes.byref(dev))
class Proc(ctypes.Structure):
    _fields_ = [("pid", ctypes.c_uint), ("used", ctypes.c_ulonglong)]
procs = (Proc * 4)()
count = ctypes.c_uint(4)
out["nvml_procs_rc"] = nvml.nvmlDeviceGetComputeRunningProcesses(dev, ctypes.byref(count), procs)
out["nvml_procs"] = [[procs[i].pid, procs[i].used] for i in range(count.value)]
out["pid"] = os.getpid()
uuid = ctypes.create_string_buffer(96)
nvml.nvmlDeviceGetUUID(dev, uuid, 96)
out["uuid"] = uuid.value.decode()
out["nvml_nvlink"] = nvml.nvmlDeviceGetNvLinkRemotePciInfo_v2(dev, 0, ctypes.create_string_buffer(64))

# cuBLAS, cuBLASLt, cuDNN stand-ins
blas = ctypes.CDLL(os.path.join(fake, "libcublas.so.12"))
lt = ctypes.CDLL(os.path.join(fake, "libcublasLt.so.12"))
h = ctypes.c_void_p()
out["blas_create"] = blas.cublasCreate_v2(ctypes.byref(h))
out["blas_stream"] = blas.cublasSetStream_v2(h, None)
out["blas_bad_handle"] = blas.cublasSetStream_v2(None, None)
descs = [ctypes.c_void_p() for _ in range(6)]
lt.cublasLtMatmulDescCreate(ctypes.byref(descs[0]), 68, 0)
for d in descs[1:5]:
    lt.cublasLtMatrixLayoutCreate(ctypes.byref(d), 0, ctypes.c_uint64(64), ctypes.c_uint64(64), ctypes.c_int64(64))
lt.cublasLtMatmulPreferenceCreate(ctypes.byref(descs[5]))
results = ctypes.create_string_buffer(96 * 2)
got = ctypes.c_int(0)
out["lt_heuristic"] = lt.cublasLtMatmulAlgoGetHeuristic(h, descs[0], descs[1], descs[2], descs[3], descs[4], descs[5], 1, results, ctypes.byref(got))
out["lt_returned"] = got.value
cudnn = ctypes.CDLL(os.path.join(fake, "libcudnn.so.9"))
cudnn.cudnnGetVersion.restype = ctypes.c_size_t
out["cudnn_version"] = cudnn.cudnnGetVersion()
out["cudnn_create"] = cudnn.cudnnCreate(ctypes.byref(ctypes.c_void_p()))
print(json.dumps(out))
"""


class FakeStackForTorch(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUGUARD_", "FAKECUDA_"))
               and k != "LD_PRELOAD"}
        env["FAKECUDA_DEVICES"] = RTX3090
        if os.environ.get("GG_SANITIZE") == "1":
            out = subprocess.run(["cc", "-print-file-name=libasan.so"], stdout=subprocess.PIPE, text=True)
            env["LD_PRELOAD"] = out.stdout.strip()
            env["ASAN_OPTIONS"] = "detect_leaks=0:verify_asan_link_order=0"
        proc = subprocess.run([sys.executable, "-c", PROBE, FAKE], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, timeout=120)
        if proc.returncode != 0:
            raise AssertionError(proc.stderr)
        import json
        cls.r = json.loads(proc.stdout.strip().splitlines()[-1])

    def test_cuda12_device_properties(self):
        r = self.r
        self.assertEqual(r["props_rc"], 0)
        self.assertTrue(r["props_tail_intact"], "wrote past CUDA 12's 1032 bytes")
        self.assertEqual(r["name"], "NVIDIA GeForce RTX 3090")
        self.assertEqual(r["total"], 24 << 30)
        self.assertEqual(r["cc"], [8, 6])
        self.assertEqual(r["sms"], 82)                  # NVIDIA's RTX 3090
        self.assertEqual((r["warp"], r["threads_per_block"], r["threads_per_sm"]), (32, 1024, 1536))
        self.assertEqual(r["l2"], 6 << 20)
        self.assertEqual(r["smem_optin"], 101376)       # 99 KiB on compute capability 8.6
        self.assertEqual(r["pci_bus"], 1)

    def test_cuda12_pointer_attributes(self):
        r = self.r
        self.assertEqual((r["malloc_rc"], r["attr_rc"], r["attr_host_rc"]), (0, 0, 0))
        self.assertTrue(r["attr_tail_intact"], "wrote past CUDA 12's 24 bytes")
        self.assertEqual(r["attr_type"], 2)
        self.assertEqual(r["attr_host_type"], 0)

    def test_copies(self):
        self.assertEqual((self.r["d2h_rc"], self.r["h2h_rc"]), (0, 0))
        self.assertEqual(self.r["d2h"], [0] * 16)
        self.assertEqual(self.r["h2h"], list(range(16)))

    def test_streams_and_events(self):
        r = self.r
        self.assertEqual(r["stream_rc"], 0)
        self.assertEqual(r["priority"], -5)
        self.assertEqual(r["range"], [0, -5])
        self.assertEqual((r["capturing_rc"], r["capturing"]), (0, 0))
        self.assertEqual(r["elapsed_rc"], 0)
        self.assertTrue(r["elapsed_ok"])
        self.assertEqual((r["query_rc"], r["destroy_rc"]), (0, 0))
        self.assertEqual(r["destroyed_query_rc"], 400)  # cudaErrorInvalidResourceHandle
        self.assertEqual(r["capture_rc"], 801)          # graphs are not simulated

    def test_launches_are_checked(self):
        r = self.r
        self.assertEqual(r["launch_rc"], 0)
        self.assertEqual(r["launch_big_rc"], 9)         # cudaErrorInvalidConfiguration
        self.assertEqual((r["occ_rc"], r["occupancy"]), (0, 3))
        self.assertEqual(r["bus"], "00000000:01:00.0")

    def test_nvml(self):
        r = self.r
        self.assertEqual((r["nvml_init"], r["nvml_by_bus"], r["nvml_procs_rc"]), (0, 0, 0))
        self.assertEqual(r["nvml_procs"], [[r["pid"], 1 << 20]])
        self.assertRegex(r["uuid"], r"^GPU-[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")
        self.assertEqual(r["nvml_nvlink"], 3)           # NVML_ERROR_NOT_SUPPORTED

    def test_blas_and_cudnn_stand_ins(self):
        r = self.r
        self.assertEqual((r["blas_create"], r["blas_stream"]), (0, 0))
        self.assertEqual(r["blas_bad_handle"], 1)       # CUBLAS_STATUS_NOT_INITIALIZED
        self.assertEqual((r["lt_heuristic"], r["lt_returned"]), (0, 1))
        self.assertEqual(r["cudnn_version"], 90000)
        self.assertEqual(r["cudnn_create"], 1001)       # CUDNN_STATUS_NOT_INITIALIZED
