"""The C API from C and C++ trainers: a program built with the flags of the
installed gpuguard.pc (`make install DESTDIR=...`) does not need
libgpuguard.so, runs without the preload (the API says "inactive"), and
reaches the guard when the shim is preloaded."""
import json
import os
import re
import shutil
import subprocess

from gg import BUILD, FAKE, ROOT, SANITIZE, GiB, Case, base_env, sanitizer_preload

CUDA_HOME = os.environ.get("CUDA_HOME", "/usr/local/cuda")

# One source, compiled as C and as C++: what a trainer does with the API.
CLIENT = r"""
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include <gpuguard.h>

static void *poll(void *arg)
{
    struct gpuguard_stats s;
    int *rc = (int *)arg;
    for (int i = 0; i < 1000; i++)
        *rc |= gpuguard_stats(0, &s) == 0 ? 1 : 2;
    return NULL;
}

int main(void)
{
    struct gpuguard_stats s;
    struct gpuguard_advice a;
    void *p = NULL;
    int rcs[4] = {0, 0, 0, 0};
    pthread_t th[4];

    printf("active %d\n", gpuguard_active());
    gpuguard_set_batch(8, 2);
    if (cudaMalloc(&p, 1ull << 30) != cudaSuccess)
        return 3;
    gpuguard_note("hello from " LANG);
    {
        long long dims[2] = {8, 512};       /* the step's token ids: batch first */
        gpuguard_step_shape(dims, 2, 0);
        gpuguard_step_needed(0, 1ull << 29); /* its tensors' peak: 512 MiB */
    }
    gpuguard_step(1);
    for (int i = 0; i < 4; i++)
        pthread_create(&th[i], NULL, poll, &rcs[i]);
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
    memset(&s, 0, sizeof s);
    int rc = gpuguard_stats(0, &s);
    printf("stats %d current %llu peak %llu name [%s] threads %d %d %d %d\n", rc, s.current,
           s.peak, s.name, rcs[0], rcs[1], rcs[2], rcs[3]);
    printf("advice %d\n", gpuguard_advice(&a));
    gpuguard_ack(0);
    printf("stats of GPU 9: %d\n", gpuguard_stats(9, &s));
    cudaFree(p);
    printf("done\n");
    return 0;
}
"""


