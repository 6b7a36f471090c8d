"""Tests of tools/bin/gpuguard-report on synthetic journals written from the
schema of docs/journal.md."""

import html.parser
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest
import xml.etree.ElementTree as ET
from contextlib import redirect_stderr, redirect_stdout

HERE = os.path.dirname(os.path.abspath(__file__))
PYDIR = os.path.dirname(HERE)
TOOLS = os.path.dirname(PYDIR)
REPORT = os.path.join(TOOLS, "bin", "gpuguard-report")
for _p in (PYDIR, HERE):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import shimlike  # noqa: E402


def load_report():
    """The gpuguard.report package (tools/python/gpuguard/report)."""
    from gpuguard import report
    return report


rpt = load_report()

GiB = 1 << 30
MiB = 1 << 20
SVG = "{http://www.w3.org/2000/svg}"


def frame(i, module, sym, off):
    return {"ip": "0x%x" % (0x7f1200000000 + i), "module": module, "sym": sym, "off": off}


CACHING = frame(1, "/site-packages/torch/lib/libc10_cuda.so",
                "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc", 0x1a4)
EMPTY = frame(2, "/site-packages/torch/lib/libtorch_cuda.so", "at::native::empty_cuda", 0x52)
ADDMM = frame(3, "/site-packages/torch/lib/libtorch_cuda.so", "at::native::addmm_out_cuda", 0x91)
CONV = frame(4, "/site-packages/torch/lib/libtorch_cuda.so", "at::native::cudnn_convolution", 0x33)
PYEVAL = frame(5, "/usr/lib/libpython3.11.so.1.0", "_PyEval_EvalFrameDefault", 0x2f1)
NCCL = frame(6, "/site-packages/nvidia/nccl/lib/libnccl.so.2", None, None)
MAIN = frame(7, "/usr/bin/python3.11", "main", 0x10)

LIMIT0 = 24 * GiB - 3 * GiB // 2

NOTE = ('gpuguard: SIGUSR2 received by the trainer; advice #1 (near_miss): batch 16 x accum 2\n'
        'Python stack (most recent call last):\n'
        '  File "/home/me/train.py", line 80, in <module>\n'
        '    main()\n'
        '  File "/home/me/train.py", line 42, in train_step\n'
        '    loss = model(batch).loss\n')


def journal_rank0():
    """A complete run on an RTX 3090: samples, 3 near misses (two stacks),
    a refusal, an OOM, two advice, a note, an error, a summary."""
    ev = [{"t": 0.0, "ev": "start", "pid": 4242, "comm": "python", "host": "node1", "rank": 0,
           "version": "0.1.0", "mode": "enforce", "future_field": {"x": 1},
           "devices": [{"dev": 0, "name": "NVIDIA GeForce RTX 3090", "total": 24 * GiB,
                        "cc": "8.6", "policy": "/p/rtx-3090.ini", "limit": LIMIT0}]}]
    for i in range(11):
        ev.append({"t": float(i), "ev": "sample", "dev": 0, "current": 2 * i * GiB,
                   "used": 2 * i * GiB + GiB})
    nm = {"ev": "near_miss", "dev": 0, "api": "cudaMalloc", "limit": LIMIT0, "total": 24 * GiB}
    ev.append(dict(nm, t=10.2, bytes=512 * MiB, used=22 * GiB - 1, stack=[CACHING, EMPTY, ADDMM, PYEVAL]))
    ev.append({"t": 10.25, "ev": "advice", "seq": 1, "dev": 0, "batch_size": 16, "grad_accum": 2,
               "reason": "near_miss", "signaled": True})
    ev.append({"t": 10.26, "ev": "note", "text": NOTE})
    ev.append(dict(nm, t=10.3, bytes=256 * MiB, used=22 * GiB, stack=[CACHING, EMPTY, ADDMM, MAIN]))
    ev.append(dict(nm, t=10.4, bytes=64 * MiB, used=21 * GiB, api="cuMemCreate",
                   stack=[CACHING, EMPTY, CONV, PYEVAL]))
    ev.append({"t": 10.5, "ev": "refused", "dev": 0, "api": "cudaMalloc", "bytes": 2 * GiB,
               "used": 22 * GiB, "limit": LIMIT0, "total": 24 * GiB,
               "stack": [CACHING, EMPTY, CONV, PYEVAL], "unknown": True})
    ev.append({"t": 10.6, "ev": "oom", "dev": 0, "api": "cudaMalloc", "bytes": 4 * GiB,
               "used": 22 * GiB, "limit": LIMIT0, "total": 24 * GiB, "stack": []})
    ev.append({"t": 10.7, "ev": "advice", "seq": 2, "dev": 0, "batch_size": 8, "grad_accum": 4,
               "reason": "refused", "signaled": False})
    ev.append({"t": 10.8, "ev": "hologram", "dev": 0})
    ev.append({"t": 10.9, "ev": "error", "message": "policy.ini:3: unknown key 'hedroom'"})
    ev.append({"t": 11.0, "ev": "summary", "duration": 11.0, "devices": [{
        "dev": 0, "name": "NVIDIA GeForce RTX 3090", "total": 24 * GiB, "limit": LIMIT0,
        "peak": 20 * GiB, "peak_used": 22 * GiB, "allocs": 1234, "frees": 1200,
        "near_misses": 3, "refusals": 1, "ooms": 1, "live_bytes": 3 * GiB // 2,
        "live_allocs": 34, "peak_stack": [CACHING, EMPTY, ADDMM],
        "peak_sites": [
            {"stack": [CACHING, EMPTY, ADDMM, PYEVAL, MAIN], "bytes": 12 * GiB, "allocs": 6},
            {"stack": [CACHING, EMPTY, CONV, PYEVAL, MAIN], "bytes": 6 * GiB, "allocs": 3},
            {"stack": [NCCL, MAIN], "bytes": 1 * GiB, "allocs": 1},
            {"stack": [CACHING, frame(8, "/x/libfoo.so", "tiny", 1)], "bytes": 10 * MiB, "allocs": 1},
        ]}]})
    return ev


