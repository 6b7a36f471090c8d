"""What a reader of the report meets first: the recommendation says what the
next run will do with each batch; the Perfetto trace has a slice per step
(honest about the steps the journal thinned) and names each process once; the
site tree says which way it reads, and what ran inside a Python line is not
drawn as a caller of its outermost frame."""
import json
import os
import shutil
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import shimlike  # noqa: E402
from test_report import load_report  # noqa: E402

rpt = load_report()
from gpuguard.report import tree  # noqa: E402
from gpuguard.report.recommendation import Recommendation, shape_text  # noqa: E402
GiB, MiB = shimlike.GiB, shimlike.MiB
RTX = "NVIDIA GeForce RTX 3090"


class Base(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="gg-reading-")
        self.addCleanup(shutil.rmtree, self.tmp, ignore_errors=True)

    def process(self, rank=None):
        return shimlike.Process([shimlike.device(0, RTX, 24 * GiB, 2 * GiB, 24 * GiB // 20)],
                                pid=4242, rank=rank, host="node1", comm="python3")

    def trace(self, path):
        """The events `gpuguard-report --trace` writes for this journal."""
        out = os.path.join(self.tmp, "trace.json")
        with open(os.devnull, "w") as null:
            saved = sys.stdout, sys.stderr
            sys.stdout = sys.stderr = null
            try:
                rc = rpt.main(["--trace", out, path])
            finally:
                sys.stdout, sys.stderr = saved
        self.assertEqual(rc, 0)
        with open(out) as f:
            return json.load(f)["traceEvents"]


class RecommendationWords(unittest.TestCase):
    def test_what_the_next_run_does_with_each_batch(self):
        r = Recommendation(RTX)
        # the helper keeps the loader's 32 and splits it 11 + 11 + 10: never 33
        r.batch, r.accum, r.effective = 11, 3, 32
        self.assertEqual(shape_text(r), "each batch of 32 as 3 micro-batches of at most 11 "
                                        "(effective 32)")
        # batch 10 allows 4 pieces of 10, but 32 in 4 is 8 each: what the
        # helper will run, and what would fit
        r.batch, r.accum, r.effective = 10, 4, 32
        self.assertEqual(shape_text(r), "each batch of 32 as 4 micro-batches of at most 8 "
                                        "(effective 32; up to 10 would fit)")
        r.batch, r.accum, r.effective = 24, 1, 24
        self.assertEqual(shape_text(r), "each batch of 24 whole (effective 24)")


class TraceSteps(Base):
    def run_with_steps(self, steps, rank=None):
        """A process whose steps end at t = step / 10 s (the ones listed)."""
        p = self.process(rank)
        p.sample(0.01, 0, GiB, 2 * GiB)
        for n in steps:
            p.step(n / 10.0, n, 0, (4 + n % 3) * GiB, 2 * GiB + n * MiB, 3 * GiB)
        p.summary(max(steps) / 10.0 + 0.1)
        return p.write(self.tmp)

    def slices(self, evs):
        return [e for e in evs if e["ph"] == "X"]

    def test_a_slice_per_step(self):
        evs = self.trace(self.run_with_steps(range(1, 6)))
        xs = self.slices(evs)
        # step 1's start is not in the journal: steps 2..5, each from the
        # boundary before it to its own
        self.assertEqual([e["name"] for e in xs], ["step 2", "step 3", "step 4", "step 5"])
        t0 = next(e["ts"] for e in evs if e["ph"] == "C" and e["name"] == "GPU0 step peak")
        for k, e in enumerate(xs):
            self.assertAlmostEqual(e["ts"] - t0, k * 1e5, places=3)
            self.assertAlmostEqual(e["dur"], 1e5, places=3)
            self.assertEqual(e["args"]["step"], k + 2)
            self.assertEqual(e["args"]["peak"], (4 + (k + 2) % 3) * GiB)
            self.assertEqual(e["pid"], 4242)
        tids = {e["tid"] for e in xs}
        self.assertEqual(len(tids), 1)
        names = [e["args"]["name"] for e in evs if e["name"] == "thread_name"
                 and e["tid"] in tids]
        self.assertEqual(names, ["GPU0 %s steps" % RTX])
        # the instants' thread is another
        self.assertNotIn(0, tids)

    def test_thinned_steps_are_one_slice_that_says_so(self):
        # as the shim writes them past step 100: every 100th
        evs = self.trace(self.run_with_steps(list(range(1, 101)) + [200, 300, 301]))
        xs = self.slices(evs)
        by = {e["name"]: e for e in xs}
        self.assertIn("step 100", by)
        self.assertEqual(by["steps 101-200"]["args"]["first_step"], 101)
        self.assertEqual(by["steps 101-200"]["args"]["last_step"], 200)
        self.assertEqual(by["steps 101-200"]["args"]["steps"], 100)
        self.assertIn("the journal has the boundary of the last only",
                      by["steps 101-200"]["args"]["note"])
        self.assertIn("steps 201-300", by)
        self.assertIn("step 301", by)
        self.assertNotIn("note", by["step 301"]["args"])
        # slices never overlap on their track
        xs.sort(key=lambda e: e["ts"])
        for a, b in zip(xs, xs[1:]):
            self.assertLessEqual(a["ts"] + a["dur"], b["ts"] + 1e-3)

    def test_a_step_count_that_starts_again_gets_no_slice_back(self):
        p = self.process()
        for t, n in ((0.1, 1), (0.2, 2), (0.3, 1), (0.4, 2)):
            p.step(t, n, 0, GiB, GiB, GiB)
        p.summary(0.5)
        evs = self.trace(p.write(self.tmp))
        xs = self.slices(evs)
        self.assertEqual([e["name"] for e in xs], ["step 2", "step 2"])
        self.assertEqual([round(e["dur"]) for e in xs], [100000, 100000])

    def test_the_process_is_named_once(self):
        evs = self.trace(self.run_with_steps([1, 2]))
        (name,) = [e["args"]["name"] for e in evs if e["name"] == "process_name"]
        self.assertEqual(name, "pid 4242 (python3) on host node1")
        evs = self.trace(self.run_with_steps([1, 2], rank=3))
        (name,) = [e["args"]["name"] for e in evs if e["name"] == "process_name"]
        self.assertEqual(name, "rank 3 (host node1, pid 4242, python3)")


class TreeDirection(unittest.TestCase):
    PY = [{"file": "/home/me/model.py", "line": 88, "func": "Block.forward"},
          {"file": "/home/me/train.py", "line": 80, "func": "<module>"}]
    NATIVE = [shimlike.frame(1, "/opt/lib/libtorchlike.so", "seg_alloc", 0x28e),
              shimlike.frame(2, "/opt/lib/libtorchlike.so", "tl_malloc", 0x3c6),
              shimlike.frame(3, "/usr/lib/libffi.so.8", "ffi_call", 0xcd),
              shimlike.frame(4, "/usr/lib/libpython3.11.so.1.0", "_PyEval_EvalFrameDefault", 9)]

    def test_what_ran_inside_the_line_is_not_its_callers_caller(self):
        site = {"stack": self.NATIVE, "pystack": self.PY, "bytes": GiB, "allocs": 1}
        lead, path = tree.site_path(site)
        labels = [label for _, label in path]
        self.assertEqual(labels, [
            "/home/me/model.py:88 in Block.forward",
            "/home/me/train.py:80 in <module>",
            # the direction turns here: the label says where these frames ran
            "inside model.py:88, from the allocation out: seg_alloc+0x28e (libtorchlike.so)",
            "tl_malloc+0x3c6 (libtorchlike.so)",
            "ffi_call+0xcd (libffi.so.8)"])
        # top-down is call order throughout: no turn to say
        lead, path = tree.site_path(site, top_down=True)
        self.assertEqual([label for _, label in path], [
            "/home/me/train.py:80 in <module>", "/home/me/model.py:88 in Block.forward",
            "ffi_call+0xcd (libffi.so.8)", "tl_malloc+0x3c6 (libtorchlike.so)",
            "seg_alloc+0x28e (libtorchlike.so)"])
        # without Python frames there is no turn either
        lead, path = tree.site_path({"stack": self.NATIVE[:3], "pystack": []})
        self.assertFalse([label for _, label in path if label.startswith("inside")])

    def test_the_title_says_which_way_it_reads(self):
        site = {"stack": self.NATIVE, "pystack": self.PY, "bytes": GiB, "allocs": 1}

        class Opts(object):
            threshold = 0.0
            top_down = False
        f = {"peak": GiB}
        lines = tree.peak_tree_lines(f, [site], rpt.site_tree([site], 12), Opts)
        self.assertTrue(lines[0].endswith("listed at the process peak of 1.0 GiB; under each "
                                          "line, its caller"), lines[0])
        Opts.top_down = True
        lines = tree.peak_tree_lines(f, [site], rpt.site_tree([site], 12, True), Opts)
        self.assertTrue(lines[0].endswith("; under each line, what it called"), lines[0])


if __name__ == "__main__":
    unittest.main()
