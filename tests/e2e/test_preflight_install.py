"""gpuguard-preflight as `make install` puts it: the command beside the
others, and the simulated GPU in <prefix>/lib/gpuguard/sim only, where no
loader looks (a libcuda.so.1 on the loader's path would break every GPU job
on the host); without PyTorch's CUDA build it says so and runs nothing."""
import os
import subprocess
import sys

from gg import BUILD, ROOT, SANITIZE, Case


class Installed(Case):
    def setUp(self):
        super().setUp()
        self.dest = os.path.join(self.tmp, "dest")
        make = subprocess.run(
            ["make", "-s", "--no-print-directory", "install", "DESTDIR=" + self.dest,
             "PREFIX=/usr", "BUILD=" + os.path.relpath(BUILD, ROOT), "SANITIZE=" + SANITIZE],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True,
            timeout=600)
        self.assertEqual(make.returncode, 0, make.stdout)
        self.prefix = os.path.join(self.dest, "usr")

    def test_the_simulated_gpu_is_where_no_loader_looks(self):
        sim = os.path.join(self.prefix, "lib", "gpuguard", "sim")
        self.assertEqual(sorted(os.listdir(sim)), sorted([
            "libcuda.so.1", "libcudart.so.12", "libcudart.so.13", "libnvidia-ml.so.1",
            "libcublas.so.12", "libcublasLt.so.12", "libcublas.so.13", "libcublasLt.so.13",
            "libcudnn.so.9"]))
        found = []
        for d, _, files in os.walk(self.dest):
            found += [os.path.join(d, f) for f in files
                      if f.startswith(("libcuda.so", "libcudart", "libnvidia-ml", "libcublas",
                                       "libcudnn"))]
        self.assertTrue(found)
        self.assertTrue(all(os.path.dirname(f) == sim for f in found), found)
        # nothing of the install is a directory the loader searches by itself
        self.assertFalse(os.path.exists(os.path.join(self.dest, "etc")))

    def test_the_command_is_installed_and_runs(self):
        pf = os.path.join(self.prefix, "bin", "gpuguard-preflight")
        self.assertTrue(os.access(pf, os.X_OK))
        out = subprocess.run([pf, "--help"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             universal_newlines=True)
        self.assertEqual(out.returncode, 0, out.stdout)
        self.assertIn("--gpu MODEL", out.stdout)
        self.assertTrue(os.path.isfile(os.path.join(self.prefix, "share", "gpuguard", "python",
                                                    "gpuguard", "preflight", "sandbox.py")))

    def test_without_pytorchs_cuda_build_nothing_runs(self):
        pf = os.path.join(self.prefix, "bin", "gpuguard-preflight")
        script = os.path.join(self.tmp, "train.py")
        with open(script, "w") as f:
            f.write("open(%r, 'w').write('ran')\n" % os.path.join(self.tmp, "ran"))
        # a Python with no torch at all, and (where Debian's is here) a CPU-only torch
        pythons = [sys.executable]
        probe = subprocess.run(["/usr/bin/python3", "-c", "import torch; print(torch.version.cuda)"],
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                               universal_newlines=True) if os.path.exists("/usr/bin/python3") \
            else None
        if probe is not None and probe.returncode == 0 and probe.stdout.strip() == "None":
            pythons.append("/usr/bin/python3")
        for python in pythons:
            has = subprocess.run([python, "-c", "import torch"], stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL).returncode == 0
            out = subprocess.run([pf, "--gpu", "rtx-3090", "--", python, script],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 universal_newlines=True, cwd=self.tmp)
            self.assertEqual(out.returncode, 3, out.stdout + out.stderr)
            self.assertIn("links no CUDA runtime" if has else "has no torch", out.stderr)
            self.assertIn("nothing would run on a GPU", out.stderr)
            self.assertFalse(os.path.exists(os.path.join(self.tmp, "ran")))
