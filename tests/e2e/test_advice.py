"""Trainer advice: halve the batch, keep the effective batch, before
the OOM; the signal only where a handler waits for it."""
import re

from gg import FAKE, GiB, Case

POLICY = """\
[gpu]
match = NVIDIA GeForce RTX 3090*
[memory]
headroom = 2 GiB
near_miss = 5%
[trainer]
signal = SIGUSR2
{trainer}
"""


def advice_line(run):
    m = re.findall(r"advice: seq=(\d+) dev=(\d+) batch=(\d+) accum=(\d+) reason=(\w+)", run.out)
    return [(int(a), int(b), int(c), int(d), e) for a, b, c, d, e in m]


class Advice(Case):
    def policy(self, trainer=""):
        return self.write_policy("p.ini", POLICY.format(trainer=trainer))

    def test_scripted_values(self):
        run = self.api("fill", "1G", "batch", "32", "1", policy=self.policy())
        events = [(e["seq"], e["batch_size"], e["grad_accum"], e["reason"]) for e in run.of("advice")]
        # the zone entry advises once (no ack yet), the refusal always does
        self.assertEqual(events, [(1, 16, 2, "near_miss"), (2, 16, 2, "refused")])
        self.assertEqual(advice_line(run), [(2, 0, 16, 2, "refused")])

    def test_policy_batch_when_the_trainer_said_nothing(self):
        run = self.api("fill", "1G", policy=self.policy("batch_size = 4\ngrad_accum = 4"))
        first = run.of("advice")[0]
        self.assertEqual((first["batch_size"], first["grad_accum"]), (2, 8))

    def test_unknown_batch_says_halve(self):
        run = self.api("fill", "1G", policy=self.policy())
        first = run.of("advice")[0]
        self.assertEqual((first["batch_size"], first["grad_accum"]), (0, 0))

    def test_odd_batch_keeps_the_effective_batch(self):
        run = self.api("fill", "1G", "batch", "5", "3", policy=self.policy())
        first = run.of("advice")[0]
        self.assertEqual((first["batch_size"], first["grad_accum"]), (2, 8))  # 2x8 >= 5x3

    def test_signal_only_with_a_handler(self):
        run = self.api("fill", "1G", "handler", "batch", "8", "1", policy=self.policy())
        self.assertEqual(run.rc, 0)
        self.assertTrue(all(e["signaled"] for e in run.of("advice")))
        self.assertIn("signals: 2", run.out)
        run = self.api("fill", "1G", "batch", "8", "1", policy=self.policy())
        self.assertEqual(run.rc, 0)  # SIGUSR2's default action would have killed it
        self.assertFalse(any(e["signaled"] for e in run.of("advice")))

    def test_python_without_handler_survives(self):
        code = (
            "import ctypes, os\n"
            f"lib = ctypes.CDLL(os.path.join({FAKE!r}, 'libtorchlike.so'))\n"
            "p = ctypes.c_void_p()\n"
            "print('r', lib.tl_malloc(ctypes.c_size_t(30 << 30), ctypes.byref(p)))\n")
        run = self.python(code, policy=self.policy())
        self.assertEqual(run.rc, 0, run.err)
        self.assertIn("r 2", run.out)
        self.assertTrue(run.of("advice"))
        self.assertFalse(any(e["signaled"] for e in run.of("advice")))

    def test_rearm_only_after_ack(self):
        run = self.api("ack-cycle", "1G", policy=self.policy())
        reasons = [(e["seq"], e["reason"], e["batch_size"], e["grad_accum"]) for e in run.of("advice")]
        # first fill: near miss (16x2) and refusal; ack makes 16x2 current;
        # second fill: a new zone entry advises 8x4, then the refusal
        self.assertEqual(reasons, [(1, "near_miss", 16, 2), (2, "refused", 16, 2),
                                   (3, "near_miss", 8, 4), (4, "refused", 8, 4)])
        self.assertIn("acked 2", run.out)
        self.assertIn("advice: none", run.out)

    def test_at_min(self):
        run = self.api("fill", "1G", "batch", "1", "4", policy=self.policy())
        events = [(e["batch_size"], e["grad_accum"], e["reason"]) for e in run.of("advice")]
        self.assertEqual(events, [(1, 4, "at_min"), (1, 4, "at_min")])

    def test_min_batch_size(self):
        run = self.api("fill", "1G", "batch", "6", "1", policy=self.policy("min_batch_size = 4"))
        first = run.of("advice")[0]
        self.assertEqual((first["batch_size"], first["grad_accum"]), (4, 2))

    def test_threads_leave_one_pending_with_increasing_seq(self):
        run = self.api("advice-threads", "8", "1G", policy=self.policy())
        seqs = [e["seq"] for e in run.of("advice")]
        self.assertEqual(seqs, sorted(seqs))
        self.assertEqual(len(set(seqs)), len(seqs))
        (pending,) = advice_line(run)
        self.assertEqual(pending[0], max(seqs))

    def test_note_is_escaped(self):
        text = 'File "train.py", line 42\n\tloss = model(x)  # "quoted" \\ done'
        run = self.api("note", text)
        self.assertEqual(run.one("note")["text"], text)
