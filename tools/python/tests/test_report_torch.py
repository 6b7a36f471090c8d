"""gpuguard-report in PyTorch's terms, on journals in
the shim's shape with native stacks from the real-PyTorch rig (shimlike.RIG_*)
and the `torch` and `backward` lines of the contract: native and Python
frames merged in call order, PyTorch's allocator, dispatcher and interpreter
collapsed, ATen ops and autograd nodes named, autograd's allocations tied to
the `.backward()` line, the verdict's sentence (tensors by line,
fragmentation or demand, expandable segments), the peak that expandable
segments' failed growth explains, --native, and odd lines never raising."""
import html
import io
import json
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
from shimlike import RIG_BACKWARD, RIG_FORWARD, RIG_FORWARD_PYSTACK, with_node  # noqa: E402
from test_report import load_report  # noqa: E402

rpt = load_report()
from gpuguard.journal import frames, pytorch  # noqa: E402

GiB, MiB = shimlike.GiB, shimlike.MiB
MM_BACKWARD = with_node(RIG_BACKWARD, "MmBackward0")
POW_BACKWARD = with_node(RIG_BACKWARD, "PowBackward0")
FWD18 = [{"file": "/home/me/model.py", "line": 18, "func": "Block.forward"},
         {"file": "/usr/lib/python3/dist-packages/torch/nn/modules/module.py", "line": 1750,
          "func": "Module._call_impl"},
         {"file": "/home/me/train.py", "line": 50, "func": "train_step"}]
FWD30 = [{"file": "/usr/lib/python3/dist-packages/torch/nn/modules/linear.py", "line": 125,
          "func": "Linear.forward"},
         {"file": "/home/me/model.py", "line": 30, "func": "Attention.forward"}]
MERGED_FORWARD = [
    "#0 [PyTorch caching allocator: 4 frames]",
    "#4 aten::addmm (15 frames)",
    "#19 aten::linear (4 frames)",
    "#23 [1 frame in libtorch_python.so.2.6]",
    "py#0 /usr/lib/python3/dist-packages/torch/nn/modules/linear.py:125 in Linear.forward",
    "py#3 /home/me/model.py:24 in Attention.forward",
    "py#6 /home/me/model.py:44 in Block.forward",
    "py#9 /usr/lib/python3/dist-packages/torch/nn/modules/container.py:250 in Sequential.forward",
    "py#12 /home/me/model.py:56 in Model.forward"]
MERGED_BACKWARD = [
    "#0 [PyTorch caching allocator: 4 frames]",
    "#4 aten::mm (15 frames)",
    "#19 [1 frame in libtorch_cpu.so.2.6]",
    "#20 MmBackward0 (autograd node)",
    "#21 [1 frame in libtorch_cpu.so.2.6]",
    "#22 [autograd engine: 4 frames]",
    "#26 [1 frame in libstdc++.so.6]",
    "#27 [2 frames in libc.so.6]"]


def groups_of(text, title):
    """The lines under each group head (`3x  largest ...`) of a section."""
    sec = text[text.index("   %s: " % title):]
    out, cur = [], None
    for line in sec.splitlines()[1:]:
        if not line.startswith("     "):
            break
        if re.match(r"^     \d+x  ", line):
            cur = []
            out.append(cur)
        else:
            cur.append(line[9:])
    return out


def pre_blocks(page, cls):
    return [html.unescape(b).split("\n")
            for b in re.findall(r'<pre class="%s">(.*?)</pre>' % cls, page, re.S)]


class Base(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="gg-torch-")
        self.addCleanup(shutil.rmtree, self.tmp)
        # the script whose line 57 called .backward(), readable as on the run's host
        self.train = os.path.join(self.tmp, "train.py")
        with open(self.train, "w") as f:
            f.write("\n" * 56 + "        loss.backward()\n" + "\n" * 10 +
                    "    print('done')\n")
        self.bwpy = [{"file": self.train, "line": 57, "func": "train_step"},
                     {"file": self.train, "line": 80, "func": "<module>"}]

    def main(self, *args):
        out, err = io.StringIO(), io.StringIO()
        with redirect_stdout(out), redirect_stderr(err):
            rc = rpt.main(list(args))
        self.assertEqual(rc, 0, err.getvalue())
        return out.getvalue()

    def report(self, path, *args):
        page = os.path.join(self.tmp, "r.html")
        out = self.main("--html", page, path, *args)
        with open(page, encoding="utf-8") as f:
            return out, f.read()

    def process(self, rank=0):
        devs = [shimlike.device(0, "NVIDIA H100 80GB HBM3", 80 * GiB, 8 * GiB, 2 * GiB)]
        p = shimlike.Process(devs, rank=rank)
        p.sample(1.0, 0, 60 * GiB, 61 * GiB)
        return p

    def backward_oom(self, **torch):
        """A backward OOM at step 812 on autograd's thread in MmBackward0,
        answered by a `torch` line: fragmentation, tensors by line."""
        p = self.process()
        p.backward(2.0, self.bwpy, step=812, count=812)
        p.incident("near_miss", 2.1, 0, 512 * MiB, 71 * GiB, stack=RIG_FORWARD,
                   pystack=RIG_FORWARD_PYSTACK)
        # the failure's own moment (the shim's ledger): PyTorch held 30 GiB,
        # its flush released 8 GiB, the retry failed too: raised
        p.incident("oom", 2.5, 0, 1300 * MiB, 71 * GiB, stack=MM_BACKWARD, pystack=[],
                   thread="pt_autograd_0", reserved=30 * GiB, step=812, recovered=False,
                   retried=True, freed=8 * GiB, freed_largest=1 * GiB)
        # PyTorch's OOM observer's view, as it raised: its cache emptied
        figures = dict(step=812, reserved=22 * GiB, allocated=18 * GiB + 100 * MiB,
                       unallocated=3994 * MiB, largest_free=512 * MiB, inactive_split=GiB,
                       request=1229 * MiB, fits=True, raised=True,
                       segments={"small": 412, "large": 37, "expandable": 0},
                       tensors=[(12800 * MiB, 18, FWD18, "aten::mm"),
                                (6144 * MiB, 9, FWD18, "aten::gelu"),
                                (2 * GiB, 4, FWD30, "aten::addmm")])
        figures.update(torch)
        p.torch(2.6, 0, "oom", **figures)
        p.summary(3.0)
        return p.write(self.tmp)


