"""Tests of the Python helper (gpuguard.Guard, the adapters) and of
tools/bin/gpuguard-run, without the shim: a stand-in library made of ctypes
callbacks plays libgpuguard.so's C API."""

import collections
import contextlib
import ctypes
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import types
import unittest
import warnings
from unittest import mock

HERE = os.path.dirname(os.path.abspath(__file__))
PYDIR = os.path.dirname(HERE)                      # tools/python
TOOLS = os.path.dirname(PYDIR)                     # tools
if PYDIR not in sys.path:
    sys.path.insert(0, PYDIR)

import gpuguard                                    # noqa: E402
from gpuguard import _native, _split, trainer      # noqa: E402

SIG = signal.SIGUSR2


class FakeShim(object):
    """libgpuguard.so's C API with the contract's semantics, as C-callable
    ctypes callbacks (so the helper's ctypes declarations are exercised)."""

    STATS = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.POINTER(_native.GpuguardStats))
    ADVICE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(_native.GpuguardAdvice))
    ACK = ctypes.CFUNCTYPE(None, ctypes.c_uint)
    SET_BATCH = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_int)
    NOTE = ctypes.CFUNCTYPE(None, ctypes.c_char_p)
    POLICY = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.POINTER(_native.GpuguardPolicy))

    def __init__(self, min_batch_size=1):
        self.min_batch_size = min_batch_size
        self.batch = 0
        self.accum = 1
        self.seq = 0
        self.pending = None
        self.notes = []
        self.acks = []
        self.set_calls = []
        self.gpuguard_stats = self.STATS(self._stats)
        self.gpuguard_advice = self.ADVICE(self._advice)
        self.gpuguard_ack = self.ACK(self._ack)
        self.gpuguard_set_batch = self.SET_BATCH(self._set_batch)
        self.gpuguard_note = self.NOTE(self._note)
        #: device 0's policy: (batch_size, grad_accum, min_batch_size, apply_batch, file)
        self.policy = (4, 4, 1, 0, "/usr/share/gpuguard/policy/rtx-3090.ini")
        self.gpuguard_policy = self.POLICY(self._policy)

    # what the shim does on a near miss (docs/trainer.md, "Advice protocol")
    def advise(self, reason="near_miss", batch=None, accum=None):
        b = self.batch if batch is None else batch
        if batch is None:
            nb = max(self.min_batch_size, b // 2) if b else 0
            na = self.accum
            if nb and nb < b:
                while nb * na < b * self.accum:
                    na += 1
            if b and nb == b:
                reason = "at_min"
        else:
            nb, na = batch, accum
        self.seq += 1
        self.pending = (self.seq, 0, nb, na, reason)
        return self.pending

    def _stats(self, dev, out):
        if dev != 0:
            return -1
        s = out.contents
        s.dev = 0
        s.name = b"NVIDIA GeForce RTX 3090"
        s.total = 24 << 30
        s.limit = (24 << 30) - (3 << 29)
        s.used = 20 << 30
        s.current = 19 << 30
        s.peak = 21 << 30
        s.peak_used = 22 << 30
        s.allocs, s.frees, s.near_misses, s.refusals, s.ooms = 100, 90, 3, 1, 0
        return 0

    def _advice(self, out):
        if self.pending is None:
            return 0
        a = out.contents
        a.seq, a.dev, a.batch_size, a.grad_accum, reason = self.pending
        a.reason = reason.encode()
        return 1

    def _ack(self, seq):
        self.acks.append(seq)
        if self.pending is not None and self.pending[0] == seq:
            self.batch, self.accum = self.pending[2], self.pending[3]
            self.pending = None

    def _set_batch(self, b, a):
        self.set_calls.append((b, a))
        self.batch, self.accum = b, a

    def _note(self, text):
        self.notes.append(text.decode())

    def _policy(self, dev, out):
        if dev != 0:
            return -1
        p = out.contents
        p.batch_size, p.grad_accum, p.min_batch_size, p.apply_batch, f = self.policy
        p.file = f.encode()
        return 0


def wait_for(cond, timeout=2.0):
    end = time.time() + timeout
    while not cond() and time.time() < end:
        time.sleep(0.001)
    return cond()


class Base(unittest.TestCase):
    def setUp(self):
        self.saved_handler = signal.getsignal(SIG)
        self.fake = FakeShim()
        _native.set_library(self.fake)
        env = mock.patch.dict(os.environ)
        env.start()
        self.addCleanup(env.stop)
        os.environ.pop("GPUGUARD_SIGNAL", None)

    def tearDown(self):
        _native.reset_library()
        signal.signal(SIG, self.saved_handler)

    def guard(self, *a, **kw):
        g = gpuguard.Guard(*a, **kw)
        self.addCleanup(g.close)
        return g


class InertTest(Base):
    def setUp(self):
        super(InertTest, self).setUp()
        _native.set_library(None)

    def test_inert_with_one_warning(self):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            g = gpuguard.Guard(32, grad_accum=2)
        msgs = [str(w.message) for w in caught]
        self.assertEqual(msgs, ["gpuguard: libgpuguard.so is not preloaded; the guard is inert"])
        self.assertTrue(issubclass(caught[0].category, gpuguard.GpuguardWarning))
        self.assertFalse(g.active)
        self.assertFalse(g.shrink_requested)
        self.assertFalse(g.sync_shrink_requested())
        self.assertIsNone(g.advice())
        self.assertIsNone(g.stats())
        self.assertEqual(g.accept(), (32, 2))
        g.note("ignored")
        g.set_batch(16, 4)
        self.assertEqual(g.accept(), (16, 4))
        self.assertEqual(signal.getsignal(SIG), self.saved_handler)
        self.assertIsNone(g.signal)
        g.close()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with gpuguard.Guard(8) as g2:
                self.assertFalse(g2.active)

    def test_real_lookup_finds_nothing_without_the_preload(self):
        _native.reset_library()
        try:
            ctypes.CDLL(None).gpuguard_stats
        except AttributeError:
            self.assertIsNone(_native.load())
        else:
            self.skipTest("libgpuguard.so is preloaded")

    def test_bad_arguments(self):
        for args in ((0,), (4, 0), (4, 1, 0)):
            with self.assertRaises(ValueError):
                gpuguard.Guard(*args)


class StructTest(unittest.TestCase):
    def test_structs_mirror_the_header(self):
        s = [n for n, _ in _native.GpuguardStats._fields_]
        self.assertEqual(s, ["dev", "name", "total", "limit", "used", "current", "peak",
                             "peak_used", "allocs", "frees", "near_misses", "refusals", "ooms"])
        self.assertEqual(ctypes.sizeof(_native.GpuguardStats), 4 + 256 + 4 + 11 * 8)
        a = [n for n, _ in _native.GpuguardAdvice._fields_]
        self.assertEqual(a, ["seq", "dev", "batch_size", "grad_accum", "reason"])
        self.assertEqual(ctypes.sizeof(_native.GpuguardAdvice), 16 + 32)

    def test_plain_python_stand_in(self):
        calls = []
        lib = types.SimpleNamespace(
            gpuguard_stats=lambda dev, out: -1,
            gpuguard_advice=lambda out: 0,
            gpuguard_ack=lambda seq: calls.append(("ack", seq)),
            gpuguard_set_batch=lambda b, a: calls.append(("set", b, a)),
            gpuguard_note=lambda text: calls.append(("note", text)))
        n = _native.Native(lib)
        self.assertIsNone(n.stats(0))
        self.assertIsNone(n.advice())
        n.set_batch(4, 2)
        n.ack(3)
        n.note("a\0b")
        self.assertEqual(calls, [("set", 4, 2), ("ack", 3), ("note", b"ab")])

    def test_optional_functions(self):
        calls = []
        base = dict(gpuguard_stats=lambda dev, out: -1, gpuguard_advice=lambda out: 0,
                    gpuguard_ack=lambda seq: None, gpuguard_set_batch=lambda b, a: None,
                    gpuguard_note=lambda text: None)
        older = _native.Native(types.SimpleNamespace(**base))  # a shim before gpuguard_step
        self.assertFalse(older.has("gpuguard_step"))
        self.assertFalse(older.step(3))
        newer = _native.Native(types.SimpleNamespace(gpuguard_step=calls.append, **base))
        self.assertTrue(newer.has("gpuguard_step"))
        self.assertTrue(newer.step(3))
        self.assertEqual(calls, [3])
        self.assertEqual(_native.OPTIONAL, ("gpuguard_step", "gpuguard_policy",
                                            "gpuguard_torch_attach", "gpuguard_torch_detach",
                                            "gpuguard_torch_view", "gpuguard_backward",
                                            "gpuguard_torch_raise", "gpuguard_step_shape",
                                            "gpuguard_step_needed", "gpuguard_uncaught",
                                            "gpuguard_predict", "gpuguard_set_batch_why"))
        self.assertIsNone(older.predict(0, 1000))          # a shim before the memory model
        self.assertFalse(older.has("gpuguard_torch_raise"))  # a shim before it: views swallow
        self.assertFalse(older.has("gpuguard_torch_view"))   # a shim before the instrumentation
        self.assertFalse(older.has("gpuguard_step_shape"))   # a shim before steps in shapes
        self.assertIsNone(older.function("gpuguard_torch_view"))
        self.assertIsNone(older.policy(0))                 # a shim before gpuguard_policy
        _native.set_library(types.SimpleNamespace(**base))
        try:
            self.assertIsNotNone(_native.load())               # still the shim
        finally:
            _native.reset_library()

    def test_missing_function_means_absent(self):
        lib = types.SimpleNamespace(gpuguard_stats=lambda dev, out: -1)
        _native.set_library(lib)
        try:
            self.assertIsNone(_native.load())
        finally:
            _native.reset_library()


class GuardTest(Base):
    def test_set_batch_at_start(self):
        g = self.guard(32, grad_accum=2)
        self.assertTrue(g.active)
        self.assertEqual(self.fake.set_calls, [(32, 2)])
        self.assertEqual((g.batch_size, g.grad_accum, g.effective_batch_size), (32, 2, 64))
        self.assertFalse(g.shrink_requested)
        self.assertEqual(g.signal, SIG)

    def test_signal_sets_flag_and_attaches_python_stack(self):
        g = self.guard(32)
        self.fake.advise()
        os.kill(os.getpid(), SIG)
        self.assertTrue(wait_for(lambda: g._flag))
        self.assertTrue(g.shrink_requested)
        self.assertEqual(len(self.fake.notes), 1)
        note = self.fake.notes[0]
        self.assertIn("SIGUSR2", note)
        self.assertIn("advice #1 (near_miss): batch 16 x accum 2", note)
        self.assertIn("test_helper.py", note)
        last = note.rstrip("\n").splitlines()[-2]   # the innermost frame
        self.assertIn("in test_signal_sets_flag_and_attaches_python_stack", last)
        self.assertLessEqual(len(note), gpuguard.NOTE_LIMIT + 512)

    def test_a_failing_handler_is_counted_never_raised(self):
        """The signal handler's note fails with an error nobody expects: the
        loop never sees it, the flag is still set, and the error is counted
        at its place (said on stderr only under GPUGUARD_DEBUG)."""
        from gpuguard import _debug
        g = self.guard(32)
        before = _debug.counts.get(("trainer.Guard._on_signal", "LookupError"), 0)

        def broken(text):
            raise LookupError("no codec")
        g._native.note = broken
        os.kill(os.getpid(), SIG)
        self.assertTrue(wait_for(lambda: g._flag))
        self.assertEqual(_debug.counts[("trainer.Guard._on_signal", "LookupError")], before + 1)

    def test_debug_says_what_was_swallowed_only_when_asked(self):
        code = ("from gpuguard import _debug\n"
                "_debug.swallowed('here', KeyError('k'))\n"
                "_debug.swallowed('here', KeyError('k'))\n")
        for value, said in (("1", True), ("", False), ("0", False)):
            env = dict(os.environ, PYTHONPATH=PYDIR, GPUGUARD_DEBUG=value)
            p = subprocess.run([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, universal_newlines=True)
            self.assertEqual(p.returncode, 0, p.stderr)
            if said:
                self.assertEqual(p.stderr.count("gpuguard: debug: here swallowed KeyError"), 1,
                                 p.stderr)
                self.assertIn("swallowed 2 exception(s): here KeyError x2", p.stderr)
            else:
                self.assertEqual(p.stderr, "")

    def test_flag_without_advice_still_requests(self):
        g = self.guard(8)
        os.kill(os.getpid(), SIG)
        self.assertTrue(wait_for(lambda: g.shrink_requested))
        self.assertEqual(g.accept(), (8, 1))      # nothing advised: unchanged
        self.assertFalse(g.shrink_requested)
        self.assertEqual(self.fake.acks, [])

    def test_polling_works_without_the_signal(self):
        g = self.guard(32, signal=None)
        self.assertIsNone(g.signal)
        self.assertEqual(signal.getsignal(SIG), self.saved_handler)
        self.assertFalse(g.shrink_requested)
        self.fake.advise()
        self.assertTrue(g.shrink_requested)
        self.assertEqual(g.advice(), {"seq": 1, "dev": 0, "batch_size": 16,
                                      "grad_accum": 2, "reason": "near_miss"})

    def test_accept_acks_and_returns_the_advice(self):
        g = self.guard(32)
        self.fake.advise()
        os.kill(os.getpid(), SIG)
        self.assertTrue(wait_for(lambda: g._flag))
        self.assertEqual(g.accept(), (16, 2))
        self.assertEqual(self.fake.acks, [1])
        self.assertEqual(self.fake.set_calls[-1], (16, 2))
        self.assertEqual((self.fake.batch, self.fake.accum), (16, 2))
        self.assertIsNone(self.fake.pending)
        self.assertFalse(g.shrink_requested)
        self.assertEqual((g.batch_size, g.grad_accum), (16, 2))
        self.assertEqual(g.accept(), (16, 2))     # nothing pending: no change
        self.assertEqual(self.fake.acks, [1])

    def test_effective_batch_kept(self):
        g = self.guard(5, grad_accum=1)
        seen = []
        while True:
            self.fake.advise()
            b, a = g.accept()
            seen.append((b, a))
            self.assertGreaterEqual(b * a, 5)
            if b == 1:
                break
        self.assertEqual(seen, [(2, 3), (1, 6)])   # the shim's rule compounds
        self.fake.advise()                         # at the minimum
        self.assertEqual(self.fake.pending[4], "at_min")
        self.assertEqual(g.accept(), (1, 6))
        self.assertEqual(self.fake.acks, [1, 2, 3])

    def test_accumulation_lifted_to_the_effective_batch(self):
        g = self.guard(8, grad_accum=3)
        self.fake.advise(batch=4, accum=2)         # too little accumulation
        self.assertEqual(g.accept(), (4, 6))
        self.assertEqual(self.fake.set_calls[-1], (4, 6))

    def test_min_batch_size_and_unknown_batch(self):
        g = self.guard(8, min_batch_size=4)
        self.fake.advise(batch=2, accum=4)         # the shim does not know our floor
        self.assertEqual(g.accept(), (4, 2))
        self.assertEqual(self.fake.set_calls[-1], (4, 2))
        g2 = self.guard(12, grad_accum=1)
        self.fake.advise(batch=0, accum=0)         # "halve whatever you use"
        self.assertEqual(g2.accept(), (6, 2))

    def test_advice_never_grows_the_batch(self):
        g = self.guard(8)
        self.fake.advise(batch=16, accum=1)        # stale: computed for an older batch
        self.assertEqual(g.accept(), (8, 1))
        self.assertEqual(self.fake.acks, [1])

    def test_set_batch_resets_the_effective_batch(self):
        g = self.guard(8, grad_accum=4)
        g.set_batch(16, 1)
        self.assertEqual(self.fake.set_calls[-1], (16, 1))
        self.fake.advise()
        self.assertEqual(g.accept(), (8, 2))

    def test_chains_to_the_previous_handler_and_close_restores_it(self):
        calls = []

        def previous(signum, frame):
            calls.append(signum)
        signal.signal(SIG, previous)
        g = gpuguard.Guard(16)
        self.assertIsNot(signal.getsignal(SIG), previous)
        self.fake.advise()
        os.kill(os.getpid(), SIG)
        self.assertTrue(wait_for(lambda: calls))
        self.assertEqual(calls, [SIG])
        self.assertTrue(g.shrink_requested)
        g.close()
        self.assertIs(signal.getsignal(SIG), previous)
        self.assertFalse(g.active)
        self.assertFalse(g.shrink_requested)
        g.close()                                   # twice is fine

    def test_close_restores_default_and_context_manager(self):
        signal.signal(SIG, signal.SIG_DFL)
        with gpuguard.Guard(16) as g:
            self.assertNotEqual(signal.getsignal(SIG), signal.SIG_DFL)
            self.assertTrue(g.active)
        self.assertEqual(signal.getsignal(SIG), signal.SIG_DFL)
        self.assertFalse(g.active)

    def test_close_leaves_a_later_handler_alone(self):
        g = gpuguard.Guard(16)
        ours = signal.getsignal(SIG)

        def later(signum, frame):
            ours(signum, frame)
        signal.signal(SIG, later)
        g.close()
        self.assertIs(signal.getsignal(SIG), later)
        os.kill(os.getpid(), SIG)                   # a closed guard only chains
        time.sleep(0.01)
        self.assertEqual(self.fake.notes, [])

    def test_handler_only_on_the_main_thread(self):
        box = {}

        def make():
            box["g"] = gpuguard.Guard(16)
        t = threading.Thread(target=make)
        t.start()
        t.join()
        g = box["g"]
        self.addCleanup(g.close)
        self.assertTrue(g.active)
        self.assertIsNone(g.signal)
        self.assertEqual(signal.getsignal(SIG), self.saved_handler)
        self.fake.advise()
        self.assertTrue(g.shrink_requested)
        self.assertEqual(g.accept(), (8, 2))

    def test_signal_from_environment_and_by_name(self):
        os.environ["GPUGUARD_SIGNAL"] = "SIGUSR1"
        saved = signal.getsignal(signal.SIGUSR1)
        self.addCleanup(signal.signal, signal.SIGUSR1, saved)
        g = self.guard(4)
        self.assertEqual(g.signal, signal.SIGUSR1)
        g.close()
        os.environ["GPUGUARD_SIGNAL"] = "none"
        self.assertIsNone(self.guard(4).signal)
        self.assertEqual(self.guard(4, signal="usr2").signal, SIG)
        with self.assertRaises(ValueError):
            gpuguard.Guard(4, signal="SIGNOPE")

    def test_stats(self):
        g = self.guard(4)
        s = g.stats()
        self.assertEqual(s["name"], "NVIDIA GeForce RTX 3090")
        self.assertEqual(s["total"], 24 << 30)
        self.assertEqual((s["near_misses"], s["refusals"], s["ooms"]), (3, 1, 0))
        self.assertEqual(set(s), set(_native.STATS_FIELDS))
        self.assertIsNone(g.stats(3))

    def test_note(self):
        g = self.guard(4)
        g.note("hello \u00e9")
        self.assertEqual(self.fake.notes, ["hello \u00e9"])

    def test_stack_trimmed(self):
        def ping(n):
            if n == 0:
                return trainer._format_stack(sys._getframe())
            return pong(n - 1)

        def pong(n):
            return ping(n)
        text = ping(200)   # alternating frames: format_stack folds no repeats
        self.assertLessEqual(len(text), gpuguard.NOTE_LIMIT + 16)
        self.assertTrue(text.startswith("  ...\n  File "), text[:80])
        self.assertIn("in ping", text.splitlines()[-2])


class FakeArray(object):
    """A tensor as the splitter sees one: a shape, and slices along dim 0."""

    def __init__(self, rows, tail=()):
        self.rows = list(rows)
        self.shape = (len(self.rows),) + tuple(tail)

    def __getitem__(self, index):
        assert isinstance(index, slice)
        return FakeArray(self.rows[index], self.shape[1:])

    def __len__(self):
        return len(self.rows)

    def __repr__(self):
        return "FakeArray(%r)" % (self.rows,)


class Scalar(object):
    shape = ()  # a 0-dim tensor: not split


class SplitTest(unittest.TestCase):
    def rows(self, piece):
        return piece.rows

    def test_one_piece_is_the_batch_itself(self):
        batch = {"x": FakeArray(range(8))}
        self.assertEqual(_split.split(batch, 1), [(batch, 8)])
        self.assertEqual(_split.split(42, 4), [(42, 1)])          # nothing to split
        single = FakeArray([7])
        self.assertEqual(_split.split(single, 4), [(single, 1)])  # one sample

    def test_nearly_equal_consecutive_pieces(self):
        parts = _split.split(FakeArray(range(10)), 4)
        self.assertEqual([size for _, size in parts], [3, 3, 2, 2])
        self.assertEqual([p.rows for p, _ in parts], [[0, 1, 2], [3, 4, 5], [6, 7], [8, 9]])
        parts = _split.split(FakeArray(range(3)), 8)               # never an empty piece
        self.assertEqual([p.rows for p, _ in parts], [[0], [1], [2]])

    def test_nested_structures_keep_their_shape(self):
        Pair = collections.namedtuple("Pair", "inputs labels")
        batch = {"pair": Pair(FakeArray(range(4), (3,)), FakeArray("abcd")),
                 "ids": [10, 11, 12, 13],                # a sequence of samples
                 "names": ("a", "b", "c", "d"),
                 "tag": "constant", "scale": Scalar(), "none": None,
                 "other": FakeArray(range(7)),           # not the batch's length
                 "short": [1, 2],                        # neither
                 "nested": [{"m": FakeArray(range(4))}, 5]}
        (a, na), (b, nb) = _split.split(batch, 2)
        self.assertEqual((na, nb), (2, 2))
        self.assertIsInstance(a["pair"], Pair)
        self.assertEqual(a["pair"].inputs.rows, [0, 1])
        self.assertEqual(a["pair"].inputs.shape, (2, 3))
        self.assertEqual(b["pair"].labels.rows, ["c", "d"])
        self.assertEqual(a["ids"], [10, 11])
        self.assertEqual(b["names"], ("c", "d"))
        for piece in (a, b):
            self.assertEqual(piece["tag"], "constant")
            self.assertIs(piece["scale"], batch["scale"])
            self.assertIsNone(piece["none"])
            self.assertIs(piece["other"], batch["other"])
            self.assertIs(piece["short"], batch["short"])
            self.assertEqual(piece["nested"][1], 5)
        self.assertEqual(b["nested"][0]["m"].rows, [2, 3])

    def test_mapping_types_and_plain_sequences(self):
        class Encoding(collections.OrderedDict):
            pass
        parts = _split.split(Encoding(x=FakeArray(range(4))), 2)
        self.assertTrue(all(type(p) is Encoding for p, _ in parts))
        texts = ["one", "two", "three"]                  # no tensor: samples
        self.assertEqual([p for p, _ in _split.split(texts, 2)], [["one", "two"], ["three"]])
        self.assertEqual(_split.batch_length({"a": 1}), None)
        self.assertEqual(_split.batch_length("a string"), None)
        self.assertEqual(_split.batch_length({"k": [1, 2], "x": FakeArray(range(5))}), 5)


class StepShim(FakeShim):
    """A newer shim: gpuguard_step too."""

    STEP = ctypes.CFUNCTYPE(None, ctypes.c_ulonglong)

    def __init__(self, **kw):
        super(StepShim, self).__init__(**kw)
        self.steps = []
        self.gpuguard_step = self.STEP(self.steps.append)


class ShapeShim(StepShim):
    """A shim with the memory model (gpuguard_predict): once `ready`, a step
    of t tokens is predicted to need base + per_token x t bytes (+ margin
    beyond the largest input told), against a 20 GiB near-miss line."""

    PREDICT = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_ulonglong,
                               ctypes.POINTER(_native.GpuguardPrediction))
    SHAPE = ctypes.CFUNCTYPE(None, ctypes.POINTER(ctypes.c_longlong), ctypes.c_int, ctypes.c_int)
    LINE = 20 << 30

    def __init__(self, **kw):
        super(ShapeShim, self).__init__(**kw)
        self.ready = False
        self.base, self.per_token = 2 << 30, 512 << 10   # 512 KiB a token
        self.margin = 0
        self.beyond_share = 5       # beyond the largest input told: + 1/5 of the prediction
        self.most = 0
        self.asked, self.shapes = [], []
        self.max_tokens = 0
        self.gpuguard_predict = self.PREDICT(self._predict)
        self.gpuguard_step_shape = self.SHAPE(self._shape)
        self.whys = []
        self.gpuguard_set_batch_why = self.SET_BATCH_WHY(self._set_batch_why)

    SET_BATCH_WHY = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_int, ctypes.c_char_p)

    def _set_batch_why(self, b, a, why):
        self._set_batch(b, a)
        self.whys.append(why.decode() if why else None)

    def _shape(self, dims, n, batch_dim):
        shape = tuple(dims[i] for i in range(n))
        self.shapes.append((shape, batch_dim))
        t = 1
        for d in shape:
            t *= d
        self.most = max(self.most, t)

    def _predict(self, dev, tokens, out):
        self.asked.append(tokens)
        p = out.contents
        p.line, p.steps, p.most_tokens = self.LINE, len(self.shapes), self.most
        p.max_tokens = self.max_tokens
        if not self.ready:
            return 1
        p.bytes = self.base + self.per_token * tokens
        p.beyond = 1 if tokens > self.most else 0
        p.margin = self.margin + (p.bytes // self.beyond_share if p.beyond and
                                  self.beyond_share else 0)
        return 0


