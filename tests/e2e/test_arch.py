"""Device code against the GPU, "no kernel image is available": libraries built here by the real
nvcc for chosen archs (tests/arch/arch.mk), judged against fake GPUs of
compute capability 7.5 to 12.0 by gpuguard-check --arch and by the shim, for
the static runtime (nvcc's default) and the shared one (docs/how-it-works.md).
A static-runtime library dlopen'ed after the start is judged too,
whether its runtime starts or not, and the fix is said in its user's terms
(the wheel or package it came from, and which PyTorch to install)."""
import os
import re
import shutil
import subprocess
import unittest

from gg import BUILD, CHECK, Case, base_env

ARCH = os.path.join(BUILD, "arch")
PROG = os.path.join(BUILD, "tests", "progs", "archprog")
NVCC = os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "nvcc")

# What each library was built to carry (tests/arch/arch.mk's flags).
CARRIES = {
    "sass80": (["sm_80"], []),
    "ptx80": ([], ["compute_80"]),
    "multi": (["sm_75", "sm_86", "sm_90"], []),
    "sm90a": (["sm_90a"], []),
    "sm120": (["sm_120"], []),
}
# Static-runtime only: linked without arch flags (nvcc's device-link stub is
# sm_75 and has no kernels), and -rdc (the device-link output is the code).
STATIC_ONLY = {"sass80_dlink": (["sm_80"], []), "rdc80": (["sm_80"], [])}

GPUS = {
    (7, 5): "NVIDIA GeForce RTX 2080 Ti,11GiB,7.5",
    (8, 0): "NVIDIA A100-SXM4-40GB,40GiB,8.0",
    (8, 6): "NVIDIA GeForce RTX 3090,24GiB,8.6",
    (8, 9): "NVIDIA GeForce RTX 4090,24GiB,8.9",
    (9, 0): "NVIDIA H100 80GB HBM3,80GiB,9.0",
    (12, 0): "NVIDIA GeForce RTX 5090,32GiB,12.0",
}


def runs(code, cc):
    """The rule, written again here: SASS for the same major and a minor <=
    the GPU's; PTX for an arch <= the GPU's; `a` code on that arch only; `f`
    code within its family."""
    kind, arch, variant = re.fullmatch(r"(sm|compute)_(\d+)([af]?)", code).groups()
    arch, dev = int(arch), cc[0] * 10 + cc[1]
    if variant == "a":
        return arch == dev
    if variant == "f" or kind == "sm":
        return arch // 10 == cc[0] and arch % 10 <= cc[1]
    return arch <= dev


def libraries():
    """{path: (sass, ptx, runtime)} for every library built."""
    libs = {}
    for name, (sass, ptx) in CARRIES.items():
        libs[os.path.join(ARCH, f"libarch_{name}.so")] = (sass, ptx, "static")
        libs[os.path.join(ARCH, f"libarch_{name}_shared.so")] = (sass, ptx, "shared")
    for name, (sass, ptx) in STATIC_ONLY.items():
        libs[os.path.join(ARCH, f"libarch_{name}.so")] = (sass, ptx, "static")
    return libs


def expected_ok(lib, cc):
    sass, ptx, _ = libraries()[lib]
    return any(runs(c, cc) for c in sass + ptx)


class ArchCase(Case):
    def setUp(self):
        super().setUp()
        missing = [p for p in libraries() if not os.path.exists(p)]
        if missing:
            if os.path.exists(NVCC):
                self.fail(f"{NVCC} exists but {missing[0]} was not built (tests/arch/arch.mk)")
            self.skipTest(f"no nvcc at {NVCC}: the nvcc-built libraries cannot be made")

    def arch(self, *cmds, devices, **kw):
        return self.run_prog([PROG, *cmds], env=base_env(devices=devices), **kw)

    def arch_events(self, run):
        return {e["module"]: e for e in run.of("arch")}

    def check(self, *args, devices, env=None):
        env = env or base_env(devices=devices)
        return subprocess.run([CHECK, *args], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, timeout=120)