class Naming(unittest.TestCase):
    def test_symbol_names(self):
        self.assertEqual(frames.base_name(
            "at::_ops::mm::call(at::Tensor const&, at::Tensor const&)"), "at::_ops::mm::call")
        self.assertEqual(frames.base_name("void at::native::gpu_kernel<at::native::Foo>(int)"),
                         "at::native::gpu_kernel<at::native::Foo>")
        self.assertEqual(frames.base_name("at::(anonymous namespace)::wrapper_CUDA_mm(at::Tensor "
                                          "const&)"), "at::(anonymous namespace)::wrapper_CUDA_mm")
        self.assertEqual(frames.base_name("torch::autograd::Node::operator()(std::vector<at::"
                                          "Tensor>&&)"), "torch::autograd::Node::operator()")
        self.assertEqual(frames.base_name(7), "7")

    def test_op_names(self):
        for ops, aten in (("mm", "mm"), ("mul_Tensor", "mul"), ("sum_dim_IntList", "sum"),
                          ("to_dtype_layout", "to"), ("empty_memory_format", "empty"),
                          ("fill__Scalar", "fill_"), ("_to_copy", "_to_copy"),
                          ("_foreach_mul__Scalar", "_foreach_mul_"), ("where_self", "where"),
                          ("native_layer_norm_backward", "native_layer_norm_backward"),
                          ("empty_strided", "empty_strided"), ("add_out", "add"),
                          ("softmax_int", "softmax"), ("_softmax_backward_data",
                                                       "_softmax_backward_data")):
            self.assertEqual(frames.aten_name(ops), aten, ops)
        for fn, op in (("structured_sum_out", "sum"), ("addmm_out_cuda", "addmm"),
                       ("cudnn_convolution", "cudnn_convolution"), ("empty_cuda", "empty")):
            self.assertEqual(frames.native_name(fn), op)

    def test_frame_classes(self):
        kinds = [frames.classify(f)[0] for f in MM_BACKWARD]
        self.assertEqual(kinds[:4], ["alloc"] * 4)                 # libc10_cuda, no symbols
        self.assertEqual(frames.classify(MM_BACKWARD[18]), ("op", "mm"))
        self.assertEqual(frames.classify(MM_BACKWARD[15])[0], "disp")   # mm::redispatch
        self.assertEqual(frames.classify(MM_BACKWARD[20]), ("node", "MmBackward0"))
        self.assertEqual({frames.classify(f)[0] for f in MM_BACKWARD[22:26]}, {"engine"})
        self.assertEqual(frames.classify(RIG_FORWARD[-1])[0], "interp")     # python3.13
        self.assertEqual(frames.classify(shimlike.ALLOC_STACK[-1])[0], "interp")  # libpython
        self.assertTrue(frames.is_pytorch(RIG_FORWARD))
        # a library named like torch is not PyTorch's
        like = [{"ip": "0x1", "module": "/x/libtorchlike.so", "sym": "seg_alloc", "off": 3}]
        self.assertFalse(frames.is_pytorch(like))


    def test_runs_without_an_op_frame(self):
        # a stack cut inside the op (no at::_ops::mm::call): its kernel names it
        v = frames.build(MM_BACKWARD[:16], [], "pt_autograd_0")
        self.assertEqual(v.lines(4), ["#0 [PyTorch caching allocator: 4 frames]",
                                      "#4 aten::mm (12 frames)"])
        # the dispatcher alone, then an extension's own frame (its symbol without arguments)
        lib = "/usr/lib/python3/dist-packages/torch/lib/libtorch_cpu.so"
        stack = MM_BACKWARD[:4] + [
            {"ip": "0x10", "module": lib, "sym": "c10::Dispatcher::callBoxed(c10::OperatorHandle "
             "const&, std::vector<c10::IValue>*) const", "off": 80},
            {"ip": "0x20", "module": lib, "sym": "c10::impl::BoxedKernelWrapper<void ()>::call()",
             "off": 16},
            {"ip": "0x30", "module": "/opt/ext/libmyop.so", "sym": "myop::run(at::Tensor const&)",
             "off": 32}]
        v = frames.build(stack, [], "MainThread")
        self.assertEqual(v.stack_lines(4), ["(no Python frames: thread MainThread)",
                                            "#0 [PyTorch caching allocator: 4 frames]",
                                            "#4 [PyTorch dispatcher: 2 frames]",
                                            "#6 myop::run+0x20 (libmyop.so)"])
        self.assertEqual(v.where, "myop::run+0x20 (libmyop.so) (no Python frames: thread MainThread)")


