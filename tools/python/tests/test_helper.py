"""Tests of the Python helper (gpuguard.Guard, the adapters) and of
tools/gpuguard-run, without the shim: a stand-in library made of ctypes
callbacks plays libgpuguard.so's C API."""

import ctypes
import dataclasses
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
from gpuguard import _native                       # noqa: E402

SIG = signal.SIGUSR2


class FakeShim(object):
    """libgpuguard.so's C API with the contract's semantics, as C-callable
    ctypes callbacks (so the helper's ctypes declarations are exercised)."""

    STATS = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.POINTER(_native.GpuguardStats))
    ADVICE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(_native.GpuguardAdvice))
    ACK = ctypes.CFUNCTYPE(None, ctypes.c_uint)
    SET_BATCH = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_int)
    NOTE = ctypes.CFUNCTYPE(None, ctypes.c_char_p)

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

    # what the shim does on a near miss (DESIGN.md "Advice protocol")
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
                return gpuguard._format_stack(sys._getframe())
            return pong(n - 1)

        def pong(n):
            return ping(n)
        text = ping(200)   # alternating frames: format_stack folds no repeats
        self.assertLessEqual(len(text), gpuguard.NOTE_LIMIT + 16)
        self.assertTrue(text.startswith("  ...\n  File "), text[:80])
        self.assertIn("in ping", text.splitlines()[-2])


class FakeTensor(object):
    def __init__(self, values):
        self.values = list(values)

    def item(self):
        assert len(self.values) == 1
        return self.values[0]


def fake_torch(other_rank_value=None, cuda_initialized=True):
    """A torch stand-in: cuda cache, and a process group of two ranks where
    the other rank contributes `other_rank_value` to every all_reduce."""
    torch = types.ModuleType("torch")
    torch.int64 = "int64"
    torch.calls = []
    torch.cuda = types.SimpleNamespace(
        is_initialized=lambda: cuda_initialized,
        empty_cache=lambda: torch.calls.append("empty_cache"),
        current_device=lambda: 0)

    def tensor(values, dtype=None, device=None):
        torch.calls.append(("tensor", device))
        return FakeTensor(values)
    torch.tensor = tensor
    ops = types.SimpleNamespace(MIN="min", MAX="max")

    def all_reduce(t, op=None):
        torch.calls.append(("all_reduce", op, t.values[0]))
        other = other_rank_value(op) if callable(other_rank_value) else other_rank_value
        t.values[0] = (min if op == "min" else max)(t.values[0], other)
    torch.distributed = types.SimpleNamespace(
        is_available=lambda: True,
        is_initialized=lambda: other_rank_value is not None,
        get_backend=lambda: "nccl",
        all_reduce=all_reduce, ReduceOp=ops)
    return torch


class TorchTest(Base):
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

    def test_ranks_agree_on_the_smallest_batch(self):
        torch = fake_torch(other_rank_value=lambda op: 4 if op == "min" else 1)
        with mock.patch.dict(sys.modules, {"torch": torch}):
            g = self.guard(32, grad_accum=1)
            self.fake.advise()
            self.assertEqual(g.accept(), (4, 8))
        self.assertIn(("all_reduce", "min", 16), torch.calls)
        self.assertIn(("tensor", "cuda:0"), torch.calls)
        self.assertEqual(self.fake.acks, [1])
        self.assertEqual(self.fake.set_calls[-1], (4, 8))

    def test_rank_without_advice_follows_the_others(self):
        torch = fake_torch(other_rank_value=lambda op: 8 if op == "min" else 1)
        with mock.patch.dict(sys.modules, {"torch": torch}):
            g = self.guard(16, grad_accum=2)
            self.assertFalse(g.shrink_requested)
            self.assertTrue(g.sync_shrink_requested())     # another rank was advised
            self.assertEqual(g.accept(), (8, 4))
        self.assertEqual(self.fake.acks, [])
        self.assertIn("empty_cache", torch.calls)
        self.assertEqual(self.fake.set_calls[-1], (8, 4))

    def test_sync_shrink_requested_local_only_without_process_group(self):
        torch = fake_torch(other_rank_value=None)
        with mock.patch.dict(sys.modules, {"torch": torch}):
            g = self.guard(16)
            self.assertFalse(g.sync_shrink_requested())
            self.fake.advise()
            self.assertTrue(g.sync_shrink_requested())
        self.assertNotIn("all_reduce", [c[0] for c in torch.calls if isinstance(c, tuple)])


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

