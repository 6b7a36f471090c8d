"""gpuguard-report by Python line, on hand-written
journals in the shim's shape: near misses grouped by their Python line and
then by stack, the peak tree led by the Python line with the native frames
below, stacks without Python frames named by their thread, and the HTML
saying exactly what the text says. Every report here is --native: the frames
as the shim took them (the same stacks in PyTorch's terms, merged and
collapsed: test_report_torch)."""
import html
import io
import os
import re
import shutil
import sys
import tempfile
import unittest
from contextlib import redirect_stderr, redirect_stdout

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import shimlike  # noqa: E402
from test_report import ADDMM, CACHING, CONV, EMPTY, MAIN, PYEVAL, frame, load_report  # noqa: E402

rpt = load_report()
GiB, MiB = shimlike.GiB, shimlike.MiB

CONV_BWD = frame(9, "/site-packages/torch/lib/libtorch_cuda.so",
                 "at::native::cudnn_convolution_backward", 0x48)
AUTOGRAD = frame(10, "/site-packages/torch/lib/libtorch_cpu.so",
                 "torch::autograd::Engine::thread_main", 0x210)
FWD88 = {"file": "/home/me/model.py", "line": 88, "func": "Block.forward"}
MLP120 = {"file": "/home/me/model.py", "line": 120, "func": "Block.mlp"}
STEP42 = {"file": "/home/me/train.py", "line": 42, "func": "train_step"}
STEP47 = {"file": "/home/me/train.py", "line": 47, "func": "train_step"}
MAIN80 = {"file": "/home/me/train.py", "line": 80, "func": "<module>"}


def pre_blocks(page, cls):
    """The text of each <pre class="cls"> of a page, unescaped."""
    return [html.unescape(b) for b in re.findall(r'<pre class="%s">(.*?)</pre>' % cls, page, re.S)]


class Base(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="gg-pylines-")
        self.addCleanup(shutil.rmtree, self.tmp)

    def main(self, *args):
        out, err = io.StringIO(), io.StringIO()
        with redirect_stdout(out), redirect_stderr(err):
            rc = rpt.main(["--native"] + list(args))
        self.assertEqual(rc, 0, err.getvalue())
        return out.getvalue()

    def report(self, path, *args):
        """(text, html page) of one journal."""
        page = os.path.join(self.tmp, "r.html")
        out = self.main("--html", page, path, *args)
        with open(page, encoding="utf-8") as f:
            return out, f.read()

    def process(self):
        devs = [shimlike.device(0, "NVIDIA GeForce RTX 4090", 24 * GiB, 2 * GiB, GiB, cc="8.9")]
        p = shimlike.Process(devs, rank=0)
        p.sample(1.0, 0, 20 * GiB, 21 * GiB)
        return p


