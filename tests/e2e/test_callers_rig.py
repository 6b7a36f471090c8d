"""Every real caller, the rig itself: the rig behaves as CUDA does, WITHOUT the
shim (no LD_PRELOAD but the sanitizer's), so that every case the shim must
handle can be reproduced under a real LD_PRELOAD: stream-ordered pools that
keep freed memory until trimmed, arrays charged what they hold, host memory
charged nothing, the legacy (v1) driver names, a program linked with -lcuda,
a program built with the real nvcc (and its static-runtime stand-in), ctypes
on both libraries."""
import ctypes
import os
import re
import subprocess
import sys

from gg import (FAKE, PROGS, ROOT, GiB, MiB, Case, base_env, sanitizer_preload)

DRVPROG = os.path.join(PROGS, "drvprog")
SRTLIKE = os.path.join(PROGS, "srtlike")
NVCCPROG = os.path.join(PROGS, "nvccprog")
CTYPES = os.path.join(ROOT, "tests", "progs", "ctypes_alloc.py")
NVCC = os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "nvcc")
TWO_GPUS = "NVIDIA GeForce RTX 3090,24GiB,8.6;NVIDIA GeForce RTX 3090,24GiB,8.6"
SMALL = "NVIDIA GeForce RTX 3090,4GiB,8.6"


def array_bytes(w, h, d, elem, levels=1, layered=False):
    """What CUDA arrays are charged: every mip level's extent (halved, at
    least 1; a layered one keeps its layers) times the element, rounded up to
    512 bytes at the end."""
    total = 0
    for level in range(levels):
        lw = max(w >> level, 1)
        lh = max(h >> level, 1) if h else 1
        ld = (d if layered else max(d >> level, 1)) if d else 1
        total += lw * lh * ld * elem
    return (total + 511) // 512 * 512


class Rig(Case):
    """Runs without the shim; under ASan the sanitizer runtime still comes
    first (the fakes are instrumented, nvcc's program and Python are not)."""

    def plain(self, argv, devices=SMALL.replace("4GiB", "24GiB"), **extra):
        env = base_env(devices=devices, **extra)
        if sanitizer_preload():
            env["LD_PRELOAD"] = ":".join(sanitizer_preload())
        run = self.run_prog(argv, preload=False, env=env)
        self.assertEqual(run.rc, 0, run.out + run.err)
        self.assertNotIn("libgpuguard", env.get("LD_PRELOAD", ""))
        self.assertEqual(run.files, [], "no shim, no journal")
        self.sanitizer_clean(run)
        return run

    def sc(self, *cmds, **kw):
        run = self.plain([os.path.join(PROGS, "script"), *cmds], **kw)
        self.assertTrue(run.out.endswith("script: done\n"), run.out)
        return run

    def used(self, run, dev=0):
        """Every `devused` reading of device dev, in order."""
        return [int(v) for v in re.findall(rf"^devused {dev}=(\d+)$", run.out, re.M)]

    def pool(self, run):
        """Every `pool:info` reading as a dict, in order."""
        return [dict((k, int(v)) for k, v in re.findall(r"(\w+)=(\d+)", line))
                for line in run.out.splitlines() if line.startswith("pool ") and "=" in line]


