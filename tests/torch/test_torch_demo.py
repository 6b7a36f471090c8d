"""`make demo TORCH=real`: the demo's story with real PyTorch 2.6 on the fake
RTX 3090 (tools/demo/demo.py --rig). Unguarded, PyTorch's own allocator runs
the device out of memory and the trainer dies of torch.OutOfMemoryError;
under the shipped rtx-3090 policy the shim forecasts the steps that would
enter the near-miss zone, the helper splits the loader's batch, and the run
finishes every step."""
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from torchrig import BUILD, ROOT, TorchCase  # noqa: E402

DEMO = os.path.join(ROOT, "tools", "demo", "demo.py")


class RealDemo(TorchCase):
    def test_the_story_with_real_pytorch(self):
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("GPUGUARD_", "FAKECUDA_")) and k != "LD_PRELOAD"}
        env["GG_BUILD"] = BUILD
        # on the host, outside the rig: no path in the chroot looks like it
        out_dir = tempfile.mkdtemp(prefix="demo-out-")
        self.addCleanup(shutil.rmtree, out_dir, ignore_errors=True)
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
        # the shim's lines name the journal where it is on the host, not in the chroot
        said = re.findall(r"^   gpuguard: GPU0 .*; journal (\S+)$", out, re.M)
        self.assertEqual(len(said), 2, out[-4000:])
        for path in said:
            self.assertEqual(os.path.dirname(path), out_dir)
            self.assertTrue(os.path.exists(path), path)
        self.assertNotRegex("\n".join(l for l in out.splitlines() if "gpuguard:" in l),
                            r"(?<![\w/])/tmp/gg-")
        # run 3, under the recommended policy, as the simulated story has it:
        # the recommendation's words are what its helper then does
        self.assertIn("Run 3: the next run, under the recommended policy", out)
        m = re.search(r"NVIDIA GeForce RTX 3090: each batch of 32 as (\d+) micro-batches of at "
                      r"most (\d+) \(effective 32", out)
        self.assertIsNotNone(m, out[-4000:])
        self.assertIn("gpuguard: from batch 1 on, each batch of 32 is split into %s micro-batches "
                      "of at most %s (policy %s" % (m.group(1), m.group(2),
                                                    os.path.join(out_dir, "next", "nvidia-geforce-"
                                                                 "rtx-3090.ini")), out)
        self.assertRegex(out, r"next run: +finished every step \(exit status 0, [\d.]+ s\), "
                              r"started at micro-batch %s, 0 advice, 0 near misses" % m.group(2))
        self.assertTrue(out.rstrip().endswith("story: as expected"))
        journals = [n for n in os.listdir(out_dir) if n.endswith(".jsonl")]
        self.assertEqual(len(journals), 2, journals)
        self.assertTrue(os.path.exists(os.path.join(out_dir, "report.html")))