class NearMissesByLine(Base):
    def journal(self):
        p = self.process()
        nm = lambda t, b, stack, py, thread=None: p.incident(  # noqa: E731
            "near_miss", t, 0, b, 21 * GiB, stack=stack, pystack=py, thread=thread)
        nm(2.0, 512 * MiB, [CACHING, EMPTY, ADDMM, PYEVAL], [FWD88, STEP42, MAIN80])
        nm(2.1, 256 * MiB, [CACHING, EMPTY, CONV, PYEVAL], [FWD88, STEP42, MAIN80])
        nm(2.2, 128 * MiB, [CACHING, EMPTY, ADDMM, PYEVAL], [FWD88, STEP42, MAIN80])
        nm(2.3, 64 * MiB, [CACHING, EMPTY, ADDMM, PYEVAL], [MLP120, STEP42, MAIN80])
        # autograd's backward threads have no Python frames
        nm(3.0, 1 * GiB, [CACHING, EMPTY, CONV_BWD, AUTOGRAD], [], "pt_autograd_0")
        nm(3.1, 1 * GiB, [CACHING, EMPTY, CONV, AUTOGRAD], [], "pt_autograd_0")
        nm(3.2, 2 * MiB, [CACHING, EMPTY, CONV, AUTOGRAD], [])   # the thread's name unknown
        p.summary(4.0)
        return p.write(self.tmp)

    def test_grouped_by_python_line_then_stack(self):
        out, page = self.report(self.journal())
        sec = out[out.index("   Near misses: 7, by Python line:"):out.index("   Advice")
                  if "   Advice" in out else len(out)]
        lines = [l[5:] for l in sec.splitlines()[1:] if l.strip()]
        # the line with most near misses first; its two native stacks under it
        self.assertEqual(lines[0], "3x  largest 512.0 MiB, 896.0 MiB in all; 2.00 s .. 2.20 s; "
                                   "device used up to 21.0 GiB (limit 22.0 GiB); cudaMalloc")
        self.assertEqual(lines[1:14], [
            "    /home/me/model.py:88 in Block.forward, from 2 stacks:",
            "      2x  largest 512.0 MiB, 640.0 MiB in all; 2.00 s .. 2.20 s; cudaMalloc",
            "          py#1 /home/me/train.py:42 in train_step",
            "          py#2 /home/me/train.py:80 in <module>",
            "          #0 c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc+0x1a4 (libc10_cuda.so)",
            "          #1 at::native::empty_cuda+0x52 (libtorch_cuda.so)",
            "          #2 at::native::addmm_out_cuda+0x91 (libtorch_cuda.so)",
            "          #3 _PyEval_EvalFrameDefault+0x2f1 (libpython3.11.so.1.0)",
            "      1x  largest 256.0 MiB, 256.0 MiB in all; 2.10 s .. 2.10 s; cudaMalloc",
            "          py#1 /home/me/train.py:42 in train_step",
            "          py#2 /home/me/train.py:80 in <module>",
            "          #0 c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc+0x1a4 (libc10_cuda.so)",
            "          #1 at::native::empty_cuda+0x52 (libtorch_cuda.so)"])
        heads = [l for l in lines if re.match(r"^\d+x  ", l)]
        self.assertEqual(len(heads), 4)
        # a thread without Python frames is a group of its own, by name
        i = lines.index(heads[1])
        self.assertTrue(heads[1].startswith("2x  largest 1.0 GiB, 2.0 GiB in all; 3.00 s .. 3.10 s"))
        self.assertEqual(lines[i + 1], "    (no Python frames: thread pt_autograd_0), from 2 stacks:")
        self.assertIn("#2 at::native::cudnn_convolution_backward+0x48 (libtorch_cuda.so)",
                      lines[i + 5])
        i = lines.index(heads[2])
        self.assertEqual(lines[i + 1:i + 3], ["    /home/me/model.py:120 in Block.mlp",
                                              "      py#1 /home/me/train.py:42 in train_step"])
        i = lines.index(heads[3])
        self.assertEqual(lines[i + 1:i + 3], [
            "    (no Python frames)",
            "      #0 c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc+0x1a4 (libc10_cuda.so)"])
        # the HTML shows each group exactly as the text does
        groups = pre_blocks(page, "group")
        self.assertEqual(len(groups), 4)
        text_groups, cur = [], None
        for l in lines:
            if re.match(r"^\d+x  ", l):
                cur = []
                text_groups.append(cur)
            else:
                cur.append(l[4:])
        self.assertEqual([g.split("\n") for g in groups], text_groups)

    def test_frames_option_merges_stacks_under_a_line(self):
        out = self.main("--frames", "2", self.journal())
        # two frames (allocator, empty_cuda) no longer tell the stacks apart
        self.assertIn("     3x  largest 512.0 MiB, 896.0 MiB in all", out)
        self.assertNotIn("/home/me/model.py:88 in Block.forward, from", out)
        self.assertIn("         /home/me/model.py:88 in Block.forward\n"
                      "           py#1 /home/me/train.py:42 in train_step\n"
                      "           #0 c10::cuda", out)

    def test_first_failure_and_marks_name_the_line_or_the_thread(self):
        p = self.process()
        p.incident("refused", 2.0, 0, 4 * GiB, 21 * GiB, stack=[CACHING, EMPTY, CONV_BWD, AUTOGRAD],
                   pystack=[], thread="pt_autograd_0")
        p.incident("oom", 2.5, 0, 4 * GiB, 21 * GiB, stack=[CACHING, EMPTY, ADDMM, PYEVAL],
                   pystack=[FWD88, STEP42])
        path = p.write(self.tmp)
        out = self.main(path)
        self.assertIn("asked from c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator"
                      "::malloc+0x1a4 (libc10_cuda.so) (no Python frames: thread pt_autograd_0)",
                      out.splitlines()[2])
        trace = os.path.join(self.tmp, "t.json")
        self.main("--trace", trace, path)
        import json
        with open(trace) as f:
            evs = json.load(f)["traceEvents"]
        oom = [e for e in evs if e.get("cat") == "gpuguard,oom"][0]
        self.assertEqual(oom["args"]["stack"][:3], [
            "py#0 /home/me/model.py:88 in Block.forward", "py#1 /home/me/train.py:42 in train_step",
            "#0 c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc+0x1a4 "
            "(libc10_cuda.so)"])
        ref = [e for e in evs if e.get("cat") == "gpuguard,refused"][0]
        self.assertEqual(ref["args"]["stack"][0], "(no Python frames: thread pt_autograd_0)")