def tokens(b, t):
    """Token ids [b, t] as the splitter sees them."""
    return FakeArray(range(b), (t,))


class SizingTest(Base):
    """Each batch sized by its shape before it runs (the shim's model)."""

    def setUp(self):
        super(SizingTest, self).setUp()
        self.fake = ShapeShim()
        _native.set_library(self.fake)

    def test_before_the_model_has_data_the_split_is_as_today(self):
        g = self.guard(8)
        self.assertEqual(len(g.microbatches(tokens(8, 7556))), 1)  # no model: whole
        self.fake.advise()
        with self.assertLogs("gpuguard", logging.WARNING) as logs:
            self.assertEqual(len(g.microbatches(tokens(8, 500))), 2)  # advised: halved, kept
        self.assertIn("(advice #1, near_miss)", logs.output[0])
        self.assertEqual(self.fake.whys, ["advice"])
        self.assertEqual(len(g.microbatches(tokens(8, 500))), 2)
        self.assertEqual([s for s, _ in self.fake.shapes], [(8, 7556), (8, 500), (8, 500)])
        g.finish()
        self.assertEqual(g.sizing, {"whole": 1, "split_by_shape": 0, "split": 2, "redone": 0})

    def test_a_long_batch_is_split_before_it_runs_and_the_rest_run_whole(self):
        g = self.guard(8)
        self.fake.ready = True
        self.fake.beyond_share = 0
        sizes = []
        with self.assertLogs("gpuguard", logging.WARNING) as logs:
            for t in (700, 900, 7556, 600, 4100, 800):
                pieces = g.microbatches(tokens(8, t))
                sizes.append([len(p) for p in pieces])
                self.assertAlmostEqual(sum(p.weight for p in pieces), 1.0)
                self.assertEqual(sum(len(p) for p in pieces), 8)
            g.finish()
        # 8 x 7556: 2 + 0.5 x 60 448 MiB = 31.5 GiB; 4 pieces of 2: 9.4 GiB;
        # 3 pieces (3, 3, 2): 13.1 GiB; 2 of 4: 16.8 GiB: the fewest under 20 GiB.
        self.assertEqual(sizes, [[8], [8], [4, 4], [8], [8], [8]])
        self.assertEqual(logs.output[0], "WARNING:gpuguard:gpuguard: batch 3: 8 x 7 556 tokens, "
                         "predicted 31.5 GiB over the 20.0 GiB line: 2 pieces")
        self.assertEqual(g.sizing, {"whole": 5, "split_by_shape": 1, "split": 0, "redone": 0})
        self.assertIn("6 batches: 5 whole, 1 split by their shape, 0 redone", logs.output[-1])
        # the shim hears the piece's shape (what the step's peak follows) and the batch
        self.assertEqual(self.fake.shapes[2], ((4, 7556), 0))
        self.assertEqual(self.fake.set_calls[1:], [(4, 2), (8, 1)])
        self.assertEqual(self.fake.whys, ["shape", "shape"])     # the batch events' reason
        self.assertEqual([h["reason"] for h in g.history], ["shape", "shape"])

    def test_the_split_grows_back_after_an_advice(self):
        g = self.guard(8)
        g.microbatches(tokens(8, 500))
        self.fake.advise()
        with self.assertLogs("gpuguard", logging.WARNING):
            self.assertEqual(len(g.microbatches(tokens(8, 500))), 2)  # no model yet: as advised
        self.fake.ready = True
        self.fake.advise()
        self.assertEqual(len(g.microbatches(tokens(8, 500))), 1)  # predicted to fit: whole
        self.assertEqual(self.fake.acks, [1, 2])

    def test_beyond_every_input_seen_the_margin_counts_and_is_said_once(self):
        g = self.guard(8)
        self.fake.ready = True
        g.microbatches(tokens(8, 1000))
        # 8 x 4000 alone: 2 + 15.6 = 17.6 GiB, under the line; + 20% beyond: 21.1 GiB
        with self.assertLogs("gpuguard", logging.WARNING) as logs:
            self.assertEqual(len(g.microbatches(tokens(8, 4000))), 2)
            self.assertEqual(len(g.microbatches(tokens(8, 4500))), 2)
        self.assertIn("batch 2: 8 x 4 000 tokens, predicted 17.6 GiB + 3.5 GiB margin over the "
                      "20.0 GiB line: 2 pieces", logs.output[0])
        said = [l for l in logs.output if "larger than any" in l]
        self.assertEqual(len(said), 1)
        self.assertIn("batch 2 is larger than any the run has seen (32 000 tokens, the largest "
                      "so far 8 000)", said[0])
        self.assertEqual(len(g.microbatches(tokens(8, 4000))), 2)   # pieces seen, not the whole
        self.assertEqual(len(g.microbatches(tokens(8, 1500))), 1)   # within what was seen

    def test_the_policys_max_tokens_applies_from_the_first_batch(self):
        g = self.guard(8)
        self.fake.max_tokens = 8 * 2000                 # [trainer] max_tokens = 16000
        with self.assertLogs("gpuguard", logging.WARNING) as logs:
            self.assertEqual([len(p) for p in g.microbatches(tokens(8, 7556))], [2] * 4)
        self.assertEqual(logs.output[0], "WARNING:gpuguard:gpuguard: batch 1: 8 x 7 556 tokens, "
                         "over the policy's max_tokens 16 000: 4 pieces")
        self.assertEqual(len(g.microbatches(tokens(8, 1500))), 1)   # under it: whole
        self.fake.ready = True                          # the model says 8 x 3000 fits,
        self.assertEqual(len(g.microbatches(tokens(8, 3000))), 2)   # the cap does not
        g.finish()
        self.assertEqual(g.sizing["split_by_shape"], 2)

    def test_pieces_never_below_min_batch_size(self):
        g = self.guard(8, min_batch_size=4)
        self.fake.ready = True
        with self.assertLogs("gpuguard", logging.WARNING):
            pieces = g.microbatches(tokens(8, 40000))  # over the line even in pieces of 1
        self.assertEqual([len(p) for p in pieces], [4, 4])

    def test_ranks_take_the_largest_split(self):
        torch = fake_torch(lambda mine: [1, 3])        # the other rank's batch needs 3
        p = mock.patch.dict(sys.modules, {"torch": torch})
        p.start()
        self.addCleanup(p.stop)
        g = self.guard(8)
        self.fake.ready = True
        self.assertEqual([len(x) for x in g.microbatches(tokens(8, 500))], [3, 3, 2])
        self.assertEqual(len(torch.reduced), 1)         # one all-reduce a batch
        self.assertEqual(self.fake.shapes[-1], ((3, 500), 0))  # the pieces that run, told

    def test_run_redoes_a_batch_the_model_misjudged_and_counts_it(self):
        torch = fake_torch()
        torch.cuda.OutOfMemoryError = OOM
        p = mock.patch.dict(sys.modules, {"torch": torch})
        p.start()
        self.addCleanup(p.stop)
        g = self.guard(8)
        self.fake.ready = True
        calls = []

        def step(mb):
            calls.append(len(mb))
            if len(mb) * mb.data.shape[1] > 8 * 2000:    # more than the model thinks
                raise OOM("CUDA out of memory. Tried to allocate 2.00 GiB")
        with self.assertLogs("gpuguard", logging.WARNING):
            g.run(tokens(8, 3000), step, lambda: None)
            g.run(tokens(8, 500), step, lambda: None)
            g.finish()
        self.assertEqual(calls, [8, 4, 4, 8])            # redone in halves, then whole again
        self.assertEqual(g.sizing, {"whole": 1, "split_by_shape": 0, "split": 0, "redone": 1})