class MergedStacks(Base):
    def journal(self, stack=RIG_FORWARD, pystack=RIG_FORWARD_PYSTACK, thread=None):
        p = self.process()
        p.incident("near_miss", 2.0, 0, 512 * MiB, 71 * GiB, stack=stack, pystack=pystack,
                   thread=thread)
        p.summary(3.0)
        return p.write(self.tmp)

    def test_python_frames_where_the_interpreter_ran_them(self):
        out, page = self.report(self.journal())
        (nm,) = groups_of(out, "Near misses")
        # grouped under the line outside torch that asked; the allocator, each
        # ATen op with its dispatch, the binding: one line each; then the
        # Python frames at the interpreter, torch.nn's call wrappers left out
        self.assertEqual(nm, ["/home/me/model.py:24 in Attention.forward"] +
                         ["  " + line for line in MERGED_FORWARD])
        self.assertNotIn("Module._call_impl", out)
        self.assertNotIn("_PyEval_EvalFrameDefault", out)
        self.assertNotIn("0x7fb0e34cee83", out)
        self.assertEqual(pre_blocks(page, "group"), [nm])
        # the callers shown follow --frames
        out = self.main("--frames", "2", self.journal())
        (nm,) = groups_of(out, "Near misses")
        self.assertEqual(nm[-2:], ["  py#3 /home/me/model.py:24 in Attention.forward",
                                   "  py#6 /home/me/model.py:44 in Block.forward"])

    def test_a_global_forward_hooks_closure_is_call_machinery_too(self):
        # With a global forward pre-hook (gpuguard-run's, or the program's
        # own) nn.Module runs the forward inside a closure, `inner`: one more
        # frame of torch's call machinery, never a line of the user's.
        inner = {"file": "/usr/lib/python3/dist-packages/torch/nn/modules/module.py",
                 "line": 1793, "func": "Module._call_impl.<locals>.inner"}
        hooked = RIG_FORWARD_PYSTACK[:3] + [inner] + RIG_FORWARD_PYSTACK[3:]
        out, _ = self.report(self.journal(pystack=hooked))
        plain, _ = self.report(self.journal())
        self.assertNotIn("<locals>.inner", out)
        def unnumbered(report):  # py#N counts the journal's frames, the closure's too
            return [[re.sub(r"py#\d+ ", "py# ", line) for line in g]
                    for g in groups_of(report, "Near misses")]
        self.assertEqual(unnumbered(out), unnumbered(plain))

    def test_native_shows_every_frame(self):
        out = self.main("--native", self.journal())
        (nm,) = groups_of(out, "Near misses")
        self.assertEqual(nm[:5], [
            "/usr/lib/python3/dist-packages/torch/nn/modules/linear.py:125 in Linear.forward",
            "  py#1 /usr/lib/python3/dist-packages/torch/nn/modules/module.py:1750 in "
            "Module._call_impl",
            "  py#2 /usr/lib/python3/dist-packages/torch/nn/modules/module.py:1739 in "
            "Module._wrapped_call_impl",
            "  py#3 /home/me/model.py:24 in Attention.forward",
            "  #0 0x7fb0e34cee83 (libc10_cuda.so.2.6)"])
        self.assertNotIn("aten::", out)
        self.assertNotIn("[PyTorch caching allocator", out)

    def test_interpreter_and_frames_without_symbols_collapse(self):
        # no Python frames read (GPUGUARD_PYTHON=0): the interpreter is one line
        out = self.main(self.journal(pystack=[], thread="MainThread"))
        (nm,) = groups_of(out, "Near misses")
        self.assertEqual(nm, ["(no Python frames: thread MainThread)"] +
                         ["  " + line for line in MERGED_FORWARD[:4]] +
                         ["  #24 [Python interpreter: 8 frames]"])
        # an extension between two Python frames is counted in that line
        stack = RIG_FORWARD[:27] + [dict(RIG_FORWARD[23], ip="0x7fb0e270b999")] + RIG_FORWARD[27:]
        out = self.main(self.journal(stack=stack, pystack=[], thread="MainThread"))
        self.assertIn("  #24 [Python interpreter: 9 frames, with libtorch_python.so.2.6]\n", out)
        # a native stack cut before the interpreter: the Python frames follow its last frame
        out = self.main(self.journal(stack=RIG_FORWARD[:20]))
        (nm,) = groups_of(out, "Near misses")
        self.assertEqual(nm[1:5], ["  #0 [PyTorch caching allocator: 4 frames]",
                                   "  #4 aten::addmm (15 frames)",
                                   "  #19 [1 frame in libtorch_cpu.so.2.6]",
                                   "  py#0 /usr/lib/python3/dist-packages/torch/nn/modules/"
                                   "linear.py:125 in Linear.forward"])

    def test_ops_split_stacks_under_one_line(self):
        """Two ops from one line are two stacks under it, told apart by the op
        (their top native frames are the same allocator's)."""
        p = self.process()
        gelu = RIG_FORWARD[:18] + [dict(RIG_FORWARD[18], ip="0x7fb0d89b2519", sym=(
            "at::_ops::gelu::call(at::Tensor const&, std::basic_string_view<char, "
            "std::char_traits<char> >)"))] + RIG_FORWARD[23:]
        for t, stack in ((2.0, RIG_FORWARD), (2.1, gelu), (2.2, RIG_FORWARD)):
            p.incident("near_miss", t, 0, 64 * MiB, 71 * GiB, stack=stack,
                       pystack=RIG_FORWARD_PYSTACK)
        p.summary(3.0)
        out = self.main(p.write(self.tmp))
        (nm,) = groups_of(out, "Near misses")
        self.assertEqual(nm[0], "/home/me/model.py:24 in Attention.forward, from 2 stacks:")
        self.assertRegex(nm[1], r"^  2x  largest 64\.0 MiB")
        self.assertEqual(nm[3], "      #4 aten::addmm (15 frames)")
        i = [k for k, line in enumerate(nm) if line.startswith("  1x")][0]
        self.assertEqual(nm[i + 2], "      #4 aten::gelu (15 frames)")

    def test_a_stack_outside_pytorch_reads_as_the_shim_wrote_it(self):
        stack = [{"ip": "0x7f0000001000", "module": "/opt/ext/libfoo.so", "sym": "foo_alloc",
                  "off": 16},
                 {"ip": "0x7f0000002000", "module": "/usr/lib/libpython3.11.so.1.0",
                  "sym": "_PyEval_EvalFrameDefault", "off": 32}]
        out = self.main(self.journal(stack=stack, pystack=FWD30))
        (nm,) = groups_of(out, "Near misses")
        self.assertEqual(nm, ["/usr/lib/python3/dist-packages/torch/nn/modules/linear.py:125 in "
                              "Linear.forward",
                              "  py#1 /home/me/model.py:30 in Attention.forward",
                              "  #0 foo_alloc+0x10 (libfoo.so)",
                              "  #1 _PyEval_EvalFrameDefault+0x20 (libpython3.11.so.1.0)"])

    def test_peak_tree_in_pytorchs_terms(self):
        p = self.process()
        p.backward(1.5, self.bwpy, step=3)
        p.summary(3.0)
        dev = p.events[-1]["devices"][0]
        dev["peak"] = 20 * GiB
        dev["peak_sites"] = [
            {"stack": RIG_FORWARD, "pystack": RIG_FORWARD_PYSTACK, "bytes": 12 * GiB, "allocs": 6},
            {"stack": MM_BACKWARD, "pystack": [], "thread": "pt_autograd_0", "bytes": 6 * GiB,
             "allocs": 3}]
        out = self.main("--threshold", "0", p.write(self.tmp))
        # PyTorch's sites hold segments of its cache, said as such
        head = "Segments of PyTorch's cache at the peak, by the line that grew the cache for them"
        self.assertIn(head, out)
        self.assertNotIn("Allocation sites at the peak", out)
        tree = [line[5:] for line in out[out.index(head):].splitlines()[1:]
                if line.startswith("     ")]
        self.assertEqual(tree[1:9], [
            "->60.00% (12.0 GiB) 6 allocs: /home/me/model.py:24 in Attention.forward",
            "| ->60.00% (12.0 GiB) 6 allocs: /home/me/model.py:44 in Block.forward",
            "|   ->60.00% (12.0 GiB) 6 allocs: /usr/lib/python3/dist-packages/torch/nn/modules/"
            "container.py:250 in Sequential.forward",
            "|     ->60.00% (12.0 GiB) 6 allocs: /home/me/model.py:56 in Model.forward",
            "|       ->60.00% (12.0 GiB) 6 allocs: /home/me/train.py:29 in main",
            "|         ->60.00% (12.0 GiB) 6 allocs: /home/me/train.py:43 in <module>",
            "|           ->60.00% (12.0 GiB) 6 allocs: inside model.py:24, from the allocation "
            "out: aten::addmm (15 frames)",
            "|             ->60.00% (12.0 GiB) 6 allocs: aten::linear (4 frames)"])
        i = tree.index("->30.00%% (6.0 GiB) 3 allocs: backward of `loss.backward()` (%s:57 in "
                       "train_step), MmBackward0" % self.train)
        self.assertEqual(tree[i + 1], "  ->30.00% (6.0 GiB) 3 allocs: aten::mm (15 frames)")
        out = self.main("--threshold", "0", "--top-down", p.write(self.tmp))
        self.assertIn("->60.00% (12.0 GiB) 6 allocs: /home/me/train.py:43 in <module>", out)