class RuleTable(unittest.TestCase):
    def test_the_rule_on_cells_stated_by_hand(self):
        # a few cells stated by hand, so the table below is not only the rule
        self.assertTrue(runs("sm_80", (8, 6)) and runs("sm_80", (8, 9)))
        self.assertFalse(runs("sm_86", (8, 0)) or runs("sm_80", (9, 0)) or runs("sm_80", (12, 0)))
        self.assertTrue(runs("compute_80", (12, 0)) and not runs("compute_80", (7, 5)))
        self.assertTrue(runs("sm_90a", (9, 0)) and not runs("sm_90a", (12, 0)))
        self.assertFalse(runs("sm_120", (9, 0)))


class CheckTool(ArchCase):
    def test_every_library_on_every_gpu(self):
        libs = sorted(libraries())
        for cc, gpu in GPUS.items():
            with self.subTest(cc=cc):
                out = self.check("--arch", *libs, devices=gpu)
                self.assertEqual(out.stderr, "")
                lines = [l for l in out.stdout.splitlines() if l.startswith(ARCH)]
                self.assertEqual(len(lines), len(libs), out.stdout)  # one per (file, GPU)
                any_bad = False
                for line in lines:
                    path, rest = line.split(": GPU 0 ", 1)
                    sass, ptx, _ = libraries()[path]
                    want = expected_ok(path, cc)
                    any_bad |= not want
                    self.assertIn(f"({cc[0]}.{cc[1]})", rest)
                    self.assertEqual("CANNOT RUN" not in rest, want, line)
                    carries = rest.split("; carries ", 1)[1]
                    for c in sass + ptx:
                        self.assertIn(c, carries)
                    if want and not any(runs(c, cc) for c in sass):
                        self.assertIn("JIT compilation of PTX", rest)
                self.assertEqual(out.returncode, 1 if any_bad else 0, out.stdout)

    def test_all_good_exits_0_and_other_files_are_said(self):
        gpu = GPUS[(8, 6)]
        good = [os.path.join(ARCH, "libarch_sass80.so"), os.path.join(ARCH, "libarch_ptx80_shared.so")]
        out = self.check("--arch", *good, os.path.join(BUILD, "fake", "libcuda.so.1"), devices=gpu)
        self.assertEqual(out.returncode, 0, out.stdout)
        self.assertIn("libcuda.so.1: no device code", out.stdout)
        out = self.check("--arch", *good, os.path.join(self.tmp, "absent.so"), devices=gpu)
        self.assertEqual(out.returncode, 1)
        self.assertIn("absent.so: cannot read", out.stdout)
        corrupt = os.path.join(self.tmp, "corrupt.so")
        with open(good[0], "rb") as f:
            data = bytearray(f.read())
        at = data.index(b"\x50\xed\x55\xba")  # the first fat binary's magic
        data[at:at + 4] = b"XXXX"
        with open(corrupt, "wb") as f:
            f.write(data)
        out = self.check("--arch", corrupt, devices=gpu)
        self.assertEqual(out.returncode, 1)
        self.assertRegex(out.stdout, r"corrupt\.so: corrupt device code: .* \(at offset \d+\)")

    def test_no_gpu_is_a_usage_error(self):
        out = self.check("--arch", os.path.join(ARCH, "libarch_sass80.so"), devices="")
        self.assertEqual(out.returncode, 2)
        self.assertIn("no CUDA devices", out.stderr)


