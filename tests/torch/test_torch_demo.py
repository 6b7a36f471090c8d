"""`make demo TORCH=real`: the demo's story with real PyTorch 2.6 on the fake
RTX 3090 (tools/demo/demo.py --rig). Unguarded, PyTorch's own allocator runs
the device out of memory and the trainer dies of torch.OutOfMemoryError;
under the shipped rtx-3090 policy the shim forecasts the steps that would
enter the near-miss zone, the helper splits the loader's batch, and the run
finishes every step."""
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from torchrig import BUILD, ROOT, TorchCase  # noqa: E402

DEMO = os.path.join(ROOT, "tools", "demo", "demo.py")


class RealDemo(TorchCase):
    def test_the_story_with_real_pytorch(self):
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("GPUGUARD_", "FAKECUDA_")) and k != "LD_PRELOAD"}
        env["GG_BUILD"] = BUILD
        out_dir = os.path.join(self.tmp, "demo")
        proc = subprocess.run([sys.executable, DEMO, "--rig", "--out", out_dir], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              timeout=600)
        out = proc.stdout
        self.assertEqual(proc.returncode, 0, out[-4000:] + proc.stderr[-2000:])
        self.assertIn("Debian's python3-torch-cuda 2.6", out)
        self.assertRegex(out, r"=> it died: torch\.OutOfMemoryError: CUDA out of memory\. Tried to "
                              r"allocate [\d.]+ [MG]iB\. GPU 0 has a total capacity of 24\.00 GiB")
        self.assertIn("finished: 28/28 steps, 896 samples (effective batch 32 per step)", out)
        self.assertIn("=> it finished every step (exit status 0", out)
        self.assertRegex(out, r"batch 32 -> 16 -> 8; 2 advice \(forecast, forecast\), the first "
                              r"before any near miss, refusal or OOM")
        self.assertTrue(out.rstrip().endswith("story: as expected"))
        journals = [n for n in os.listdir(out_dir) if n.endswith(".jsonl")]
        self.assertEqual(len(journals), 1, journals)
        self.assertTrue(os.path.exists(os.path.join(out_dir, "report.html")))