class MicrobatchTest(Base):
    def pieces(self, guard, n=32):
        return guard.microbatches(FakeArray(range(n)))

    def test_whole_batch_until_advised_then_halved_at_the_next_boundary(self):
        g = self.guard(32, grad_accum=2)
        batch = FakeArray(range(32))
        (mb,) = g.microbatches(batch)
        self.assertIs(mb.data, batch)
        self.assertEqual((mb.weight, len(mb), mb.index, mb.count, mb.last), (1.0, 32, 0, 1, True))
        self.fake.advise()                               # inside the batch: nothing changes yet
        self.assertEqual(self.fake.acks, [])
        with self.assertLogs("gpuguard", logging.WARNING) as logs:
            pieces = self.pieces(g)
        self.assertEqual([len(p) for p in pieces], [16, 16])
        self.assertEqual([p.weight for p in pieces], [0.5, 0.5])
        self.assertEqual([p.last for p in pieces], [False, True])
        self.assertEqual(pieces[1].data.rows, list(range(16, 32)))
        self.assertEqual(self.fake.acks, [1])
        self.assertEqual(self.fake.set_calls[-1], (16, 4))  # micro-batch, accumulation x split
        self.assertEqual((g.split, g.micro_batch_size, g.batch_size), (2, 16, 32))
        self.assertIn("from batch 2 on, each batch of 32 is split into 2 micro-batches of "
                      "at most 16 (advice #1, near_miss)", logs.output[0])
        self.assertEqual(g.history, [{"batch": 2, "split": 2, "micro_batch_size": 16,
                                      "reason": "advice #1, near_miss"}])
        self.assertEqual(len(self.pieces(g)), 2)         # the split stays
        self.fake.advise()
        with self.assertLogs("gpuguard", logging.WARNING):
            self.assertEqual([len(p) for p in self.pieces(g)], [8, 8, 8, 8])
        self.assertEqual(self.fake.set_calls[-1], (8, 8))

    def test_weights_of_uneven_pieces_add_up(self):
        g = self.guard(10)
        self.fake.advise(batch=3, accum=4)
        with self.assertLogs("gpuguard", logging.WARNING):
            pieces = g.microbatches(FakeArray(range(10)))
        self.assertEqual([len(p) for p in pieces], [3, 3, 2, 2])
        self.assertEqual([p.weight for p in pieces], [0.3, 0.3, 0.2, 0.2])
        short = g.microbatches(FakeArray(range(5)))      # a last, short batch
        self.assertEqual([p.weight for p in short], [0.4, 0.2, 0.2, 0.2])

    def test_floor_stale_and_at_min_advice(self):
        g = self.guard(8, min_batch_size=4)
        self.fake.advise(batch=1, accum=8)               # below our floor
        with self.assertLogs("gpuguard", logging.WARNING):
            self.assertEqual(len(self.pieces(g, 8)), 2)
        self.fake.advise(batch=8, accum=1)               # stale: never grows
        self.assertEqual(len(self.pieces(g, 8)), 2)
        self.fake.advise(reason="at_min", batch=4, accum=2)
        self.assertEqual(len(self.pieces(g, 8)), 2)
        self.assertEqual(self.fake.acks, [1, 2, 3])      # every advice answered
        self.assertEqual(self.fake.set_calls[-1], (4, 2))
        g2 = self.guard(12)
        self.fake.advise(batch=0, accum=0)               # "halve whatever you use"
        with self.assertLogs("gpuguard", logging.WARNING):
            self.assertEqual([len(p) for p in self.pieces(g2, 12)], [6, 6])

    def test_each_boundary_is_a_step_for_a_shim_that_has_gpuguard_step(self):
        shim = StepShim()
        _native.set_library(shim)
        g = self.guard(4)
        for _ in range(3):
            g.microbatches(FakeArray(range(4)))
        self.assertEqual(shim.steps, [1, 2])             # batches 1 and 2 ended
        g.step()                                         # a hand-written loop's step
        self.assertEqual(shim.steps, [1, 2, 3])
        _native.set_library(self.fake)                   # an older shim: no gpuguard_step
        g2 = self.guard(4)
        self.assertFalse(g2._native.has("gpuguard_step"))
        g2.microbatches([1, 2, 3, 4])
        g2.microbatches([1, 2, 3, 4])
        g2.step()

    def test_empty_cache_when_the_split_changes(self):
        torch = fake_torch()
        with mock.patch.dict(sys.modules, {"torch": torch}):
            g = self.guard(32)
            self.pieces(g)
            self.assertEqual(torch.calls, [])
            self.fake.advise()
            with self.assertLogs("gpuguard", logging.WARNING):
                self.pieces(g)
        self.assertEqual(torch.calls, ["empty_cache"])