class BackwardByLineAndOp(Base):
    def test_autograd_allocations_name_the_backward_line_and_node(self):
        p = self.process()
        other = os.path.join(self.tmp, "finetune.py")
        with open(other, "w") as f:
            f.write("\n" * 29 + "    scaler.scale(loss).backward()\n")
        p.backward(2.0, self.bwpy, step=7, count=7)
        p.incident("near_miss", 2.1, 0, GiB, 71 * GiB, stack=MM_BACKWARD, pystack=[],
                   thread="pt_autograd_0")
        p.incident("near_miss", 2.2, 0, GiB, 71 * GiB, stack=POW_BACKWARD, pystack=[],
                   thread="pt_autograd_0")
        # the next .backward() line: autograd works for it from then on
        p.backward(3.0, [{"file": other, "line": 30, "func": "step"}], step=8)
        p.incident("near_miss", 3.1, 0, GiB, 71 * GiB, stack=MM_BACKWARD, pystack=[],
                   thread="pt_autograd_0")
        p.summary(4.0)
        out, page = self.report(p.write(self.tmp))
        groups = groups_of(out, "Near misses")
        heads = sorted(g[0] for g in groups)
        self.assertEqual(heads, [
            "backward of `loss.backward()` (%s:57 in train_step), MmBackward0" % self.train,
            "backward of `loss.backward()` (%s:57 in train_step), PowBackward0" % self.train,
            "backward of `scaler.scale(loss).backward()` (%s:30 in step), MmBackward0" % other])
        g = [g for g in groups if g[0].endswith("train_step), MmBackward0")][0]
        self.assertEqual(g[1:], ["  " + line for line in MERGED_BACKWARD])
        self.assertIn("  backward     7 calls: backward of `loss.backward()` (%s:57 in train_step), "
                      "last at step 7\n" % self.train, out)
        self.assertIn("backward: 7 calls: backward of `loss.backward()`", html.unescape(page))
        # --native: the thread, as before
        out = self.main("--native", p.write(self.tmp))
        self.assertIn("(no Python frames: thread pt_autograd_0)", out)
        self.assertNotIn("MmBackward0 (autograd node)", out)

    def test_without_the_source_or_the_backward_line(self):
        p = self.process()
        p.backward(2.0, [{"file": "/home/me/train.py", "line": 57, "func": "train_step"}])
        p.incident("refused", 2.1, 0, GiB, 71 * GiB, stack=MM_BACKWARD, pystack=[],
                   thread="pt_autograd_0")
        p.summary(3.0)
        out = self.main(p.write(self.tmp))
        self.assertIn("asked from backward of /home/me/train.py:57 in train_step, MmBackward0, "
                      "aten::mm\n", out)
        # a line that does not call backward is not quoted (the file is not what ran)
        p = self.process()
        p.backward(2.0, [{"file": self.train, "line": 68, "func": "train_step"}])
        p.incident("refused", 2.1, 0, GiB, 71 * GiB, stack=MM_BACKWARD, pystack=[],
                   thread="pt_autograd_0")
        out = self.main(p.write(self.tmp))
        self.assertIn("asked from backward of %s:68 in train_step, MmBackward0" % self.train, out)
        # no backward line before it (instrumentation off): the thread
        p = self.process()
        p.incident("refused", 2.1, 0, GiB, 71 * GiB, stack=MM_BACKWARD, pystack=[],
                   thread="pt_autograd_0")
        p.backward(2.5, self.bwpy)
        out = self.main(p.write(self.tmp))
        self.assertIn("asked from backward on thread pt_autograd_0, MmBackward0, aten::mm\n", out)


