"""Every real caller, end to end under a real LD_PRELOAD on the fake CUDA
stack:

  1. two runtimes in one process: each call reaches its own runtime
  2. stream-ordered pools: counted as the device sees them
  3. refusal by who can cope: the module that asked, not the API path
  4. nothing device-side invisible: arrays, 3-D, v1 names, -lcuda
  5. managed memory never refused, even under enforce = all

The limit is 22 GiB of a 24 GiB RTX 3090 (headroom 2 GiB), enforced."""
import os
import re
import subprocess
import sys

from gg import (FAKE, PROGS, ROOT, SCRIPT, GiB, MiB, Case, base_env, sanitizer_preload)

REPORT = os.path.join(ROOT, "tools", "bin", "gpuguard-report")

HOST = os.path.join(PROGS, "host")
DRVPROG = os.path.join(PROGS, "drvprog")
SRTLIKE = os.path.join(PROGS, "srtlike")
NVCCPROG = os.path.join(PROGS, "nvccprog")
CTYPES = os.path.join(ROOT, "tests", "progs", "ctypes_alloc.py")
NVCC = os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "nvcc")
TWO_GPUS = "NVIDIA GeForce RTX 3090,24GiB,8.6;NVIDIA GeForce RTX 3090,24GiB,8.6"
ENFORCE = """\
[gpu]
match = NVIDIA GeForce RTX 3090*
[memory]
headroom = 2 GiB
near_miss = 5%
mode = enforce
"""
LIMIT = 22 * GiB


def array_bytes(w, h, d, elem, levels=1, layered=False):
    """What an array holds: every mip level's extent times the element,
    rounded up to 512 bytes (tests/fake/README.md)."""
    total = 0
    for level in range(levels):
        lw = max(w >> level, 1)
        lh = max(h >> level, 1) if h else 1
        ld = (d if layered else max(d >> level, 1)) if d else 1
        total += lw * lh * ld * elem
    return (total + 511) // 512 * 512


class Callers(Case):
    def policy(self, extra=""):
        return self.write_policy("enforce.ini", ENFORCE + extra)

    def guarded(self, argv, extra="", **kw):
        kw.setdefault("policy", self.policy(extra))
        run = self.run_prog(argv, **kw)
        self.assertEqual(run.rc, 0, run.out + run.err)
        self.sanitizer_clean(run)
        return run

    def sc(self, *cmds, **kw):
        run = self.guarded([SCRIPT, *cmds], **kw)
        self.assertTrue(run.out.endswith("script: done\n"), run.out + run.err)
        return run

    def used(self, run, dev=0):
        return [int(v) for v in re.findall(rf"^devused {dev}=(\d+)$", run.out, re.M)]

    def refused(self, run):
        return [(e["api"], e["bytes"], e["caller"]) for e in run.of("refused")]


class TwoRuntimes(Callers):
    """1. A CUDA 12 extension beside the CUDA 13 runtime, on a 12.8 driver
    (where libcudart.so.13 cannot start): the extension's calls reach its own
    runtime, which works, as it does without the shim."""

    def test_the_extension_works_where_only_its_runtime_can(self):
        kw = dict(devices=TWO_GPUS, GG_FAKE_DIR=FAKE, FAKECUDA_DRIVER_VERSION="12080")
        plain = self.run_prog([HOST, "apart"], preload=False, **kw)
        run = self.guarded([HOST, "apart"], **kw)
        self.assertEqual(run.out, plain.out)
        lines = run.out.splitlines()
        self.assertIn("alloc13 35", lines)  # cudaErrorInsufficientDriver: its own runtime's
        self.assertIn("alloc12 0", lines)
        self.assertIn("last12 2 last13 35", lines)  # each runtime its own last error
        devices = run.one("summary")["devices"]
        self.assertEqual((devices[0]["peak"], devices[1]["peak"]), (0, 2 * GiB))  # on GPU 1
        # its 1 TiB is refused by the guard, as its own out-of-memory
        self.assertEqual(self.refused(run), [("cudaMalloc", 1 << 40, "host")])