class TrainerCallback(object):
    """transformers.TrainerCallback, as far as the adapter needs it."""

    def on_train_begin(self, args, state, control, **kwargs):
        pass


class LightningCallback(object):
    def __init__(self):
        self.base_init = True


def fake_transformers():
    m = types.ModuleType("transformers")
    m.TrainerCallback = TrainerCallback
    return m


def fake_lightning(name="lightning.pytorch"):
    mods = {}
    if name == "lightning.pytorch":
        top = types.ModuleType("lightning")
        sub = types.ModuleType("lightning.pytorch")
        sub.Callback = LightningCallback
        top.pytorch = sub
        mods = {"lightning": top, "lightning.pytorch": sub}
    else:
        m = types.ModuleType("pytorch_lightning")
        m.Callback = LightningCallback
        mods = {"pytorch_lightning": m, "lightning": None, "lightning.pytorch": None}
    return mods


@dataclasses.dataclass(frozen=True)
class FrozenArgs(object):
    per_device_train_batch_size: int = 32
    gradient_accumulation_steps: int = 1


class HFAdapterTest(Base):
    def setUp(self):
        super(HFAdapterTest, self).setUp()
        from gpuguard.adapters import hf
        self.hf = hf
        hf._reset()
        self.addCleanup(hf._reset)

    def test_callback(self):
        with mock.patch.dict(sys.modules, {"transformers": fake_transformers()}):
            self.assertTrue(self.hf.available())
            from gpuguard.adapters.hf import GpuguardCallback
            self.assertTrue(issubclass(GpuguardCallback, TrainerCallback))
            cb = GpuguardCallback()
            args = types.SimpleNamespace(per_device_train_batch_size=32,
                                         gradient_accumulation_steps=1)
            state = types.SimpleNamespace(global_step=7)
            control = object()
            self.assertIs(cb.on_train_begin(args, state, control), control)
            self.assertEqual(self.fake.set_calls, [(32, 1)])
            self.assertIs(cb.on_step_end(args, state, control), control)
            self.assertEqual(args.per_device_train_batch_size, 32)
            self.fake.advise()
            with self.assertLogs("gpuguard", logging.WARNING) as logs:
                cb.on_step_end(args, state, control)
            self.assertEqual((args.per_device_train_batch_size,
                              args.gradient_accumulation_steps), (16, 2))
            self.assertIn("step 7", logs.output[0])
            self.assertIn("32 -> 16", logs.output[0])
            self.assertEqual(self.fake.acks, [1])
            self.assertEqual(cb.history[0]["reason"], "near_miss")
            self.assertNotEqual(signal.getsignal(SIG), self.saved_handler)
            cb.on_train_end(args, state, control)
            self.assertIsNone(cb.guard)
            self.assertEqual(signal.getsignal(SIG), self.saved_handler)

    def test_given_guard_frozen_args_and_check_every(self):
        with mock.patch.dict(sys.modules, {"transformers": fake_transformers()}):
            from gpuguard.adapters.hf import GpuguardCallback
            g = self.guard(32)
            cb = GpuguardCallback(guard=g, check_every=2)
            args = FrozenArgs()
            state = types.SimpleNamespace(global_step=1)
            cb.on_train_begin(args, state, None)
            self.assertIs(cb.guard, g)
            self.fake.advise()
            with self.assertLogs("gpuguard", logging.WARNING):
                cb.on_step_end(args, state, None)          # step 1: not checked
                self.assertEqual(args.per_device_train_batch_size, 32)
                cb.on_step_end(args, state, None)          # step 2: checked
            self.assertEqual((args.per_device_train_batch_size,
                              args.gradient_accumulation_steps), (16, 2))
            cb.on_train_end(args, state, None)
            self.assertTrue(g.active)                       # not ours to close

    def test_without_transformers(self):
        with mock.patch.dict(sys.modules, {"transformers": None}):
            self.assertFalse(self.hf.available())
            with self.assertRaises(ImportError):
                self.hf.GpuguardCallback
            with self.assertRaises(ImportError):
                from gpuguard.adapters.hf import GpuguardCallback  # noqa: F401


