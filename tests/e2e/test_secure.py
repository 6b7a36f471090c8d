"""Secure-execution mode. A set-user-ID program (the
kernel's AT_SECURE) takes its environment from whoever runs it: the shim
reads no GPUGUARD_* variable that names a file or a directory there
(GPUGUARD_POLICY, GPUGUARD_JOURNAL_DIR, GPUGUARD_METRICS_DIR,
GPUGUARD_TRACE), changes no environment, and says so once in its journal.

The dynamic loader ignores LD_PRELOAD paths in that mode, so the program is
built here linked with the shim (absolute run paths, which the loader
still follows), set-user-ID to one user and run as another. Root only (CI
runs as root)."""
import json
import os
import shutil
import subprocess
import sys

from gg import FAKE, ROOT, SANITIZE, SHIM, Case, base_env

CUDA_HOME = os.environ.get("CUDA_HOME", "/usr/local/cuda")
OWNER, RUNNER = 65533, 65534  # the program's owner, and who runs it


class SecureExecution(Case):
    def build(self):
        """script.c linked with the shim and the fake runtime, in a directory
        everyone can read; its path."""
        cc = shutil.which("cc")
        if os.geteuid() != 0 or not cc:
            self.skipTest("needs root (to run a set-user-ID program as another user) and a C "
                          "compiler (CI runs as root with both)")
        world = os.path.join(self.tmp, "world")
        shutil.copytree(FAKE, os.path.join(world, "fake"), symlinks=True)
        shutil.copy2(SHIM, os.path.join(world, "libgpuguard.so"))
        prog = os.path.join(world, "secure")
        flags = []
        if SANITIZE == "1":
            # a set-user-ID program reads no sanitizer options from its
            # environment: leak checking (a ptrace tracer, which a set-user-ID
            # process cannot have) off from within
            opts = os.path.join(world, "asan_options.c")
            with open(opts, "w") as f:
                f.write('const char *__asan_default_options(void);\n'
                        'const char *__asan_default_options(void) '
                        '{ return "detect_leaks=0:verify_asan_link_order=0"; }\n')
            flags = ["-fsanitize=address,undefined", opts]
        cmd = [cc, "-std=c11", "-D_GNU_SOURCE", "-O1", *flags, "-I" + os.path.join(CUDA_HOME, "include"),
               "-I" + os.path.join(ROOT, "tests", "progs"),
               os.path.join(ROOT, "tests", "progs", "script.c"), "-o", prog,
               "-Wl,--no-as-needed", "-L" + world, "-l:libgpuguard.so",
               "-L" + os.path.join(world, "fake"), "-l:libcudart.so.13",
               "-Wl,-rpath," + world + ":" + os.path.join(world, "fake"), "-ldl", "-lpthread"]
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.assertEqual(p.returncode, 0, p.stderr)
        for d, _, files in os.walk(self.tmp):
            os.chmod(d, 0o755)
            for n in files:
                path = os.path.join(d, n)
                if not os.path.islink(path):
                    os.chmod(path, os.stat(path).st_mode | 0o444)
        os.chown(prog, OWNER, OWNER)
        os.chmod(prog, 0o4755)  # set-user-ID: runs as OWNER whoever starts it
        return prog

    def open_dir(self, name):
        d = os.path.join(self.tmp, name)
        os.makedirs(d)
        os.chmod(d, 0o777)
        return d

    def test_a_set_user_id_program_reads_no_file_from_its_environment(self):
        prog = self.build()
        cwd, wanted = self.open_dir("cwd"), self.open_dir("journals")
        metrics, trace = self.open_dir("metrics"), os.path.join(self.tmp, "trace.out")
        policy = os.path.join(self.tmp, "evil.ini")
        with open(policy, "w") as f:
            f.write("[gpu]\nmatch = *\n[memory]\nheadroom = 90%\nmode = enforce\n")
        os.chmod(policy, 0o644)
        env = base_env(GPUGUARD_JOURNAL_DIR=wanted, GPUGUARD_POLICY=policy,
                       GPUGUARD_METRICS_DIR=metrics, GPUGUARD_METRICS_INTERVAL="1",
                       GPUGUARD_TRACE=trace, GPUGUARD_TORCH="1", GPUGUARD_QUIET="1")
        env.pop("LD_PRELOAD", None)
        env.pop("LD_LIBRARY_PATH", None)
        env["PYTHONPATH"] = "/mine"

        def as_runner():
            os.setgroups([])
            os.setgid(RUNNER)
            os.setuid(RUNNER)
        p = subprocess.run([prog, "alloc:8G", "sleep:1200", "freeall", "print:end"], env=env,
                           cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           timeout=120, preexec_fn=as_runner)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("end", p.stdout)  # 8 GiB fit: the planted 90% headroom did not apply
        self.assertNotIn("error", p.stdout)
        self.assertEqual(os.listdir(wanted), [])  # no journal where the environment said
        self.assertEqual(os.listdir(metrics), [])
        self.assertFalse(os.path.exists(trace))
        journals = [n for n in os.listdir(cwd) if n.endswith(".jsonl")]
        self.assertEqual(len(journals), 1, (os.listdir(cwd), p.stderr))  # the policy's own dir (".")
        with open(os.path.join(cwd, journals[0])) as f:
            events = [json.loads(l) for l in f if l.strip()]
        said = [e["message"] for e in events if e["ev"] == "error"]
        self.assertEqual(len(said), 1, said)
        self.assertIn("secure-execution mode", said[0])
        self.assertIn("GPUGUARD_JOURNAL_DIR, GPUGUARD_METRICS_DIR, GPUGUARD_POLICY, GPUGUARD_TRACE "
                      "set and not used", said[0])
        (start,) = [e for e in events if e["ev"] == "start"]
        self.assertNotEqual(start["devices"][0]["policy"], policy)
