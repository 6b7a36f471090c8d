"""The "no kernel image is available" story with the real libraries: Debian's
PyTorch 2.6 was built for sm_50-sm_90 with PTX for compute_90, and its NCCL
(Debian's libnccl2) carries SASS up to sm_90 and no PTX. On a fake RTX 5090
(compute capability 12.0) libtorch_cuda runs by JIT compilation of its PTX
and NCCL cannot run: said by the shim at the first CUDA call (an `arch` event
per module, one stderr line for NCCL, in its user's terms: Debian's package,
the PyTorch that uses it, the PyTorch build to install) and by
gpuguard-check --arch before a launch. PyTorch itself warns that sm_120 is
not compatible. A library with NVIDIA's static runtime (nvcc's default),
dlopen'ed by the Python process after CUDA started and never called, is
judged too."""
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from torchrig import BUILD, RTX3090, RTX5090, Run, TorchCase, command  # noqa: E402

LIB = "usr/lib/x86_64-linux-gnu"
# What the shim says of NCCL, whatever Debian's versions (read from the rig's dpkg).
NCCL_FIX = ("Fix: install PyTorch 2.7 or newer built with CUDA 12.8 or newer, whose wheels carry "
            "sm_100 and sm_120 (pip install torch --index-url "
            "https://download.pytorch.org/whl/cu128); that PyTorch brings its own NCCL (the "
            "nvidia-nccl-cu12 wheel)")


class RealLibrariesOnAnRtx5090(TorchCase):
    def arch_events(self, run):
        return {os.path.basename(e["module"]): e for e in run.of("arch")}

    def version(self, package):
        """The installed version of a package of the rig, from its dpkg."""
        with open(os.path.join(self.sess.root, "var/lib/dpkg/status")) as f:
            for stanza in f.read().split("\n\n"):
                fields = dict(l.split(": ", 1) for l in stanza.splitlines() if ": " in l)
                if fields.get("Package") == package and fields.get("Architecture") in ("amd64",
                                                                                    "all"):
                    return fields["Version"]
        self.fail(f"{package} is not installed in the rig")

    def nccl_whose(self):
        return (f"It is NCCL, from the Debian package libnccl2 {self.version('libnccl2')}, which "
                f"PyTorch here (the Debian package libtorch-cuda-2.6 "
                f"{self.version('libtorch-cuda-2.6')}) uses for its multi-GPU collectives "
                f"(torch.distributed).")

    def test_the_shim_says_what_runs(self):
        run = self.torch("train.py", "--steps", "1", devices=RTX5090)
        self.assertRan(run)
        ev = self.arch_events(run)
        torch_cuda = ev["libtorch_cuda.so.2.6"]
        self.assertTrue(torch_cuda["ok"])
        self.assertEqual(torch_cuda["ptx"], ["compute_90"])
        self.assertIn("sm_90", torch_cuda["sass"])
        self.assertNotIn("sm_120", torch_cuda["sass"])
        self.assertIn("JIT compilation of PTX compute_90", torch_cuda["message"])
        nccl = ev["libnccl.so.2"]
        self.assertFalse(nccl["ok"])
        self.assertEqual(nccl["ptx"], [])
        self.assertIn("no kernel image", nccl["message"])
        self.assertTrue(nccl["message"].endswith(". " + self.nccl_whose() + " " + NCCL_FIX),
                        nccl["message"])
        lines = [l for l in run.err.splitlines() if l.startswith("gpuguard:") and "kernel image" in l]
        self.assertEqual(len(lines), 1, run.err)
        self.assertIn("libnccl.so.2", lines[0])
        self.assertIn("RTX 5090", lines[0])
        # in the user's terms: Debian's package, the PyTorch that uses it, which
        # PyTorch to install (not "rebuild it with nvcc")
        self.assertTrue(lines[0].endswith('"no kernel image is available for execution on the '
                                          'device". ' + self.nccl_whose() + " " + NCCL_FIX),
                        lines[0])
        self.assertNotIn("nvcc", lines[0])
        self.assertIn("sm_120 is not compatible with the current PyTorch installation", run.err)

    def test_on_an_rtx_3090_everything_runs(self):
        run = self.torch("train.py", "--steps", "1", devices=RTX3090)
        self.assertRan(run)
        ev = self.arch_events(run)
        self.assertTrue(ev["libtorch_cuda.so.2.6"]["ok"])
        self.assertTrue(ev["libnccl.so.2"]["ok"])
        self.assertNotIn("JIT", ev["libtorch_cuda.so.2.6"]["message"])
        self.assertFalse([l for l in run.err.splitlines() if "kernel image" in l])

    def test_gpuguard_check_before_a_launch(self):
        """gpuguard-check --arch on the very files, read from outside the chroot."""
        root = self.sess.root
        files = [os.path.join(root, LIB, "libtorch_cuda.so.2.6.0"), os.path.join(root, LIB, "libnccl.so.2")]
        env = dict(os.environ, FAKECUDA_DEVICES=RTX5090,
                   LD_LIBRARY_PATH=os.path.join(BUILD, "fake"))
        out = subprocess.run([os.path.join(BUILD, "gpuguard-check"), "--arch", *files], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=300)
        lines = {os.path.basename(l.split(":", 1)[0]): l for l in out.stdout.splitlines()
                 if l.startswith(root)}
        self.assertNotIn("CANNOT RUN", lines["libtorch_cuda.so.2.6.0"])
        self.assertIn("JIT compilation of PTX", lines["libtorch_cuda.so.2.6.0"])
        self.assertIn("CANNOT RUN", lines["libnccl.so.2"])
        self.assertNotEqual(out.returncode, 0)  # a file that cannot run: not all good

    def test_gpuguard_check_in_the_users_terms(self):
        """... and run where they are installed (the rig's dpkg): the fix for
        NCCL is the shim's."""
        lib = os.path.join(self.sess.host_dir, "lib")
        shutil.copy2(os.path.join(BUILD, "gpuguard-check"), lib)
        argv = command([self.sess.dir + "/lib/gpuguard-check", "--arch", "/" + LIB +
                        "/libtorch_cuda.so.2.6.0", "/" + LIB + "/libnccl.so.2"],
                       self.sess.inside(self.tmp), preload=False, devices=RTX5090)
        out = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             timeout=300)
        self.assertEqual(out.returncode, 1, out.stderr)
        self.assertIn(f"GPU 0 (sm_120): /{LIB}/libnccl.so.2: {self.nccl_whose()} {NCCL_FIX}\n",
                      out.stdout)
        self.assertNotIn("rebuild", out.stdout)