class LightningAdapterTest(Base):
    def setUp(self):
        super(LightningAdapterTest, self).setUp()
        from gpuguard.adapters import lightning
        self.pl = lightning
        lightning._reset()
        self.addCleanup(lightning._reset)

    def run_callback(self, modname):
        with mock.patch.dict(sys.modules, fake_lightning(modname)):
            self.assertTrue(self.pl.available())
            from gpuguard.adapters.lightning import GpuguardCallback
            self.assertTrue(issubclass(GpuguardCallback, LightningCallback))
            cb = GpuguardCallback()
            self.assertTrue(cb.base_init)
            dm = types.SimpleNamespace(batch_size=32)
            trainer = types.SimpleNamespace(accumulate_grad_batches=2, datamodule=dm)
            module = types.SimpleNamespace(batch_size=32, hparams={})
            cb.on_train_start(trainer, module)
            self.assertEqual(self.fake.set_calls, [(32, 2)])
            cb.on_train_batch_end(trainer, module, None, None, 0)
            self.assertEqual(trainer.accumulate_grad_batches, 2)
            self.fake.advise()
            with self.assertLogs("gpuguard", logging.WARNING):
                cb.on_train_batch_end(trainer, module, None, None, 1)
            self.assertEqual(trainer.accumulate_grad_batches, 4)
            self.assertEqual(dm.batch_size, 16)
            self.assertEqual(module.batch_size, 16)
            self.assertEqual(self.fake.acks, [1])
            cb.on_train_end(trainer, module)
            self.assertIsNone(cb.guard)
            self.assertEqual(signal.getsignal(SIG), self.saved_handler)

    def test_lightning_pytorch(self):
        self.run_callback("lightning.pytorch")

    def test_pytorch_lightning_fallback(self):
        self.run_callback("pytorch_lightning")

    def test_batch_size_from_hparams_or_inert(self):
        with mock.patch.dict(sys.modules, fake_lightning()):
            from gpuguard.adapters.lightning import GpuguardCallback
            cb = GpuguardCallback()
            trainer = types.SimpleNamespace(accumulate_grad_batches=1, datamodule=None)
            module = types.SimpleNamespace(hparams={"batch_size": 12})
            cb.on_train_start(trainer, module)
            self.assertEqual(self.fake.set_calls, [(12, 1)])
            cb.on_train_end(trainer, module)
            cb2 = GpuguardCallback()
            with self.assertLogs("gpuguard", logging.WARNING):
                cb2.on_train_start(trainer, types.SimpleNamespace())
            self.assertIsNone(cb2.guard)
            cb2.on_train_batch_end(trainer, None, None, None, 0)   # inert, no error

    def test_without_lightning(self):
        with mock.patch.dict(sys.modules, {"lightning": None, "lightning.pytorch": None,
                                           "pytorch_lightning": None}):
            self.assertFalse(self.pl.available())
            with self.assertRaises(ImportError):
                self.pl.GpuguardCallback


# --- gpuguard-run ---------------------------------------------------------

RUN = os.path.join(TOOLS, "gpuguard-run")


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
        self.assertEqual(env["PYTHONPATH"], PYDIR + ":/x")
        self.assertEqual(env["GPUGUARD_POLICY"], os.path.realpath(pol))
        self.assertEqual(env["GPUGUARD_MODE"], "observe")
        self.assertEqual(env["GPUGUARD_JOURNAL_DIR"], os.path.realpath(jdir))
        self.assertEqual(env["GPUGUARD_QUIET"], "1")
        self.assertTrue(os.path.isdir(jdir))
        self.assertIn("exec python3 train.py --lr 1", out.stdout)

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
        self.assertEqual(env["PYTHONPATH"], real + "/share/gpuguard/python")
        self.assertNotIn("GPUGUARD_QUIET", env)
        out = self.run_script(["--", "true"], script=script,
                              GPUGUARD_LIB=os.path.join(self.tmp, "nope.so"))
        self.assertEqual(out.returncode, 1)

    def test_helper_importable_under_the_runner(self):
        code = "import gpuguard, sys; sys.stdout.write(gpuguard.__file__)"
        out = self.run_script(["--", sys.executable, "-c", code], GPUGUARD_LIB=self.lib)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertEqual(os.path.dirname(out.stdout), os.path.join(PYDIR, "gpuguard"))


if __name__ == "__main__":
    unittest.main()
