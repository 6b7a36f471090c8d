"""`tests/torch/rig run -- python3 script.py`: a user's own script, in the
directory it is started from, run in the rig with the installed gpuguard (the
shim, the fakes, the helper, gpuguard-run and its instrumentation, the shipped
policies). The directory is mounted in the chroot: the script reads and writes
its files there, and its journal lands there, on the host."""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from torchrig import BUILD, RIG, TorchCase  # noqa: E402

SCRIPT = """\
import os, sys
import torch
with open("data.txt") as f:                      # read from the user's directory
    n = int(f.read())
x = torch.randn(n, 1024, 1024, device="cuda")    # n x 4 MiB
loss = (x * 2).square().mean()
print("allocated", torch.cuda.max_memory_allocated(), "gpu", torch.cuda.get_device_name(0))
with open("out.txt", "w") as f:                  # and written there
    f.write("cwd %s\\n" % os.getcwd())
sys.exit(int(os.environ.get("EXIT", "0")))
"""


class RigRun(TorchCase):
    def setUp(self):
        super().setUp()
        # the user's directory: on the host, outside the rig
        self.home = tempfile.mkdtemp(prefix="gg-user-")
        self.addCleanup(shutil.rmtree, self.home, ignore_errors=True)
        with open(os.path.join(self.home, "script.py"), "w") as f:
            f.write(SCRIPT)
        with open(os.path.join(self.home, "data.txt"), "w") as f:
            f.write("64\n")

    def rig_run(self, *args):
        env = dict(os.environ, GG_BUILD=BUILD)
        for k in list(env):
            if k.startswith(("GPUGUARD_", "FAKECUDA_")) or k == "LD_PRELOAD":
                del env[k]
        return subprocess.run([RIG, "run"] + list(args), cwd=self.home, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              timeout=600)

    def journals(self):
        return sorted(n for n in os.listdir(self.home) if n.endswith(".jsonl"))

    def test_a_users_script_from_its_directory(self):
        out = self.rig_run("--", "python3", "script.py")
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
        allocated = int(re.search(r"allocated (\d+) gpu NVIDIA GeForce RTX 3090", out.stdout)
                        .group(1))
        self.assertGreaterEqual(allocated, 64 * 4 << 20)
        # it ran in the chroot, in the mounted directory, and wrote here
        with open(os.path.join(self.home, "out.txt")) as f:
            inner = f.read().split()[1]
        self.assertTrue(inner.startswith("/tmp/gg-") and inner.endswith("/work"), inner)
        self.assertIn("rig run: python3 script.py, in %s (mounted at %s in the rig); under "
                      "gpuguard-run; journals land there" % (self.home, inner), out.stderr)
        # under the shim, instrumented by gpuguard-run: its journal is here
        (journal,) = self.journals()
        with open(os.path.join(self.home, journal)) as f:
            events = [json.loads(l) for l in f if l.strip()]
        start = [e for e in events if e["ev"] == "start"][0]
        self.assertEqual(start["devices"][0]["name"], "NVIDIA GeForce RTX 3090")
        self.assertTrue(start["devices"][0]["policy"].endswith("/policy/rtx-3090.ini"))
        (summary,) = [e for e in events if e["ev"] == "summary"]
        self.assertGreaterEqual(summary["devices"][0]["peak"], 64 * 4 << 20)
        self.assertIn("gpuguard: GPU0 NVIDIA GeForce RTX 3090: peak", out.stderr)
        # where the journal is on the host, and how to read it
        self.assertIn("rig run: journal %s\n" % os.path.join(self.home, journal), out.stderr)
        self.assertIn("--substitute-path %s %s\n" % (inner, self.home), out.stderr)
        # gpuguard-run's options, checked there as everywhere
        bad = self.rig_run("--headroom", "10parsecs", "--", "python3", "script.py")
        self.assertEqual(bad.returncode, 2)
        self.assertIn("gpuguard-run: --headroom '10parsecs': malformed size", bad.stderr)
        self.assertEqual(len(self.journals()), 1)

    def test_bare_the_exit_status_and_another_gpu(self):
        out = self.rig_run("--bare", "--gpu", "NVIDIA H100 80GB HBM3,80GiB,9.0", "--",
                           "sh", "-c", "EXIT=3 python3 script.py")
        self.assertEqual(out.returncode, 3, out.stderr)
        self.assertIn("gpu NVIDIA H100 80GB HBM3", out.stdout)
        self.assertIn("; without gpuguard", out.stderr)
        self.assertEqual(self.journals(), [])          # no shim, no journal
        self.assertNotIn("gpuguard:", out.stderr)

    def test_usage(self):
        for args in ([], ["python3", "script.py"], ["--"]):
            out = self.rig_run(*args)
            self.assertEqual(out.returncode, 2, args)
            self.assertIn("usage: tests/torch/rig run", out.stderr)