def journal_rank1_killed():
    """An H200 rank killed mid-run: no summary, a truncated last line."""
    ev = [{"t": 0.0, "ev": "start", "pid": 4243, "comm": "python", "host": "node1", "rank": 1,
           "version": "0.1.0", "mode": "observe",
           "devices": [{"dev": 1, "name": "NVIDIA H200", "total": 141 * GiB, "cc": "9.0",
                        "policy": "/p/default.ini", "limit": 130 * GiB}]}]
    for i in range(6):
        ev.append({"t": float(i), "ev": "sample", "dev": 1, "current": 20 * i * GiB,
                   "used": 20 * i * GiB + 2 * GiB})
    ev.append({"t": 5.5, "ev": "near_miss", "dev": 1, "api": "cuMemCreate", "bytes": 2 * GiB,
               "used": 125 * GiB, "limit": 130 * GiB, "total": 141 * GiB,
               "stack": [NCCL, MAIN]})
    return ev


def write_journal(path, events, tail=""):
    with open(path, "w") as f:
        for e in events:
            f.write(json.dumps(e) + "\n")
        f.write(tail)
    return path


class ReportTestBase(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="gg-report-")
        self.addCleanup(shutil.rmtree, self.tmp)
        self.j0 = write_journal(os.path.join(self.tmp, "gpuguard.python.rank0.4242.jsonl"),
                                journal_rank0())
        self.j1 = write_journal(os.path.join(self.tmp, "gpuguard.python.rank1.4243.jsonl"),
                                journal_rank1_killed(), tail='{"t": 6.0, "ev": "sample", "dev": 1, "cur')

    def main(self, *args):
        out, err = io.StringIO(), io.StringIO()
        with redirect_stdout(out), redirect_stderr(err):
            rc = rpt.main(list(args))
        return rc, out.getvalue(), err.getvalue()

    def section(self, text, start, end=None):
        i = text.index(start)
        j = text.index(end, i) if end else len(text)
        return text[i:j]