class OOM(RuntimeError):
    """What torch 1.13 raises: a RuntimeError subclass."""


class RunTest(Base):
    def setUp(self):
        super(RunTest, self).setUp()
        self.torch = fake_torch()
        self.torch.cuda.OutOfMemoryError = OOM
        patch = mock.patch.dict(sys.modules, {"torch": self.torch})
        patch.start()
        self.addCleanup(patch.stop)

    def trainer(self, limit, ooms=None):
        """step() fails while a piece is larger than limit[0]."""
        calls, zeroed = [], []

        def step(mb):
            calls.append(len(mb))
            if len(mb) > limit[0]:
                self.fake.advise(reason="refused")        # the shim advises on a refusal
                raise (ooms or OOM)("CUDA out of memory. Tried to allocate 2.00 GiB")
        return calls, zeroed, step, lambda: zeroed.append(len(calls))

    def test_halves_and_redoes_the_whole_batch_then_keeps_the_split(self):
        g = self.guard(32)
        calls, zeroed, step, zero = self.trainer([10])
        with self.assertLogs("gpuguard", logging.WARNING) as logs:
            g.run(FakeArray(range(32)), step, zero)
        self.assertEqual(calls, [32, 16, 8, 8, 8, 8])
        self.assertEqual(zeroed, [1, 2])                  # before each redo
        self.assertEqual(g.ooms, 2)
        self.assertEqual(self.fake.acks, [1, 2])          # the refusals' advice answered
        self.assertIn("(out of memory)", logs.output[0])
        del calls[:]
        g.run(FakeArray(range(32)), step, zero)
        self.assertEqual(calls, [8, 8, 8, 8])
        self.assertEqual(g.ooms, 2)

    def test_every_kind_of_oom(self):
        class TorchOOM(Exception):
            pass
        self.torch.OutOfMemoryError = TorchOOM               # torch 2.x
        for exc in (TorchOOM, OOM, RuntimeError):           # RuntimeError: torch < 1.13
            g = self.guard(4)
            calls, _, step, zero = self.trainer([2], exc)
            with self.assertLogs("gpuguard", logging.WARNING):
                g.run(FakeArray(range(4)), step, zero)
            self.assertEqual(calls, [4, 2, 2], exc)

    def test_raises_at_min_batch_size_and_lets_other_errors_through(self):
        g = self.guard(8, min_batch_size=4)
        calls, zeroed, step, zero = self.trainer([1])
        with self.assertLogs("gpuguard", logging.WARNING):
            with self.assertRaises(OOM):
                g.run(FakeArray(range(8)), step, zero)
        self.assertEqual(calls, [8, 4])
        self.assertEqual(zeroed, [1])
        g2 = self.guard(8)

        def broken(mb):
            raise ValueError("not a memory problem")
        with self.assertRaises(ValueError):
            g2.run(FakeArray(range(8)), broken, zero)
        g3 = self.guard(8)
        calls, _, step, zero = self.trainer([0])
        with self.assertLogs("gpuguard", logging.WARNING):
            with self.assertRaises(OOM):                  # down to one sample, then raised
                g3.run(FakeArray(range(8)), step, zero)
        self.assertEqual(calls, [8, 4, 2, 1])
        g4 = self.guard(8)
        with self.assertRaises(OOM):                      # nothing to split
            g4.run(7, step, zero)


