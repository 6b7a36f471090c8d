"""How gpuguard-preflight puts the simulated CUDA libraries in front of a
PyTorch wheel's own (docs/preflight.md, "PyTorch from pip"), shown with the
dynamic loader itself on libraries built here, shaped as a wheel's are.

A wheel's libtorch finds libcudart.so.12 and libcublas.so.12 in its
nvidia/*/lib directories by DT_RPATH, which the loader searches before
LD_LIBRARY_PATH (ld.so(8)); torch/__init__.py may also load them by full
path (_preload_cuda_deps). What does come first: a library already loaded
whose SONAME is the name asked for (glibc's _dl_map_object matches loaded
objects' names before any search) - so preloading the simulated library
under the same SONAME puts it in place whatever the RPATH, and symbols bind
to it first even when the real one is loaded again by path. Debian's build
has no RPATH: there LD_LIBRARY_PATH is enough, as for the rig.
"""
import os
import subprocess
import sys

from gg import Case, PYHELPER

sys.path.insert(0, PYHELPER)
from gpuguard.preflight.runner import elf_needed  # noqa: E402

LIB = "int which_cudart(void) { return %d; }\n"
TORCHY = "int which_cudart(void);\nint torchy(void) { return which_cudart(); }\n"


class WheelLoading(Case):
    def setUp(self):
        super().setUp()
        self.real = os.path.join(self.tmp, "nvidia", "cuda_runtime", "lib")
        self.sim = os.path.join(self.tmp, "sim")
        self.torch = os.path.join(self.tmp, "torch", "lib")
        for d in (self.real, self.sim, self.torch):
            os.makedirs(d)
        self.cc(LIB % 1, os.path.join(self.real, "libcudart.so.12"), soname="libcudart.so.12")
        self.cc(LIB % 2, os.path.join(self.sim, "libcudart.so.12"), soname="libcudart.so.12")
        # as a wheel's: DT_RPATH to the nvidia directory; and as Debian's: none
        self.cc(TORCHY, os.path.join(self.torch, "libtorch_cuda.so"),
                link=["-L" + self.real, "-l:libcudart.so.12", "-Wl,--disable-new-dtags",
                      "-Wl,-rpath," + self.real])
        self.cc(TORCHY, os.path.join(self.torch, "libtorch_cuda_runpath.so"),
                link=["-L" + self.real, "-l:libcudart.so.12", "-Wl,--enable-new-dtags",
                      "-Wl,-rpath," + self.real])

    def cc(self, src, out, soname=None, link=()):
        c = out + ".c"
        with open(c, "w") as f:
            f.write(src)
        cmd = ["cc", "-shared", "-fPIC", "-o", out, c] + list(link)
        if soname:
            cmd.insert(1, "-Wl,-soname," + soname)
        subprocess.run(cmd, check=True)

    def which(self, lib="libtorch_cuda.so", by_path_first=False, **env):
        """Which libcudart the torch library's call reaches: 1 the real, 2
        the simulated."""
        code = ("import ctypes, sys\n"
                "if %r:\n    ctypes.CDLL(%r, mode=ctypes.RTLD_GLOBAL)\n"
                "print(ctypes.CDLL(%r).torchy())\n" % (
                    by_path_first, os.path.join(self.real, "libcudart.so.12"),
                    os.path.join(self.torch, lib)))
        e = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "LD_LIBRARY_PATH")}
        e.update(env)
        out = subprocess.run([sys.executable, "-c", code], env=e, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, universal_newlines=True)
        self.assertEqual(out.returncode, 0, out.stderr)
        return int(out.stdout.strip())

    def test_rpath_beats_the_library_path_and_a_preload_beats_both(self):
        self.assertEqual(self.which(), 1)
        self.assertEqual(self.which(LD_LIBRARY_PATH=self.sim), 1)      # DT_RPATH first
        sim = os.path.join(self.sim, "libcudart.so.12")
        self.assertEqual(self.which(LD_PRELOAD=sim), 2)                # the SONAME is loaded
        # torch/__init__.py loading the real one by path first: a second
        # copy comes in, and the calls still reach the preloaded one
        self.assertEqual(self.which(by_path_first=True, LD_PRELOAD=sim), 2)

    def test_without_rpath_the_library_path_is_enough(self):
        self.assertEqual(self.which("libtorch_cuda_runpath.so"), 1)
        self.assertEqual(self.which("libtorch_cuda_runpath.so", LD_LIBRARY_PATH=self.sim), 2)

    def test_preflight_reads_what_a_library_links(self):
        needed, rpath = elf_needed(os.path.join(self.torch, "libtorch_cuda.so"))
        self.assertIn("libcudart.so.12", needed)
        self.assertTrue(rpath)
        needed, rpath = elf_needed(os.path.join(self.torch, "libtorch_cuda_runpath.so"))
        self.assertIn("libcudart.so.12", needed)
        self.assertFalse(rpath)
        self.assertEqual(elf_needed(os.path.join(self.tmp, "nothing.so")), ([], False))
