"""The golden traces are what real PyTorch does now: a scenario recorded
again in the rig (shim with GPUGUARD_TRACE, then tests/traces/tracefmt.py)
makes the same calls as the committed trace, and replays through the light
fake stack (tests/e2e/test_traces.py's way) with the journal it had."""
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "e2e"))

import record_traces  # noqa: E402
from torchrig import ROOT, TorchCase  # noqa: E402

TRACES = os.path.join(ROOT, "tests", "traces")

CALLS = ("lookup", "alloc", "free", "map", "unmap", "release", "pool", "meminfo", "step", "batch", "ack",
         "shape", "needed")


def calls(path):
    with open(path) as f:
        return [l.rstrip("\n") for l in f if l.split(" ", 1)[0] in CALLS]


class RecordedAgain(TorchCase):
    def again(self, name):
        run, torch_kv = record_traces.record(name, self.tmp)
        out = os.path.join(self.tmp, name + ".trace")
        record_traces.make_golden(name, run, torch_kv, "this test", out)
        return out

    def committed_is_what_pytorch_does_now(self, name):
        fresh = self.again(name)
        committed = os.path.join(TRACES, name + ".trace")
        self.assertEqual(calls(fresh), calls(committed),
                         "%s differs from what PyTorch does now: `make torch-traces` "
                         "records it again" % committed)

    def test_a_fresh_trace_replays(self):
        import gg
        import test_traces

        class Replay(gg.Case):
            def runTest(self):
                pass

        case = Replay()
        case.setUp()
        self.addCleanup(case.doCleanups)
        fresh = self.again("helper-grow")
        run, h = test_traces.replay(case, fresh)
        self.assertEqual(run.rc, 0, run.out[-3000:])
        want = test_traces.fields(h["expect"][0])
        want.pop("dev")
        got = run.summary()
        for k, v in want.items():
            self.assertEqual(got[k], int(v), k)
        self.assertTrue(run.of("advice"))  # the trainer's calls replayed: the same advice


# A test per scenario (each a real PyTorch run in the rig, 2-20 s): the
# runner spreads them over its workers; a scenario added is tested too.
for _name in sorted(record_traces.SCENARIOS):
    def _test(self, name=_name):
        self.committed_is_what_pytorch_does_now(name)
    _test.__name__ = "test_the_committed_trace_is_what_pytorch_does_now_" + _name.replace("-", "_")
    _test.__doc__ = "tests/traces/%s.trace is what PyTorch does now" % _name
    setattr(RecordedAgain, _test.__name__, _test)