class FirstContactTest(Base):
    """What the helper's users expect of it: the next run starts where
    gpuguard-report --recommend said, the micro-batch's weight is applied
    for them, and the run's last step is told."""

    def test_a_recommended_policy_is_the_starting_split(self):
        self.fake.policy = (11, 3, 1, 1, "/runs/next/nvidia-geforce-rtx-3090.ini")
        g = self.guard(32)
        with self.assertLogs("gpuguard", logging.WARNING) as logs:
            pieces = g.microbatches(FakeArray(range(32)))
        self.assertEqual([len(p) for p in pieces], [11, 11, 10])     # at most 11 each
        self.assertEqual(self.fake.set_calls[-1], (11, 3))
        self.assertEqual(len(logs.output), 1)
        self.assertIn("from batch 1 on, each batch of 32 is split into 3 micro-batches of at "
                      "most 11 (policy /runs/next/nvidia-geforce-rtx-3090.ini: batch_size 11 x "
                      "grad_accum 3)", logs.output[0])

    def test_a_shipped_policy_batch_is_not_applied(self):
        # rtx-3090.ini says batch 4 x 4 for trainers that never say theirs;
        # without apply_batch the script's own batch stands
        g = self.guard(32)
        self.assertEqual([len(p) for p in g.microbatches(FakeArray(range(32)))], [32])
        self.fake.policy = (64, 1, 1, 1, "/p.ini")                   # larger: nothing to do
        g2 = self.guard(32)
        self.assertEqual(len(g2.microbatches(FakeArray(range(32)))), 1)

    def test_backward_applies_the_running_pieces_weight(self):
        g = self.guard(32)
        g.microbatches(FakeArray(range(32)))             # batch 1: one piece
        self.fake.advise(batch=8, accum=4)
        seen = []

        class Loss(object):
            def __init__(self, v):
                self.v = v

            def __mul__(self, w):
                return Loss(self.v * w)

            def backward(self, **kw):
                seen.append((self.v, kw))

        with self.assertLogs("gpuguard", logging.WARNING):
            g.run(FakeArray(range(32)), lambda mb: g.backward(Loss(2.0), retain_graph=True),
                  lambda: None)
        self.assertEqual(seen, [(0.5, {"retain_graph": True})] * 4)  # 2.0 x 8/32
        mb = g.microbatches(FakeArray(range(8)))[0]     # 4 pieces of 2
        g.backward(Loss(3.0), mb)                        # the manual loop passes its piece
        self.assertEqual(seen[-1], (0.75, {}))
        with self.assertRaises(gpuguard.UsageError):     # outside a loop: unknown piece
            g.backward(Loss(5.0))
        self.assertEqual(len(seen), 5)

    def test_backward_in_a_microbatches_loop_uses_the_loops_piece(self):
        g = self.guard(10)
        g.microbatches(FakeArray(range(10)))             # batch 1: one piece
        self.fake.advise(batch=4, accum=3)
        seen = []

        class Loss(object):
            def __init__(self, v):
                self.v = v

            def __mul__(self, w):
                return Loss(self.v * w)

            def backward(self):
                seen.append(self.v)

        with self.assertLogs("gpuguard", logging.WARNING):
            pieces = g.microbatches(FakeArray(range(10)))  # 3 uneven pieces: 4, 3, 3
        for mb in pieces:
            g.backward(Loss(1.0))
        self.assertEqual(seen, [0.4, 0.3, 0.3])
        for mb in pieces:                                # a second loop over the same pieces
            g.backward(Loss(10.0))
        self.assertEqual(seen[3:], [4.0, 3.0, 3.0])
        for mb in pieces:                                # a loop left early forgets its piece
            break
        with self.assertRaises(gpuguard.UsageError):
            g.backward(Loss(1.0))
        with self.assertRaises(gpuguard.UsageError):     # a copy: its loop is the list's
            for mb in list(pieces):
                g.backward(Loss(1.0))
        (one,) = gpuguard.Guard(4).microbatches(FakeArray(range(4)))  # unpacked: no loop runs
        with self.assertRaises(gpuguard.UsageError):
            g.backward(Loss(1.0))
        errors = []
        for mb in pieces:                                # another thread has no piece
            t = threading.Thread(target=lambda: errors.append(
                self.raises(gpuguard.UsageError, g.backward, Loss(1.0))))
            t.start()
            t.join()
        self.assertEqual(errors, [True] * 3)
        self.assertEqual(len(seen), 6)
        self.assertEqual([len(p) for p in pieces], [4, 3, 3])   # still a sequence
        self.assertEqual(pieces[2].weight, 0.3)

    @staticmethod
    def raises(cls, call, *args):
        try:
            call(*args)
        except cls:
            return True
        return False

    def test_the_last_batch_is_a_step_too(self):
        shim = StepShim()
        _native.set_library(shim)
        g = self.guard(32)
        for _ in range(3):
            g.run(FakeArray(range(32)), lambda mb: None, lambda: None)
        self.assertEqual(shim.steps, [1, 2])             # each at the next boundary
        g.finish()                                       # close() and exit call it
        self.assertEqual(shim.steps, [1, 2, 3])
        g.close()
        g.finish()
        self.assertEqual(shim.steps, [1, 2, 3])          # once


class InertLoopTest(Base):
    def test_no_shim_changes_nothing(self):
        _native.set_library(None)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            g = gpuguard.Guard(32)
            batch = FakeArray(range(32))
            (mb,) = g.microbatches(batch)
            calls = []
            g.run(batch, calls.append, lambda: calls.append("zero"))
        self.assertEqual(len(caught), 1)
        self.assertIs(mb.data, batch)
        self.assertEqual(mb.weight, 1.0)
        self.assertEqual(len(calls), 1)
        self.assertIs(calls[0].data, batch)
        self.assertEqual((g.split, g.history, g.ooms), (1, [], 0))

    def test_no_shim_still_halves_on_a_real_oom(self):
        # As Accelerate's find_executable_batch_size: the real OOM halves the
        # piece and the batch runs again; said once, that there is no shim.
        _native.set_library(None)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            g = gpuguard.Guard(32)
        sizes, zeroed = [], []

        def step(mb):
            sizes.append(len(mb))
            if len(mb) > 8:
                raise OOM("CUDA out of memory. Tried to allocate 2.00 GiB")
        with self.assertLogs("gpuguard", "WARNING") as logs:
            g.run(FakeArray(range(32)), step, lambda: zeroed.append(1))
            g.run(FakeArray(range(32)), step, lambda: zeroed.append(1))
        self.assertEqual(sizes, [32, 16, 8, 8, 8, 8, 8, 8, 8, 8])
        self.assertEqual((g.split, g.ooms, len(zeroed)), (4, 2, 2))
        bare = [m for m in logs.output if "without the shim" in m]
        self.assertEqual(len(bare), 1, logs.output)
        # at the smallest piece the error goes through
        with self.assertLogs("gpuguard", "WARNING"):
            with self.assertRaises(OOM):
                g.run(FakeArray(range(32)), lambda mb: (_ for _ in ()).throw(OOM("CUDA out of memory")),
                      lambda: None)
        self.assertEqual(g.split, 32)


class FakeTensor(object):
    def __init__(self, values):
        self.values = list(values)

    def tolist(self):
        return list(self.values)


