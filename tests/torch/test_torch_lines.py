"""Real PyTorch under the shim: near misses and refusals name the model's
Python lines when the main thread allocates (forward), and the thread when
autograd's own threads do (backward), as the journal promises."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from torchrig import GiB, MiB, TorchCase  # noqa: E402

TOTAL = 24 * GiB


def policy(limit, near_miss, mode="enforce"):
    return """[gpu]
match = *
[memory]
headroom = %d
near_miss = %d
mode = %s
""" % (TOTAL - limit, near_miss, mode)


def model_frames(event):
    return [f for f in event.get("pystack", []) if f["file"].endswith("/scripts/model.py")]


class ForwardAndBackward(TorchCase):
    ARGS = ("--batch", "16", "--seq", "256", "--dim", "512", "--layers", "2")

    def measure(self):
        """What the step holds after its forward, and the most it has in use
        at once (PyTorch's allocated bytes: no cache can serve more)."""
        run = self.torch("backward.py", *self.ARGS,
                         policy=self.write_policy("observe.ini", policy(TOTAL, 0, "observe")))
        self.assertRan(run)
        return run.result("forward")["reserved"], run.result("step")["max_allocated"]

    def test_near_misses_name_the_forward_lines(self):
        """Every allocation is in the near-miss zone: those of the forward pass
        name Attention.forward / Block.forward and their lines in model.py."""
        run = self.torch("backward.py", *self.ARGS,
                         policy=self.write_policy("zone.ini", policy(TOTAL, TOTAL - MiB, "observe")))
        self.assertRan(run)
        near = run.of("near_miss")
        self.assertTrue(near)
        named = {(f["func"], f["line"]) for e in near for f in model_frames(e)}
        funcs = {f for f, _ in named}
        self.assertTrue(funcs & {"Attention.forward", "Block.forward", "Model.forward"}, named)
        with open(os.path.join(os.path.dirname(__file__), "scripts", "model.py")) as f:
            lines = f.read().splitlines()
        for func, line in named:  # each named line is real code of that function
            self.assertTrue(lines[line - 1].strip(), (func, line))

    def test_autograds_thread_is_named(self):
        """Backward allocates on autograd's device thread, which has no Python
        frames: its near misses say which thread it was, and native frames."""
        run = self.torch("backward.py", *self.ARGS,
                         policy=self.write_policy("zone.ini", policy(TOTAL, TOTAL - MiB, "observe")))
        self.assertRan(run)
        threads = {e.get("thread") for e in run.of("near_miss") if not e.get("pystack")}
        self.assertIn("pt_autograd_0", threads, [e.get("thread") for e in run.of("near_miss")])

    def test_a_refusal_in_forward_names_its_line(self):
        fwd, peak = self.measure()
        run = self.torch("backward.py", *self.ARGS,
                         policy=self.write_policy("small.ini", policy(fwd // 2, 0)))
        self.assertRan(run)
        self.assertEqual(run.result("oom")["phase"], "forward")
        refused = run.of("refused")
        self.assertTrue(refused)
        self.assertTrue(any(model_frames(e) for e in refused), refused[0])

    def test_a_refusal_in_backward_is_autograds(self):
        """A limit between what the forward reserved and what the step must
        have at once: the forward runs, backward is refused on autograd's
        thread (even after PyTorch empties its cache and retries), and the
        script gets torch.OutOfMemoryError from loss.backward()."""
        fwd, peak = self.measure()
        self.assertGreater(peak, fwd)
        run = self.torch("backward.py", *self.ARGS,
                         policy=self.write_policy("mid.ini", policy((fwd + peak) // 2, 0)))
        self.assertRan(run)
        oom = run.result("oom")
        self.assertEqual(oom["phase"], "backward")
        self.assertEqual(oom["type"], "OutOfMemoryError")
        refused = run.of("refused")
        self.assertTrue(refused)
        self.assertEqual({e.get("thread") for e in refused if not e.get("pystack")}, {"pt_autograd_0"})