class Pools(Rig):
    def test_default_pool_keeps_freed_memory_until_a_synchronize(self):
        run = self.sc("api:async:4G", "devused", "free:0", "devused", "pool:info:d0",
                      "api:async:3G", "devused", "pool:info:d0", "sync", "devused",
                      "freeall", "devused", "streamsync", "devused", "pool:info:d0")
        self.assertNotIn("error", run.out)
        # freed into the pool: still on the device; served again from it
        self.assertEqual(self.used(run), [4 * GiB, 4 * GiB, 4 * GiB, 3 * GiB, 3 * GiB, 0])
        p = self.pool(run)
        self.assertEqual((p[0]["reserved"], p[0]["used"], p[0]["threshold"]), (4 * GiB, 0, 0))
        self.assertEqual((p[1]["reserved"], p[1]["used"]), (4 * GiB, 3 * GiB))
        self.assertEqual((p[2]["reserved"], p[2]["used"]), (0, 0))
        self.assertEqual((p[2]["reserved_high"], p[2]["used_high"]), (4 * GiB, 4 * GiB))

    def test_a_request_the_pool_can_serve_needs_no_free_device_memory(self):
        run = self.sc("api:pool:20G", "free:0", "alloc:10G", "api:pool:15G", "devused",
                      "api:pool:10G", "devused", "pool:info:d0")
        lines = run.out.splitlines()
        self.assertIn("alloc 10G: error 2", lines)       # the device has 4 GiB free
        self.assertNotIn("api pool 15G: error 2", lines)  # the pool holds 20 GiB
        self.assertIn("api pool 10G: error 2", lines)     # growing by 5 GiB does not fit
        self.assertEqual(self.used(run), [20 * GiB, 20 * GiB])
        self.assertEqual(self.pool(run)[0]["used"], 15 * GiB)

    def test_trim_and_release_threshold(self):
        run = self.sc("pool:create:0:device", "pool:threshold:1G", "api:poolalloc:3G",
                      "free:0", "sync", "devused", "pool:trim:512M", "devused",
                      "api:poolalloc:256M", "pool:cutrim:0", "devused", "pool:info")
        self.assertNotIn("error", run.out)
        # the sync keeps the threshold; a trim never takes what is in use
        self.assertEqual(self.used(run), [GiB, 512 * MiB, 256 * MiB])
        p = self.pool(run)[0]
        self.assertEqual((p["reserved"], p["used"], p["threshold"]), (256 * MiB, 256 * MiB, GiB))

    def test_a_pool_charges_its_own_device(self):
        run = self.sc("setdev:0", "pool:create:1:device", "api:poolalloc:2G",
                      "pool:cucreate:1:device", "api:cupoolalloc:1G", "devused:0", "devused:1",
                      "freeall", "sync", "devused:1", devices=TWO_GPUS)
        self.assertNotIn("error", run.out)
        self.assertEqual(self.used(run, 0), [0])
        self.assertEqual(self.used(run, 1), [3 * GiB, 0])

    def test_host_pools_are_never_charged(self):
        run = self.sc("pool:create:0:host", "api:poolalloc:100G", "pool:create:0:hostnuma",
                      "api:poolalloc:50G:1", "pool:cucreate:0:host", "api:cupoolalloc:30G",
                      "devused", "pool:info:0", "freeall", "sync", "pool:info:0")
        self.assertNotIn("error", run.out)
        self.assertEqual(self.used(run), [0])
        self.assertEqual([p["reserved"] for p in self.pool(run)], [100 * GiB, 0])

    def test_current_pool_max_size_and_destruction(self):
        run = self.sc("pool:create:0:device:1G", "pool:current", "api:async:768M",
                      "pool:info", "pool:info:d0", "api:async:512M", "pool:destroy",
                      "devused", "free:0", "devused", "pool:destroy:d0", "pool:info:0")
        lines = run.out.splitlines()
        p = self.pool(run)
        self.assertEqual((p[0]["used"], p[1]["used"]), (768 * MiB, 0))  # from the current pool
        self.assertIn("api async 512M: error 2", lines)   # past the pool's maxSize
        # destroyed with 768 MiB out: released with its last allocation
        self.assertEqual(self.used(run), [768 * MiB, 0])
        self.assertIn("pool destroy:d0: error 1", lines)  # a default pool stays
        self.assertIn("pool info:0: error 1", lines)      # a destroyed pool is gone


class Arrays(Rig):
    def test_arrays_are_charged_their_computed_bytes(self):
        cases = [  # (command, bytes)
            ("api:array:1000", array_bytes(1000, 0, 0, 1)),
            ("api:array:1000:3:f32x4", array_bytes(1000, 3, 0, 16)),
            ("api:array3d:100:100:10:u16x2", array_bytes(100, 100, 10, 4)),
            ("api:array3d:16:0:6:u8x1:1", array_bytes(16, 0, 6, 1, layered=True)),  # layered 1-D
            ("api:array3d:16:16:6:f32x4:4", array_bytes(16, 16, 6, 16, layered=True)),  # cubemap
            ("api:mipmap:1024:1024:0:11:u8x4", array_bytes(1024, 1024, 0, 4, 11)),
            ("api:mipmap:64:32:16:7:f16x2", array_bytes(64, 32, 16, 4, 7)),
            ("api:cuarray:1000:3:f32x4", array_bytes(1000, 3, 0, 16)),
            ("api:cuarray3d:100:100:10:s32x1", array_bytes(100, 100, 10, 4)),
            ("api:cumipmap:8:4:2:4", array_bytes(8, 4, 2, 1, 4)),
            ("api:3d:1000:10:10", 1024 * 10 * 10),  # pitched: round_up(width, 512)
        ]
        cmds = []
        for cmd, _ in cases:
            cmds += [cmd, "devused"]
        run = self.sc(*cmds, "freeall", "devused")
        self.assertNotIn("error", run.out)
        expect, total = [], 0
        for _, size in cases:
            total += size
            expect.append(total)
        self.assertEqual(self.used(run), expect + [0])
        self.assertEqual(expect[0], 1024)
        self.assertEqual(cases[5][1], 5592576)  # 4 x (1024^2 + 512^2 + ... + 1) rounded

    def test_bad_extents_are_rejected_and_charge_nothing(self):
        big = 1 << 32
        run = self.sc(f"api:array3d:{big}:{big}:{big}:f32x4", f"api:cuarray3d:{big}:{big}:1",
                      f"api:mipmap:{big}:{big}:2:2", "api:mipmap:1024:1024:0:12",
                      "api:array3d:16:0:6", "api:array3d:16:16:5:u8x1:4",
                      "api:array3d:16:16:6:f32x4:0x40", "devused")
        errors = re.findall(r"^api (\S+) \S+: error (\d+)$", run.out, re.M)
        self.assertEqual(errors, [("array3d", "1"), ("cuarray3d", "1"), ("mipmap", "1"),
                                  ("mipmap", "1"), ("array3d", "1"), ("array3d", "1")])
        self.assertEqual(self.used(run), [0])  # and a sparse array holds nothing itself


