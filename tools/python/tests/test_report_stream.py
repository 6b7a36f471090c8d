"""gpuguard-report at any length: journals are read line by line into
bounded summaries, and the text stays a few hundred lines. (Its speed on
100 MB and 1 GB journals is measured by bench/report_bench.py under
`make bench`, never here.)"""
import io
import json
import os
import random
import re
import shutil
import sys
import tempfile
import tracemalloc
import unittest
from contextlib import redirect_stderr, redirect_stdout

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import gen_journal  # noqa: E402
import shimlike  # noqa: E402
from test_report import load_report  # noqa: E402

rpt = load_report()
GiB, MiB = shimlike.GiB, shimlike.MiB


class Base(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="gg-stream-")
        self.addCleanup(shutil.rmtree, self.tmp)

    def main(self, *args):
        out, err = io.StringIO(), io.StringIO()
        with redirect_stdout(out), redirect_stderr(err):
            rc = rpt.main(list(args))
        self.assertEqual(rc, 0, err.getvalue())
        return out.getvalue()


class BoundedStructures(Base):
    def test_timeline_keeps_each_buckets_extremes(self):
        tl = rpt.Timeline()
        rnd = random.Random(7)
        truth = []
        for i in range(200000):
            t = i * 0.37                      # 20 hours
            cur = rnd.randrange(0, 1000) * MiB
            used = cur + rnd.randrange(0, 50) * MiB
            truth.append((t, cur, used))
            tl.add(t, cur, used)
        truth[123456] = (truth[123456][0], 5000 * MiB, 5100 * MiB)   # one spike
        tl2 = rpt.Timeline()
        for s in truth:
            tl2.add(*s)
        pts = tl2.points()
        self.assertLessEqual(sum(b is not None for b in tl2.b), rpt.TIMELINE_BUCKETS)
        self.assertLessEqual(len(pts), 6 * rpt.TIMELINE_BUCKETS)
        self.assertIn(truth[123456], pts)                 # the spike survives
        self.assertEqual(min(p[1] for p in pts), min(s[1] for s in truth))
        self.assertEqual(pts[0], truth[0])
        self.assertEqual(pts[-1], truth[-1])
        self.assertEqual([p[0] for p in pts], sorted(p[0] for p in pts))
        # every bucket's envelope is exact: compare with the truth per bucket
        width = tl2.width
        for b in tl2.b:
            if b is None:
                continue
            k = int(b[0][0] / width)
            inside = [s for s in truth if int(s[0] / width) == k]
            self.assertEqual(b[2][1], max(s[1] for s in inside))
            self.assertEqual(b[5][2], min(s[2] for s in inside))
            break

    def test_thinned_marks_stay_even_and_bounded(self):
        th = rpt.Thinned(cap=100)
        for i in range(100000):
            if th.want():
                th.add(i)
        self.assertLess(len(th.items), 100)
        self.assertGreater(len(th.items), 40)
        gaps = {b - a for a, b in zip(th.items, th.items[1:])}
        self.assertEqual(gaps, {th.stride})
        self.assertEqual(th.items[0], 0)

    def test_stack_groups_are_capped(self):
        inc = rpt.Incidents("refused", 4)
        for i in range(rpt.GROUPS_MAX + 50):
            stack = [dict(shimlike.ALLOC_STACK[0], sym="site_%d" % i)]
            py = [{"file": "/home/me/model.py", "line": i, "func": "f"}]
            for _ in range(2):
                inc.add({"ev": "refused", "bytes": MiB, "used": GiB, "stack": stack,
                         "pystack": py}, float(i), None)
        self.assertEqual(len(inc.groups), rpt.GROUPS_MAX)
        self.assertEqual(inc.other["count"], 100)
        self.assertEqual(inc.journaled, 2 * (rpt.GROUPS_MAX + 50))
        lines = inc.sorted_lines()
        self.assertEqual(len(lines), rpt.GROUPS_MAX + 1)
        self.assertEqual(sum(len(ln["subs"]) for ln in lines[:-1]), rpt.GROUPS_MAX)
        self.assertEqual(rpt.line_group_lines(lines[-1], None),
                         ["(other stacks, beyond the %d grouped)" % rpt.GROUPS_MAX])

    def test_running_near_miss_counts(self):
        # the shim writes a site's 1st..8th near miss, then the 16th, 32nd...
        inc = rpt.Incidents("near_miss", 4)
        a = [dict(shimlike.ALLOC_STACK[0], ip="0xa")]
        b = [dict(shimlike.ALLOC_STACK[0], ip="0xb")]
        for n in list(range(1, 9)) + [16, 32, 64]:
            inc.add({"ev": "near_miss", "count": n, "stack": a}, float(n), None)
        for n in (1, 2, 3, 1, 2):    # a slot collision restarted b's count
            inc.add({"ev": "near_miss", "count": n, "stack": b}, 100.0, None)
        self.assertEqual(inc.journaled, 16)
        self.assertEqual(inc.counted, 64 + 3 + 2)


