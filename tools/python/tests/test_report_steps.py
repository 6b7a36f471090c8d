"""gpuguard-report on mode, arch, step and leak events, from synthetic
journals in the schema of docs/journal.md: `mode` switches and `arch` verdicts in their
places; `step` lines (bounded whatever their number, trends, the step rate),
`leak` and forecast advice first in the verdict and drawn in the HTML; the
recommendation from step peaks when not every step was journaled."""
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
import xml.etree.ElementTree as ET
from contextlib import redirect_stderr, redirect_stdout

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import shimlike  # noqa: E402
from test_report import SVG, W0, load_report  # noqa: E402

rpt = load_report()
GiB, MiB = shimlike.GiB, shimlike.MiB
RTX = "NVIDIA GeForce RTX 3090"


class Base(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="gg-steps-")
        self.addCleanup(shutil.rmtree, self.tmp)

    def main(self, *args):
        out, err = io.StringIO(), io.StringIO()
        with redirect_stdout(out), redirect_stderr(err):
            rc = rpt.main(list(args))
        self.assertEqual(rc, 0, err.getvalue())
        return out.getvalue()

    def html(self, *paths):
        page = os.path.join(self.tmp, "r.html")
        self.main("--html", page, *paths)
        with open(page, encoding="utf-8") as f:
            return f.read()

    def leaky(self, steps=200, rate=64 * MiB, seconds=10.0, forecast_at=None, noise=0, rank=0,
              pid=4242):
        """A run on a 24 GiB RTX 3090 (limit 22 GiB, near-miss line 21 GiB)
        whose live bytes grow by `rate` a step from 4 GiB, with a working set
        of 6 GiB on top; the shim's `leak` at step 150."""
        devs = [shimlike.device(0, RTX, 24 * GiB, 2 * GiB, GiB, cc="8.6")]
        p = shimlike.Process(devs, rank=rank, pid=pid)
        p.mode(0.5, 0)
        rnd = random.Random(1)
        for k in range(1, steps + 1):
            live = 4 * GiB + k * rate
            peak = live + 6 * GiB + (rnd.randrange(-noise, noise + 1) * MiB if noise else 0)
            p.step(seconds * k, k, 0, peak, peak + 512 * MiB, live)
            if k == 150:
                p.events.append({"t": seconds * k + 0.001, "ev": "leak", "dev": 0, "since_step": 3,
                                 "step": k, "rate": rate, "live": live, "projected_step": 230,
                                 "sites": [{"stack": shimlike.ALLOC_STACK,
                                            "pystack": shimlike.ALLOC_PYSTACK, "bytes": 9 * GiB},
                                           {"stack": shimlike.ALLOC_STACK[:2], "pystack": [],
                                            "thread": "pt_autograd_0", "bytes": 512 * MiB}]})
            if k == forecast_at:
                p.advice(seconds * k + 0.002, 1, 0, 8, 4, "forecast",
                         forecast={"step": k + 1, "bytes": 21 * GiB + 100 * MiB})
        p.summary(seconds * steps + 1)
        return p