class TextReportTest(ReportTestBase):
    def test_figures_of_a_complete_run(self):
        rc, out, err = self.main(self.j0)
        self.assertEqual(rc, 0, err)
        self.assertIn("host node1 rank 0 pid 4242 (python)", out)
        self.assertIn("gpuguard 0.1.0, mode enforce, duration 11.00 s", out)
        self.assertIn("-- GPU0 NVIDIA GeForce RTX 3090", out)
        self.assertIn("cc 8.6, policy /p/rtx-3090.ini", out)
        self.assertIn("total        24.0 GiB", out)
        self.assertIn("limit        22.5 GiB (headroom 1.5 GiB, 93.75% of total)", out)
        self.assertIn("peak         20.0 GiB process (83.33% of total), 22.0 GiB device-wide (91.67%)", out)
        self.assertIn("peak time    about 10.00 s", out)
        self.assertIn("allocations  1234 allocs, 1200 frees", out)
        self.assertIn("live at exit 1.5 GiB in 34 allocations", out)
        self.assertIn("events       3 near misses, 1 refusal, 1 OOM, 2 advice", out)
        self.assertIn("error at 10.90 s: policy.ini:3: unknown key 'hedroom'", out)
        self.assertIn("unknown events skipped: hologram x1", out)
        self.assertNotIn("no summary", out)


    def test_a_count_of_one_is_singular(self):
        ev = journal_rank0()
        ev[-1]["devices"][0].update(allocs=1, frees=1)
        j = write_journal(os.path.join(self.tmp, "gpuguard.python.one.4244.jsonl"), ev)
        rc, out, err = self.main(j)
        self.assertEqual(rc, 0, err)
        self.assertIn("allocations  1 alloc, 1 free\n", out)

    def test_peak_sites_tree(self):
        # --native: every frame as the shim took it (the PyTorch view: test_report_torch)
        rc, out, _ = self.main("--native", self.j0)
        tree = self.section(out, "Allocation sites at the peak:", "Near misses")
        lines = [l.strip() for l in tree.splitlines()[1:] if l.strip()]
        # 12 + 6 + 1 GiB + 10 MiB of a 20 GiB peak; massif-style, allocator side first
        self.assertTrue(lines[0].startswith("95.05% (19.0 GiB) in 4 sites listed at the process peak of 20.0 GiB"), lines[0])
        self.assertRegex(lines[1], r"^->90\.05% \(18\.0 GiB\) 10 allocs: c10::cuda::CUDACachingAllocator"
                                   r"::Native::DeviceCachingAllocator::malloc\+0x1a4 \(libc10_cuda\.so\)$")
        self.assertRegex(lines[2], r"^\| ->90\.00% \(18\.0 GiB\) 9 allocs: at::native::empty_cuda\+0x52 \(libtorch_cuda\.so\)$")
        self.assertRegex(lines[3], r"^\| \| ->60\.00% \(12\.0 GiB\) 6 allocs: at::native::addmm_out_cuda\+0x91")
        self.assertTrue(any(re.match(r"^\| \| ->30\.00% \(6\.0 GiB\) 3 allocs: at::native::cudnn_convolution", l)
                            for l in lines), lines)
        self.assertTrue(any("0.05% (10.0 MiB) in 1 place, all below the 1.00% threshold" in l
                            for l in lines), lines)
        # the NCCL site has no symbol: its frame is its address and module
        self.assertTrue(any(re.match(r"^->5\.00% \(1\.0 GiB\) 1 alloc: 0x7f1200000006 \(libnccl\.so\.2\)$", l)
                            for l in lines), lines)
        self.assertIn("(1014.0 MiB of the peak in sites the summary does not list)", tree)
        # subtrees: the addmm branch continues into its callers
        i = lines.index(next(l for l in lines if "addmm_out_cuda" in l))
        self.assertIn("_PyEval_EvalFrameDefault", lines[i + 1])
        self.assertIn("main+0x10 (python3.11)", lines[i + 2])

    def test_tree_orientation_depth_and_threshold(self):
        sites = journal_rank0()[-1]["devices"][0]["peak_sites"]
        top = rpt.site_tree(sites, depth=12, top_down=True)
        self.assertEqual([n.label for n in top.children.values()][:1], ["main+0x10 (python3.11)"])
        self.assertEqual(list(top.children.values())[0].bytes, 19 * GiB)
        shallow = rpt.site_tree(sites, depth=1)
        lines = rpt.render_tree(shallow, 20 * GiB, 0.0, "x")
        self.assertIn("->...", "\n".join(lines))
        lines = rpt.render_tree(rpt.site_tree(sites, 12), 20 * GiB, 50.0, "x")
        self.assertTrue(any("below the 50.00% threshold" in l for l in lines), lines)

    def test_near_misses_grouped_by_top_frames(self):
        # A journal from before Python frames: every stack is under one
        # "(no Python frames)" line, split by its top native frames (--native:
        # the frames themselves; the PyTorch view groups by op, test_report_torch).
        rc, out, _ = self.main("--native", self.j0)
        nm = self.section(out, "Near misses: 3, by Python line:", "Refused")
        lines = [l.strip() for l in nm.splitlines()]
        self.assertEqual(lines[1], "3x  largest 512.0 MiB, 832.0 MiB in all; 10.20 s .. 10.40 s; "
                                   "device used up to 22.0 GiB (limit 22.5 GiB); cudaMalloc, cuMemCreate")
        self.assertEqual(lines[2], "(no Python frames), from 3 stacks:")
        # the first two share their top 3 frames (different 4th frame): 4 frames split them
        stacks = [l for l in lines if re.match(r"^\d+x  ", l)][1:]
        self.assertEqual(len(stacks), 3)
        rc, out, _ = self.main("--native", "--frames", "3", self.j0)
        nm = self.section(out, "Near misses: 3, by Python line:", "Refused")
        stacks = [l.strip() for l in nm.splitlines() if re.match(r"^\s+\d+x  ", l)][1:]
        self.assertEqual(len(stacks), 2)
        self.assertEqual(stacks[0], "2x  largest 512.0 MiB, 768.0 MiB in all; 10.20 s .. 10.30 s; "
                                    "cudaMalloc")
        self.assertIn("#2 at::native::addmm_out_cuda+0x91 (libtorch_cuda.so)", nm)
        self.assertIn("1x  largest 64.0 MiB", stacks[1])
        self.assertIn("cuMemCreate", stacks[1])

    def test_refusals_ooms_and_advice(self):
        rc, out, _ = self.main(self.j0)
        self.assertIn("Refused: 1, by Python line:", out)
        self.assertIn("1x  largest 2.0 GiB, 2.0 GiB in all; 10.50 s .. 10.50 s", out)
        oom = self.section(out, "Out of memory (real allocator): 1, by Python line:", "Advice history")
        self.assertIn("(no stack)", oom)
        adv = self.section(out, "Advice history:")
        self.assertRegex(adv, r"10\.25 s  #1  near_miss batch 16 x accum 2, signaled")
        self.assertIn("trainer at /home/me/train.py:42 in train_step: loss = model(batch).loss", adv)
        self.assertRegex(adv, r"10\.70 s  #2  refused\s+batch 8 x accum 4, not signaled")
        self.assertNotIn("Notes:", out)   # the only note answered advice #1

    def test_merged_journals(self):
        rc, out, err = self.main(self.j1, self.j0)
        self.assertEqual(rc, 0, err)
        self.assertTrue(out.startswith("gpuguard report: 2 journals, 2 device sections"))
        rows = [l for l in out.splitlines() if l.startswith("node1 ")]
        self.assertEqual(len(rows), 2)
        self.assertRegex(rows[0], r"^node1\s+0\s+4242\s+GPU0\s+20\.0 GiB\s+22\.0 GiB\s+22\.5 GiB\s+24\.0 GiB\s+3\s+1\s+1\s+2$")
        self.assertRegex(rows[1], r"^node1\s+1\s+4243\s+GPU1\s+100\.0 GiB\s+125\.0 GiB\s+130\.0 GiB\s+141\.0 GiB\s+1\s+0\s+0\s+0$")
        # sections in rank order whatever the order on the command line
        self.assertLess(out.index("rank 0 pid 4242"), out.index("rank 1 pid 4243"))

    def test_killed_process_and_truncated_line(self):
        rc, out, err = self.main(self.j1)
        self.assertEqual(rc, 0, err)
        self.assertIn("no summary: the process ended without one (killed?)", out)
        self.assertIn("the last line is truncated (skipped)", out)
        self.assertIn("-- GPU1 NVIDIA H200", out)
        # figures from the samples and the events
        self.assertIn("peak         100.0 GiB process (70.92% of total), 125.0 GiB device-wide", out)
        self.assertIn("last sample  at 5.00 s: process 100.0 GiB, device 102.0 GiB", out)
        self.assertIn("events       1 near miss, 0 refusals, 0 OOMs, 0 advice", out)
        self.assertIn("#0 0x7f1200000006 (libnccl.so.2)", out)
        self.assertNotIn("allocations", out)

    def test_lines_the_shim_left_out_or_lost(self):
        # the budgets' counts: from the summary, else (killed) the last suppressed line
        ev = journal_rank0()
        summary = [e for e in ev if e["ev"] == "summary"][0]
        summary["suppressed"] = {"near_miss": 1200, "sample": 34, "step": 0}
        summary["lost_lines"] = 3
        summary["partial"] = "exit interrupted the shim: stacks and sites left out"
        ev.insert(-1, {"t": 9.0, "ev": "suppressed", "since": {"near_miss": 7},
                       "total": {"near_miss": 7}})
        path = write_journal(os.path.join(self.tmp, "gpuguard.python.rank5.50.jsonl"), ev)
        rc, out, err = self.main(path)
        self.assertEqual(rc, 0, err)
        self.assertIn("1234 lines left out by the journal's budgets (counted, not written): "
                      "near_miss 1200, sample 34", out)
        self.assertIn("3 lines lost: the journal could not be written (full disk?)", out)
        self.assertIn("the summary is incomplete: exit interrupted the shim", out)
        self.assertNotIn("suppressed x", out)     # a known event, not skipped
        killed = [e for e in ev if e["ev"] != "summary"]
        path = write_journal(os.path.join(self.tmp, "gpuguard.python.rank6.60.jsonl"), killed)
        rc, out, err = self.main(path, "--html", os.path.join(self.tmp, "k.html"))
        self.assertIn("7 lines left out by the journal's budgets (counted, not written): "
                      "near_miss 7", out)
        self.assertNotIn("lost", out)
        with open(os.path.join(self.tmp, "k.html")) as f:
            self.assertIn("7 lines left out by the journal&#x27;s budgets", f.read())

    def test_garbage_lines_unknown_fields_and_missing_start(self):
        path = os.path.join(self.tmp, "gpuguard.bash.rank3.77.jsonl")
        with open(path, "w") as f:
            f.write('not json\n[1, 2]\n{"ev": "sample", "dev": 0, "current": 5, "used": "x"}\n')
            f.write('{"t": 1, "ev": "sample", "dev": 0, "current": 1048576, "used": null, "zz": 1}\n')
            f.write('{"t": 2, "ev": "advice", "seq": "?", "reason": 7}\n')
            f.write('{"t": 3, "ev": "near_miss", "dev": 0, "stack": [1, "x"], "bytes": "big"}\n')
            f.write('{"t": 3.5, "ev": "refused", "dev": 0, "stack": [{"ip": "0x1"}], "bytes": 4096}\n')
            f.write('{"t": 4, "ev": "summary", "devices": [null, {"dev": "0"}, {"dev": 0, "peak_sites": [{"stack": null}, 3]}]}\n')
        rc, out, err = self.main(path)
        self.assertEqual(rc, 0, err)
        self.assertIn("host ? rank 3 pid 77 (bash)", out)     # identity from the file name
        self.assertIn("2 lines unreadable (skipped)", out)
        self.assertIn("-- GPU0 (unknown device)", out)
        self.assertIn("(no stack)", out)
        self.assertIn("#0 0x1 (?)", out)
        self.assertIn("live at exit n/a", out)

    def test_empty_and_unreadable(self):
        empty = os.path.join(self.tmp, "gpuguard.python.1.jsonl")
        open(empty, "w").close()
        rc, out, err = self.main(empty)
        self.assertEqual(rc, 0)
        self.assertIn("empty journal: no events", out)
        rc, out, err = self.main(os.path.join(self.tmp, "nope.jsonl"), self.j0)
        self.assertEqual(rc, 1)
        self.assertIn("nope.jsonl", err)
        self.assertIn("host node1 rank 0", out)

    def test_directory_argument(self):
        rc, out, err = self.main(self.tmp)
        self.assertEqual(rc, 0, err)
        self.assertIn("2 journals", out)
        other = tempfile.mkdtemp(dir=self.tmp)
        rc, out, err = self.main(other)
        self.assertEqual(rc, 1)
        self.assertIn("no gpuguard.*.jsonl journal", err)