class Shim(ArchCase):
    def libs(self, runtime=None):
        return sorted(p for p, (_, _, rt) in libraries().items() if runtime in (None, rt))

    def assert_judged(self, run, cc, libs):
        events = self.arch_events(run)
        for lib in libs:
            self.assertIn(lib, events, run.err)
            ev = events[lib]
            sass, ptx, _ = libraries()[lib]
            self.assertEqual(ev["ok"], expected_ok(lib, cc), ev)
            self.assertEqual(ev["cc"], f"{cc[0]}.{cc[1]}")
            self.assertEqual((ev["sass"], ev["ptx"]), (sass, ptx))
            self.assertEqual((ev["dev"], ev["devs"]), (0, [0]))
            self.assertEqual(ev["source"], "file")
        self.assertEqual(len(run.of("arch")), len(libs), "one event per module")
        # one stderr line per module no GPU of the process runs, none for the others
        lines = [l for l in self.shim_lines(run) if "no kernel image" in l]
        bad = [lib for lib in libs if not expected_ok(lib, cc)]
        self.assertEqual(sorted(l.split()[1] for l in lines), sorted(bad), run.err)

    def test_loaded_before_the_first_cuda_call(self):
        for cc, gpu in GPUS.items():
            with self.subTest(cc=cc):
                libs = self.libs()
                run = self.arch(*[f"load:{p}" for p in libs], "alloc", devices=gpu)
                self.assertEqual(run.rc, 0, run.err)
                self.assert_judged(run, cc, libs)
                self.sanitizer_clean(run)

    def test_loaded_after_the_first_cuda_call(self):
        # shared runtime: checked when the library registers its fat binaries;
        # static runtime: when its runtime starts (looks the driver up)
        for cc, gpu in GPUS.items():
            with self.subTest(cc=cc):
                cmds = ["alloc"]
                for p in self.libs():
                    cmds.append(f"load:{p}")
                    if libraries()[p][2] == "static":
                        cmds.append("call:arch_alloc")
                run = self.arch(*cmds, devices=gpu)
                self.assertEqual(run.rc, 0, run.err)
                self.assert_judged(run, cc, self.libs())

    def lines_about(self, run, lib):
        return [l for l in self.shim_lines(run) if "no kernel image" in l and l.split()[1] == lib]

    def assert_judged_once_before(self, run, lib, mark):
        """One `arch` event and one stderr line for lib, the line before the
        program's `mark` on stderr."""
        self.assertEqual(run.rc, 0, run.err)
        self.assertEqual(list(self.arch_events(run)), [lib])
        self.assertFalse(run.one("arch")["ok"])
        self.assertEqual(len(self.lines_about(run, lib)), 1, run.err)
        err = run.err.splitlines()
        self.assertLess(err.index(self.lines_about(run, lib)[0]), err.index("archprog: " + mark),
                        run.err)

    def test_what_triggers_a_late_check(self):
        gpu = GPUS[(12, 0)]
        shared = os.path.join(ARCH, "libarch_sass80_shared.so")
        static = os.path.join(ARCH, "libarch_sass80.so")
        # the shared runtime's registration, from the library's constructor
        run = self.arch("alloc", f"load:{shared}", "mark:loaded", devices=gpu)
        self.assert_judged_once_before(run, shared, "loaded")
        # a static runtime (nvcc's default) registers inside its library, never
        # through the shim; the library is judged when its runtime starts
        # (looks the driver up with cuGetProcAddress), before any kernel of it
        run = self.arch("alloc", f"load:{static}", "call:arch_alloc", "mark:called", devices=gpu)
        self.assert_judged_once_before(run, static, "called")
        self.assertIn("arch_alloc: ", run.out)  # the static runtime's own error, untouched
        # ... or finds the driver by name, as runtimes before CUDA 11.3 do
        run = self.arch("alloc", f"load:{static}", "lookup:cuInit", "mark:looked", devices=gpu)
        self.assert_judged_once_before(run, static, "looked")

    def test_a_static_runtime_library_loaded_and_not_used(self):
        # loaded after the start, its runtime never started: the shim's own
        # thread finds it within a tick (0.5 s) ...
        gpu = GPUS[(12, 0)]
        static = os.path.join(ARCH, "libarch_sass80.so")
        run = self.arch("alloc", f"load:{static}", "sleep:2000", "mark:slept", devices=gpu)
        self.assert_judged_once_before(run, static, "slept")
        # ... and a process that ends first, at its exit, before the summary
        run = self.arch("alloc", f"load:{static}", devices=gpu)
        self.assertEqual(list(self.arch_events(run)), [static])
        self.assertEqual(len(self.lines_about(run, static)), 1, run.err)
        lines = self.shim_lines(run)
        self.assertIn("no kernel image", lines[0])
        self.assertIn("peak", lines[-1])  # the summary comes after
        self.sanitizer_clean(run)

    def test_judged_once_whatever_finds_it(self):
        # every cold point after the load: the tick, the runtime's start, a
        # lookup by name, the exit; a library that runs: an event, no line
        gpu = GPUS[(12, 0)]
        bad = os.path.join(ARCH, "libarch_sass80.so")
        good = os.path.join(ARCH, "libarch_sm120.so")
        run = self.arch("alloc", f"load:{good}", f"load:{bad}", "sleep:1200", "call:arch_alloc",
                        "lookup:cuMemAlloc_v2", devices=gpu)
        self.assertEqual(run.rc, 0, run.err)
        self.assertEqual(sorted(self.arch_events(run)), sorted([bad, good]))
        self.assertEqual(len(run.of("arch")), 2)
        self.assertTrue(self.arch_events(run)[good]["ok"])
        self.assertEqual([l.split()[1] for l in self.shim_lines(run) if "no kernel image" in l],
                         [bad])

    def test_sm80_library_on_a_cc_12_gpu(self):
        sass80 = os.path.join(ARCH, "libarch_sass80.so")
        ptx80 = os.path.join(ARCH, "libarch_ptx80.so")
        run = self.arch(f"load:{sass80}", f"load:{ptx80}", "alloc", devices=GPUS[(12, 0)])
        lines = [l for l in self.shim_lines(run) if "no kernel image" in l]
        self.assertEqual(len(lines), 1, run.err)
        line = lines[0]
        for part in (sass80, "GPU0 NVIDIA GeForce RTX 5090", "compute capability 12.0",
                     "carries SASS sm_80, no PTX", "no kernel image is available for execution",
                     "Fix:", "arch=compute_120,code=sm_120"):
            self.assertIn(part, line)
        events = self.arch_events(run)
        self.assertFalse(events[sass80]["ok"])
        self.assertIn("no kernel image for sm_120", events[sass80]["message"])
        self.assertTrue(events[ptx80]["ok"])  # PTX the driver can JIT: no line
        self.assertIn("JIT compilation of PTX compute_80", events[ptx80]["message"])

    def test_registration_reaches_the_runtime(self):
        libs = self.libs("shared")
        cmds = [f"load:{p}" for p in libs] + ["modules"]
        plain = self.arch(*cmds, devices=GPUS[(8, 6)], preload=False)
        guarded = self.arch(*cmds, devices=GPUS[(8, 6)])
        self.assertEqual(plain.out, guarded.out)
        self.assertIn(f"modules: {len(libs)}\n", guarded.out)
        # no CUDA call: nothing written, nothing said, though registrations came
        self.assertEqual(guarded.files, [])
        self.assertEqual(guarded.err, "")

    def test_unloaded_and_loaded_again(self):
        a = os.path.join(ARCH, "libarch_sass80_shared.so")
        b = os.path.join(ARCH, "libarch_sm120_shared.so")
        run = self.arch("alloc", f"load:{a}", "unload", f"load:{b}", "unload", f"load:{a}",
                        "modules", devices=GPUS[(12, 0)])
        self.assertEqual(run.rc, 0, run.err)
        self.assertIn("modules: 1\n", run.out)  # unregistered at each unload
        self.assertEqual([(e["module"], e["ok"]) for e in run.of("arch")],
                         [(a, False), (b, True)])  # once each, though `a` came back
        self.assertEqual(len([l for l in self.shim_lines(run) if "no kernel image" in l]), 1)

    def test_several_gpus(self):
        sass80 = os.path.join(ARCH, "libarch_sass80_shared.so")
        devices = ";".join([GPUS[(8, 6)], GPUS[(12, 0)], GPUS[(8, 6)]])
        run = self.arch(f"load:{sass80}", "alloc", devices=devices)
        evs = sorted(run.of("arch"), key=lambda e: e["dev"])
        self.assertEqual([(e["dev"], e["devs"], e["cc"], e["ok"]) for e in evs],
                         [(0, [0, 2], "8.6", True), (1, [1], "12.0", False)])
        # GPU0 and GPU2 run it: no line
        self.assertEqual([l for l in self.shim_lines(run) if "no kernel image" in l], [])
        run = self.arch(f"load:{sass80}", "alloc", devices=f"{GPUS[(12, 0)]};{GPUS[(9, 0)]}")
        lines = [l for l in self.shim_lines(run) if "no kernel image" in l]
        self.assertEqual(len(lines), 1)
        self.assertIn("GPU0 NVIDIA GeForce RTX 5090", lines[0])
        self.assertIn("(nor for the other GPU)", lines[0])

    def test_many_objects_loaded_before_the_start(self):
        # more objects than one scan pass takes (a Python process has hundreds)
        plain = os.path.join(BUILD, "fake", "libnccllike.so")
        copies = []
        for i in range(300):
            copies.append(os.path.join(self.tmp, f"libplain{i}.so"))
            shutil.copy(plain, copies[-1])
        lib = os.path.join(ARCH, "libarch_sm120.so")
        run = self.arch(*[f"load:{c}" for c in copies], f"load:{lib}", "alloc",
                        devices=GPUS[(12, 0)])
        self.assertEqual(run.rc, 0, run.err)
        self.assertEqual(list(self.arch_events(run)), [lib])
        self.assertTrue(run.one("arch")["ok"])

    def test_file_gone_judged_from_the_registered_fat_binaries(self):
        copy = os.path.join(self.tmp, "libgone.so")
        shutil.copy(os.path.join(ARCH, "libarch_multi_shared.so"), copy)
        run = self.arch(f"load:{copy}", f"unlink:{copy}", "alloc", devices=GPUS[(8, 0)])
        ev = self.arch_events(run)[copy]
        self.assertEqual(ev["source"], "registered")
        self.assertEqual(ev["sass"], ["sm_75", "sm_86", "sm_90"])
        self.assertFalse(ev["ok"])

    def corrupt_copy(self, name, every):
        corrupt = os.path.join(self.tmp, ("all_" if every else "first_") + name)
        with open(os.path.join(ARCH, name), "rb") as f:
            data = f.read()
        magic = b"\x50\xed\x55\xba"  # a fat binary's
        if every:
            data = data.replace(magic, b"XXXX")
        else:
            data = data.replace(magic, b"XXXX", 1)
        with open(corrupt, "wb") as f:
            f.write(data)
        return corrupt

    def test_corrupt_device_code_is_journaled_not_judged(self):
        for name in ("libarch_sass80.so", "libarch_sass80_shared.so"):
            with self.subTest(lib=name):
                corrupt = self.corrupt_copy(name, every=True)
                run = self.arch(f"load:{corrupt}", "alloc", devices=GPUS[(12, 0)])
                self.assertEqual(run.rc, 0, run.err)
                self.assertEqual(run.of("arch"), [])
                errors = [e["message"] for e in run.of("error")]
                self.assertEqual(len(errors), 1, errors)
                self.assertRegex(errors[0], re.escape(corrupt) + r": cannot read its device code: "
                                 r"corrupt device code: no fat-binary magic .*not checked$")
                self.assertEqual([l for l in self.shim_lines(run) if corrupt in l], [])
                self.sanitizer_clean(run)

    def test_corrupt_file_judged_from_what_registered(self):
        # the first fat binary is nvcc's device-link stub, which this library
        # never registers: its code, registered, is still readable
        corrupt = self.corrupt_copy("libarch_sass80_shared.so", every=False)
        run = self.arch(f"load:{corrupt}", "alloc", devices=GPUS[(8, 6)])
        ev = run.one("arch")
        self.assertEqual((ev["source"], ev["sass"], ev["ok"]), ("registered", ["sm_80"], True))
        self.assertIn("judged from the fat binaries it registered", run.one("error")["message"])

    def test_mode_off_is_invisible(self):
        lib = os.path.join(ARCH, "libarch_sass80_shared.so")
        run = self.run_prog([PROG, f"load:{lib}", "modules", "alloc"],
                            env=base_env(devices=GPUS[(12, 0)], GPUGUARD_MODE="off"))
        self.assertEqual(run.rc, 0)
        self.assertEqual(run.out, "modules: 1\narchprog: done\n")
        self.assertEqual((run.err, run.files), ("", []))

    def test_fix_for_a_torch_library(self):
        torch_lib = os.path.join(self.tmp, "site", "torch", "lib")
        os.makedirs(torch_lib)
        lib = os.path.join(torch_lib, "libtorch_cuda.so")
        shutil.copy(os.path.join(ARCH, "libarch_multi.so"), lib)
        run = self.arch(f"load:{lib}", "alloc", devices=GPUS[(12, 0)])
        line = [l for l in self.shim_lines(run) if "no kernel image" in l][0]
        self.assertIn("Fix: install PyTorch 2.7 or newer built with CUDA 12.8 or newer", line)


