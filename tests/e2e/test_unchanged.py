"""tests/unchanged/unchanged.py, the proof that a change left the output
as it was (make unchanged): what it takes out of a journal before
comparing (times, the process, the run's directory, the events the shim's
clock writes) and what it keeps, and that compare finds a difference and
says where. Over made-up journals: the records of real runs are make
unchanged's own."""
import contextlib
import io
import json
import os
import shutil
import sys
import tempfile
import unittest

from gg import ROOT

sys.path.insert(0, os.path.join(ROOT, "tests", "unchanged"))
import unchanged  # noqa: E402


def journal(directory, events, name="gpuguard.python3.4242.jsonl"):
    path = os.path.join(directory, name)
    with open(path, "w") as f:
        for e in events:
            f.write(json.dumps(e) + "\n")
    return path


class Normalize(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="gg-unchanged-")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def norm(self, events, name="gpuguard.python3.4242.jsonl"):
        return unchanged.normalize([journal(self.tmp, events, name)], [(self.tmp, "<RUN>")])

    def test_what_differs_between_runs_is_taken_out(self):
        """Two runs that differ only in times, pids, host, the run's
        directory, native addresses and clocked samples read the same."""
        def run(t, pid, host, samples):
            return [{"ev": "start", "t": t, "pid": pid, "host": host, "version": "0.1.0",
                     "devices": [{"dev": 0, "policy": self.tmp + "/policy.ini"}]}] + [
                {"ev": "sample", "t": t + i, "used": i} for i in range(samples)] + [
                {"ev": "refused", "t": t + 1.5, "bytes": 4096, "api": "cudaMalloc",
                 "stack": [{"ip": 0x7f00 + pid, "module": "libx.so", "off": 12, "sym": "f"}]},
                {"ev": "summary", "t": t + 2, "duration": t * 3, "wall_us": pid,
                 "suppressed": {"sample": samples, "near_miss": 1}}]
        a = self.norm(run(0.5, 100, "a", 2), "gpuguard.python3.100.jsonl")
        os.unlink(os.path.join(self.tmp, "gpuguard.python3.100.jsonl"))
        b = self.norm(run(9.25, 200, "b", 5), "gpuguard.python3.200.jsonl")
        self.assertEqual(a, b)
        self.assertIn("# gpuguard.python3.PID.jsonl", a)
        self.assertIn('"policy": "<RUN>/policy.ini"', a)
        self.assertIn('"off": 12', a)
        self.assertIn('"suppressed": {"near_miss": 1}', a)
        self.assertNotIn('"ev": "sample"', a)

    def test_what_the_shim_decided_is_kept(self):
        """A figure, a field or an event the product writes differently is
        a difference."""
        base = {"ev": "refused", "t": 1, "bytes": 4096, "api": "cudaMalloc"}
        a = self.norm([base])
        for changed in ({"bytes": 8192}, {"api": "cudaMallocAsync"}, {"extra": 1}):
            self.assertNotEqual(a, self.norm([dict(base, **changed)]), changed)
        self.assertNotEqual(a, self.norm([base, {"ev": "advice", "t": 2}]))


class Compare(unittest.TestCase):
    def test_same_and_different(self):
        """compare: 0 when every file is the same; 1, naming the file and
        showing the line, when one differs or is missing on a side."""
        with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
            for d in (a, b):
                with open(os.path.join(d, "s.jsonl"), "w") as f:
                    f.write('{"ev": "start"}\n{"bytes": 1}\n')
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                self.assertEqual(unchanged.compare(a, b), 0)
            self.assertIn("the same: 1 files, 1 scenarios", out.getvalue())
            with open(os.path.join(b, "s.jsonl"), "w") as f:
                f.write('{"ev": "start"}\n{"bytes": 2}\n')
            with open(os.path.join(a, "s.err"), "w") as f:
                f.write("exit 0\n")
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                self.assertEqual(unchanged.compare(a, b), 1)
            text = out.getvalue()
            self.assertIn('+{"bytes": 2}', text)
            self.assertIn("s.err only in " + a, text)
            self.assertIn("2 of 2 files differ", text)


if __name__ == "__main__":
    unittest.main()
