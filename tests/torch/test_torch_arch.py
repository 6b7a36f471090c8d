"""The "no kernel image is available" story with the real libraries: Debian's
PyTorch 2.6 was built for sm_50-sm_90 with PTX for compute_90, and its NCCL
carries SASS up to sm_90 and no PTX. On a fake RTX 5090 (compute capability
12.0) libtorch_cuda runs by JIT compilation of its PTX and NCCL cannot run:
said by the shim at the first CUDA call (an `arch` event per module, one
stderr line for NCCL) and by gpuguard-check --arch before a launch. PyTorch
itself warns that sm_120 is not compatible."""
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from torchrig import BUILD, RTX3090, RTX5090, TorchCase  # noqa: E402

LIB = "usr/lib/x86_64-linux-gnu"


class RealLibrariesOnAnRtx5090(TorchCase):
    def arch_events(self, run):
        return {os.path.basename(e["module"]): e for e in run.of("arch")}

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
        lines = [l for l in run.err.splitlines() if l.startswith("gpuguard:") and "kernel image" in l]
        self.assertEqual(len(lines), 1, run.err)
        self.assertIn("libnccl.so.2", lines[0])
        self.assertIn("RTX 5090", lines[0])
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
