"""One process's view of one GPU: static facts (name, total, limit, compute
capability, policy, margins, mode), timeline, peaks, incidents per kind,
advice, phases, steps and their recent trend, leaks, mode switches, the
summary's device entry; and `figures`, the device's numbers from the summary
or, without one, from the events.
"""

import collections

from .advice import AdviceLog
from .incidents import STACK_EVENTS, Incidents
from .limits import RECENT_FAILURES, RECENT_STEPS
from .phases import Phases
from .series import StepSeries, Thinned, Timeline, fit_line
from .sizing import Sizing
from .values import as_int, as_str, num
from .workload import Workload


class Device(object):
    def __init__(self, dev, nframes):
        self.dev = dev
        self.name = None
        self.total = None
        self.limit = None
        self.cc = None
        self.policy = None
        self.headroom = None
        self.near = None              # the near-miss margin in bytes
        self.mode = None
        self.timeline = Timeline()
        self.peak_cur = None
        self.peak_t = None
        self.max_used = None
        self.other_max = None         # device use not the process's, at most
        self.last = None
        self.events = {k: Incidents(k, nframes) for k in STACK_EVENTS}
        self.advice = AdviceLog()
        self.phases = Phases()
        self.steps = 0                 # `step` lines
        self.first_step = None         # (step, t)
        self.last_step = None          # (step, t)
        self.step_peak = None
        self.step_series = StepSeries()
        self.recent = collections.deque(maxlen=RECENT_STEPS)   # (step, peak, live, t)
        self.leaks = 0
        self.first_leak = None
        self.last_leak = None
        # the latest refusals and OOMs (their lines, with t and step): which
        # of them one OutOfMemoryError PyTorch raised covers
        self.recent_failures = collections.deque(maxlen=RECENT_FAILURES)
        self.leak_marks = Thinned()
        self.modes = []                # (t, mode, why): what `auto` switched to
        self.modes_dropped = 0
        self.summary = None
        self.uuid = None               # the GPU's UUID: journals that shared it merge by it
        self.peers = 0                 # the most other guarded processes seen on it at once
        self.peers_peak = None         # the most they held or claimed at once
        self.work = Workload()         # steps' inputs and needs, failures' outcomes
        self.sizing = Sizing()         # steps' predicted peaks beside their measured ones
        self.shapes = None             # (steps seen, the report's Shapes of them): built once

    # What a device's entry says: the start's all of these, the summary's
    # the first of each.
    START_TEXT = ("name", "cc", "policy", "mode", "uuid")
    START_NUMBERS = (("total", "total"), ("limit", "limit"), ("headroom", "headroom"),
                     ("near_miss", "near"))
    SUMMARY_TEXT = START_TEXT[:1]
    SUMMARY_NUMBERS = START_NUMBERS[:2]

    def update(self, d, text=START_TEXT, numbers=START_NUMBERS):
        for k in text:
            v = d.get(k)
            if v is not None:
                setattr(self, k, as_str(v))
        for k, attr in numbers:
            v = num(d.get(k))
            if v is not None:
                setattr(self, attr, v)

    @property
    def label(self):
        return "GPU%d %s" % (self.dev, self.name or "(unknown device)")

    @property
    def used(self):
        """Did the process allocate anything here, or have an incident?"""
        s = self.summary
        if s is not None:
            for k in ("allocs", "peak", "near_misses", "refusals", "ooms"):
                if num(s.get(k)):
                    return True
        if self.peak_cur or self.step_peak:
            return True
        if any(self.events[k].journaled for k in STACK_EVENTS):
            return True
        return bool(self.advice.n or self.leaks or self.phases.by_batch)

    @property
    def near_line(self):
        """The device use above which an allocation is a near miss: the
        limit less the near-miss margin."""
        if self.limit is None or self.near is None:
            return None
        return self.limit - self.near

    def step_rate(self):
        """Steps per second over the recent `step` lines, or None."""
        if len(self.recent) < 2:
            return None
        s0, s1 = self.recent[0], self.recent[-1]
        ds, dt = s1[0] - s0[0], s1[3] - s0[3]
        if ds <= 0 or dt <= 0:
            return None
        return ds / dt

    def trends(self):
        """Least-squares lines over the recent steps of the batch running
        last (steps of another batch say nothing of its trend): {"peak":
        (a, b), "live": (a, b)} for y = a + b * step, those that fit, and
        "steps": (first, last) of the steps they fit."""
        since = self.phases.path()[-1]["t"] if self.phases.path() else None
        recent = [r for r in self.recent if since is None or r[3] >= since]
        out = _fits(recent)
        if out:
            out["steps"] = (recent[0][0], recent[-1][0])
        return out

    def phase_trends(self):
        """One trend per batch phase, over its journaled steps: [{"steps":
        (first, last), "batch": b, "accum": a, "peak": (a, b), "live": (a, b)}]
        in step order (phases with fewer than two steps have none)."""
        path = self.phases.path()
        bounds = [(c["t"], c["batch"], c["accum"]) for c in path] or [(None, None, None)]
        out = []
        pts = self.step_series.points()
        for i, (t0, b, a) in enumerate(bounds):
            t1 = bounds[i + 1][0] if i + 1 < len(bounds) else None
            mine = [p for p in pts if (t0 is None or p[3] >= t0) and (t1 is None or p[3] < t1)]
            fit = _fits(mine)
            if fit:
                fit.update(steps=(mine[0][0], mine[-1][0]), batch=b, accum=a)
                out.append(fit)
        return out