class FromWheels(ArchCase):
    """The line in its user's terms: nvcc-built libraries laid out as pip
    installs PyTorch's CUDA wheels (site-packages/torch/lib,
    site-packages/nvidia/nccl/lib, each wheel's .dist-info and its RECORD)
    and a third party's extension; loaded after the start, each with its
    static runtime never started."""

    TORCH = "torch/lib/libtorch_cuda.so"
    NCCL = "nvidia/nccl/lib/libnccl.so.2"
    EXT = "flash_attn_2_cuda.cpython-312-x86_64-linux-gnu.so"
    DISTS = {TORCH: "torch-2.6.0+cu124", NCCL: "nvidia_nccl_cu12-2.21.5",
             EXT: "flash_attn-2.7.4.post1"}

    def install(self, libs):
        """{relative path: the library copied there}: their paths."""
        site = os.path.join(self.tmp, "venv", "lib", "python3.12", "site-packages")
        paths = {}
        for rel, src in libs.items():
            paths[rel] = os.path.join(site, rel)
            os.makedirs(os.path.dirname(paths[rel]), exist_ok=True)
            shutil.copy(src, paths[rel])
            info = os.path.join(site, self.DISTS[rel] + ".dist-info")
            os.makedirs(info, exist_ok=True)
            with open(os.path.join(info, "RECORD"), "a") as f:
                f.write(f"{rel},sha256=0,1\n")
        # another CUDA's NCCL wheel, which does not hold the file
        info = os.path.join(site, "nvidia_nccl_cu11-2.19.3.dist-info")
        os.makedirs(info, exist_ok=True)
        with open(os.path.join(info, "RECORD"), "w") as f:
            f.write("nvidia/nccl/lib/libnccl.so.2.19,sha256=0,1\n")
        return paths

    def late(self, paths, *order):
        run = self.arch("alloc", *[f"load:{paths[rel]}" for rel in order], devices=GPUS[(12, 0)])
        self.assertEqual(run.rc, 0, run.err)
        return run

    def line(self, run, path):
        lines = [l for l in self.shim_lines(run) if "no kernel image" in l]
        self.assertEqual([l.split()[1] for l in lines], [path], run.err)
        return lines[0]

    def test_nccl_of_the_torch_wheels(self):
        paths = self.install({self.TORCH: os.path.join(ARCH, "libarch_ptx80.so"),
                              self.NCCL: os.path.join(ARCH, "libarch_sass80.so")})
        run = self.late(paths, self.TORCH, self.NCCL)
        events = self.arch_events(run)
        self.assertTrue(events[paths[self.TORCH]]["ok"])  # PyTorch runs by JIT of its PTX
        nccl = events[paths[self.NCCL]]
        self.assertFalse(nccl["ok"])
        whose = ("It is NCCL, from the wheel nvidia-nccl-cu12 2.21.5, which PyTorch here (the "
                 "wheel torch 2.6.0+cu124) uses for its multi-GPU collectives (torch.distributed).")
        fix = ("Fix: install PyTorch 2.7 or newer built with CUDA 12.8 or newer, whose wheels "
               "carry sm_100 and sm_120 (pip install torch --index-url "
               "https://download.pytorch.org/whl/cu128); that PyTorch brings its own NCCL (the "
               "nvidia-nccl-cu12 wheel)")
        self.assertEqual(nccl["message"], "no kernel image for sm_120: the module carries SASS "
                         "sm_80, no PTX. " + whose + " " + fix)
        line = self.line(run, paths[self.NCCL])
        self.assertTrue(line.endswith('"no kernel image is available for execution on the '
                                      'device". ' + whose + " " + fix), line)
        self.assertNotIn("rebuild", line)
        # gpuguard-check says the same of the same files
        out = self.check("--arch", paths[self.TORCH], paths[self.NCCL], devices=GPUS[(12, 0)])
        self.assertEqual(out.returncode, 1)
        self.assertIn(f"GPU 0 (sm_120): {paths[self.NCCL]}: {whose} {fix}\n", out.stdout)
        self.assertNotIn("rebuild", out.stdout)

    def test_pytorch_of_a_wheel_that_cannot_run(self):
        paths = self.install({self.TORCH: os.path.join(ARCH, "libarch_multi.so")})
        line = self.line(self.late(paths, self.TORCH), paths[self.TORCH])
        self.assertIn("no PTX, so its kernels fail with \"no kernel image is available for "
                      "execution on the device\". It is one of PyTorch's own libraries, from "
                      "the wheel torch 2.6.0+cu124. Fix: install PyTorch 2.7 or newer built with "
                      "CUDA 12.8 or newer", line)

    def test_an_extension_of_another_wheel(self):
        paths = self.install({self.TORCH: os.path.join(ARCH, "libarch_ptx80.so"),
                              self.EXT: os.path.join(ARCH, "libarch_sass80.so")})
        line = self.line(self.late(paths, self.TORCH, self.EXT), paths[self.EXT])
        self.assertIn("It comes from the wheel flash-attn 2.7.4.post1. Fix: install a build of "
                      "flash-attn made for sm_120 with CUDA 12.8 or newer, or rebuild it (nvcc "
                      "-gencode arch=compute_120,code=sm_120)", line)
        self.assertNotIn("PyTorch", line)