class Pools(Callers):
    """2. Stream-ordered pools keep freed memory on the device."""

    def test_pool_memory_stays_on_the_device(self):
        # 11 GiB + a 10 GiB pool, freed into the pool: the device holds 21 GiB
        run = self.sc("alloc:11G", "api:pool:10G", "free:1", "alloc:2G", "api:pool:10G",
                      "devused", "free:3", "sync", "devused")
        self.assertIn("alloc 2G: error 2", run.out)          # 23 GiB would cross the line
        self.assertNotIn("api pool 10G: error", run.out)     # the pool serves it: nothing grows
        self.assertEqual(self.used(run), [21 * GiB, 11 * GiB])
        refused = run.one("refused")
        self.assertEqual((refused["api"], refused["used"], refused["reserved"]),
                         ("cudaMalloc", 21 * GiB, 21 * GiB))
        near = run.of("near_miss")
        self.assertEqual([(e["api"], e["grows"]) for e in near],
                         [("cudaMallocFromPoolAsync", 10 * GiB)])  # only when the pool grew
        s = run.summary()
        self.assertEqual((s["peak"], s["peak_used"]), (21 * GiB, 21 * GiB))
        self.assertEqual((s["reserved"], s["allocated"], s["pool_reserved"]), (11 * GiB,) * 2 + (0,))
        self.assertEqual(s["peak_pool_reserved"], 10 * GiB)
        # the report shows what pools held beside what they handed out
        out = subprocess.run([sys.executable, REPORT, run.files[0]], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("   pools        0 B reserved, 0 B allocated at exit; at most 10.0 GiB "
                      "reserved", out.stdout)

    def test_a_pool_request_that_grows_the_device_past_the_line_is_refused(self):
        run = self.sc("pool:create:0:device", "api:poolalloc:15G", "free:0", "alloc:5G",
                      "api:poolalloc:16G", "free:2", "api:poolalloc:18G", "devused")
        lines = run.out.splitlines()
        self.assertNotIn("api poolalloc 16G: error 2", lines)  # 15 GiB held + 1 GiB: 21 GiB
        self.assertIn("api poolalloc 18G: error 2", lines)     # 16 held + 2: 23 GiB
        self.assertEqual(self.used(run), [21 * GiB])
        (refused,) = run.of("refused")
        self.assertEqual((refused["bytes"], refused["grows"]), (18 * GiB, 2 * GiB))

    def test_trim_destroy_and_synchronisation_release(self):
        run = self.sc("pool:create:0:device", "pool:threshold:1G", "api:poolalloc:8G", "free:0",
                      "sync", "devused", "alloc:20G", "free:1", "pool:trim:0", "devused",
                      "api:poolalloc:4G", "api:async:2G", "free:3", "pool:destroy", "devused",
                      "free:2", "devused", "streamsync", "devused", "alloc:21G")
        self.assertNotIn("error", run.out)
        self.assertEqual(self.used(run), [GiB, 0, 6 * GiB, 2 * GiB, 0])
        self.assertEqual(run.of("refused"), [])
        s = run.summary()
        self.assertEqual((s["reserved"], s["allocated"], s["pool_reserved"]), (21 * GiB, 21 * GiB, 0))

    def test_a_pool_charges_its_own_device(self):
        run = self.sc("setdev:0", "pool:create:1:device", "api:poolalloc:2G",
                      "pool:cucreate:1:device", "api:cupoolalloc:1G", "freeall", devices=TWO_GPUS)
        devices = run.one("summary")["devices"]
        self.assertEqual(devices[0]["peak"], 0)
        self.assertEqual(devices[1]["peak"], 3 * GiB)
        self.assertEqual(devices[1]["pool_reserved"], 3 * GiB)  # freed into its pools

    def test_host_pools_are_never_counted(self):
        run = self.sc("pool:create:0:host", "api:poolalloc:30G", "pool:create:0:hostnuma",
                      "api:poolalloc:50G:1", "pool:cucreate:0:host", "api:cupoolalloc:30G",
                      "freeall", "alloc:1G", "free:3")
        self.assertNotIn("error", run.out)
        self.assertEqual(run.of("refused") + run.of("near_miss") + run.of("error"), [])
        s = run.summary()
        self.assertEqual((s["allocs"], s["frees"], s["peak"], s["unknown_frees"]), (1, 1, GiB, 0))


class WhoMayBeRefused(Callers):
    """3. Refusal follows the module that asked, not the API path: every
    caller that turns it into a clean OOM may be refused; an NCCL-like
    library is only counted."""

    def test_a_static_runtime_program_is_refused(self):
        run = self.guarded([SRTLIKE, "alloc:23G", "lasterror", "alloc:1G", "freeall"])
        self.assertEqual(run.out.splitlines(), [
            "alloc 23G: error 2 cudaErrorMemoryAllocation", "lasterror: 2", "srtlike: done"])
        self.assertEqual(self.refused(run), [("cuMemAlloc", 23 * GiB, "srtlike")])
        self.assertEqual(run.summary()["peak"], GiB)

    def test_ctypes_on_either_library_is_refused(self):
        run = self.guarded([sys.executable, CTYPES, "rt:23G", "drv:23G", "rt:1G", "drv:1G",
                            "freeall"], GG_FAKE_DIR=FAKE)
        self.assertEqual(run.out.splitlines(), ["rt 23G: error 2", "drv 23G: error 2",
                                                "ctypes_alloc: done"])
        refused = self.refused(run)
        self.assertEqual([r[:2] for r in refused], [("cudaMalloc", 23 * GiB), ("cuMemAlloc", 23 * GiB)])
        self.assertTrue(all(r[2].startswith("libffi") for r in refused), refused)
        s = run.summary()
        self.assertEqual((s["allocs"], s["frees"], s["peak"]), (2, 2, 2 * GiB))

    def test_a_dlsym_caller_of_the_driver_is_refused(self):
        run = self.sc("api:dlsym:23G", "api:dlsym:1G", "freeall")  # as JAX and TensorFlow
        self.assertIn("api dlsym 23G: error 2", run.out)
        self.assertEqual(self.refused(run), [("cuMemAlloc", 23 * GiB, "script")])

    def test_an_nccl_like_library_is_only_counted(self):
        # its driver buffers, and a cudaMalloc of its own static runtime
        run = self.sc("nccl:0:22G", "ncclrt:0:1G", "devused", "ncclfree")
        self.assertNotIn("error", run.out)
        self.assertEqual(self.used(run), [23 * GiB + MiB])
        self.assertEqual(run.of("refused"), [])
        spared = [(e["api"], e["caller"], e.get("spared")) for e in run.of("near_miss")]
        self.assertIn(("cuMemAlloc", "libnccllike.so", "never_refuse"), spared)
        self.assertTrue(all(e["over_limit"] for e in run.of("near_miss") if e.get("spared")))
        # enforce = all: every module may be refused
        run = self.sc("nccl:0:23G", "ncclrt:0:23G", "ncclfree", extra="enforce = all\n")
        self.assertIn("nccl 0 23G: error 2", run.out)
        self.assertIn("ncclrt 0 23G: error 2", run.out)
        self.assertEqual(self.refused(run), [("cuMemCreate", 23 * GiB, "libnccllike.so"),
                                             ("cuMemAlloc", 23 * GiB, "libnccllike.so")])

    def test_never_refuse_names_the_modules(self):
        run = self.guarded([SRTLIKE, "alloc:23G", "freeall"], extra="never_refuse = srt*, libnccl*\n")
        self.assertEqual(run.out.splitlines(), ["srtlike: done"])
        (near,) = run.of("near_miss")
        self.assertEqual((near["caller"], near["spared"]), ("srtlike", "never_refuse"))
        run = self.sc("nccl:0:23G", extra="never_refuse = srt*\n")  # no longer spared
        self.assertIn("nccl 0 23G: error 2", run.out)


class Invisible(Callers):
    """4. Nothing that allocates device memory passes unseen."""

    def test_arrays_and_3d_memory_are_counted_and_refused(self):
        cases = [("api:array:1000:3:f32x4", array_bytes(1000, 3, 0, 16)),
                 ("api:array3d:100:100:10:u16x2", array_bytes(100, 100, 10, 4)),
                 ("api:mipmap:1024:1024:0:11:u8x4", array_bytes(1024, 1024, 0, 4, 11)),
                 ("api:cuarray:1000:3:f32x4", array_bytes(1000, 3, 0, 16)),
                 ("api:cuarray3d:16:16:6:f32x4:4", array_bytes(16, 16, 6, 16, layered=True)),
                 ("api:cumipmap:8:4:2:4", array_bytes(8, 4, 2, 1, 4)),
                 ("api:3d:1000:10:10", 1024 * 10 * 10)]
        run = self.sc(*[c for c, _ in cases], "devused", "api:array3d:16:16:6:f32x4:0x40",
                      "api:array3d:1M:368:4:f32x4", "api:cuarray3d:4G:4G:4G:f32x4",
                      "api:3d:1G:1:23", "freeall", "devused")
        held = sum(b for _, b in cases)
        self.assertEqual(self.used(run), [held, 0])
        lines = run.out.splitlines()
        self.assertIn("api array3d 1M:368:4:f32x4: error 2", lines)  # 23 GiB: refused
        self.assertIn("api cuarray3d 4G:4G:4G:f32x4: error 1", lines)  # overflow: the driver's own error
        self.assertIn("api 3d 1G:1:23: error 2", lines)
        self.assertEqual([(a, b) for a, b, _ in self.refused(run)],
                         [("cudaMalloc3DArray", array_bytes(1 << 20, 368, 4, 16)),
                          ("cudaMalloc3D", 23 * GiB)])
        s = run.summary()
        self.assertEqual((s["peak"], s["allocs"], s["frees"]), (held, 7, 7))  # sparse: nothing
        self.assertEqual(s["unknown_frees"], 0)

    def test_legacy_v1_names(self):
        run = self.sc("api:v1:1G", "api:v1sym:512M", "devused", "alloc:19G", "api:v1:3G",
                      "free:0", "freeall", "devused")
        self.assertNotIn("64-bit pointer", run.out)  # each got a hook of the legacy ABI
        self.assertIn("api v1 3G: error 2", run.out)  # 23.5 GiB: refused
        self.assertEqual(self.used(run), [1536 * MiB, 0])
        s = run.summary()
        self.assertEqual((s["peak"], s["allocs"], s["frees"]), (1536 * MiB + 19 * GiB, 3, 3))
        self.assertEqual(self.refused(run), [("cuMemAlloc", 3 * GiB, "script")])

    def test_a_program_linked_with_lcuda(self):
        run = self.guarded([DRVPROG, "alloc:1G", "v1:512M", "pitch:1000:10", "async:1G",
                            "array:1000", "host:40G", "alloc:23G", "freeall", "sync"])
        self.assertEqual(run.out.splitlines(), ["alloc 23G: error 2", "drvprog: done"])
        self.assertEqual(self.refused(run), [("cuMemAlloc", 23 * GiB, "drvprog")])
        s = run.summary()
        held = GiB + 512 * MiB + 1024 * 10 + GiB + 1024  # the host memory is no device's
        self.assertEqual((s["peak"], s["allocs"], s["frees"], s["live_bytes"]), (held, 5, 5, 0))
        # GPUGUARD_DRIVER_HOOKS=0: the driver's exports pass everything through
        run = self.guarded([DRVPROG, "alloc:23G", "freeall"], GPUGUARD_DRIVER_HOOKS="0")
        self.assertEqual(run.out.splitlines(), ["drvprog: done"])
        self.assertEqual(run.of("refused"), [])

    def test_the_shim_needs_no_driver(self):
        out = subprocess.run(["readelf", "-d", os.path.join(os.path.dirname(PROGS), "..",
                                                           "libgpuguard.so")],
                             stdout=subprocess.PIPE, text=True).stdout
        self.assertNotRegex(out, r"NEEDED.*libcuda")
        dyn = subprocess.run(["nm", "-D", "--defined-only",
                              os.path.join(os.path.dirname(PROGS), "..", "libgpuguard.so")],
                             stdout=subprocess.PIPE, text=True).stdout
        for name in ("cuMemAlloc_v2", "cuMemAlloc", "cuMemFree_v2", "cuArrayCreate_v2",
                     "cuMemAllocAsync_ptsz", "cuGetProcAddress_v2"):
            self.assertRegex(dyn, rf" T {name}\n")  # unversioned, as libcuda's own

    def test_host_memory_is_never_counted(self):
        run = self.sc("api:host:30G", "api:hostalloc:30G", "api:cuhost:30G", "api:vmmhost:30G",
                      "freeall", "alloc:1G", "freeall")
        self.assertNotIn("error", run.out)
        self.assertEqual(run.of("refused") + run.of("near_miss"), [])
        self.assertEqual(run.summary()["peak"], GiB)

    def test_a_program_built_with_nvcc(self):
        """The real static runtime stops at the driver's private interface on
        the fake; under the shim it does exactly the same, through the same
        lookups, each handed a hook, and leaves no journal (it never got to
        allocate)."""
        if not os.path.exists(NVCC):
            self.skipTest(f"no nvcc at {NVCC}: the nvcc-built program cannot be made")
        self.assertTrue(os.path.exists(NVCCPROG), f"{NVCCPROG} was not built")
        traces = []
        outs = []
        for preload in (False, True):
            trace = os.path.join(self.tmp, f"trace{int(preload)}")
            env = base_env(FAKECUDA_TRACE=trace, GPUGUARD_POLICY=self.policy())
            if not preload and sanitizer_preload():
                env["LD_PRELOAD"] = ":".join(sanitizer_preload())
            run = self.run_prog([NVCCPROG, "alloc:1G", "lasterror"], preload=preload, env=env)
            outs.append(run.out)
            with open(trace) as f:
                traces.append(f.read())
            self.assertEqual(run.files, [])
        self.assertEqual(outs[0], outs[1])
        self.assertEqual(traces[0], traces[1])
        self.assertIn("cuGetProcAddress_v2 cuMemAlloc 3020 0 found", traces[1])


class Managed(Callers):
    """5. Managed memory may oversubscribe the device: counted, never
    refused, even under enforce = all."""

    def test_managed_is_never_refused(self):
        run = self.sc("api:managed:23G", "api:dlsym:1G", "freeall", extra="enforce = all\n")
        self.assertNotIn("error 2", run.out.split("api dlsym")[0])
        self.assertNotIn("api managed 23G: error", run.out)
        self.assertIn("api dlsym 1G: error 2", run.out)  # under all, the rest is refused
        (near,) = run.of("near_miss")
        self.assertEqual((near["api"], near["over_limit"]), ("cudaMallocManaged", True))