def _fits(rows):
    """{"peak": (a, b), "live": (a, b), "needed": (a, b)} of (step, peak,
    live, t[, needed]) rows (the need where the steps told it)."""
    out = {}
    for idx, name in ((1, "peak"), (2, "live"), (4, "needed")):
        fit = fit_line([(r[0], r[idx]) for r in rows if len(r) > idx and r[idx] is not None])
        if fit is not None:
            out[name] = fit
    return out


def figures(j, d):
    """The device's numbers, from the summary or, without one, the events."""
    s = d.summary or {}
    f = {}
    f["peak"] = num(s.get("peak"))
    if f["peak"] is None:
        f["peak"] = max([v for v in (d.peak_cur, d.step_peak) if v is not None], default=None)
    f["peak_used"] = num(s.get("peak_used"))
    if f["peak_used"] is None:
        f["peak_used"] = d.max_used
    for k in ("allocs", "frees", "live_bytes", "live_allocs", "pool_reserved", "pool_allocated",
              "peak_pool_reserved"):
        f[k] = num(s.get(k))
    for k, ev in (("near_misses", "near_miss"), ("refusals", "refused"), ("ooms", "oom")):
        v = num(s.get(k))
        f[k] = d.events[ev].counted if v is None else v
    # of the failures, those the caller recovered from (a flush of PyTorch's
    # cache) and those that reached the program: the summary's totals, or
    # the journaled lines' without one
    rec = [num(s.get(k)) for k in ("ooms_recovered", "refusals_recovered")]
    if d.summary is not None and rec[0] is not None and rec[1] is not None:
        f["recovered"] = rec[0] + rec[1]
        f["raised"] = max(0, (f["ooms"] or 0) + (f["refusals"] or 0) - f["recovered"])
    else:
        f["recovered"] = d.work.recovered_lines
        f["raised"] = d.work.raised_count
    f["flush_steps"] = as_int(s.get("flush_steps"))
    if f["flush_steps"] is None:
        f["flush_steps"] = d.work.flush_step_lines
    # steps: every boundary (the summary's), its lines are thinned
    f["steps"] = as_int(s.get("steps"))
    f["last_step"] = as_int(s.get("step"))
    if f["last_step"] is None and d.last_step:
        f["last_step"] = d.last_step[0]
    # advice: heard (given) and not, totals when the summary says them
    f["advice"] = as_int(s.get("advice"))
    f["advice_unheard"] = as_int(s.get("advice_unheard"))
    if f["advice"] is None:
        f["advice"] = d.advice.heard
        f["advice_unheard"] = d.advice.unheard
    if d.summary is None and d.work.peak_line is not None:
        # killed before its summary: the latest `peak` line's
        pl = d.work.peak_line
        if num(pl.get("peak")) is not None and (f["peak"] is None or pl["peak"] > f["peak"]):
            f["peak"] = pl["peak"]
        if num(pl.get("peak_used")) is not None and (f["peak_used"] is None or
                                                     pl["peak_used"] > f["peak_used"]):
            f["peak_used"] = pl["peak_used"]
    f["last"] = d.last
    f["peak_t"] = d.peak_t
    return f
