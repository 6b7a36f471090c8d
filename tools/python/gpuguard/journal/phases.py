"""The trainer's batch over time from `batch` events: phases, per batch the
highest fitted peak (with its source and the thinning margin) and the lower
bound of failed phases; the batch path.
"""

import collections

from .limits import FIT_POINTS, PATH_HEAD, PATH_TAIL
from .values import num

MARGIN_SOURCE = "steps (not every step journaled: + margin)"


class Phases(object):
    """The trainer's batch over time, from `batch` events: each one ends a
    phase (its `peak` is the phase's process peak) and starts the next.
    Kept per batch size: the highest peak of a phase that fitted, and for
    phases with a refusal or OOM the lower bound on what they needed."""

    def __init__(self):
        self.events = 0
        self.cur = None
        # Before the first batch event: steps and samples of a batch not
        # said yet, the first phase once an event names it (was_batch_size).
        self.before = self._phase(None, None, 0.0)
        # For --recommend's fit with the step as a variable: [phase, step,
        # peak] of step lines (every `stride`-th once FIT_POINTS were kept),
        # and [phase, step] of each advice that moved the trainer off its
        # phase's batch (the batch is the phase's, named when it is known).
        self.points = []
        self.stride = 1
        self.seen_points = 0
        self.advised_off = []
        self.fails = []          # [phase, step, device bytes it needed]
        self.by_batch = {}
        self.effective = None
        self.head = []
        self.tail = collections.deque(maxlen=PATH_TAIL)
        self.changes = 0
        self.last_step = None    # the number of the last `step` line, any phase
        self.step_lines = 0
        self.thinning = False    # steps skipped past the 100th line: the shim thins
        self.by_shape = 0        # changes of the split for a batch's shape (reason shape)

    @staticmethod
    def _phase(b, a, t0):
        return {"batch": b, "accum": a, "t0": t0, "step_peak": None, "sample_peak": None,
                "event_peak": None, "need": None, "failed": 0, "thinned": False}

    def _open(self, t, b, a, reason=None):
        if self.effective is None or b * a > self.effective:
            self.effective = b * a
        prev = (self.tail or self.head or [None])[-1]
        if prev is None or (prev["batch"], prev["accum"]) != (b, a):
            ch = {"t": t, "batch": b, "accum": a, "reason": reason}
            self.changes += 1
            if len(self.head) < PATH_HEAD:
                self.head.append(ch)
            else:
                self.tail.append(ch)

    def batch(self, t, b, a, peak, d, was=None, was_accum=None, reason=None):
        """A `batch` event: the trainer runs b x a from now on; `peak` is
        the phase that ends, whose batch the event says as `was` when the
        journal has no phase open (the first event of a trainer that set
        its batch before the shim started)."""
        self.events += 1
        if reason == "shape":
            self.by_shape += 1
        a = a if a is not None and a >= 1 else 1
        if self.cur is None and self.before is not None and was is not None and was >= 1:
            c = self.before
            c["batch"], c["accum"] = was, (was_accum if was_accum is not None and was_accum >= 1
                                           else 1)
            self._open(c["t0"], c["batch"], c["accum"])
            self.cur = c
        self.before = None
        c = self.cur
        if c is not None and (c["batch"], c["accum"]) == (b, a):
            # The same batch again (the helper acks an advice, then sets what
            # it acked): the phase goes on; what the event measured is its.
            if peak and (c["event_peak"] is None or peak > c["event_peak"]):
                c["event_peak"] = peak
            return
        if c is not None:
            self._close(peak, d, final=False)
        if b is None or b < 1:
            self.cur = None
            return
        self._open(t, b, a, reason)
        self.cur = self._phase(b, a, t)

    def sample(self, cur):
        c = self.cur or self.before
        if c is not None and (c["sample_peak"] is None or cur > c["sample_peak"]):
            c["sample_peak"] = cur

    def step(self, step, peak):
        """A `step` line. Past its first 100 the shim writes one only every
        100th step or when a value moved by 5% of total: a phase whose steps
        skip numbers then may have peaked up to that much higher than its
        lines say (and, once the shim thins, so may any phase open then:
        its last steps may be the ones not written)."""
        c = self.cur
        last, self.last_step = self.last_step, step
        self.step_lines += 1
        gap = step is not None and last is not None and step > last + 1 and self.step_lines > 100
        if gap:
            self.thinning = True
        c = c or self.before
        if c is None or peak is None:
            return
        if step is not None and step >= 0:
            self.seen_points += 1
            if self.seen_points % self.stride == 0:
                self.points.append([c, step, peak])
                if len(self.points) >= FIT_POINTS:
                    self.points = self.points[1::2]
                    self.stride *= 2
        if c["step_peak"] is None or peak > c["step_peak"]:
            c["step_peak"] = peak
        if gap:
            c["thinned"] = True

    def advised(self, step, batch):
        """An advice at `step` (the last step reported) to run `batch`: the
        trainer was advised off its phase's batch there."""
        c = self.cur or self.before
        if c is not None and batch is not None and len(self.advised_off) < FIT_POINTS:
            self.advised_off.append([c, step, batch])

    def fit_points(self):
        """(batch, step, peak) of the step lines of phases whose batch is
        known and that fitted (a refusal or OOM cut its steps' peaks short:
        what they needed is in fail_points)."""
        return [(c["batch"], st, p) for c, st, p in self.points
                if c["batch"] is not None and not c["failed"]]

    def fail_points(self):
        """(batch, step, device bytes needed) of refusals and OOMs."""
        return [(c["batch"], st, n) for c, st, n in self.fails if c["batch"] is not None]

    def advised_off_batches(self):
        """(batch, step): batches the run was advised off, at the step it was."""
        return [(c["batch"], st) for c, st, b in self.advised_off
                if c["batch"] is not None and b < c["batch"]]

    def failed(self, used, nbytes):
        """A refusal or OOM in the current phase: the device would have
        needed at least used + bytes."""
        c = self.cur or self.before
        if c is None:
            return
        c["failed"] += 1
        if used is not None and nbytes is not None:
            need = used + nbytes
            if c["need"] is None or need > c["need"]:
                c["need"] = need
            if self.last_step is not None and len(self.fails) < FIT_POINTS:
                self.fails.append([c, self.last_step, need])

    def finish(self, d):
        if self.cur is not None:
            self._close(None, d, final=True)
            self.cur = None
        if self.thinning:
            for e in self.by_batch.values():
                if e["source"] == "steps" and e["bound"] is not None and e["bound"] > e["peak"]:
                    e["peak"], e["source"] = e["bound"], MARGIN_SOURCE

    def _close(self, peak, d, final):
        """End the current phase. `peak`: what the event that ends it says
        (None at the end of the journal: the last phase has no such event)."""
        c = self.cur
        bound = None
        seen = [v for v in (c["event_peak"], c["step_peak"], c["sample_peak"]) if v is not None]
        if peak:
            best, source = max([peak] + seen), "batch event"
        elif c["step_peak"] is not None:
            best, source = max(seen), "steps"
            if self.step_lines >= 100 and d.total:
                # Steps not journaled stayed within 5% of total of a journaled
                # one, and within 1% of the highest sample: the tighter bound,
                # taken now when this phase skipped steps, at the end when
                # the shim turns out to thin.
                bound = c["step_peak"] + d.total * 5 // 100
                if c["sample_peak"] is not None:
                    bound = min(bound, c["sample_peak"] + d.total // 100)
                bound = max(bound, best)
                if c["thinned"]:
                    best, source = bound, MARGIN_SOURCE
        elif c["sample_peak"] is not None:
            # Samples are written when use moves by 1% of total: the highest
            # one is within 1% of the peak. The summary's peak is exact when
            # the run's highest sample fell in this (last) phase.
            best, source = c["sample_peak"], "samples"
            speak = num((d.summary or {}).get("peak"))
            if final and speak is not None and c["sample_peak"] >= d.peak_cur:
                best, source = speak, "summary"
            elif d.total:
                best += d.total // 100
                source = "samples (+1% of total)"
            best = max([best] + seen)
        else:
            best, source = c["event_peak"], "batch event"
        e = self.by_batch.get(c["batch"])
        if e is None:
            e = self.by_batch[c["batch"]] = {"peak": None, "source": None, "need": None,
                                             "failed_peak": None, "phases": 0, "failed": 0,
                                             "bound": None}
        e["phases"] += 1
        if c["failed"]:
            e["failed"] += c["failed"]
            if c["need"] is not None and (e["need"] is None or c["need"] > e["need"]):
                e["need"] = c["need"]
            if best is not None and (e["failed_peak"] is None or best > e["failed_peak"]):
                e["failed_peak"] = best
        elif best is not None and (e["peak"] is None or best > e["peak"]):
            e["peak"], e["source"] = best, source
            e["bound"] = bound if source == "steps" else None

    def path(self):
        return self.head + list(self.tail)