class DriverLookups(Rig):
    def test_every_way_to_the_driver_allocates(self):
        run = self.sc("api:drv:1G", "api:dlsym:2G", "api:cuasync:4G", "devused", "freeall",
                      "devused", "sync", "devused")
        self.assertNotIn("error", run.out)
        self.assertEqual(self.used(run), [7 * GiB, 4 * GiB, 0])


class HostMemory(Rig):
    def test_host_allocations_are_never_charged(self):
        run = self.sc("api:host:30G", "api:hostalloc:30G", "api:cuhost:30G", "api:vmmhost:30G",
                      "devused", "meminfo", "freeall", "devused")
        self.assertNotIn("error", run.out)
        self.assertEqual(self.used(run), [0, 0])
        self.assertIn(f"meminfo free={24 * GiB} total={24 * GiB}", run.out)


class LegacyNames(Rig):
    def test_v1_allocations_are_charged_and_freed(self):
        run = self.sc("api:v1:1G", "api:v1sym:512M", "devused", "meminfo1", "free:0",
                      "devused", "freeall", "devused")
        self.assertNotIn("error", run.out)
        self.assertNotIn("64-bit pointer", run.out)  # each got the legacy ABI
        self.assertEqual(self.used(run), [1536 * MiB, 512 * MiB, 0])
        self.assertIn("meminfo1 free=4294967295 total=4294967295", run.out)  # clamped

    def test_get_proc_address_hands_out_the_abi_of_the_version(self):
        code = f"""
import ctypes, os
d = ctypes.CDLL(os.path.join({FAKE!r}, "libcuda.so.1"))
gp = d.cuGetProcAddress_v2
gp.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int,
               ctypes.c_uint64, ctypes.POINTER(ctypes.c_int)]
def sym(name):
    return ctypes.cast(getattr(d, name), ctypes.c_void_p).value
for base, version in [("cuMemAlloc", 3000), ("cuMemAlloc", 3020), ("cuMemFree", 2000),
                      ("cuMemGetInfo", 3010), ("cuArrayCreate", 3000), ("cuArrayCreate", 13000),
                      ("cuDevicePrimaryCtxRelease", 7000), ("cuCtxSynchronize", 12090),
                      ("cuCtxSynchronize", 13000), ("cuMemPoolCreate", 11020)]:
    fn, st = ctypes.c_void_p(), ctypes.c_int(-1)
    r = gp(base.encode(), ctypes.byref(fn), version, 0, ctypes.byref(st))
    names = [n for n in (base, base + "_v2") if hasattr(d, n) and sym(n) == fn.value]
    print(base, version, r, st.value, names)
# a v1 pointer fits its 32 bits, and the _v2 free takes it
d.cuInit(0)
dev, ctx, p = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_uint32()
d.cuDeviceGet(ctypes.byref(dev), 0)
d.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev)
d.cuCtxSetCurrent(ctx)
print("v1", d.cuMemAlloc(ctypes.byref(p), 1 << 20), 0 < p.value < 1 << 32,
      d.cuMemFree_v2(ctypes.c_uint64(p.value)))
"""
        run = self.plain([sys.executable, "-c", code])
        self.assertEqual(run.out.splitlines(), [
            "cuMemAlloc 3000 0 0 ['cuMemAlloc']",
            "cuMemAlloc 3020 0 0 ['cuMemAlloc_v2']",
            "cuMemFree 2000 0 0 ['cuMemFree']",
            "cuMemGetInfo 3010 0 0 ['cuMemGetInfo']",
            "cuArrayCreate 3000 0 0 ['cuArrayCreate']",
            "cuArrayCreate 13000 0 0 ['cuArrayCreate_v2']",
            "cuDevicePrimaryCtxRelease 7000 0 0 ['cuDevicePrimaryCtxRelease']",
            "cuCtxSynchronize 12090 0 0 ['cuCtxSynchronize']",
            "cuCtxSynchronize 13000 0 0 ['cuCtxSynchronize_v2']",
            "cuMemPoolCreate 11020 0 0 ['cuMemPoolCreate']",
            "v1 0 True 0",
        ])