class AStaticRuntimeLibraryLoadedLater(TorchCase):
    """An extension of a wheel built by nvcc here for sm_80 with the static
    runtime (tests/arch), dlopen'ed by PyTorch's process once CUDA runs and
    never called: nothing of it goes through the shim."""

    SCRIPT = """
import ctypes, sys, time
import torch
x = torch.ones(1 << 20, device="cuda")
lib = ctypes.CDLL(sys.argv[1])
print("loaded", file=sys.stderr, flush=True)
time.sleep(float(sys.argv[2]))
print("slept", file=sys.stderr, flush=True)
"""

    def setUp(self):
        super().setUp()
        built = os.path.join(BUILD, "arch", "libarch_sass80.so")
        if not os.path.exists(built):
            self.skipTest(f"no {built}: nvcc builds it (tests/arch/arch.mk)")
        site = os.path.join(self.tmp, "site-packages")
        rel = "flash_attn_2_cuda.cpython-313-x86_64-linux-gnu.so"
        os.makedirs(os.path.join(site, "flash_attn-2.7.4.post1.dist-info"))
        with open(os.path.join(site, "flash_attn-2.7.4.post1.dist-info", "RECORD"), "w") as f:
            f.write(f"{rel},sha256=0,1\n")
        shutil.copy(built, os.path.join(site, rel))
        self.ext = self.sess.inside(os.path.join(site, rel))
        self.script = os.path.join(self.tmp, "late.py")
        with open(self.script, "w") as f:
            f.write(self.SCRIPT)

    def late(self, sleep):
        run_dir = tempfile.mkdtemp(prefix="r-", dir=self.tmp)
        os.chmod(run_dir, 0o777)
        argv = command(["/usr/bin/python3", self.sess.inside(self.script), self.ext, str(sleep)],
                       self.sess.inside(run_dir), devices=RTX5090)
        proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              timeout=600)
        run = Run(proc, run_dir)
        self.assertRan(run)
        return run

    def assert_judged(self, run):
        events = [e for e in run.of("arch") if e["module"] == self.ext]
        self.assertEqual(len(events), 1, run.err)
        self.assertFalse(events[0]["ok"])
        self.assertEqual(events[0]["sass"], ["sm_80"])
        lines = [l for l in run.err.splitlines() if l.startswith("gpuguard: " + self.ext)]
        self.assertEqual(len(lines), 1, run.err)
        self.assertIn("RTX 5090", lines[0])
        self.assertIn("It comes from the wheel flash-attn 2.7.4.post1. Fix: install a build of "
                      "flash-attn made for sm_120 with CUDA 12.8 or newer", lines[0])
        return run.err.splitlines().index(lines[0])

    def test_judged_by_the_shims_thread(self):
        run = self.late(2)
        at = self.assert_judged(run)
        err = run.err.splitlines()
        self.assertLess(err.index("loaded"), at)
        self.assertLess(at, err.index("slept"))  # within a tick, not at the exit

    def test_judged_at_the_exit(self):
        run = self.late(0)
        at = self.assert_judged(run)
        summary = [i for i, l in enumerate(run.err.splitlines()) if "peak" in l]
        self.assertLess(at, summary[0])