class CApiClient(Case):
    def setUp(self):
        super().setUp()
        for tool in ("pkg-config", "g++", "make"):
            if not shutil.which(tool):
                self.skipTest("%s is not installed: cannot build the C API clients" % tool)
        self.dest = os.path.join(self.tmp, "dest")
        env = {k: v for k, v in os.environ.items() if not k.startswith("MAKE") and k != "MFLAGS"}
        build = os.path.relpath(BUILD, ROOT)
        make = subprocess.run(["make", "-s", "install", "PREFIX=/usr/local", "DESTDIR=" + self.dest,
                               "BUILD=" + build, "SANITIZE=" + SANITIZE], cwd=ROOT, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.assertEqual(make.returncode, 0, make.stdout)
        self.prefix = os.path.join(self.dest, "usr", "local")
        self.pc_env = dict(os.environ, PKG_CONFIG_PATH=os.path.join(self.prefix, "lib", "pkgconfig"),
                           PKG_CONFIG_SYSROOT_DIR=self.dest, PKG_CONFIG_LIBDIR="")

    def pkg_config(self, *args):
        out = subprocess.run(["pkg-config"] + list(args) + ["gpuguard"], env=self.pc_env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.assertEqual(out.returncode, 0, out.stderr)
        return out.stdout.split()

    def build(self, lang):
        src = os.path.join(self.tmp, "client." + ("c" if lang == "C" else "cpp"))
        with open(src, "w") as f:
            f.write(CLIENT.replace("LANG", '"%s"' % lang))
        exe = os.path.join(self.tmp, "client-" + lang.replace("+", "x"))
        compiler = ["cc", "-std=c11", "-Wpedantic"] if lang == "C" else ["g++", "-std=c++11", "-Wpedantic"]
        cmd = (compiler + ["-Wall", "-Wextra", "-Werror", "-Wshadow", "-I" + os.path.join(CUDA_HOME, "include")]
               + self.pkg_config("--cflags") + [src, "-o", exe, "-L" + FAKE, "-l:libcudart.so.13",
                                                 "-Wl,-rpath," + FAKE, "-lpthread"]
               + self.pkg_config("--libs"))
        out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.assertEqual(out.returncode, 0, " ".join(cmd) + "\n" + out.stdout)
        needed = subprocess.run(["readelf", "-d", exe], stdout=subprocess.PIPE, text=True).stdout
        self.assertNotIn("libgpuguard", needed)
        return exe

    def run_client(self, exe, preload):
        env = base_env()
        cwd = os.path.join(self.tmp, "run-%s-%d" % (os.path.basename(exe), preload))
        os.makedirs(cwd)
        if preload:
            env["LD_PRELOAD"] = ":".join(sanitizer_preload()
                                         + [os.path.join(self.prefix, "lib", "libgpuguard.so")])
        proc = subprocess.run([exe], cwd=cwd, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, timeout=120)
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        journals = [os.path.join(cwd, n) for n in os.listdir(cwd) if n.endswith(".jsonl")]
        events = []
        for j in journals:
            with open(j) as f:
                events += [json.loads(l) for l in f if l.strip()]
        return proc.stdout.splitlines(), events

    def test_pc_file_does_not_link_the_shim(self):
        self.assertEqual(self.pkg_config("--libs"), ["-ldl"])
        self.assertEqual(self.pkg_config("--cflags"), ["-I" + os.path.join(self.prefix, "include")])
        # (pkg-config puts the sysroot, here DESTDIR, before the path)
        self.assertEqual(self.pkg_config("--variable=preload"),
                         [os.path.join(self.prefix, "lib", "libgpuguard.so")])
        # the version of the header, where it is written once
        with open(os.path.join(ROOT, "include", "gpuguard.h")) as f:
            version = re.search(r'#define GPUGUARD_VERSION "([^"]+)"', f.read()).group(1)
        self.assertEqual(self.pkg_config("--modversion"), [version])

    def check(self, lang):
        exe = self.build(lang)
        # without the preload: inactive, and the program runs to its end
        out, events = self.run_client(exe, preload=False)
        self.assertEqual(out, ["active 0",
                               "stats -1 current 0 peak 0 name [] threads 2 2 2 2",
                               "advice 0", "stats of GPU 9: -1", "done"])
        self.assertEqual(events, [])
        # with it: the calls reach the guard
        out, events = self.run_client(exe, preload=True)
        self.assertEqual(out[0], "active 1")
        self.assertEqual(out[1], "stats 0 current %d peak %d name [NVIDIA GeForce RTX 3090] "
                                 "threads 1 1 1 1" % (GiB, GiB))
        self.assertEqual(out[2:], ["advice 0", "stats of GPU 9: -1", "done"])
        notes = [e["text"] for e in events if e["ev"] == "note"]
        self.assertEqual(notes, ["hello from " + lang])
        [step] = [e for e in events if e["ev"] == "step"]
        self.assertEqual((step["shape"], step["tokens"], step["batch"], step["needed"]),
                         ([8, 512], 4096, 8, 1 << 29))
        self.assertEqual([(e["mode"], e["why"]) for e in events if e["ev"] == "mode"],
                         [("enforce", "trainer registered")])    # gpuguard_set_batch arrived
        start = [e for e in events if e["ev"] == "start"][0]
        self.assertEqual(os.path.normpath(start["devices"][0]["policy"]),
                         os.path.join(self.prefix, "share", "gpuguard", "policy", "rtx-3090.ini"))

    def test_c_client(self):
        self.check("C")

    def test_cxx_client(self):
        self.check("C++")