H100 = "NVIDIA H100 80GB HBM3"
W0 = 1795000000.0


def multi_rank(tmp, walls=True):
    """A 4-rank job on 2 hosts, each process seeing 4 H100s and using one
    (rank r: GPU r % 2). Ranks 0 and 1 finish. Rank 2 (started 1 s after
    rank 0) is refused at 100 s and killed; rank 3 (started 31 s after rank
    0) dies of a real OOM at 90 s: it failed second, though its own clock
    says 90 < 100."""
    devs = [shimlike.device(i, H100, 80 * GiB, 8 * GiB, 4 * GiB) for i in range(4)]
    start = {0: 0.0, 1: 0.2, 2: 1.0, 3: 31.0}
    paths = []
    for r in range(4):
        p = shimlike.Process(devs, pid=5000 + r, rank=r, host="node1" if r < 2 else "node2",
                             wall=W0 + start[r])
        if not walls:
            del p.events[0]["wall"]
        dev = r % 2
        for i in range(4):
            p.mode(0.5, i)      # the shim switches every auto device at registration
        end = {0: 200, 1: 200, 2: 100, 3: 90}[r]
        for k in range(1, end):
            cur = 40 * GiB + (k % 7) * GiB
            p.sample(k - 0.5, dev, cur, cur + GiB)
            p.step(float(k), k, dev, cur + 2 * GiB, cur + 3 * GiB, 30 * GiB)
        if r == 2:
            p.incident("near_miss", 99.5, dev, 2 * GiB, 69 * GiB, count=1)
            p.incident("refused", 100.0, dev, 6 * GiB, 70 * GiB)
            p.advice(100.0001, 1, dev, 16, 2, "refused")
            p.sample(100.2, dev, 45 * GiB, 46 * GiB)
        elif r == 3:
            p.incident("oom", 90.0, dev, 8 * GiB, 75 * GiB, api="cuMemCreate")
            p.advice(90.0001, 1, dev, 16, 2, "oom")
        else:
            p.summary(200.0)
        paths.append(p.write(tmp))
    return paths