def fake_torch(other=None, cuda_initialized=True, backend="gloo"):
    """A torch stand-in: CUDA's cache, and with `other` a process group of
    two ranks where the other rank contributes other(values) to each
    all_reduce (element-wise MAX)."""
    torch = types.ModuleType("torch")
    torch.int64 = "int64"
    torch.calls = []
    torch.reduced = []
    torch.cuda = types.SimpleNamespace(
        is_initialized=lambda: cuda_initialized,
        empty_cache=lambda: torch.calls.append("empty_cache"),
        current_device=lambda: 0)

    def tensor(values, dtype=None, device=None):
        torch.calls.append(("tensor", device))
        return FakeTensor(values)
    torch.tensor = tensor

    def all_reduce(t, op=None):
        assert op == "max"
        mine = list(t.values)
        theirs = other(mine)
        torch.reduced.append((mine, theirs))
        t.values = [max(a, b) for a, b in zip(mine, theirs)]
    torch.distributed = types.SimpleNamespace(
        is_available=lambda: True,
        is_initialized=lambda: other is not None,
        get_backend=lambda: backend, get_rank=lambda: 0,
        all_reduce=all_reduce, ReduceOp=types.SimpleNamespace(MAX="max"))
    return torch


class DistTest(Base):
    """One rank's guard against a simulated other rank."""

    def patch(self, other, **kw):
        torch = fake_torch(other, **kw)
        p = mock.patch.dict(sys.modules, {"torch": torch})
        p.start()
        self.addCleanup(p.stop)
        return torch

    def test_the_split_is_agreed_every_batch_with_one_all_reduce(self):
        theirs = [1]
        torch = self.patch(lambda mine: [1, theirs[0]])
        g = self.guard(32)
        self.assertEqual(len(g.microbatches(FakeArray(range(32)))), 1)
        theirs[0] = 4                                    # the other rank was advised
        with self.assertLogs("gpuguard", logging.WARNING) as logs:
            self.assertEqual(len(g.microbatches(FakeArray(range(32)))), 4)
        self.assertIn("(another rank was advised)", logs.output[0])
        self.assertEqual(self.fake.set_calls[-1], (8, 4))
        self.fake.advise(batch=16, accum=2)              # stale: we would take 2 of 16
        self.assertEqual(len(g.microbatches(FakeArray(range(32)))), 4)
        self.assertEqual(self.fake.acks, [1])
        self.assertEqual([m for m, _ in torch.reduced], [[1, 1], [1, 1], [1, 4]])
        self.assertIn(("tensor", "cpu"), torch.calls)

    def test_nccl_reduces_on_the_gpu(self):
        torch = self.patch(lambda mine: [1, 1], backend="nccl")
        self.guard(8).microbatches([1] * 8)
        self.assertIn(("tensor", "cuda:0"), torch.calls)

    def test_a_rank_without_the_shim_takes_part_and_follows(self):
        torch = self.patch(lambda mine: [1, 2])
        _native.set_library(None)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            g = gpuguard.Guard(8)
        with self.assertLogs("gpuguard", logging.WARNING):
            self.assertEqual(len(g.microbatches(FakeArray(range(8)))), 2)
        self.assertEqual(torch.reduced[0][0], [0, 1])   # inert, wants one piece

    def test_no_active_rank_stops_asking_after_the_first_batch(self):
        torch = self.patch(lambda mine: [0, 1])
        _native.set_library(None)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            g = gpuguard.Guard(8)
        for _ in range(5):
            self.assertEqual(len(g.microbatches(FakeArray(range(8)))), 1)
        self.assertFalse(g.shrink_requested)
        self.assertEqual(len(torch.reduced), 1)

    def test_run_redoes_the_batch_when_another_rank_ran_out(self):
        outcomes = [[1, 2, 0, 0], [1, 0, 0, 0]]          # out of memory, then fine

        def other(mine):
            if len(mine) == 2:                            # the split, at the boundary
                return [1, 1]
            return outcomes.pop(0)                        # an attempt's outcome
        torch = self.patch(other)
        g = self.guard(8)
        calls, zeroed = [], []
        with self.assertLogs("gpuguard", logging.WARNING) as logs:
            g.run(FakeArray(range(8)), lambda mb: calls.append(len(mb)),
                  lambda: zeroed.append(len(calls)))
        self.assertEqual(calls, [8, 4, 4])               # the whole batch again, in 2 pieces
        self.assertEqual(zeroed, [1])
        self.assertIn("(another rank ran out of memory)", logs.output[0])
        self.assertEqual((g.split, g.ooms), (2, 0))
        self.assertEqual([m for m, _ in torch.reduced], [[1, 1], [1, 0, 0, 0], [1, 0, 0, 0]])

    def test_run_raises_everywhere_when_one_rank_gives_up(self):
        def other(mine):
            return [1, 1] if len(mine) == 2 else [1, 0, 1, 2]   # rank 1 gave up
        self.patch(other)
        self.torch_oom = None
        g = self.guard(8)
        with self.assertRaises(RuntimeError) as cm:
            g.run(FakeArray(range(8)), lambda mb: None, lambda: None)
        self.assertIn("rank 1 ran out of memory", str(cm.exception))

    def test_shrink_requested_is_the_collective_accept_is_not(self):
        torch = self.patch(lambda mine: [1, 0, -8])    # the other rank wants 8, not advised
        g = self.guard(32, grad_accum=1)
        self.fake.advise()                              # we want 16
        self.assertTrue(g.shrink_requested)
        self.assertEqual(len(torch.reduced), 1)
        self.assertEqual(g.accept(), (8, 4))            # the agreed batch, no all-reduce
        self.assertEqual(len(torch.reduced), 1)
        self.assertEqual(self.fake.acks, [1])
        self.assertEqual(self.fake.set_calls[-1], (8, 4))
        self.assertEqual(g.accept(), (8, 4))            # accept() alone: local, no collective
        self.assertEqual(len(torch.reduced), 1)

    def test_a_rank_without_advice_follows_and_one_advised_late_waits(self):
        torch = self.patch(lambda mine: [1, 1, -8])     # the other rank was advised to 8
        g = self.guard(16, grad_accum=2)
        self.assertTrue(g.sync_shrink_requested())
        self.fake.advise()                              # arrives after the agreement
        self.assertEqual(g.accept(), (8, 4))
        self.assertEqual(self.fake.acks, [])            # left for the next agreement
        self.assertIn("empty_cache", torch.calls)


class NoProcessGroupTest(Base):
    def test_local_without_process_group(self):
        torch = fake_torch(other=None)
        with mock.patch.dict(sys.modules, {"torch": torch}):
            g = self.guard(16)
            self.assertFalse(g.shrink_requested)
            self.fake.advise()
            self.assertTrue(g.sync_shrink_requested())
            self.assertEqual(g.accept(), (8, 2))
            g.microbatches([1] * 16)
        self.assertEqual(torch.reduced, [])

    def test_empty_cache_when_cuda_initialized(self):
        torch = fake_torch()
        with mock.patch.dict(sys.modules, {"torch": torch}):
            g = self.guard(32)
            self.fake.advise()
            self.assertEqual(g.accept(), (16, 2))
        self.assertEqual(torch.calls, ["empty_cache"])

    def test_no_empty_cache_before_cuda_init(self):
        torch = fake_torch(cuda_initialized=False)
        with mock.patch.dict(sys.modules, {"torch": torch}):
            g = self.guard(32)
            self.fake.advise()
            self.assertEqual(g.accept(), (16, 2))
        self.assertEqual(torch.calls, [])


class ImportTest(unittest.TestCase):
    def test_import_pulls_in_no_framework(self):
        code = ("import sys, gpuguard, gpuguard.adapters, gpuguard.adapters.hf, "
                "gpuguard.adapters.lightning\n"
                "from gpuguard.adapters import hf, lightning\n"
                "assert hf is sys.modules['gpuguard.adapters.hf']\n"
                "print(sorted(m for m in ('torch', 'transformers', 'lightning', "
                "'pytorch_lightning', 'numpy') if m in sys.modules))\n")
        env = dict(os.environ, PYTHONPATH=PYDIR)
        out = subprocess.run([sys.executable, "-c", code], env=env, check=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             universal_newlines=True)
        self.assertEqual(out.stdout.strip(), "[]")
        self.assertEqual(out.stderr, "")


# --- adapters -------------------------------------------------------------
#
# Their arithmetic runs against real torch and faithful stand-ins of the
# libraries in tests/e2e/test_helper_torch.py; here, without torch, what
# they call and when.

class Loss(float):
    """A loss without torch: multiplies and adds like a tensor."""

    def __mul__(self, other):
        return Loss(float(self) * other)

    def __add__(self, other):
        return Loss(float(self) + float(other))

    def __truediv__(self, other):
        return Loss(float(self) / other)

    def detach(self):
        return self


class FakeHFTrainer(object):
    """transformers.Trainer's training_step / compute_loss contract."""

    def __init__(self, model=None, args=None, **kwargs):
        self.args = args
        self.model_accepts_loss_kwargs = kwargs.get("accepts", False)
        self.compute_loss_func = None
        self.syncs = []
        self.backward = []
        self.accelerator = types.SimpleNamespace(no_sync=self.no_sync)

    @contextlib.contextmanager
    def no_sync(self, model):
        self.syncs.append("no_sync")
        yield

    def training_step(self, model, inputs, num_items_in_batch=None):
        loss = self.compute_loss(model, inputs, num_items_in_batch=num_items_in_batch)
        if not self.model_accepts_loss_kwargs or num_items_in_batch is None:
            loss = loss / self.args.gradient_accumulation_steps
        self.backward.append(float(loss))
        return loss.detach()

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        loss = Loss(sum(inputs) / float(len(inputs)))  # a mean over the batch
        if num_items_in_batch is not None and self.model_accepts_loss_kwargs:
            loss = Loss(sum(inputs) / float(num_items_in_batch))
        return (loss, "outputs") if return_outputs else loss


def fake_transformers():
    m = types.ModuleType("transformers")
    m.Trainer = FakeHFTrainer
    return m