class PeakTree(Base):
    SITES = [
        {"stack": [CACHING, EMPTY, ADDMM, PYEVAL, MAIN], "pystack": [FWD88, STEP42, MAIN80],
         "bytes": 12 * GiB, "allocs": 6},
        # the same Python line, another native stack: under the same line
        {"stack": [CACHING, EMPTY, CONV, PYEVAL, MAIN], "pystack": [FWD88, STEP47, MAIN80],
         "bytes": 6 * GiB, "allocs": 3},
        {"stack": [CACHING, EMPTY, CONV_BWD, AUTOGRAD], "pystack": [], "thread": "pt_autograd_0",
         "bytes": 1 * GiB, "allocs": 2},
        # the shim's entry for what no listed site holds
        {"stack": [], "pystack": [], "bytes": 512 * MiB, "allocs": None},
    ]

    def journal(self, sites=SITES, **summary):
        p = self.process()
        p.summary(3.0)
        dev = p.events[-1]["devices"][0]
        dev["peak"] = 20 * GiB
        dev["peak_sites"] = sites
        dev.update(summary)
        return p.write(self.tmp)

    def tree(self, out):
        sec = out[out.index("   Allocation sites at the peak:"):]
        return [l[5:] for l in sec.splitlines()[1:] if l.startswith("     ")]

    def test_tree_leads_with_the_python_line(self):
        out, page = self.report(self.journal(), "--threshold", "0")
        tree = self.tree(out)
        self.assertEqual(tree[:9], [
            "97.50% (19.5 GiB) in 4 sites listed at the process peak of 20.0 GiB; under each "
            "line, its caller",
            "->90.00% (18.0 GiB) 9 allocs: /home/me/model.py:88 in Block.forward",
            "| ->60.00% (12.0 GiB) 6 allocs: /home/me/train.py:42 in train_step",
            "| | ->60.00% (12.0 GiB) 6 allocs: /home/me/train.py:80 in <module>",
            # then the native frames, up to the interpreter (the Python frames say the rest):
            # what ran inside model.py:88, not a caller of <module>, and the first says so
            "| |   ->60.00% (12.0 GiB) 6 allocs: inside model.py:88, from the allocation out: "
            "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc+0x1a4 "
            "(libc10_cuda.so)",
            "| |     ->60.00% (12.0 GiB) 6 allocs: at::native::empty_cuda+0x52 (libtorch_cuda.so)",
            "| |       ->60.00% (12.0 GiB) 6 allocs: at::native::addmm_out_cuda+0x91 (libtorch_cuda.so)",
            "| ->30.00% (6.0 GiB) 3 allocs: /home/me/train.py:47 in train_step",
            "|   ->30.00% (6.0 GiB) 3 allocs: /home/me/train.py:80 in <module>"])
        self.assertNotIn("_PyEval_EvalFrameDefault", "\n".join(tree))
        i = tree.index("->5.00% (1.0 GiB) 2 allocs: (no Python frames: thread pt_autograd_0)")
        self.assertEqual(tree[i + 1], "| ->5.00% (1.0 GiB) 2 allocs: c10::cuda::CUDACachingAllocator::"
                                      "Native::DeviceCachingAllocator::malloc+0x1a4 (libc10_cuda.so)")
        self.assertIn("->2.50% (512.0 MiB) 0 allocs: (in smaller sites, or allocated without a stack)",
                      tree)
        # the HTML's tree is the text's
        self.assertEqual(pre_blocks(page, "tree"), ["\n".join(tree)])

    def test_top_down_starts_from_the_outermost_python_caller(self):
        out = self.main("--top-down", "--threshold", "0", self.journal())
        tree = self.tree(out)
        self.assertTrue(tree[0].endswith("; under each line, what it called"), tree[0])
        self.assertEqual(tree[1], "->90.00% (18.0 GiB) 9 allocs: /home/me/train.py:80 in <module>")
        self.assertEqual(tree[2], "| ->60.00% (12.0 GiB) 6 allocs: /home/me/train.py:42 in train_step")
        self.assertEqual(tree[3], "| | ->60.00% (12.0 GiB) 6 allocs: /home/me/model.py:88 in Block.forward")
        self.assertEqual(tree[4], "| |   ->60.00% (12.0 GiB) 6 allocs: at::native::addmm_out_cuda+0x91 "
                                  "(libtorch_cuda.so)")
        # a thread without Python frames still leads with its name
        i = tree.index("->5.00% (1.0 GiB) 2 allocs: (no Python frames: thread pt_autograd_0)")
        self.assertIn("torch::autograd::Engine::thread_main", tree[i + 1])

    def test_depth_counts_below_the_thread(self):
        out = self.main("--depth", "1", "--threshold", "0", self.journal())
        tree = self.tree(out)
        i = tree.index("->5.00% (1.0 GiB) 2 allocs: (no Python frames: thread pt_autograd_0)")
        self.assertIn("malloc+0x1a4", tree[i + 1])
        self.assertEqual(tree[i + 2].strip(" |"), "->...")

    def test_peak_stack_when_no_sites_are_listed(self):
        out = self.main(self.journal(sites=[], peak_stack=[CACHING, EMPTY, CONV_BWD],
                                     peak_pystack=[], thread="pt_autograd_0"))
        sec = out[out.index("   Stack of the allocation that made the peak:"):].splitlines()
        self.assertEqual([l.strip() for l in sec[1:3]], [
            "(no Python frames: thread pt_autograd_0)",
            "#0 c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc+0x1a4 "
            "(libc10_cuda.so)"])
        out = self.main(self.journal(sites=[], peak_stack=[CACHING, EMPTY],
                                     peak_pystack=[FWD88, STEP42]))
        sec = out[out.index("   Stack of the allocation that made the peak:"):].splitlines()
        self.assertEqual([l.strip() for l in sec[1:4]], [
            "py#0 /home/me/model.py:88 in Block.forward", "py#1 /home/me/train.py:42 in train_step",
            "#0 c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc+0x1a4 "
            "(libc10_cuda.so)"])


if __name__ == "__main__":
    unittest.main()