class ModeAndArch(Base):
    def test_mode_switch_in_the_device_section(self):
        p = self.leaky(steps=3)
        path = p.write(self.tmp)
        out = self.main(path)
        self.assertIn("   mode         auto -> enforce at 0.50 s (trainer registered)\n", out)
        self.assertNotIn("unknown events", out)
        page = self.html(path)
        self.assertIn("<tr><th>mode</th><td>auto -&gt; enforce at 0.50 s (trainer registered)</td></tr>",
                      page)

    def arch(self, p, module, cc, sass, ptx, ok, message, devs):
        p.events.append({"t": 0.01, "ev": "arch", "dev": devs[0], "cc": cc, "module": module,
                         "sass": sass, "ptx": ptx, "ok": ok, "message": message, "devs": devs,
                         "source": "file", "fatbins": 1, "read_bytes": 2048, "read_us": 12})

    def two_gpu_rank(self, rank):
        """A process with an RTX 3090 (8.6) and an RTX 5090 (12.0)."""
        devs = [shimlike.device(0, RTX, 24 * GiB, 2 * GiB, GiB, cc="8.6"),
                shimlike.device(1, "NVIDIA GeForce RTX 5090", 32 * GiB, 2 * GiB, GiB, cc="12.0")]
        p = shimlike.Process(devs, rank=rank, pid=5000 + rank)
        self.arch(p, "/opt/ext/libsm80.so", "8.6", ["sm_80"], [], True, "runs SASS sm_80", [0])
        self.arch(p, "/opt/ext/libsm80.so", "12.0", ["sm_80"], [], False,
                  "no kernel image for sm_120: the module carries SASS sm_80", [1])
        self.arch(p, "/opt/ext/libptx.so", "8.6", [], ["compute_80"], True,
                  "runs only by JIT compilation of PTX compute_80 (no SASS for sm_86)", [0])
        self.arch(p, "/opt/ext/libptx.so", "12.0", [], ["compute_80"], True,
                  "runs only by JIT compilation of PTX compute_80 (no SASS for sm_120)", [1])
        self.arch(p, "/opt/ext/libsm90.so", "8.6", ["sm_90"], [], False,
                  "no kernel image for sm_86: the module carries SASS sm_90", [0])
        self.arch(p, "/opt/ext/libsm90.so", "12.0", ["sm_90"], [], False,
                  "no kernel image for sm_120: the module carries SASS sm_90", [1])
        self.arch(p, "/opt/ext/libsm86.so", "8.6", ["sm_86"], [], True, "runs SASS sm_86", [0])
        for dev in (0, 1):
            p.sample(1.0, dev, 4 * GiB, 5 * GiB)
        p.summary(2.0)
        return p.write(self.tmp)

    def test_modules_no_gpu_runs_open_the_verdict(self):
        paths = [self.two_gpu_rank(0), self.two_gpu_rank(1)]
        out = self.main(*paths)
        lines = out.splitlines()
        self.assertEqual(lines[1:4], [
            "  ranks 0-1 GPU1 NVIDIA GeForce RTX 5090 (cc 12.0): no kernel image in /opt/ext/"
            "libsm80.so (another GPU of the process runs it): no kernel image for sm_120: the "
            "module carries SASS sm_80",
            "  ranks 0-1 GPU0 NVIDIA GeForce RTX 3090 (cc 8.6): no kernel image in /opt/ext/"
            "libsm90.so (no GPU of the process runs it): no kernel image for sm_86: the module "
            "carries SASS sm_90",
            "  ranks 0-1 GPU1 NVIDIA GeForce RTX 5090 (cc 12.0): no kernel image in /opt/ext/"
            "libsm90.so (no GPU of the process runs it): no kernel image for sm_120: the module "
            "carries SASS sm_90"])
        self.assertEqual(lines[4], "  no refusal and no OOM in any journal")
        self.assertNotIn("unknown events", out)
        # the details: modules that run only by JIT, and those that do not run
        sec = out[out.index("pid 5000"):out.index("pid 5001")]
        gpu0 = sec[sec.index("-- GPU0"):sec.index("-- GPU1")]
        self.assertIn("   device code  4 modules checked: 2 run SASS, 1 only by JIT compilation of "
                      "PTX, 1 not at all\n"
                      "                /opt/ext/libsm90.so: no kernel image for sm_86: the module "
                      "carries SASS sm_90\n"
                      "                /opt/ext/libptx.so: runs only by JIT compilation of PTX "
                      "compute_80 (no SASS for sm_86)\n", gpu0)
        self.assertNotIn("libsm86.so", out)          # runs its own SASS: counted, not listed
        gpu1 = sec[sec.index("-- GPU1"):]
        self.assertIn("   device code  3 modules checked: 0 run SASS, 1 only by JIT compilation of "
                      "PTX, 2 not at all", gpu1)

    def test_sass_and_jit_rules(self):
        self.assertTrue(rpt.sass_runs("sm_86", "8.9"))
        self.assertTrue(rpt.sass_runs("sm_80", "8.6"))
        self.assertFalse(rpt.sass_runs("sm_89", "8.6"))
        self.assertFalse(rpt.sass_runs("sm_80", "9.0"))
        self.assertTrue(rpt.sass_runs("sm_90a", "9.0"))
        self.assertFalse(rpt.sass_runs("sm_90a", "9.1"))
        self.assertTrue(rpt.sass_runs("sm_120", "12.0"))
        self.assertTrue(rpt.sass_runs("sm_100f", "10.3"))
        self.assertFalse(rpt.sass_runs("compute_80", "8.6"))
        self.assertFalse(rpt.sass_runs("sm_80", "?"))
        # an event without a message is judged from its SASS list
        self.assertTrue(rpt.runs_only_by_jit({"sass": ["sm_90"], "ptx": ["compute_80"]}, "8.6", ""))
        self.assertFalse(rpt.runs_only_by_jit({"sass": ["sm_80"]}, "8.6", ""))
        self.assertFalse(rpt.runs_only_by_jit({"sass": ["sm_80"]}, "8.6", "runs SASS sm_80"))