def needed(path):
    out = subprocess.run(["readelf", "-d", path], stdout=subprocess.PIPE, text=True).stdout
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out)


class Programs(Rig):
    def test_a_program_linked_with_lcuda(self):
        libs = needed(DRVPROG)
        self.assertIn("libcuda.so.1", libs)
        self.assertFalse([l for l in libs if "cudart" in l], libs)
        run = self.plain([DRVPROG, "alloc:1G", "v1:512M", "pitch:1000:10", "async:1G",
                          "array:1000", "host:40G", "meminfo", "alloc:30G", "freeall", "meminfo",
                          "sync", "meminfo"])
        held = GiB + 512 * MiB + 1024 * 10 + GiB + 1024
        self.assertEqual(run.out.splitlines(), [
            f"meminfo free={24 * GiB - held} total={24 * GiB}",
            "alloc 30G: error 2",
            f"meminfo free={23 * GiB} total={24 * GiB}",  # the async GiB stays in its pool
            f"meminfo free={24 * GiB} total={24 * GiB}",
            "drvprog: done"])

    def test_static_runtime_stand_in(self):
        self.assertFalse([l for l in needed(SRTLIKE) if "cuda" in l])
        trace = os.path.join(self.tmp, "trace")
        run = self.plain([SRTLIKE, "alloc:1G", "async:2G", "host:30G", "meminfo", "free:1",
                          "meminfo", "sync", "meminfo", "alloc:30G", "lasterror", "freeall"],
                         FAKECUDA_TRACE=trace)
        self.assertEqual(run.out.splitlines(), [
            f"meminfo free={21 * GiB} total={24 * GiB}",
            f"meminfo free={21 * GiB} total={24 * GiB}",
            f"meminfo free={23 * GiB} total={24 * GiB}",
            "alloc 30G: error 2 cudaErrorMemoryAllocation",
            "lasterror: 2",
            "srtlike: done"])
        with open(trace) as f:
            lookups = f.read().splitlines()
        # found through cuGetProcAddress_v2 at the version of each ABI
        self.assertIn("cuGetProcAddress_v2 cuMemAlloc 3020 0 found", lookups)
        self.assertIn("cuGetProcAddress_v2 cuMemAllocAsync 11020 0 found", lookups)
        self.assertFalse([l for l in lookups if "ExportTable" in l])

    def test_a_program_built_with_nvcc(self):
        if not os.path.exists(NVCC):
            self.skipTest(f"no nvcc at {NVCC}: the nvcc-built program cannot be made")
        self.assertTrue(os.path.exists(NVCCPROG), f"{NVCCPROG} was not built")
        self.assertFalse([l for l in needed(NVCCPROG) if "cuda" in l])  # the static runtime
        trace = os.path.join(self.tmp, "trace")
        run = self.plain([NVCCPROG, "alloc:1G", "meminfo", "lasterror", "free:0"],
                         FAKECUDA_TRACE=trace)
        # It gets to the driver's private interface and stops there, cleanly.
        self.assertEqual(run.out.splitlines(), [
            "alloc 1G: error 801 cudaErrorNotSupported",
            "meminfo: error 801 cudaErrorNotSupported",
            "lasterror: 801",
            "free 0: error 801 cudaErrorNotSupported",
            "nvccprog: done"])
        with open(trace) as f:
            lookups = f.read().splitlines()
        self.assertIn("cuGetProcAddress_v2 cuMemAlloc 3020 0 found", lookups)
        self.assertIn("cuGetProcAddress_v2 cuMemAllocFromPoolAsync 11020 2 found", lookups)
        self.assertTrue(all(l.startswith("cuGetProcAddress_v2 ") for l in lookups
                            if "ExportTable " not in l), "every lookup through the _v2")
        tables = [l.split()[1] for l in lookups if l.startswith("cuGetExportTable ")]
        self.assertEqual(len(tables), 2, lookups[-5:])

    def test_ctypes_on_both_libraries(self):
        run = self.plain([sys.executable, CTYPES, "rt:1G", "drv:2G", "meminfo", "drv:30G",
                          "rt:30G", "free:0", "meminfo", "freeall", "meminfo"],
                         GG_FAKE_DIR=FAKE)
        self.assertEqual(run.out.splitlines(), [
            f"meminfo free={21 * GiB} total={24 * GiB}",
            "drv 30G: error 2",
            "rt 30G: error 2",
            f"meminfo free={22 * GiB} total={24 * GiB}",
            f"meminfo free={24 * GiB} total={24 * GiB}",
            "ctypes_alloc: done"])