class VerdictTest(ReportTestBase):
    def test_first_lines_name_the_rank_that_failed_first(self):
        paths = multi_rank(self.tmp)
        rc, out, err = self.main(*paths)
        self.assertEqual(rc, 0, err)
        lines = out.splitlines()
        self.assertEqual(lines[0], "gpuguard report: 4 journals, 4 device sections; "
                                   "12 unused devices left out (nothing allocated there)")
        self.assertEqual(lines[1], "  first failure: rank 2 GPU0 %s (host node2, pid 5002) "
                                   "at %s, 1.7 min into the run, after step 99:"
                         % (H100, rpt.fmt_wall(W0 + 101.0)))
        self.assertEqual(lines[2], "    refused cudaMalloc of 6.0 GiB with 2.0 GiB free under the "
                                   "limit (device used 70.0 GiB, limit 72.0 GiB, total 80.0 GiB), "
                                   "asked from /home/me/model.py:88 in Block.forward, aten::addmm")
        rows = lines[3:7]
        self.assertRegex(rows[0], r"^  rank 0  node1  finished after 3\.3 min\s+GPU0 %s: "
                                  r"peak 48\.0 GiB of limit 72\.0 GiB" % H100)
        self.assertRegex(rows[1], r"^  rank 1  node1  finished after 3\.3 min\s+GPU1 ")
        # killed without a summary: the last step its journal holds, and what
        # a process ends so by
        self.assertRegex(rows[2], r"^  rank 2  node2  killed after 1\.7 min, after step 99 \(no "
                                  r"summary: SIGKILL, os\._exit or a crash\)\s+GPU0 .*"
                                  r"1 near miss; 1 refusal; 1 advice$")
        self.assertRegex(rows[3], r"^  rank 3  node2  killed after 90\.00 s.* \(no summary: "
                                  r"SIGKILL, os\._exit or a crash\)\s+GPU1 .*1 OOM")

    def test_no_unused_device_appears(self):
        paths = multi_rank(self.tmp)
        rc, out, err = self.main(*paths)
        sections = re.findall(r"^-- (GPU\d) ", out, re.M)
        self.assertEqual(sections, ["GPU0", "GPU1", "GPU0", "GPU1"])
        self.assertEqual(out.count("3 unused devices left out: "), 4)
        table = [l for l in out.splitlines() if l.startswith("node")]
        self.assertEqual([l.split()[3] for l in table], ["GPU0", "GPU1", "GPU0", "GPU1"])
        page = os.path.join(self.tmp, "r.html")
        trace = os.path.join(self.tmp, "r.json")
        rc, out, err = self.main("--html", page, "--trace", trace, *paths)
        # what was written is said, on stderr (stdout is the report)
        self.assertRegex(err, r"gpuguard-report: wrote %s: the HTML report \(one self-contained "
                              r"page: open it in a browser\), [\d.]+ KiB\n" % re.escape(page))
        self.assertRegex(err, r"gpuguard-report: wrote %s: the trace \(open it in "
                              r"https://ui\.perfetto\.dev or chrome://tracing\), [\d.]+ KiB\n"
                              % re.escape(trace))
        self.assertNotIn("wrote", out)
        with open(page) as f:
            page = f.read()
        self.assertEqual(page.count('<svg xmlns="http://www.w3.org/2000/svg" class="timeline"'), 4)
        self.assertEqual(page.count('<svg xmlns="http://www.w3.org/2000/svg" class="steps"'), 4)
        with open(trace) as f:
            evs = json.load(f)["traceEvents"]
        threads = sorted((e["pid"], e["args"]["name"]) for e in evs if e["name"] == "thread_name"
                         and e["args"]["name"].endswith(" events"))
        self.assertEqual(threads, [(5000, "GPU0 %s events" % H100), (5001, "GPU1 %s events" % H100),
                                   (5002, "GPU0 %s events" % H100), (5003, "GPU1 %s events" % H100)])
        steps = sorted((e["pid"], e["args"]["name"]) for e in evs if e["name"] == "thread_name"
                       and e["args"]["name"].endswith(" steps"))
        self.assertEqual([p for p, _ in steps], [5000, 5001, 5002, 5003])

    def test_ranks_aligned_on_wall_clock(self):
        # Without the start's wall clock, each process's own clock is all
        # there is: rank 3's OOM at 90 s comes "first", and the report says
        # the times are not aligned.
        paths = multi_rank(self.tmp, walls=False)
        rc, out, err = self.main(*paths)
        lines = out.splitlines()
        self.assertTrue(lines[1].startswith("  first failure: rank 3 GPU1 %s (host node2, pid 5003) "
                                            "90.00 s into the run, after step 89:" % H100), lines[1])
        self.assertIn("out of memory: cuMemCreate of 8.0 GiB with 5.0 GiB free on the device "
                      "(used 75.0 GiB of 80.0 GiB)", lines[2])
        self.assertIn("(not every journal has the start's wall clock: times are since each "
                      "process's start)", out)
        # aligned, the trace puts rank 2's refusal 1 s after its start's offset
        trace = os.path.join(self.tmp, "r.json")
        rc, out, err = self.main("--trace", trace, *multi_rank(self.tmp))
        with open(trace) as f:
            evs = json.load(f)["traceEvents"]
        ref = [e for e in evs if e["ph"] == "i" and e["cat"] == "gpuguard,refused"]
        self.assertEqual([(e["pid"], e["ts"]) for e in ref], [(5002, 101e6)])
        oom = [e for e in evs if e["ph"] == "i" and e["cat"] == "gpuguard,oom"]
        self.assertEqual([(e["pid"], e["ts"]) for e in oom], [(5003, 121e6)])

    def test_leaks_forecasts_and_kernels_in_the_verdict(self):
        # An RTX 5090 run: a module without sm_120 code, a forecast at step
        # 40, a leak of 64 MiB per step from step 3; 30 s per step.
        devs = [shimlike.device(0, "NVIDIA GeForce RTX 5090", 32 * GiB, 3 * GiB, 2 * GiB, cc="12.0")]
        p = shimlike.Process(devs, rank=0)
        p.events.append({"t": 0.01, "ev": "arch", "dev": 0, "cc": "12.0",
                         "module": "/opt/venv/torch/lib/libtorch_cuda.so", "sass": ["sm_80", "sm_90"],
                         "ptx": ["compute_90"], "ok": False, "devs": [0],
                         "message": "no kernel image for sm_120: the module carries SASS sm_80 "
                                    "sm_90, PTX compute_90"})
        p.sample(1.0, 0, 4 * GiB, 5 * GiB)
        for k in range(1, 61):
            p.step(30.0 * k, k, 0, 8 * GiB + k * 64 * MiB, 9 * GiB + k * 64 * MiB,
                   4 * GiB + k * 64 * MiB)
            if k == 40:
                p.advice(30.0 * k + 0.001, 1, 0, 8, 4, "forecast",
                         forecast={"step": 41, "bytes": 28 * GiB})
            if k == 50:
                p.events.append({"t": 30.0 * k + 0.002, "ev": "leak", "dev": 0, "since_step": 3,
                                 "step": 50, "rate": 64 * MiB, "live": 4 * GiB + 50 * 64 * MiB,
                                 "projected_step": 290,
                                 "sites": [{"stack": shimlike.ALLOC_STACK,
                                            "pystack": [{"file": "train.py", "line": 57,
                                                         "func": "train_step"}],
                                            "bytes": 3 * GiB}]})
        p.incident("near_miss", 1700.0, 0, 64 * MiB, 27 * GiB, count=1)
        rc, out, err = self.main(p.write(self.tmp))
        lines = out.splitlines()
        dev = "rank 0 GPU0 NVIDIA GeForce RTX 5090"
        # device code, leaks and forecasts first, before the processes' lines
        self.assertEqual(lines[1], "  %s (cc 12.0): no kernel image in /opt/venv/torch/lib/"
                                   "libtorch_cuda.so (no GPU of the process runs it): no kernel "
                                   "image for sm_120: the module carries SASS sm_80 sm_90, PTX "
                                   "compute_90" % dev)
        # 240 steps to go at 30 s a step: 2 h
        self.assertEqual(lines[2], "  %s: leak: +64 MiB per step since step 3 from train.py:57 in "
                                   "train_step, aten::addmm; at this rate the limit is reached at "
                                   "step 290, in about 2 h" % dev)
        self.assertEqual(lines[3], "  %s: forecast at step 40 (at %s, 20.0 min into the run): step "
                                   "41 would peak at 28.0 GiB, over the near-miss line (27.0 GiB); "
                                   "advised batch 8 x accum 4, before any near miss"
                         % (dev, rpt.fmt_wall(W0 + 1200.001)))
        self.assertEqual(lines[4], "  no refusal and no OOM in any journal")
        # in the device section: the steps, their trend, the leak's sites
        self.assertIn("   steps        1 .. 60 (60 journaled; 0.0333 steps/s), highest step peak "
                      "11.8 GiB", out)
        self.assertIn("   trend        over steps 1 .. 60 (least squares): peak +64 MiB/step, "
                      "live +64 MiB/step", out)
        self.assertIn("   leak         +64 MiB per step since step 3 from train.py:57", out)
        self.assertIn("                live 7.1 GiB at step 50", out)
        self.assertIn("                sites whose live bytes grew, largest first:", out)
        self.assertIn("                  +3 GiB      #0 [PyTorch caching allocator: 1 frame]", out)
        self.assertIn("                              #1 aten::addmm (2 frames)", out)
        self.assertIn("                              py#0 train.py:57 in train_step", out)
        self.assertIn("   forecast     forecast at step 40", out)
        self.assertIn("   device code  1 module checked: 0 run SASS, 1 not at all", out)