class LongJournals(Base):
    def test_generated_journal_read_in_bounded_memory(self):
        small = os.path.join(self.tmp, "small.jsonl")
        big = os.path.join(self.tmp, "big.jsonl")
        gen_journal.generate(small, 1 << 20)
        facts = gen_journal.generate(big, 4 << 20)
        peaks = []
        for path in (small, big):
            tracemalloc.start()
            j = rpt.Journal(path).read()
            peaks.append(tracemalloc.get_traced_memory()[1])
            tracemalloc.stop()
        # Memory does not follow the length: 4x the journal, not 2x the memory,
        # and far less than the file.
        self.assertLess(peaks[1], 2 * peaks[0], peaks)
        self.assertLess(peaks[1], os.path.getsize(big) // 4, peaks)
        # ... and the summaries say what the file says.
        d = j.devices[0]
        self.assertEqual(j.lines, facts["lines"])
        self.assertEqual(d.events["near_miss"].journaled, facts["near_miss"])
        # between journal lines the shim counts near misses it does not write:
        # the lines say at least the highest count of each site, the summary
        # says all of them
        with open(big, "rb") as f:
            near = [json.loads(l) for l in f if b'"ev":"near_miss"' in l]
        highest = {}
        for e in near:
            key = tuple(fr["ip"] for fr in e["stack"])
            highest[key] = max(highest.get(key, 0), e["count"])
        self.assertEqual(d.events["near_miss"].counted, sum(highest.values()))
        self.assertEqual(rpt.figures(j, d)["near_misses"], facts["near_miss_counted"])
        self.assertEqual(d.events["refused"].journaled, facts["refused"])
        self.assertEqual(d.advice.n, facts["advice"])
        self.assertEqual(d.steps, facts["step"])
        self.assertEqual(d.phases.events, facts["batch_events"])
        self.assertEqual(d.timeline.n, facts["sample"])
        with open(big, "rb") as f:
            samples = [json.loads(l) for l in f if b'"ev":"sample"' in l]
        self.assertEqual(d.peak_cur, max(s["current"] for s in samples))
        pts = d.timeline.points()
        self.assertEqual(max(p[1] for p in pts), d.peak_cur)
        self.assertEqual(max(p[2] for p in pts), max(s["used"] for s in samples))
        self.assertEqual([dev.dev for dev in j.used_devices()], [0])

    def test_text_of_a_long_run_stays_readable(self):
        path = os.path.join(self.tmp, "gpuguard.python3.rank0.4242.jsonl")
        facts = gen_journal.generate(path, 3 << 20)
        out = self.main(path)
        lines = out.splitlines()
        self.assertLess(len(lines), 200, out)
        self.assertTrue(lines[0].startswith("gpuguard report: 1 journal, 1 device section; "
                                            "7 unused devices left out"), lines[0])
        self.assertTrue(lines[1].startswith("  first failure: rank 0 GPU0 NVIDIA GeForce RTX 3090"))
        # the batch path from the `batch` events, one line
        path_line = [l for l in lines if l.startswith("   batch ")]
        self.assertEqual(len(path_line), 1)
        self.assertIn("32 x 1 at ", path_line[0])
        self.assertIn(" -> 16 x 2 at ", path_line[0])
        self.assertIn(" -> 1 x 32 at ", path_line[0])
        # repeated advice is one line with its count
        adv = out[out.index("Advice history: "):]
        self.assertIn("Advice history: %d advice" % facts["advice"], adv)
        rep = re.findall(r"#(\d+)-#(\d+) (\d+)x until", adv)
        self.assertTrue(rep, adv)
        self.assertEqual(int(rep[-1][1]), facts["advice_seq"])

    def test_many_advice_runs_are_cut_in_the_middle(self):
        devs = [shimlike.device(0, "NVIDIA L4", 24 * GiB, 2 * GiB, GiB)]
        p = shimlike.Process(devs, rank=0)
        p.sample(0.5, 0, GiB, 2 * GiB)
        seq = 0
        for k in range(3000):     # alternating reasons: 3000 runs of 20
            for _ in range(20):
                seq += 1
                p.advice(1.0 + seq, seq, 0, 1, 16, ("near_miss", "refused")[k % 2])
        out = self.main(p.write(self.tmp))
        adv = out[out.index("   Advice history:"):].splitlines()
        self.assertEqual(adv[0], "   Advice history: 60 000 advice (30 000 near_miss, 30 000 refused)")
        self.assertEqual(len(adv), 1 + rpt.RUNS_HEAD + 1 + rpt.RUNS_TAIL)
        self.assertIn("... %d runs not shown ..." % (3000 - rpt.RUNS_HEAD - rpt.RUNS_TAIL),
                      adv[1 + rpt.RUNS_HEAD])
        self.assertRegex(adv[-1], r"#59981-#60000 20x until 16 h 40 min  refused")


class TimeAxes(Base):
    def test_units_that_fit(self):
        self.assertEqual(rpt.fmt_t(12.345), "12.35 s")
        self.assertEqual(rpt.fmt_t(754), "12.6 min")
        self.assertEqual(rpt.fmt_t(5 * 3600 + 7 * 60 + 3), "5 h 07 min")
        self.assertEqual(rpt.fmt_t(3 * 86400 + 4 * 3600 + 600), "3 d 4 h")
        self.assertEqual(rpt.time_unit(90), ("s", 1.0))
        self.assertEqual(rpt.time_unit(3000), ("min", 60.0))
        self.assertEqual(rpt.time_unit(30 * 3600), ("h", 3600.0))
        self.assertEqual(rpt.time_unit(7 * 86400), ("days", 86400.0))

    def test_svg_axis_of_a_week(self):
        devs = [shimlike.device(0, "NVIDIA H200", 141 * GiB, 10 * GiB, 7 * GiB)]
        p = shimlike.Process(devs, rank=0)
        for i in range(700):
            p.sample(i * 864.0, 0, (i % 50) * GiB, (i % 50 + 1) * GiB)
        p.summary(604800.0)
        page = os.path.join(self.tmp, "r.html")
        self.main("--html", page, p.write(self.tmp))
        with open(page) as f:
            svg = f.read()
        ticks = re.findall(r'class="tick" text-anchor="middle">([^<]*)</text>', svg)
        self.assertIn("time since start (days)", ticks)
        self.assertIn("7 days", ticks)
        self.assertNotIn("604800 s", svg)


if __name__ == "__main__":
    unittest.main()