class Verdict(Base):
    SENTENCE = ("    OOM at step 812 in backward of `loss.backward()` (%s:57 in train_step), "
                "`MmBackward0` asked 1.2 GiB: 18.5 GiB held by 27 activations from "
                "/home/me/model.py:18 in Block.forward; at the failure the process held 30 GiB "
                "on the device (gpuguard's ledger) and PyTorch's flush released 8 GiB before its "
                "retry; as PyTorch raised OutOfMemoryError (its cache emptied, its retry failed): "
                "3.9 GiB reserved but unallocated, largest free block 512 MiB: fragmentation; "
                "`PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` would have fit it")

    def test_backward_oom_in_pytorchs_terms(self):
        out, page = self.report(self.backward_oom())
        lines = out.splitlines()
        # raised (the retry failed too), the program caught it: the first it saw
        self.assertTrue(lines[1].startswith("  the first failure the program saw: rank 0 GPU0 "
                                            "NVIDIA H100 80GB HBM3"), lines[1])
        self.assertTrue(lines[2].endswith(", asked from backward of `loss.backward()` (%s:57 in "
                                          "train_step), MmBackward0, aten::mm" % self.train),
                        lines[2])
        self.assertEqual(lines[3], self.SENTENCE % self.train)
        verdict = [html.unescape(li).strip() for li in re.findall(r"<li>(.*?)</li>", page)]
        self.assertIn(self.SENTENCE.strip() % self.train, verdict)

    def test_the_device_block(self):
        out, page = self.report(self.backward_oom())
        block = out[out.index("   PyTorch's allocator as it raised"):].splitlines()[:8]
        self.assertEqual(block, [
            "   PyTorch's allocator as it raised OutOfMemoryError (its cache emptied, its retry "
            "failed) (step 812), 2.60 s:",
            "     reserved 22.0 GiB, allocated 18.1 GiB, reserved but unallocated 3.9 GiB, largest "
            "free block 512.0 MiB, inactive split 1.0 GiB",
            "     segments: 412 small, 37 large, 0 expandable",
            "     asked 1.2 GiB: fragmentation: it would have fit had the free bytes been one block; "
            "`PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` would have fit it",
            "     tensors by line, most bytes first:",
            "       18.5 GiB  27 tensors  /home/me/model.py:18 in Block.forward  (aten::mm, "
            "aten::gelu)",
            "        2.0 GiB  4 tensors   /home/me/model.py:30 in Attention.forward  (aten::addmm)",
            ""])
        # the HTML: the same figures, the tensors as a table
        self.assertIn("<h4>PyTorch&#x27;s allocator as it raised OutOfMemoryError (its cache "
                      "emptied, its retry failed) (step 812), 2.60 s</h4>", page)
        rows = re.findall(r'<table class="tensors">(.*?)</table>', page, re.S)
        self.assertEqual(len(rows), 1)
        cells = [html.unescape(c) for c in re.findall(r"<td[^>]*>(.*?)</td>", rows[0])]
        self.assertEqual(cells[:4], ["18.5 GiB", "27 tensors", "/home/me/model.py:18 in "
                                     "Block.forward", "aten::mm, aten::gelu"])
        self.assertIn("fragmentation: it would have fit had the free bytes been one block",
                      html.unescape(page))

    def test_real_demand_in_the_forward(self):
        p = self.process()
        p.incident("refused", 2.0, 0, 512 * MiB, 71 * GiB, stack=RIG_FORWARD,
                   pystack=RIG_FORWARD_PYSTACK)
        p.torch(2.3, 0, "refused", step=40, reserved=70 * GiB, allocated=69900 * MiB,
                unallocated=100 * MiB, largest_free=20 * MiB, request=512 * MiB, fits=False,
                tensors=[(6 * GiB, 3, FWD30, None)], raised=True)
        p.summary(3.0)
        out = self.main(p.write(self.tmp))
        self.assertIn("\n    Refusal at step 40 at /home/me/model.py:24 in Attention.forward, "
                      "`aten::addmm` asked 512 MiB: 6 GiB held by 3 tensors from /home/me/model.py:30 "
                      "in Attention.forward; as PyTorch raised OutOfMemoryError (its cache emptied, "
                      "its retry failed): 100 MiB reserved but unallocated, largest free block "
                      "20 MiB: real demand (it would not have fit had the free bytes been one block)\n",
                      out)
        # the same figures read later (a view asked for at the main thread's
        # next safe point): of another moment, no verdict
        p.events[-2]["raised"] = False
        p.events[-2]["asked"] = 2.0
        out = self.main(p.write(self.tmp))
        self.assertNotIn("real demand", out)
        self.assertIn("   PyTorch's allocator read 0.30 s after the refusal (the main thread's "
                      "next safe point) (step 40), 2.30 s:\n", out)
        self.assertIn("     asked 512.0 MiB (these figures are of a later moment than the request: "
                      "no verdict from them)\n", out)
        p.events[-2]["raised"] = True
        del p.events[-2]["asked"]
        out = self.main(p.write(self.tmp))
        self.assertIn("     asked 512.0 MiB: real demand: it would not have fit had the free bytes "
                      "been one block\n", out)

    def test_what_the_instrumentation_could_not_say(self):
        # no tensors (history off), no judgement, expandable segments on
        out = self.main(self.backward_oom(tensors=None, fits=None))
        self.assertIn("`MmBackward0` asked 1.2 GiB: at the failure the process held 30 GiB on the "
                      "device (gpuguard's ledger) and PyTorch's flush released 8 GiB before its "
                      "retry; as PyTorch raised OutOfMemoryError (its cache emptied, its retry "
                      "failed): 3.9 GiB reserved but unallocated, largest free block 512 MiB\n", out)
        self.assertIn("     tensors: not recorded (PyTorch's allocation history was off then)\n", out)
        out = self.main(self.backward_oom(segments={"expandable": 3}))
        self.assertIn("largest free block 512 MiB: fragmentation; expandable segments were already "
                      "on\n", out)
        # a `torch` line that answers nothing (before the failure) gives no sentence
        p = self.process()
        p.torch(1.5, 0, "near_miss", step=3, reserved=GiB, allocated=GiB, unallocated=0,
                largest_free=0, request=None, fits=None)
        p.incident("oom", 2.5, 0, GiB, 71 * GiB, stack=MM_BACKWARD, pystack=[],
                   thread="pt_autograd_0")
        out = self.main(p.write(self.tmp))
        self.assertNotIn("OOM at step", out)
        self.assertIn("   PyTorch's allocator at the first near miss of its step (step 3), 1.50 s:\n",
                      out)
        # --native: the sentence without PyTorch's names
        out = self.main("--native", self.backward_oom())
        self.assertIn("\n    OOM at step 812, asking 1.2 GiB: 18.5 GiB held by 27 tensors from "
                      "/home/me/model.py:18 in Block.forward; at the failure the process held 30 GiB",
                      out)

    def test_the_expandable_segments_peak_is_explained(self):
        """With expandable segments a growth that fails midway maps 20 MiB
        chunks and releases them: the journal's peak is above what PyTorch
        reports, and the report says why."""
        p = self.process()
        p.incident("refused", 2.0, 0, 20 * MiB, 71 * GiB, api="cuMemCreate", stack=MM_BACKWARD,
                   pystack=[], thread="pt_autograd_0")
        p.torch(2.1, 0, "refused", step=1, reserved=354 * MiB, allocated=354 * MiB, unallocated=0,
                largest_free=0, request=16 * MiB, fits=False, segments={"expandable": 2})
        p.summary(3.0)
        p.events[-1]["devices"][0]["peak"] = 386 * MiB
        out = self.main(p.write(self.tmp))
        self.assertIn("   peak         386.0 MiB process (0.47% of total), 61.0 GiB device-wide "
                      "(76.25%)\n                32.0 MiB above the most PyTorch reported reserved "
                      "(354.0 MiB): with expandable segments a growth that fails midway maps its "
                      "chunks and releases them; the device held them for that moment, "
                      "torch.cuda.max_memory_reserved() never counts them\n", out)
        # without expandable segments (cudaMalloc, none in the segments): no such line
        p = self.process()
        p.incident("refused", 2.0, 0, 20 * MiB, 71 * GiB, stack=MM_BACKWARD, pystack=[],
                   thread="pt_autograd_0")
        p.torch(2.1, 0, "refused", reserved=354 * MiB, segments={"large": 2})
        p.summary(3.0)
        p.events[-1]["devices"][0]["peak"] = 386 * MiB
        self.assertNotIn("above the most PyTorch reported", self.main(p.write(self.tmp)))

    def test_forecast_step_tensors(self):
        p = self.process()
        p.step(10.0, 8, 0, 60 * GiB, 61 * GiB, 30 * GiB)
        p.advice(10.001, 1, 0, 8, 4, "forecast", forecast={"step": 9, "bytes": 71 * GiB})
        p.torch(10.002, 0, "forecast", step=8, reserved=60 * GiB, allocated=58 * GiB)
        p.torch(12.0, 0, "near_miss", step=9, reserved=70 * GiB, allocated=69 * GiB,
                tensors=[(40 * GiB, 120, FWD18, "aten::mm")])
        p.summary(13.0)
        out = self.main(p.write(self.tmp))
        self.assertIn("\n    the forecast step's tensors at the first near miss of its step (step 9): "
                      "40 GiB held by 120 tensors from /home/me/model.py:18 in Block.forward\n", out)

    def test_without_history_the_line_that_grew_the_cache(self):
        """No tensors (history off): when the failure came at the process's
        peak, the shim's peak sites say which line grew PyTorch's cache the
        most; a failure below the peak says nothing of what held it."""
        def journal(allocated):
            p = self.process()
            p.backward(2.0, self.bwpy, step=812, count=812)
            p.incident("oom", 2.5, 0, 1300 * MiB, 71 * GiB, stack=MM_BACKWARD, pystack=[],
                       thread="pt_autograd_0")
            p.events[-1]["allocated"] = allocated
            p.torch(2.6, 0, "oom", step=812, reserved=22 * GiB, allocated=21 * GiB,
                    unallocated=GiB, largest_free=512 * MiB, request=1300 * MiB, fits=False,
                    raised=True)
            p.summary(3.0)
            dev = p.events[-1]["devices"][0]
            dev["peak"] = 70 * GiB
            dev["peak_sites"] = [{"stack": RIG_FORWARD, "pystack": FWD18, "bytes": 40 * GiB,
                                  "allocs": 30},
                                 {"stack": RIG_FORWARD, "pystack": FWD30, "bytes": 20 * GiB,
                                  "allocs": 10},
                                 {"stack": RIG_FORWARD, "pystack": FWD18[1:] + FWD18[:1],
                                  "bytes": 8 * GiB, "allocs": 2}]
            return self.main(p.write(self.tmp))
        out = journal(70 * GiB)
        self.assertIn("`MmBackward0` asked 1.3 GiB: 40 GiB of PyTorch's cache grown for activations "
                      "at /home/me/model.py:18 in Block.forward (30 segments); as PyTorch raised "
                      "OutOfMemoryError (its cache emptied, its retry failed): 1 GiB reserved but "
                      "unallocated, largest free block 512 MiB: real demand", out)
        out = journal(60 * GiB)
        self.assertIn("`MmBackward0` asked 1.3 GiB: as PyTorch raised OutOfMemoryError (its cache "
                      "emptied, its retry failed): 1 GiB reserved but unallocated", out)
        self.assertNotIn("cache grown", out)

    def test_the_failure_pytorch_raised_after_recovered_ones(self):
        """A refusal in the forward that PyTorch recovered from (it emptied
        its cache and the retry fit), then one in backward that it raised:
        the verdict names both, the raised one in PyTorch's terms."""
        p = self.process()
        p.incident("refused", 2.0, 0, 256 * MiB, 71 * GiB, stack=RIG_FORWARD,
                   pystack=RIG_FORWARD_PYSTACK)
        p.torch(2.2, 0, "refused", step=5, reserved=22 * GiB, allocated=21 * GiB,
                unallocated=GiB, largest_free=16 * MiB, request=256 * MiB, fits=False)
        p.backward(2.3, self.bwpy, step=5, count=5)
        p.incident("refused", 2.5, 0, 256 * MiB, 71 * GiB, stack=POW_BACKWARD, pystack=[],
                   thread="pt_autograd_0")
        p.torch(2.6, 0, "refused", step=5, reserved=22 * GiB, allocated=21 * GiB,
                unallocated=GiB, largest_free=16 * MiB, request=256 * MiB, fits=False)
        p.events[-1]["raised"] = True
        p.summary(3.0)
        out = self.main(p.write(self.tmp))
        lines = out.splitlines()
        i = lines.index("    PyTorch raised torch.OutOfMemoryError 2.50 s into the run, at a later "
                        "failure; the ones before it were recovered (PyTorch emptied its cache and "
                        "the retry fit):")
        self.assertTrue(lines[i + 1].startswith(
            "      Refusal at step 5 in backward of `loss.backward()` (%s:57 in train_step), "
            "`PowBackward0` asked 256 MiB: " % self.train), lines[i + 1])
        self.assertTrue(lines[i - 1].startswith("    Refusal at step 5 at "), lines[i - 1])
        # raised at the first failure itself: nothing more to say
        p.events = [e for e in p.events if not (e["ev"] == "torch" and e["t"] == 2.6)]
        p.events[3]["raised"] = True
        out = self.main(p.write(self.tmp))
        self.assertNotIn("at a later failure", out)
        # PyTorch's own retry: the same request refused again on the same
        # thread, then raised: one failure, nothing was recovered
        p = self.process()
        p.backward(2.3, self.bwpy, step=5, count=5)
        for t in (2.5, 2.52):
            p.incident("refused", t, 0, 256 * MiB, 71 * GiB, stack=POW_BACKWARD, pystack=[],
                       thread="pt_autograd_0")
        p.torch(2.6, 0, "refused", step=5, reserved=22 * GiB, allocated=21 * GiB,
                unallocated=GiB, largest_free=16 * MiB, request=256 * MiB, fits=False)
        p.events[-1]["raised"] = True
        p.summary(3.0)
        out = self.main(p.write(self.tmp))
        self.assertIn("Refusal at step 5 in backward of `loss.backward()`", out)
        self.assertNotIn("at a later failure", out)

    def test_a_leaks_tensors_by_line(self):
        p = self.process()
        for n in range(1, 21):
            p.step(10.0 + n, n, 0, 30 * GiB + n * GiB, 31 * GiB + n * GiB, 20 * GiB + n * GiB)
        p.events.append({"t": 30.5, "ev": "leak", "dev": 0, "since_step": 4, "step": 17,
                         "rate": GiB, "live": 37 * GiB, "projected_step": 60, "sites": [
                             {"bytes": 4 * GiB, "stack": RIG_FORWARD, "pystack": FWD30}]})
        p.torch(31.0, 0, "leak", step=20, reserved=41 * GiB, allocated=40 * GiB,
                tensors=[(39 * GiB, 700, [], None), (768 * MiB, 10, FWD18, "torch.nn.functional.gelu"),
                         (256 * MiB, 4, FWD30, None)])
        p.summary(32.0)
        out = self.main(p.write(self.tmp))
        self.assertIn("leak: +1 GiB per step since step 4: 1 GiB a step kept in 14 tensors, most from "
                      "/home/me/model.py:18 in Block.forward (768 MiB, 10 tensors; "
                      "torch.nn.functional.gelu) and 1 more line; at this rate", out)
        block = out[out.index("   PyTorch's allocator at a leak"):].splitlines()
        self.assertIn("(everything else live: allocated in other steps)", block[4])
        # without the view, the shim's site
        p.events = [e for e in p.events if e["ev"] != "torch"]
        out = self.main(p.write(self.tmp))
        self.assertIn("leak: +1 GiB per step since step 4 from /home/me/model.py:30 in "
                      "Attention.forward", out)

    def test_sources_read_under_substitute_path(self):
        """A journal from a container: the script ran as /workspace/train.py;
        --substitute-path /workspace DIR reads it from here."""
        p = self.process()
        inside = [{"file": "/workspace/train.py", "line": 57, "func": "train_step"}]
        p.backward(2.0, inside)
        p.incident("refused", 2.1, 0, GiB, 71 * GiB, stack=MM_BACKWARD, pystack=[],
                   thread="pt_autograd_0")
        p.summary(3.0)
        path = p.write(self.tmp)
        out = self.main(path)
        self.assertIn("asked from backward of /workspace/train.py:57 in train_step, MmBackward0", out)
        out = self.main("--substitute-path", "/workspace", self.tmp, path)
        self.assertIn("asked from backward of `loss.backward()` (/workspace/train.py:57 in "
                      "train_step), MmBackward0", out)
        out = self.main("--substitute-path", "/work", self.tmp, path)  # a whole component only
        self.assertNotIn("`loss.backward()`", out)


