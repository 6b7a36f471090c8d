"""The Python helper, installed: `make install` and `pip install tools/python`
put the same package in place, and it works from there."""
import filecmp
import os
import re
import shutil
import subprocess
import sys

from gg import BUILD, PYHELPER, ROOT, SANITIZE, Case

PACKAGE = os.path.join(PYHELPER, "gpuguard")


def tree(top):
    """{relative path: bytes} of the files under `top`."""
    out = {}
    for d, _, files in os.walk(top):
        for name in files:
            path = os.path.join(d, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, top)] = f.read()
    return out


def pip_python():
    """A Python that can build tools/python offline (pip, setuptools, and
    wheel where setuptools still needs it), or None."""
    probe = ("import setuptools, pip, sys\n"
             "if tuple(int(x) for x in setuptools.__version__.split('.')[:2]) < (70, 1):\n"
             "    import wheel\n")
    for python in (sys.executable, "/usr/bin/python3"):
        if os.path.exists(python) and subprocess.run(
                [python, "-c", probe], stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL).returncode == 0:
            return python
    return None


class Installed(Case):
    def make_install(self):
        dest = os.path.join(self.tmp, "dest")
        make = subprocess.run(
            ["make", "-s", "--no-print-directory", "install", "DESTDIR=" + dest, "PREFIX=/usr",
             "BUILD=" + os.path.relpath(BUILD, ROOT), "SANITIZE=" + SANITIZE],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            universal_newlines=True, timeout=600)
        self.assertEqual(make.returncode, 0, make.stdout)
        return os.path.join(dest, "usr", "share", "gpuguard", "python")

    def imports(self, path):
        code = ("import gpuguard, gpuguard.adapters.hf, gpuguard.adapters.lightning\n"
                "print(gpuguard.__version__, gpuguard.__file__)")
        env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "PYTHONPATH")}
        env["PYTHONPATH"] = path
        out = subprocess.run([sys.executable, "-c", code], env=env, cwd=self.tmp,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             universal_newlines=True)
        self.assertEqual(out.returncode, 0, out.stderr)
        version, where = out.stdout.split()
        self.assertTrue(where.startswith(path), where)
        return version

    def test_make_install_puts_the_package_and_only_it(self):
        python = self.make_install()
        pkg = os.path.join(python, "gpuguard")
        os.makedirs(os.path.join(pkg, "stale"))         # left by an older install
        open(os.path.join(pkg, "_gone.py"), "w").close()
        python = self.make_install()
        source = {k: v for k, v in tree(PACKAGE).items() if k.endswith(".py")}
        self.assertEqual(tree(pkg), source)
        version = self.imports(python)
        with open(os.path.join(ROOT, "include", "gpuguard.h")) as f:
            header = re.search(r'GPUGUARD_VERSION "([^"]+)"', f.read()).group(1)
        self.assertEqual(version, header)

    def test_pip_install_puts_the_same_package(self):
        python = pip_python()
        if python is None:
            self.skipTest("no Python here with pip, setuptools and wheel to build tools/python "
                          "offline (Debian: apt-get install python3-pip python3-setuptools "
                          "python3-wheel)")
        # From a copy: setuptools builds in the source tree (build/, *.egg-info).
        src = os.path.join(self.tmp, "src")
        shutil.copytree(PYHELPER, src, ignore=shutil.ignore_patterns(
            "tests", "__pycache__", "build", "*.egg-info"))
        target = os.path.join(self.tmp, "site")
        pip = subprocess.run([python, "-m", "pip", "install", "--quiet", "--no-index",
                              "--no-build-isolation", "--no-compile", "--no-deps",
                              "--disable-pip-version-check", "--target", target, src],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             universal_newlines=True, timeout=600)
        self.assertEqual(pip.returncode, 0, pip.stdout)
        installed = self.make_install()
        cmp = filecmp.dircmp(os.path.join(target, "gpuguard"), os.path.join(installed, "gpuguard"))
        self.assertEqual((cmp.left_only, cmp.right_only, cmp.diff_files), ([], [], []))
        self.assertEqual(tree(os.path.join(target, "gpuguard")),
                         tree(os.path.join(installed, "gpuguard")))
        version = self.imports(target)
        self.assertEqual(version, self.imports(installed))
        dist = [d for d in os.listdir(target) if d.endswith(".dist-info")]
        self.assertEqual(dist, ["gpuguard-%s.dist-info" % version])
        with open(os.path.join(target, dist[0], "METADATA")) as f:
            metadata = f.read()
        self.assertNotIn("Requires-Dist", metadata)     # standard library only
