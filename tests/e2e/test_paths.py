"""Paths as gpuguard prints them. One it finds itself (the policies installed
beside the library or beside gpuguard-check) is resolved, as realpath(3) does:
no `lib/../share` in what the user reads. One the user gives is printed as
given, with no doubled slash where gpuguard joined a name to it."""
import os
import shutil
import subprocess

from gg import CHECK, POLICY_DIR, SCRIPT, SHIM, Case, base_env, sanitizer_preload


class InstalledLayout(Case):
    def install(self):
        prefix = os.path.join(self.tmp, "opt", "gg")
        os.makedirs(os.path.join(prefix, "lib"))
        os.makedirs(os.path.join(prefix, "bin"))
        os.makedirs(os.path.join(prefix, "share", "gpuguard"))
        shutil.copy(SHIM, os.path.join(prefix, "lib", "libgpuguard.so"))
        shutil.copy(CHECK, os.path.join(prefix, "bin", "gpuguard-check"))
        shutil.copytree(POLICY_DIR, os.path.join(prefix, "share", "gpuguard", "policy"))
        return prefix

    def test_the_policy_beside_the_library_is_printed_resolved(self):
        prefix = self.install()
        env = base_env()
        env["LD_PRELOAD"] = ":".join(sanitizer_preload() + [os.path.join(prefix, "lib",
                                                                         "libgpuguard.so")])
        run = self.run_prog([SCRIPT, "alloc:1M", "freeall"], preload=False, env=env)
        self.assertEqual(run.rc, 0, run.err)
        want = os.path.join(os.path.realpath(prefix), "share", "gpuguard", "policy",
                            "rtx-3090.ini")
        self.assertEqual(run.one("start")["devices"][0]["policy"], want)
        self.assertNotIn("/../", run.err)
        for e in run.events:
            self.assertNotIn("/../", str(e), e)
        # gpuguard-check installed beside it says the same
        out = subprocess.run([os.path.join(prefix, "bin", "gpuguard-check")], env=base_env(),
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.assertIn("  policy    %s\n" % want, out.stdout)
        self.assertNotIn("/../", out.stdout)

    def test_a_journal_directory_with_a_trailing_slash(self):
        jdir = os.path.join(self.tmp, "journals") + "/"
        os.makedirs(jdir)
        run = self.script("alloc:1M", "freeall", GPUGUARD_JOURNAL_DIR=jdir)
        self.assertEqual(run.rc, 0, run.err)
        (line,) = [l for l in self.shim_lines(run) if "; journal " in l]
        name = os.listdir(jdir)[0]
        self.assertTrue(line.endswith("; journal " + jdir + name), line)
        self.assertNotIn("//", line)