class LeaksAndForecasts(Base):
    def test_verdict_leads_with_the_leak_and_the_forecast(self):
        p = self.leaky(forecast_at=180)
        p.incident("near_miss", 1850.0, 0, 64 * MiB, 21 * GiB + 10 * MiB, count=1)
        out = self.main(p.write(self.tmp))
        lines = out.splitlines()
        dev = "rank 0 GPU0 " + RTX
        # 80 steps to the limit at 10 s a step
        self.assertEqual(lines[1], "  %s: leak: +64 MiB per step since step 3 from /home/me/"
                                   "model.py:88 in Block.forward, aten::addmm; at this rate the "
                                   "limit is reached at step 230, in about 13 min" % dev)
        self.assertEqual(lines[2], "  %s: forecast at step 180 (at %s, 30.0 min into the run): step "
                                   "181 would peak at 21.1 GiB, over the near-miss line (21.0 GiB); "
                                   "advised batch 8 x accum 4, before any near miss"
                         % (dev, rpt.fmt_wall(W0 + 1800.002)))
        self.assertEqual(lines[3], "  no refusal and no OOM in any journal")
        self.assertTrue(lines[4].startswith("  rank 0  node1  finished after "), lines[4])
        # the leak's sites in the device section, a thread without Python frames named
        self.assertIn("                  +512 MiB    backward on thread pt_autograd_0\n", out)
        self.assertIn("   trend        over steps 137 .. 200 (least squares): peak +64 MiB/step, "
                      "live +64 MiB/step\n", out)

    def test_forecast_after_a_near_miss_and_leak_without_projection(self):
        p = self.leaky(steps=20, forecast_at=10)
        p.incident("near_miss", 50.0, 0, 64 * MiB, 21 * GiB + 10 * MiB, count=1)
        p.advice(150.0, 2, 0, 4, 8, "forecast", forecast={"step": 16, "bytes": 22 * GiB})
        p.events.append({"t": 190.0, "ev": "leak", "dev": 0, "since_step": 5, "step": 19,
                         "rate": 3 * MiB // 2, "live": 5 * GiB, "projected_step": None,
                         "sites": []})
        out = self.main(p.write(self.tmp))
        self.assertIn(": forecast at step 10 (", out)
        self.assertIn("advised batch 8 x accum 4, after the first near miss (50.00 s) (2 forecasts in all)",
                      out)
        self.assertIn(": leak: +1.5 MiB per step since step 5\n", out)
        self.assertIn("   leak         +1.5 MiB per step since step 5\n"
                      "                live 5.0 GiB at step 19\n", out)

    def test_repeated_leak_lines_say_how_they_changed(self):
        p = self.leaky(steps=10)
        for k, rate in ((20, 32 * MiB), (40, 64 * MiB)):
            p.events.append({"t": 10.0 * k, "ev": "leak", "dev": 0, "since_step": 12, "step": k,
                             "rate": rate, "live": 6 * GiB, "projected_step": 400, "sites": []})
        out = self.main(p.write(self.tmp))
        self.assertIn("   leak         +64 MiB per step since step 12; at this rate the limit is "
                      "reached at step 400, in about 60 min", out)
        self.assertIn("                live 6.0 GiB at step 40; 2 lines, the first at step 20 "
                      "(+32 MiB per step since step 12)", out)

    def test_rough_durations(self):
        self.assertEqual(rpt.fmt_about(40), "40 s")
        self.assertEqual(rpt.fmt_about(800), "13 min")
        self.assertEqual(rpt.fmt_about(7200), "2 h")
        self.assertEqual(rpt.fmt_about(9000), "2.5 h")
        self.assertEqual(rpt.fmt_about(30 * 3600), "30 h")
        self.assertEqual(rpt.fmt_about(4 * 86400), "4 days")
        self.assertEqual(rpt.fmt_size(64 * MiB), "64 MiB")
        self.assertEqual(rpt.fmt_size(3 * MiB // 2), "1.5 MiB")

    def test_trend_is_least_squares_over_the_recent_steps(self):
        self.assertEqual(rpt.fit_line([(1, 3.0), (2, 5.0), (3, 7.0)]), (1.0, 2.0))
        self.assertIsNone(rpt.fit_line([(1, 3.0)]))
        self.assertIsNone(rpt.fit_line([(2, 3.0), (2, 4.0)]))
        p = self.leaky(steps=400, noise=300)
        j = rpt.Journal(p.write(self.tmp)).read()
        d = j.devices[0]
        self.assertEqual(len(d.recent), rpt.RECENT_STEPS)
        self.assertEqual(d.recent[-1][0], 400)
        tr = d.trends()
        self.assertEqual(tr["live"][1], 64 * MiB)               # exact: no noise on live
        self.assertLess(abs(tr["peak"][1] - 64 * MiB), 16 * MiB)  # +-300 MiB of noise
        self.assertAlmostEqual(d.step_rate(), 0.1)

    def test_step_chart(self):
        p = self.leaky(forecast_at=180)
        page = self.html(p.write(self.tmp))
        self.assertEqual(ET.fromstring(page[len("<!DOCTYPE html>"):]).tag, "html")   # well-formed
        svgs = [ET.fromstring(s) for s in re.findall(r'<svg\b[^>]*class="steps".*?</svg>', page, re.S)]
        self.assertEqual(len(svgs), 1)
        svg = svgs[0]
        w, h = float(svg.get("width")), float(svg.get("height"))

        def drawn(cls):
            return [e for e in svg.iter() if e.get("class") == cls and e.find(SVG + "title") is not None]
        peak, live = drawn("line-step-peak"), drawn("line-step-live")
        self.assertEqual((len(peak), len(live)), (1, 1))
        self.assertEqual(peak[0].get("d").count("L"), 199)       # every step, 200 of them
        (tp,), (tl,) = drawn("trend-peak"), drawn("trend-live")
        self.assertEqual(tl.find(SVG + "title").text, "live trend over steps 137 .. 200: +64 MiB per step")
        # rising: the line goes up (SVG y grows downwards) and runs past the last step
        self.assertLess(float(tl.get("y2")), float(tl.get("y1")))
        last_x = float(re.findall(r"L([\d.]+),", live[0].get("d"))[-1])
        self.assertGreater(float(tl.get("x2")), last_x)
        (near,) = drawn("line-near")
        (limit,) = drawn("line-limit")
        self.assertGreater(float(near.get("y1")), float(limit.get("y1")))
        (fc,) = drawn("mark-forecast")
        self.assertEqual(fc.find(SVG + "title").text, "forecast at step 180: step 181 would peak "
                                                      "at 21.1 GiB; advised batch 8 x accum 4")
        (lk,) = drawn("mark-leak")
        self.assertEqual(lk.find(SVG + "title").text, "leak at step 150: +64 MiB per step since "
                                                      "step 3; the limit at step 230")
        for e in svg.iter():
            for a in ("x", "y", "x1", "x2", "y1", "y2"):
                if e.get(a) is not None:
                    self.assertTrue(0 <= float(e.get(a)) <= max(w, h), (e.get("class"), a, e.get(a)))
            for n in re.findall(r"[MHVL](-?[\d.]+)", e.get("d") or ""):
                self.assertTrue(0 <= float(n) <= max(w, h), n)

    def test_trace_has_step_counters_and_leaks(self):
        p = self.leaky(steps=160)
        trace = os.path.join(self.tmp, "t.json")
        self.main("--trace", trace, p.write(self.tmp))
        with open(trace) as f:
            evs = json.load(f)["traceEvents"]
        peaks = [e for e in evs if e["name"] == "GPU0 step peak"]
        self.assertEqual(len(peaks), 160)
        self.assertEqual(peaks[9]["ts"], 100e6)
        self.assertEqual(peaks[9]["args"], {"bytes": 10 * GiB + 10 * 64 * MiB})
        (leak,) = [e for e in evs if e.get("cat") == "gpuguard,leak"]
        self.assertEqual(leak["args"]["projected_step"], 230)
        self.assertEqual(leak["name"], "leak +64 MiB/step")


class ManySteps(Base):
    def write_steps(self, n, spike=None):
        """A journal of `n` step lines, one per step (a shim that journals
        every step), with one spike in the peaks and one dip in live."""
        path = os.path.join(self.tmp, "gpuguard.python3.rank0.%d.jsonl" % n)
        with open(path, "w") as f:
            f.write(json.dumps(self.leaky(steps=0).events[0]) + "\n")
            for k in range(1, n + 1):
                peak = 10 * GiB + (k % 97) * MiB
                live = 4 * GiB + (k % 89) * MiB
                if k == spike:
                    peak, live = 23 * GiB, GiB
                f.write('{"t":%.3f,"ev":"step","step":%d,"dev":0,"peak":%d,"peak_used":%d,"live":%d}\n'
                        % (0.5 * k, k, peak, peak + GiB, live))
        return path

    def test_step_lines_stay_bounded_whatever_their_number(self):
        small, big = self.write_steps(20000), self.write_steps(80000, spike=73457)
        peaks = []
        for path in (small, big):
            tracemalloc.start()
            j = rpt.Journal(path).read()
            peaks.append(tracemalloc.get_traced_memory()[1])
            tracemalloc.stop()
        # 4x the steps, not 2x the memory, and far less than the file
        self.assertLess(peaks[1], 2 * peaks[0], peaks)
        self.assertLess(peaks[1], os.path.getsize(big) // 4, peaks)
        d = j.devices[0]
        self.assertEqual(d.steps, 80000)
        pts = d.step_series.points()
        self.assertLessEqual(len(pts), 6 * rpt.TIMELINE_BUCKETS)
        self.assertIn(73457, [s[0] for s in pts])              # the spike and the dip survive
        self.assertEqual(max(s[1] for s in pts), 23 * GiB)
        self.assertEqual(min(s[2] for s in pts), GiB)
        self.assertEqual((pts[0][0], pts[-1][0]), (1, 80000))
        # the chart draws an envelope of a few points per pixel, spike included
        page = os.path.join(self.tmp, "r.html")
        out = self.main("--html", page, big)
        with open(page, encoding="utf-8") as f:
            svg = re.search(r'<svg\b[^>]*class="steps".*?</svg>', f.read(), re.S).group(0)
        d_peak = re.search(r'<path d="([^"]*)" class="line-step-peak"', svg).group(1)
        self.assertLess(d_peak.count("L"), 6 * 732)
        top = min(float(v) for v in re.findall(r"[ML][\d.]+,([\d.]+)", d_peak))
        self.assertLess(top, 40)                               # 23 of 24 GiB: near the top
        self.assertLess(len(out.splitlines()), 60)
        self.assertIn("   steps        1 .. 80 000 (80 000 journaled; 2 steps/s), highest step "
                      "peak 23.0 GiB", out)


class RecommendFromSteps(Base):
    def run_journal(self, thinned):
        """Batch 4 then batch 8, each phase closed by a `batch` event without
        a peak (an older shim), so the steps' peaks are what the fit has;
        the shim journals every step of the first 100, then every 100th."""
        devs = [shimlike.device(0, RTX, 24 * GiB, 2 * GiB, GiB, cc="8.6")]
        p = shimlike.Process(devs, rank=0)
        step, t = 0, 1.0
        for batch, accum, n in ((4, 8, 150), (8, 4, 150)):
            p.batch(t, 0, batch, accum, 0)
            for k in range(n):
                step += 1
                t += 1.0
                peak = 6 * GiB + batch * GiB + (256 * MiB if k == 120 else 0)
                p.sample(t - 0.5, 0, peak, peak + 512 * MiB)
                if not thinned or step <= 100 or step % 100 == 0:
                    p.step(t, step, 0, peak, peak + 512 * MiB, 6 * GiB)
        p.batch(t + 1, 0, 8, 4, 0)
        p.summary(t + 2)
        return rpt.Journal(p.write(self.tmp)).read()

    def test_step_peaks_and_their_margin(self):
        d = self.run_journal(thinned=False).devices[0]
        # every step journaled: the highest step peak is exact
        self.assertEqual(d.phases.by_batch[4]["peak"], 10 * GiB + 256 * MiB)
        self.assertEqual(d.phases.by_batch[4]["source"], "steps")
        d = self.run_journal(thinned=True).devices[0]
        # batch 4's steps 101..150 are not all journaled (step 121 peaked
        # higher): bounded by the highest sample + 1% of total
        e = d.phases.by_batch[4]
        self.assertEqual(e["source"], "steps (not every step journaled: + margin)")
        self.assertEqual(e["peak"], 10 * GiB + 256 * MiB + 24 * GiB // 100)
        # batch 8 (steps 151..300): only 200 and 300 journaled, the peak exact anyway
        self.assertEqual(d.phases.by_batch[8]["source"], "steps (not every step journaled: + margin)")
        self.assertGreaterEqual(d.phases.by_batch[8]["peak"], 14 * GiB + 256 * MiB)


if __name__ == "__main__":
    unittest.main()