class InstalledTorch(ArchCase):
    """The torch python3 imports, faked: a package directory on PYTHONPATH
    whose lib/ holds nvcc-built libraries."""

    def fake_torch(self, version, cuda, libs):
        site = os.path.join(self.tmp, "site")
        os.makedirs(os.path.join(site, "torch", "lib"))
        with open(os.path.join(site, "torch", "__init__.py"), "w") as f:
            f.write("raise ImportError('gpuguard-check must not import torch')\n")
        with open(os.path.join(site, "torch", "version.py"), "w") as f:
            f.write(f"__version__ = '{version}'\n")
            f.write(f"cuda: Optional[str] = {cuda!r}\n")
        for name, src in libs.items():
            shutil.copy(src, os.path.join(site, "torch", "lib", name))
        return site

    def env(self, devices, site):
        env = base_env(devices=devices)
        env["PYTHONPATH"] = site
        return env

    def test_paragraph_and_arch_without_files(self):
        site = self.fake_torch("2.6.0+cu124", "12.4", {
            "libtorch_cuda.so": os.path.join(ARCH, "libarch_multi_shared.so"),
            "libc10_cuda.so": os.path.join(ARCH, "libarch_sass80_shared.so"),
            "libtorch_cpu.so": os.path.join(BUILD, "fake", "libcuda.so.1"),  # no device code
        })
        for cc, runs_all in (((8, 6), True), ((12, 0), False), ((8, 0), False)):
            with self.subTest(cc=cc):
                env = self.env(GPUS[cc], site)
                listing = self.check(devices=None, env=env)
                self.assertEqual(listing.returncode, 0, listing.stderr)
                text = " ".join(listing.stdout.split("PyTorch 2.6.0+cu124", 1)[1].split())
                self.assertIn("(CUDA 12.4)", text)
                self.assertIn("(libc10_cuda.so, libtorch_cuda.so) carry SASS sm_75 sm_80 sm_86 "
                              "sm_90, no PTX", text)
                self.assertNotIn("libtorch_cpu.so", text)
                if runs_all:
                    self.assertIn("runs them", text)
                else:
                    self.assertIn(f"cannot: no kernel image for sm_{cc[0]}{cc[1]} in", text)
                    self.assertIn("no kernel image is available for execution on the device", text)
                if cc == (12, 0):
                    self.assertIn("for it, install PyTorch 2.7 or newer built with CUDA 12.8 or "
                                  "newer", text)
                    self.assertIn("libc10_cuda.so, libtorch_cuda.so, so", text)
                if cc == (8, 0):  # only libtorch_cuda.so lacks sm_80
                    self.assertIn("sm_80 in libtorch_cuda.so, so", text)
                out = self.check("--arch", devices=None, env=env)
                self.assertEqual(out.returncode, 0 if runs_all else 1, out.stdout)
                self.assertEqual(len([l for l in out.stdout.splitlines() if ": GPU 0 " in l]), 2)

    def test_cpu_only_torch(self):
        site = self.fake_torch("2.5.1+cpu", None, {})
        out = self.check("--arch", devices=None, env=self.env(GPUS[(8, 6)], site))
        self.assertEqual(out.returncode, 1)
        self.assertIn("CPU-only build", " ".join(out.stdout.split()))

    def test_no_torch(self):
        env = self.env(GPUS[(8, 6)], os.path.join(self.tmp, "empty"))
        listing = self.check(devices=None, env=env)
        self.assertEqual(listing.returncode, 0)
        self.assertNotIn("PyTorch", listing.stdout)
        out = self.check("--arch", devices=None, env=env)
        self.assertEqual(out.returncode, 2)
        self.assertIn("no torch", out.stderr)