class TagBalance(html.parser.HTMLParser):
    VOID = {"meta", "br", "hr", "img", "input", "link", "area", "base", "col", "embed",
            "source", "track", "wbr"}

    def __init__(self):
        html.parser.HTMLParser.__init__(self, convert_charrefs=True)
        self.stack = []
        self.errors = []
        self.text = []

    def handle_starttag(self, tag, attrs):
        if tag not in self.VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag, attrs):
        pass

    def handle_endtag(self, tag):
        if not self.stack or self.stack[-1] != tag:
            self.errors.append("unexpected </%s> with open %s" % (tag, self.stack[-3:]))
        else:
            self.stack.pop()

    def handle_data(self, data):
        self.text.append(data)


def journal_sized():
    """A run whose helper sized its batches by shape: step lines with the
    peak predicted before each ran, and the model in the summary."""
    ev = [{"t": 0.0, "ev": "start", "pid": 7, "comm": "python", "host": "h", "rank": None,
           "version": "0.1.0", "mode": "enforce",
           "devices": [{"dev": 0, "name": "NVIDIA GeForce RTX 3090", "total": 24 * GiB,
                        "cc": "8.6", "policy": "/p/x.ini", "limit": 6 * GiB,
                        "near_miss": 256 * MiB}]}]
    for step in range(1, 11):
        tokens = 8 * (500 + 100 * step)
        need = GiB + tokens * 150 * 1024
        e = {"t": float(step), "ev": "step", "step": step, "dev": 0, "peak": need + 64 * MiB,
             "peak_used": need + 64 * MiB, "live": GiB, "shape": [8, tokens // 8],
             "tokens": tokens, "needed": need}
        if step > 3:   # predicted from the fourth step on; step 7 off by +10%
            e["predicted"] = need + need // 10 if step == 7 else need
        ev.append(e)
    ev.append({"t": 11.0, "ev": "summary", "duration": 11.0, "devices": [
        {"dev": 0, "name": "NVIDIA GeForce RTX 3090", "total": 24 * GiB, "limit": 6 * GiB,
         "peak": 3 * GiB, "peak_used": 3 * GiB, "allocs": 10, "frees": 9, "near_misses": 0,
         "refusals": 0, "ooms": 0, "live_bytes": GiB, "live_allocs": 1, "steps": 10,
         "model": {"steps": 10, "most_tokens": 12000, "intercept": float(GiB),
                   "per_token": 150.0 * 1024, "per_token2": 0.0, "sigma": 8.0 * MiB}}]})
    return ev


class SizedReportTest(ReportTestBase):
    def test_predicted_against_measured_and_the_model(self):
        j = write_journal(os.path.join(self.tmp, "gpuguard.python.7.jsonl"), journal_sized())
        rc, out, err = self.main(j)
        self.assertEqual(rc, 0, err)
        self.assertIn("Batches sized by their shape: 7 steps predicted before they ran; "
                      "predicted against measured: median error 0.0%, the largest +10.0% "
                      "(step 7: predicted 2.6 GiB, measured 2.4 GiB)", out)
        self.assertIn("the run's memory model at exit: 1 GiB + 150 KiB per token (+- 8 MiB), "
                      "from 10 steps with a shape, the largest 12 000 tokens", out)
        html_out = os.path.join(self.tmp, "r.html")
        rc, _, err = self.main("--html", html_out, j)
        self.assertEqual(rc, 0, err)
        with open(html_out, encoding="utf-8") as f:
            page = f.read()
        ET.fromstring(page[len("<!DOCTYPE html>"):])               # well-formed
        self.assertEqual(page.count('class="mark-predicted"><title>step '), 7)
        self.assertIn("step 7 (9600 tokens): predicted 2.6 GiB, measured 2.4 GiB", page)

    def test_recommend_proposes_the_largest_input_that_fit(self):
        events = journal_sized()
        # step 10 (12 000 tokens) peaked over the near-miss line (5.75 GiB): not proposed
        events[10]["peak_used"] = 5 * GiB + 900 * MiB
        j = write_journal(os.path.join(self.tmp, "gpuguard.python.7.jsonl"), events)
        out_dir = os.path.join(self.tmp, "pol")
        rc, out, err = self.main("--recommend", "--out", out_dir, j)
        self.assertEqual(rc, 0, err)
        self.assertIn("max_tokens: 11 200 (the largest input, in elements, a step of the run "
                      "held under the near-miss line", out)
        if os.path.isdir(out_dir):
            for name in os.listdir(out_dir):
                with open(os.path.join(out_dir, name)) as f:
                    self.assertIn("\nmax_tokens = 11200\n", f.read())

    def test_recommend_on_a_sized_run_keeps_its_batch_and_bounds_the_input(self):
        """A run sized by shape ran batch 8 whole, and 4 x 2 for its long
        inputs: its batch sizes are pieces, not choices, so no line through
        them; the proposal is the batch it ran, with max_tokens."""
        events = journal_sized()
        events[10]["peak_used"] = 5 * GiB + 900 * MiB
        batch = {"ev": "batch", "dev": 0, "peak": 2 * GiB}
        events.insert(1, dict(batch, t=0.5, batch_size=8, grad_accum=1, was_batch_size=8))
        events.insert(8, dict(batch, t=6.5, batch_size=4, grad_accum=2, was_batch_size=8,
                              was_grad_accum=1, reason="shape"))
        events.insert(10, dict(batch, t=7.5, batch_size=8, grad_accum=1, was_batch_size=4,
                               was_grad_accum=2, reason="shape"))
        for e in events:
            if e["ev"] == "step" and e["step"] == 7:
                e["peak"] = e["peak_used"] = e["needed"] // 2 + 64 * MiB  # a piece of 4
        j = write_journal(os.path.join(self.tmp, "gpuguard.python.7.jsonl"), events)
        rc, out, err = self.main("--recommend", j)
        self.assertEqual(rc, 0, err)
        rec = out[out.index("Recommendation for the next run"):]
        self.assertIn("NVIDIA GeForce RTX 3090: each batch of 8 whole (effective 8)", rec)
        self.assertIn("the run sized each batch by its shape (2 changes of the split)", rec)
        self.assertNotIn("x batch from", rec)
        self.assertIn("max_tokens: 11 200", rec)
        # and the batch's path says why it changed
        rc, out, err = self.main(j)
        self.assertEqual(rc, 0, err)
        self.assertIn("8 x 1 at 0.00 s -> 4 x 2 at 6.50 s (by shape) -> 8 x 1 at 7.50 s (by shape)",
                      out)

    def test_no_section_without_predictions(self):
        rc, out, err = self.main(self.j0)
        self.assertNotIn("sized by their shape", out)


class HtmlReportTest(ReportTestBase):
    def render(self, *journals):
        out = os.path.join(self.tmp, "report.html")
        rc, _, err = self.main("--html", out, *journals)
        self.assertEqual(rc, 0, err)
        with open(out, encoding="utf-8") as f:
            return f.read()

    def test_well_formed_and_self_contained(self):
        page = self.render(self.j0, self.j1)
        self.assertTrue(page.startswith("<!DOCTYPE html>"))
        p = TagBalance()
        p.feed(page)
        p.close()
        self.assertEqual(p.errors, [])
        self.assertEqual(p.stack, [])
        # the whole page is also well-formed XML (void elements closed)
        root = ET.fromstring(page[len("<!DOCTYPE html>"):])
        self.assertEqual(root.tag, "html")
        self.assertNotRegex(page, r"<(script|link|img)\b")      # nothing external
        self.assertNotRegex(page, r'(src|href)="(https?:)?//')
        text = "".join(p.text)
        self.assertIn("NVIDIA GeForce RTX 3090", text)
        self.assertIn("trainer at", text)
        self.assertIn("/home/me/train.py:42 in train_step", text)
        self.assertIn("[PyTorch caching allocator: 1 frame]", text)
        self.assertIn("No summary", text)

    def svgs(self, page):
        found = re.findall(r"<svg\b.*?</svg>", page, re.S)
        return [ET.fromstring(s) for s in found]

    def test_svg_timeline(self):
        page = self.render(self.j0, self.j1)
        svgs = self.svgs(page)
        self.assertEqual(len(svgs), 2)
        svg = svgs[0]
        self.assertEqual(svg.tag, SVG + "svg")
        w, h = float(svg.get("width")), float(svg.get("height"))

        def cls(name):   # drawn elements carry a <title>; the legend's do not
            return [e for e in svg.iter() if e.get("class") == name
                    and e.find(SVG + "title") is not None]
        self.assertEqual(len(cls("line-used")), 1)
        self.assertEqual(len(cls("line-current")), 1)
        self.assertEqual(len(cls("line-limit")), 1)
        self.assertEqual(len(cls("line-total")), 1)
        self.assertEqual(len(cls("mark-near_miss")), 3)
        self.assertEqual(len(cls("mark-refused")), 1)
        self.assertEqual(len(cls("mark-oom")), 1)
        self.assertEqual(len(cls("mark-advice")), 2)
        titles = [t.text for t in svg.iter(SVG + "title")]
        self.assertTrue(any(t.startswith("near_miss at 10.20 s: cudaMalloc of 512.0 MiB") for t in titles), titles)
        self.assertTrue(any(t.startswith("refused at 10.50 s") for t in titles), titles)
        self.assertTrue(any(t == "limit 22.5 GiB" for t in titles), titles)
        # every coordinate lies inside the picture
        for e in svg.iter():
            for a in ("x", "y", "x1", "x2", "y1", "y2", "cx", "cy"):
                if e.get(a) is not None:
                    v = float(e.get(a))
                    self.assertTrue(0 <= v <= max(w, h), (e.tag, a, v))
            d = e.get("d")
            if d:
                for n in re.findall(r"[MHVL](-?[\d.]+)", d):
                    self.assertTrue(0 <= float(n) <= max(w, h), (d[:40], n))
        # the limit line sits below the total line (SVG y grows downwards)
        lim, tot = cls("line-limit")[0], cls("line-total")[0]
        self.assertGreater(float(lim.get("y1")), float(tot.get("y1")))
        # the device-used line is a step line through the 11 samples
        d = cls("line-used")[0].get("d")
        self.assertEqual(d.count("H"), 11)

    def test_many_samples_downsampled(self):
        ev = journal_rank1_killed()[:1]
        for i in range(50000):
            ev.append({"t": i * 0.001, "ev": "sample", "dev": 1, "current": (i % 977) * MiB,
                       "used": (i % 977) * MiB + GiB})
        ev.append({"t": 25.0, "ev": "sample", "dev": 1, "current": 99 * GiB, "used": 101 * GiB})
        path = write_journal(os.path.join(self.tmp, "gpuguard.python.5.jsonl"), ev)
        page = self.render(path)
        svg = self.svgs(page)[0]
        used = [e for e in svg.iter() if e.get("class") == "line-used"][0].get("d")
        self.assertLess(used.count("H"), 4000)
        ys = [float(v) for v in re.findall(r"V(-?[\d.]+)", used)]
        self.assertLess(min(ys), 150)      # the 101 GiB spike survives the downsampling


class TraceTest(ReportTestBase):
    def trace(self, *journals):
        out = os.path.join(self.tmp, "trace.json")
        rc, _, err = self.main("--trace", out, *journals)
        self.assertEqual(rc, 0, err)
        with open(out) as f:
            return json.load(f)

    def test_trace_events(self, native=False):
        tr = self.trace(self.j0, self.j1, *(["--native"] if native else []))
        evs = tr["traceEvents"]
        self.assertEqual(tr["displayTimeUnit"], "ms")
        for e in evs:
            self.assertIn(e["ph"], ("C", "i", "M"))
            self.assertIsInstance(e["pid"], int)
            if e["ph"] != "M":
                self.assertIsInstance(e["ts"], (int, float))
        names = {e["args"]["name"] for e in evs if e["ph"] == "M" and e["name"] == "process_name"}
        self.assertEqual(len(names), 2)
        self.assertIn("rank 0 (host node1, pid 4242, python)", names)
        # one value per counter track: a counter event with two values is
        # drawn stacked, which reads as their sum
        for e in evs:
            if e["ph"] == "C":
                self.assertEqual(list(e["args"]), ["bytes"], e)
        process = [e for e in evs if e["ph"] == "C" and e["name"] == "GPU0 process"]
        used = [e for e in evs if e["ph"] == "C" and e["name"] == "GPU0 device used"]
        self.assertEqual(len(process), 11)
        self.assertEqual(len(used), 11)
        self.assertEqual(process[3]["ts"], 3e6)
        self.assertEqual(process[3]["args"], {"bytes": 6 * GiB})
        self.assertEqual(used[3]["args"], {"bytes": 7 * GiB})
        self.assertTrue(all(e["pid"] == 4242 for e in process + used))
        h200 = [e for e in evs if e["ph"] == "C" and e["name"] == "GPU1 process"]
        self.assertEqual(len(h200), 6)
        self.assertTrue(all(e["pid"] == 4243 for e in h200))
        limits = [e for e in evs if e["ph"] == "C" and e["name"] == "GPU0 limit"]
        self.assertEqual([e["args"] for e in limits], [{"bytes": LIMIT0}] * 2)
        self.assertEqual([e["ts"] for e in limits], [0, 11e6])
        # one track group per rank, in rank order
        order = {e["pid"]: e["args"]["sort_index"] for e in evs if e["name"] == "process_sort_index"}
        self.assertEqual(order, {4242: 0, 4243: 1})
        inst = [e for e in evs if e["ph"] == "i" and e["pid"] == 4242]
        kinds = [e["cat"].split(",")[1] for e in inst]
        self.assertEqual(sorted(kinds), sorted(["near_miss"] * 3 + ["refused", "oom", "advice", "advice", "error"]))
        nm = [e for e in inst if e["cat"] == "gpuguard,near_miss"][0]
        self.assertEqual(nm["ts"], 10.2e6)
        self.assertEqual(nm["tid"], 0)
        self.assertEqual(nm["args"]["bytes"], 512 * MiB)
        if native:
            self.assertIn("addmm_out_cuda", nm["args"]["stack"][2])
        else:
            self.assertEqual(nm["args"]["stack"][:2], ["#0 [PyTorch caching allocator: 1 frame]",
                                                       "#1 aten::addmm (2 frames)"])
        adv = [e for e in inst if e["cat"] == "gpuguard,advice"][0]
        self.assertEqual(adv["args"]["batch_size"], 16)
        self.assertEqual(adv["args"]["trainer_at"],
                         "/home/me/train.py:42 in train_step: loss = model(batch).loss")

    def test_trace_events_native(self):
        self.test_trace_events(native=True)

    def test_same_pid_on_two_hosts(self):
        ev = journal_rank1_killed()
        ev[0] = dict(ev[0], host="node2", pid=4242)
        other = write_journal(os.path.join(self.tmp, "gpuguard.python.rank1.4242.jsonl"), ev)
        tr = self.trace(self.j0, other)
        pids = {e["pid"] for e in tr["traceEvents"]}
        self.assertEqual(len(pids), 2)


class CommandLineTest(ReportTestBase):
    def run_cli(self, *args):
        return subprocess.run([sys.executable, REPORT] + list(args), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, universal_newlines=True)

    def test_executable_and_exit_codes(self):
        self.assertTrue(os.access(REPORT, os.X_OK))
        with open(REPORT) as f:
            self.assertEqual(f.readline().rstrip("\n"), "#!/usr/bin/env python3")
        out = self.run_cli(self.j0)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("Advice history", out.stdout)
        self.assertEqual(self.run_cli().returncode, 2)
        self.assertEqual(self.run_cli("--frames", "0", self.j0).returncode, 2)
        out = self.run_cli(os.path.join(self.tmp, "missing.jsonl"))
        self.assertEqual(out.returncode, 1)
        self.assertIn("gpuguard-report: ", out.stderr)


if __name__ == "__main__":
    unittest.main()