class OddLines(Base):
    def test_odd_torch_and_backward_lines_never_raise(self):
        p = self.process()
        odd = [
            {"t": 1.1, "ev": "torch"},
            {"t": 1.2, "ev": "torch", "dev": "0", "why": 7, "step": "x", "reserved": "big",
             "allocated": -5, "unallocated": None, "largest_free": [1], "inactive_split": {},
             "request": True, "fits_unfragmented": "yes", "segments": [1, 2], "tensors": {"a": 1}},
            {"t": 1.3, "ev": "torch", "dev": 0, "why": "oom", "segments": {"expandable": "x", "7": 2},
             "tensors": [1, None, {"bytes": "big", "count": "x", "pystack": "x", "op": 5},
                         {"bytes": 10, "pystack": [None, 3, {"file": 2}]}]},
            {"t": 1.4, "ev": "torch", "dev": 0, "why": "refused", "tensors": []},
            {"t": 1.5, "ev": "backward"},
            {"t": 1.6, "ev": "backward", "thread": 5, "pystack": "x", "step": "y", "count": "many"},
            {"t": 1.7, "ev": "backward", "pystack": [None, {"file": None, "line": "57"}], "count": -3},
            {"t": "late", "ev": "backward", "pystack": self.bwpy},
        ]
        p.events += odd
        p.incident("oom", 2.0, 0, GiB, 71 * GiB, stack=MM_BACKWARD + [None, 3, {"module": 7}],
                   pystack=[], thread="pt_autograd_0")
        p.incident("refused", 2.1, 0, GiB, 71 * GiB, stack=[{"sym": "at::_ops::mm::call()"},
                                                             {"module": "libc10_cuda.so"}],
                   pystack="x", thread=None)
        p.torch(2.2, 0, "oom", step=None, tensors=[(GiB, None, [], None)])
        p.summary(3.0)
        dev = p.events[-1]["devices"][0]
        dev["peak_sites"] = [{"stack": MM_BACKWARD, "pystack": None, "thread": 9, "bytes": GiB},
                             {"stack": [{"module": "libtorch_cpu.so", "sym": None}], "bytes": "x"}]
        path = p.write(self.tmp)
        for args in ((), ("--native",), ("--top-down",), ("--frames", "1")):
            out, page = self.report(path, "--trace", os.path.join(self.tmp, "t.json"), *args)
            self.assertIn("-- GPU0", out)
            self.assertIn("</html>", page)
            with open(os.path.join(self.tmp, "t.json")) as f:
                self.assertTrue(json.load(f)["traceEvents"])
        self.assertNotIn("unknown events", out)
        self.assertIn("PyTorch's allocator at the OOM", out)

    def test_bounded_whatever_the_length(self):
        j = rpt.Journal(os.path.join(self.tmp, "gpuguard.python3.1.jsonl"))
        log = j.pt.backward
        for i in range(20000):
            log.add({"thread": "MainThread", "count": i + 1,
                     "pystack": [{"file": "/x/train.py", "line": 50 + i % 3, "func": "f"}]},
                    float(i))
        self.assertLessEqual(len(log.runs), pytorch.BACKWARD_RUNS)
        self.assertEqual(len(log.sites), 3)
        self.assertEqual(log.at(19999.5)["frame"]["line"], 50 + 19999 % 3)
        for i in range(200):
            log.add({"pystack": [{"file": "/x/f%d.py" % i, "line": 1, "func": "f"}]}, 20000.0 + i)
        self.assertEqual(len(log.sites), pytorch.BACKWARD_SITES)
        d = j.device(0)
        tensors = [{"bytes": 1, "count": 1, "pystack": [], "op": None}] * 100
        for i in range(5000):
            j.pt.torch({"dev": 0, "why": ("oom", "near_miss")[i % 2], "reserved": i,
                        "tensors": tensors}, float(i), d)
        td = j.pt.devices[0]
        self.assertEqual(td.n, 5000)
        self.assertEqual(len(td.first) + len(td.last), 4)
        self.assertEqual(max(len(s["tensors"]) for s in td.shown()), pytorch.TORCH_TENSORS)
        self.assertEqual(td.max_reserved, 4999)


if __name__ == "__main__":
    unittest.main()
