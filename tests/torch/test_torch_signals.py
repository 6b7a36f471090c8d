"""Signals on real PyTorch 2.6: a signal that arrives while gpuguard-run's
instrumentation reads PyTorch's view (at a step's first near miss) keeps its
meaning. A Ctrl-C's KeyboardInterrupt, and a SIGTERM handler's sys.exit(3),
stop the training at the step they arrive in, as they do without gpuguard
(the program reading memory_stats itself at the same point); before, the
exception was swallowed in the view ("Exception ignored on calling ctypes
callback function") and the training went on. And the allocation history a
program turns on itself stays on, even in the step a forecast had turned it
on for."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from torchrig import GiB, MiB, TorchCase  # noqa: E402

TOTAL = 24 * GiB


def policy(limit, near_miss, mode="observe"):
    return ("[gpu]\nmatch = *\n[memory]\nheadroom = %d\nnear_miss = %d\nmode = %s\n"
            "[trainer]\nsignal = none\n" % (TOTAL - limit, near_miss, mode))


class Signals(TorchCase):
    AT = 4
    STEPS = 10

    def interrupted(self, sig, **kw):
        # every allocation past 8 MiB device-wide is a near miss: each step asks for a view
        pol = self.write_policy("near.ini", policy(TOTAL - GiB, TOTAL - GiB - 8 * MiB))
        run = self.torch("interrupt.py", "--signal", sig, "--at", str(self.AT), "--steps",
                         str(self.STEPS), "--grow", "0", policy=pol, **kw)
        done = [r["step"] for r in run.results if r.get("kind") == "step"]
        return run, done

    def test_a_ctrl_c_during_the_view_stops_the_training(self):
        without, done_without = self.interrupted_self("INT")
        self.assertEqual(without.rc, 5, without.err[-2000:])
        run, done = self.interrupted("INT", gpuguard_run=[])
        self.assertEqual(run.rc, 5, run.err[-3000:])
        self.assertNotIn("Exception ignored", run.err)
        self.assertEqual(run.result("stopped")["how"], "KeyboardInterrupt")
        self.assertEqual(done, list(range(1, self.AT)))
        self.assertEqual(done, done_without)
        self.assertTrue(run.of("torch"))  # the views before it were read

    def test_a_sigterm_handlers_exit_during_the_view_exits(self):
        without, done_without = self.interrupted_self("TERM")
        self.assertEqual(without.rc, 3, without.err[-2000:])
        run, done = self.interrupted("TERM", gpuguard_run=[])
        self.assertEqual(run.rc, 3, run.err[-3000:])
        self.assertNotIn("Exception ignored", run.err)
        self.assertEqual(done, list(range(1, self.AT)))
        self.assertEqual(done, done_without)

    def interrupted_self(self, sig):
        """Without gpuguard: the program reads memory_stats itself, once a
        step, where the view would have."""
        run = self.torch("interrupt.py", "--signal", sig, "--at", str(self.AT), "--self",
                         "--steps", str(self.STEPS), "--grow", "0", preload=False)
        return run, [r["step"] for r in run.results if r.get("kind") == "step"]


class ProgramsOwnHistory(TorchCase):
    def test_history_the_program_turns_on_itself_stays_on(self):
        """A forecast turns PyTorch's allocation history on for the step it
        names; the program turns it on itself during that step (a user
        debugging memory): at the step's boundary the instrumentation leaves
        it on, since it is the program's now."""
        probe = self.torch("grow.py", "--steps", "12", gpuguard_run=[],
                           policy=self.write_policy("wide.ini", policy(TOTAL - GiB, 0)))
        self.assertRan(probe)
        # The forecast follows the tensors' device-wide need (what PyTorch's
        # tensors held at the step's peak, plus what is not the process's):
        # the line between steps 9's and 10's.
        need = [e["needed"] + e["peak_used"] - e["peak"] for e in probe.of("step")]
        line = (need[8] + need[9]) // 2
        margin = 64 * MiB
        pol = self.write_policy("grow.ini", policy(line + margin, margin))
        run = self.torch("grow.py", "--steps", "12", gpuguard_run=[], policy=pol)
        self.assertRan(run)
        fc = [a for a in run.of("advice") if a["reason"] == "forecast"]
        self.assertTrue(fc, run.err[-2000:])
        at = fc[0]["forecast"]["step"]
        run = self.torch("record.py", "--at", str(at), "--steps", "12", gpuguard_run=[], policy=pol)
        self.assertRan(run)
        self.assertTrue([a for a in run.of("advice") if a["reason"] == "forecast"])
        self.assertEqual(run.result("history"), {"kind": "history", "enabled": True, "at": at})
