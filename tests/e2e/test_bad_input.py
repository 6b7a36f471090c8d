"""Bad input, as a new user gives it: a policy whose section header lost its `]`,
a policy value that is not one, a file that is not a journal. Each is said in
one line that names where it is, and nothing is lost silently."""
import os
import subprocess
import sys

from gg import CHECK, ROOT, Case, base_env

REPORT = os.path.join(ROOT, "tools", "bin", "gpuguard-report")


class MalformedHeader(Case):
    TEXT = ("[gpu]\nmatch = NVIDIA*\n"
            "[memory\n"                 # 3: the header lost its ]
            "headroom = 2 GiB\n"        # 4: not read
            "mode = enforce\n"          # 5: not read
            "[trainer]\n"
            "signal = SIGFOO\n")        # 7: still checked

    def test_the_keys_under_it_are_said_by_the_shim_and_by_lint(self):
        path = self.write_policy("hdr.ini", self.TEXT)
        run = self.api("fill", "1G", policy=path)
        lines = self.shim_lines(run)
        for line, text in ((3, "malformed section header '[memory' (expected [name])"),
                           (4, "key 'headroom' is not read: it is under the malformed section "
                               "header on line 3"),
                           (5, "key 'mode' is not read: it is under the malformed section "
                               "header on line 3"),
                           (7, "[trainer] signal = 'SIGFOO': bad value")):
            self.assertTrue([l for l in lines if l.startswith("gpuguard: %s:%d: %s" %
                                                              (path, line, text))],
                            (line, lines))
        self.assertEqual(run.one("start")["devices"][0]["mode"], "observe")
        lint = subprocess.run([CHECK, "--lint", path], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
        self.assertEqual(lint.returncode, 1)
        said = [l for l in lint.stdout.splitlines() if l.startswith(path + ":")]
        self.assertEqual([l.split(":")[1] for l in said if "left to defaults" not in l],
                         ["3", "4", "5", "7"], lint.stdout)
        self.assertIn("4 problems in 1 file", lint.stdout)


class InvalidValueListed(Case):
    def listing(self, policy, **env):
        out = subprocess.run([CHECK, "--policy", policy], env=base_env(**env),
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.assertEqual(out.returncode, 1, out.stdout)
        return out.stdout

    def test_the_listing_says_what_the_file_said(self):
        path = self.write_policy("enf.ini", "[gpu]\nmatch = *\n[memory]\nmode = enforced\n")
        out = self.listing(path)
        self.assertIn("%s:4: [memory] mode = 'enforced': bad value" % path, out)
        self.assertIn("  mode      observe: the policy has problems (line 4 says mode = "
                      "'enforced', which is invalid)\n", out)
        self.assertNotIn("it says auto", out)
        self.assertRegex(out, r"\n    mode +?= auto +\(default: line 4's 'enforced' is invalid\)\n")

    def test_and_what_a_variable_said(self):
        path = self.write_policy("ok.ini", "[gpu]\nmatch = *\n[memory]\nmode = enforce\n"
                                           "bogus = 1\n")
        out = self.listing(path, GPUGUARD_MODE="loud")
        self.assertIn("  mode      observe: the policy has problems (GPUGUARD_MODE='loud' is "
                      "invalid)\n", out)
        self.assertRegex(out, r"\n    mode +?= enforce +\(default: GPUGUARD_MODE='loud' is "
                              r"invalid\)\n")
        # a good mode in a broken file: what the file says, not "it says"
        out = self.listing(path)
        self.assertIn("  mode      observe: the policy has problems (line 4 says mode = "
                      "enforce)\n", out)

    def test_values_are_checked_as_the_shim_reads_them(self):
        out = subprocess.run([CHECK, "--values", "GPUGUARD_HEADROOM=10parsecs",
                              "GPUGUARD_MODE=enforce", "GPUGUARD_SIGNAL=SIGKILL"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.assertEqual(out.returncode, 1)
        lines = out.stdout.splitlines()
        self.assertEqual(len(lines), 2, out.stdout)
        self.assertEqual(lines[0], "GPUGUARD_HEADROOM: '10parsecs': malformed size: unknown unit "
                                   "(use B, KiB, MiB, GiB, TiB, kB, KB, MB, GB, TB or %)")
        self.assertTrue(lines[1].startswith("GPUGUARD_SIGNAL: 'SIGKILL': not a signal for "
                                            "advice"), lines[1])
        # the same words as the shim's, for the same value
        run = self.script("alloc:1M", "freeall", GPUGUARD_HEADROOM="10parsecs")
        self.assertIn("gpuguard: " + lines[0], self.shim_lines(run))
        ok = subprocess.run([CHECK, "--values", "GPUGUARD_HEADROOM=1.5 GiB", "RANK=3"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.assertEqual((ok.returncode, ok.stdout), (0, ""))
        bad = subprocess.run([CHECK, "--values", "GPUGUARD_NOPE=1"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        self.assertEqual(bad.returncode, 2)
        self.assertIn("'GPUGUARD_NOPE=1' is not NAME=VALUE", bad.stderr)


class NotAJournal(Case):
    def report(self, *paths):
        return subprocess.run([sys.executable, REPORT] + list(paths), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)

    def test_a_file_with_no_journal_line_is_an_error(self):
        passwd = os.path.join(self.tmp, "passwd")
        with open(passwd, "w") as f:
            f.write("".join("user%d:x:%d:%d::/home/u:/bin/sh\n" % (i, i, i) for i in range(24)))
        out = self.report(passwd)
        self.assertEqual(out.returncode, 2)
        self.assertEqual(out.stdout, "")
        self.assertEqual(out.stderr, "gpuguard-report: %s: not a gpuguard journal: none of its "
                                     "24 lines is a journal line\n" % passwd)
        jsonl = os.path.join(self.tmp, "other.jsonl")
        with open(jsonl, "w") as f:
            f.write('{"a": 1}\n[1, 2]\n')
        out = self.report(jsonl)
        self.assertEqual((out.returncode, out.stdout), (2, ""))
        self.assertIn("none of its 2 lines is a journal line", out.stderr)
        empty = os.path.join(self.tmp, "empty.txt")
        open(empty, "w").close()
        out = self.report(empty)
        self.assertEqual((out.returncode, out.stdout), (2, ""))
        self.assertEqual(out.stderr, "gpuguard-report: %s: not a gpuguard journal: the file is "
                                     "empty\n" % empty)

    def test_a_journal_with_some_bad_lines_is_read(self):
        path = os.path.join(self.tmp, "gpuguard.python.77.jsonl")
        with open(path, "w") as f:
            f.write('{"t": 0.0, "ev": "start", "pid": 77, "comm": "python"}\nnot json\n')
        out = self.report(path)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("1 line unreadable (skipped)", out.stdout)
        # with a file that is not one beside it: the journal is reported, the
        # other said, and the exit status is 2
        passwd = os.path.join(self.tmp, "passwd")
        with open(passwd, "w") as f:
            f.write("root:x:0:0::/root:/bin/sh\n")
        out = self.report(path, passwd)
        self.assertEqual(out.returncode, 2)
        self.assertIn("pid 77 (python)", out.stdout)
        self.assertIn("gpuguard-report: %s: not a gpuguard journal: its only line is not a "
                      "journal line\n" % passwd, out.stderr)