class HFAdapterTest(Base):
    def setUp(self):
        super(HFAdapterTest, self).setUp()
        from gpuguard.adapters import hf
        self.hf = hf
        hf._reset()
        self.addCleanup(hf._reset)
        self.args = types.SimpleNamespace(per_device_train_batch_size=4,
                                          gradient_accumulation_steps=2)

    def test_pieces_are_weighted_and_synchronized_once(self):
        trainer = self.hf.guard_trainer(FakeHFTrainer(args=self.args))
        batch = [1.0, 2.0, 3.0, 6.0]
        self.assertEqual(trainer.training_step("model", batch), 1.5)   # mean 3 / accum 2
        self.assertEqual(trainer.gpuguard.guard.batch_size, 4)         # registered from the batch
        self.assertEqual(self.fake.set_calls, [(4, 2)])
        self.fake.advise()
        with self.assertLogs("gpuguard", logging.WARNING):
            loss = trainer.training_step("model", batch)
        self.assertEqual(loss, 1.5)                                     # the batch's loss
        self.assertEqual(trainer.backward[-2:], [0.375, 1.125])         # 1.5 x 0.5 / 2, 4.5 x 0.5 / 2
        self.assertEqual(trainer.syncs, ["no_sync"])                    # all but the last piece
        self.assertNotIn("compute_loss", trainer.__dict__)
        self.assertEqual((self.args.per_device_train_batch_size,
                          self.args.gradient_accumulation_steps), (4, 2))

    def test_loss_normalized_by_num_items_is_not_weighted(self):
        trainer = self.hf.guard_trainer(FakeHFTrainer(args=self.args, accepts=True))
        batch = [1.0, 2.0, 3.0, 6.0]
        trainer.training_step("model", batch, 8)                        # the first batch: whole
        self.fake.advise(batch=2, accum=4)
        with self.assertLogs("gpuguard", logging.WARNING):
            loss = trainer.training_step("model", batch, 8)
        self.assertEqual(trainer.backward[-2:], [3 / 8.0, 9 / 8.0])
        self.assertEqual(loss, 12 / 8.0)

    def test_a_subclass_compute_loss_is_the_one_weighted(self):
        class Own(FakeHFTrainer):
            def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
                return Loss(max(inputs))
        trainer = self.hf.guard_trainer(Own(args=self.args))
        trainer.training_step("model", [1.0, 2.0, 3.0, 6.0])
        self.fake.advise()
        with self.assertLogs("gpuguard", logging.WARNING):
            trainer.training_step("model", [1.0, 2.0, 3.0, 6.0])
        self.assertEqual(trainer.backward[-2:], [0.5, 1.5])            # max x 0.5 / 2

    def test_deepspeed_is_left_alone_with_one_warning(self):
        trainer = self.hf.guard_trainer(FakeHFTrainer(args=self.args))
        trainer.is_deepspeed_enabled = True
        self.fake.advise()
        with self.assertLogs("gpuguard", logging.WARNING) as logs:
            trainer.training_step("model", [1.0, 2.0])
            trainer.training_step("model", [1.0, 2.0])
        self.assertEqual(len(logs.output), 1)
        self.assertIn("DeepSpeed", logs.output[0])
        self.assertEqual(len(trainer.backward), 2)
        self.assertIsNone(trainer.gpuguard.guard)

    def test_trainer_class_built_on_first_use(self):
        with mock.patch.dict(sys.modules, {"transformers": fake_transformers()}):
            self.assertTrue(self.hf.available())
            trainer = self.hf.GpuguardTrainer(args=self.args, gpuguard_min_batch_size=2)
            self.assertIsInstance(trainer, FakeHFTrainer)
            self.assertEqual(trainer.gpuguard.min_batch_size, 2)
            self.assertIs(self.hf.guard_trainer(trainer), trainer)     # once only

    def test_without_transformers_and_the_old_callback(self):
        with mock.patch.dict(sys.modules, {"transformers": None}):
            self.assertFalse(self.hf.available())
            with self.assertRaises(ImportError):
                self.hf.GpuguardTrainer
        with self.assertRaises(AttributeError) as cm:
            self.hf.GpuguardCallback
        self.assertIn("GpuguardTrainer or guard_trainer", str(cm.exception))


class LightningCallback(object):
    def __init__(self):
        self.base_init = True


def fake_lightning(name="lightning.pytorch"):
    if name == "lightning.pytorch":
        top = types.ModuleType("lightning")
        sub = types.ModuleType("lightning.pytorch")
        sub.Callback = LightningCallback
        top.pytorch = sub
        return {"lightning": top, "lightning.pytorch": sub}
    m = types.ModuleType("pytorch_lightning")
    m.Callback = LightningCallback
    return {"pytorch_lightning": m, "lightning": None, "lightning.pytorch": None}


class FakeStrategy(object):
    handles_gradient_accumulation = False

    def __init__(self):
        self.calls = []

    def training_step(self, batch, batch_idx):
        self.calls.append(("step", list(batch), self.blocked))
        return Loss(sum(batch))

    def backward(self, loss, optimizer, *args):
        self.calls.append(("backward", float(loss), self.blocked))

    blocked = False

    @contextlib.contextmanager
    def block_backward_sync(self):
        self.blocked = True
        yield
        self.blocked = False


class FakeModule(object):
    automatic_optimization = True

    def __init__(self):
        self.zeroed = []

    def optimizer_zero_grad(self, epoch, batch_idx, optimizer):
        self.zeroed.append(batch_idx)


class LightningAdapterTest(Base):
    def setUp(self):
        super(LightningAdapterTest, self).setUp()
        from gpuguard.adapters import lightning
        self.pl = lightning
        lightning._reset()
        self.addCleanup(lightning._reset)

    def fit(self, modname="lightning.pytorch", module=None, strategy=None):
        with mock.patch.dict(sys.modules, fake_lightning(modname)):
            self.assertTrue(self.pl.available())
            from gpuguard.adapters.lightning import GpuguardCallback
            self.assertTrue(issubclass(GpuguardCallback, LightningCallback))
            cb = GpuguardCallback()
        self.assertTrue(cb.base_init)
        strategy = strategy or FakeStrategy()
        module = module or FakeModule()
        trainer = types.SimpleNamespace(strategy=strategy, accumulate_grad_batches=2,
                                        optimizers=["opt"], current_epoch=0)
        cb.on_train_start(trainer, module)
        return cb, trainer, module, strategy

    def test_wraps_the_strategy_step_for_the_fit(self):
        cb, trainer, module, strategy = self.fit()
        step = trainer.strategy.training_step
        self.assertEqual(step([1, 2, 3, 4], 0), 10)                    # whole, registered
        self.assertEqual(self.fake.set_calls, [(4, 2)])
        self.fake.advise()
        with self.assertLogs("gpuguard", logging.WARNING):
            loss = step([1, 2, 3, 4], 2)                                # first of a cycle
        self.assertEqual(loss, 5.0)                                     # 3 x .5 + 7 x .5
        self.assertEqual(strategy.calls[1:], [("step", [1, 2], True), ("backward", 0.75, True),
                                              ("step", [3, 4], False)])
        self.assertEqual(module.zeroed, [2])                            # zeroed before the pieces
        module.optimizer_zero_grad(0, 2, "opt")                         # Lightning's own call passes
        self.assertEqual(module.zeroed, [2])
        module.optimizer_zero_grad(0, 4, "opt")
        self.assertEqual(module.zeroed, [2, 4])
        step([1, 2, 3, 4], 3)                                           # not first: no zeroing
        self.assertEqual(module.zeroed, [2, 4])
        self.assertEqual(trainer.accumulate_grad_batches, 2)
        cb.on_train_end(trainer, module)
        self.assertNotIn("training_step", strategy.__dict__)
        self.assertNotIn("optimizer_zero_grad", module.__dict__)
        self.assertIsNone(cb.guard)
        self.assertEqual(len(cb.history), 1)
        self.assertEqual(signal.getsignal(SIG), self.saved_handler)

    def test_pytorch_lightning_fallback(self):
        cb, trainer, module, strategy = self.fit("pytorch_lightning")
        cb.teardown(trainer, module, "fit")
        self.assertNotIn("training_step", strategy.__dict__)

    def test_manual_optimization_and_deepspeed_are_left_alone(self):
        module = FakeModule()
        module.automatic_optimization = False
        with self.assertLogs("gpuguard", logging.WARNING) as logs:
            cb, trainer, module, strategy = self.fit(module=module)
        self.assertIn("manual optimization", logs.output[0])
        self.assertNotIn("training_step", strategy.__dict__)
        strategy = FakeStrategy()
        strategy.handles_gradient_accumulation = True
        with self.assertLogs("gpuguard", logging.WARNING) as logs:
            self.fit(strategy=strategy)
        self.assertIn("FakeStrategy accumulates gradients itself", logs.output[0])
        self.assertNotIn("training_step", strategy.__dict__)

    def test_without_lightning(self):
        with mock.patch.dict(sys.modules, {"lightning": None, "lightning.pytorch": None,
                                           "pytorch_lightning": None}):
            self.assertFalse(self.pl.available())
            with self.assertRaises(ImportError):
                self.pl.GpuguardCallback


# --- gpuguard-run ---------------------------------------------------------

RUN = os.path.join(TOOLS, "bin", "gpuguard-run")
# The gpuguard-check that gpuguard-run checks its options' values with: the
# build's (GG_BUILD: build/san under SANITIZE=1 has no build/gpuguard-check).
CHECK = os.path.join(os.environ.get("GG_BUILD") or os.path.join(os.path.dirname(TOOLS), "build"),
                     "gpuguard-check")


class RunScriptTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="gg-run-")
        self.addCleanup(shutil.rmtree, self.tmp)
        self.lib = os.path.join(self.tmp, "libgpuguard.so")
        open(self.lib, "w").close()

    def run_script(self, args, script=RUN, **env):
        e = dict(os.environ)
        for k in list(e):
            if k.startswith("GPUGUARD_") or k in ("LD_PRELOAD",):
                del e[k]
        e["GPUGUARD_CHECK"] = CHECK
        e.update(env)
        return subprocess.run(["sh", script] + args, env=e, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, universal_newlines=True)

    def dry_env(self, out):
        lines = out.stdout.splitlines()
        return dict(line.split("=", 1) for line in lines if "=" in line and not line.startswith("exec"))

    def test_usage_errors_exit_2(self):
        for args in ([], ["--"], ["--mode", "bogus", "--", "true"], ["--frobnicate", "--", "true"],
                     ["--policy"], ["--policy", os.path.join(self.tmp, "missing.ini"), "--", "true"]):
            out = self.run_script(args, GPUGUARD_LIB=self.lib)
            self.assertEqual(out.returncode, 2, args)
            self.assertTrue(out.stderr.startswith("gpuguard-run: "), out.stderr)
            self.assertEqual(out.stdout, "")

    def test_option_values_are_read_by_the_shims_parser(self):
        # before the program starts, with the message the shim would give at
        # its first CUDA call (gpuguard-check --values), naming the option
        if not os.path.exists(CHECK):
            self.skipTest("no %s: make builds it" % CHECK)
        ran = os.path.join(self.tmp, "ran")
        cmd = ["--", "sh", "-c", "touch " + ran]
        for args, said in (
                (["--headroom", "10parsecs"], "--headroom '10parsecs': malformed size: unknown "
                                              "unit (use B, KiB, MiB, GiB, TiB, kB, KB, MB, GB, TB "
                                              "or %)"),
                (["--headroom=150%"], "--headroom '150%': percentage over 100"),
                (["--mode", "enforcing"], "--mode 'enforcing': bad value (expected auto, enforce, "
                                          "observe or off)"),
                (["--signal", "SIGKILL"], "--signal 'SIGKILL': not a signal for advice"),
                (["--signal="], "--signal '': bad value"),
                (["--mode", "enforce", "--policy", ""], "--policy '': empty")):
            out = self.run_script(args + cmd, GPUGUARD_LIB=self.lib)
            self.assertEqual(out.returncode, 2, (args, out.stderr))
            self.assertTrue(out.stderr.startswith("gpuguard-run: " + said), (args, out.stderr))
            self.assertEqual(len(out.stderr.splitlines()), 2, out.stderr)   # and "Try --help"
            self.assertFalse(os.path.exists(ran), args)
        out = self.run_script(["-n", "--headroom", "1.5 GiB", "--mode", "OBSERVE", "--signal",
                               "usr1", "--"] + cmd[1:], GPUGUARD_LIB=self.lib)
        self.assertEqual(out.returncode, 0, out.stderr)
        env = self.dry_env(out)
        self.assertEqual((env["GPUGUARD_HEADROOM"], env["GPUGUARD_MODE"], env["GPUGUARD_SIGNAL"]),
                         ("1.5 GiB", "OBSERVE", "usr1"))
        # with nothing to check them with, it says so and runs nothing
        script = os.path.join(self.tmp, "gpuguard-run")
        shutil.copy(RUN, script)
        out = self.run_script(["--mode", "enforce"] + cmd, script=script, GPUGUARD_LIB=self.lib,
                              GPUGUARD_CHECK=os.path.join(self.tmp, "none"))
        self.assertEqual(out.returncode, 1)
        self.assertIn("gpuguard-run: cannot check --mode: gpuguard-check not found beside %s; "
                      "run make, or set GPUGUARD_CHECK" % os.path.realpath(self.tmp), out.stderr)
        self.assertFalse(os.path.exists(ran))

    def test_help(self):
        out = self.run_script(["--help"])
        self.assertEqual(out.returncode, 0)
        self.assertIn("usage: gpuguard-run", out.stdout)
        self.assertIn("--journal-dir", out.stdout)

    def test_environment(self):
        pol = os.path.join(self.tmp, "policy")
        os.mkdir(pol)
        jdir = os.path.join(self.tmp, "journals", "run1")
        out = self.run_script(["-n", "--policy", pol, "--mode=observe", "--journal-dir", jdir,
                               "--quiet", "--", "python3", "train.py", "--lr", "1"],
                              GPUGUARD_LIB=self.lib, LD_PRELOAD="/other.so", PYTHONPATH="/x")
        self.assertEqual(out.returncode, 0, out.stderr)
        env = self.dry_env(out)
        self.assertEqual(env["LD_PRELOAD"], os.path.realpath(self.lib) + " /other.so")
        # PYTHONPATH is the library's to extend, in Python interpreters only
        # (docs/commands.md): the command's own is left as it is
        self.assertNotIn("PYTHONPATH", env)
        self.assertEqual(env["GPUGUARD_TORCH"], "1")
        self.assertEqual(env["GPUGUARD_POLICY"], os.path.realpath(pol))
        self.assertEqual(env["GPUGUARD_MODE"], "observe")
        self.assertEqual(env["GPUGUARD_JOURNAL_DIR"], os.path.realpath(jdir))
        self.assertEqual(env["GPUGUARD_QUIET"], "1")
        self.assertTrue(os.path.isdir(jdir))
        self.assertIn("exec python3 train.py --lr 1", out.stdout)

    def test_an_unwritable_journal_directory_is_said_before_the_run(self):
        # said by gpuguard-run before CMD starts (the shim says nothing until
        # CMD's first CUDA call); CMD runs all the same, its status kept
        afile = os.path.join(self.tmp, "afile")
        open(afile, "w").close()
        for env, where, why in (({"GPUGUARD_JOURNAL_DIR": afile}, afile, "not a directory"),
                                ({"GPUGUARD_JOURNAL_DIR": os.path.join(self.tmp, "gone")},
                                 os.path.join(self.tmp, "gone"), "no such directory")):
            out = self.run_script(["--", "sh", "-c", "echo ran; exit 3"], GPUGUARD_LIB=self.lib,
                                  **env)
            self.assertEqual((out.returncode, out.stdout), (3, "ran\n"))
            # (the stand-in library is empty: ld.so says so after)
            self.assertTrue(out.stderr.startswith(
                "gpuguard-run: warning: cannot write the journal in %s (%s): the run goes on "
                "without it; --journal-dir DIR chooses another\n" % (where, why)), out.stderr)
        out = self.run_script(["--metrics-dir", afile, "--", "true"], GPUGUARD_LIB=self.lib)
        self.assertEqual(out.returncode, 2)                # an option's argument: bad usage
        ok = self.run_script(["--journal-dir", self.tmp, "--metrics-dir", self.tmp, "--", "true"],
                             GPUGUARD_LIB=self.lib)
        self.assertEqual(ok.returncode, 0)
        self.assertNotIn("gpuguard-run", ok.stderr)
        if os.geteuid() != 0:                            # root writes anywhere
            ro = os.path.join(self.tmp, "ro")
            os.mkdir(ro, 0o555)
            out = self.run_script(["--journal-dir", ro, "--", "true"], GPUGUARD_LIB=self.lib)
            self.assertIn("(not writable by this user)", out.stderr)

    def test_exec_keeps_the_exit_status(self):
        cmd = ('printf "%s|%s|%s" "$GPUGUARD_MODE" "${GPUGUARD_QUIET-unset}" "$LD_PRELOAD"; '
               'exit 7')
        out = self.run_script(["--mode", "off", "--", "sh", "-c", cmd], GPUGUARD_LIB=self.lib)
        self.assertEqual(out.returncode, 7, out.stderr)
        self.assertEqual(out.stdout, "off|unset|" + os.path.realpath(self.lib))

    def test_installed_layout_and_missing_library(self):
        prefix = os.path.join(self.tmp, "prefix")
        os.makedirs(os.path.join(prefix, "bin"))
        script = os.path.join(prefix, "bin", "gpuguard-run")
        shutil.copy(RUN, script)
        out = self.run_script(["-n", "--", "true"], script=script)
        self.assertEqual(out.returncode, 1)
        self.assertIn("libgpuguard.so not found", out.stderr)
        os.makedirs(os.path.join(prefix, "lib"))
        os.makedirs(os.path.join(prefix, "share", "gpuguard", "python"))
        open(os.path.join(prefix, "lib", "libgpuguard.so"), "w").close()
        out = self.run_script(["-n", "--", "true"], script=script)
        self.assertEqual(out.returncode, 0, out.stderr)
        env = self.dry_env(out)
        real = os.path.realpath(prefix)
        self.assertEqual(env["LD_PRELOAD"], real + "/lib/libgpuguard.so")
        self.assertNotIn("PYTHONPATH", env)
        self.assertNotIn("GPUGUARD_QUIET", env)
        out = self.run_script(["--", "true"], script=script,
                              GPUGUARD_LIB=os.path.join(self.tmp, "nope.so"))
        self.assertEqual(out.returncode, 1)

    def test_helper_importable_under_the_runner(self):
        """The library puts gpuguard's site directory (the helper with the
        sitecustomize) on a Python's path: `import gpuguard` works under
        gpuguard-run, and the program's own PYTHONPATH stays its own."""
        lib = os.path.join(TOOLS, "..", os.environ.get("GG_BUILD") or "build", "libgpuguard.so")
        if not os.path.exists(lib):
            self.skipTest("%s is not built (make builds it)" % lib)
        if os.environ.get("GG_SANITIZE") == "1":
            self.skipTest("the sanitized library needs its runtime preloaded first "
                          "(tests/e2e/test_instrument.py runs this one)")
        code = "import gpuguard, os, sys; sys.stdout.write(os.path.realpath(gpuguard.__file__))"
        out = self.run_script(["--", sys.executable, "-c", code], GPUGUARD_LIB=lib)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertEqual(os.path.dirname(out.stdout), os.path.join(PYDIR, "gpuguard"))

if __name__ == "__main__":
    unittest.main()
