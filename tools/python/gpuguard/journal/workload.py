"""What a device's steps and failures say of the workload, kept bounded: each
step's input (shape, tokens, the batch it implies) and what its tensors
needed beside what the cache reserved; the failures with what came of them
(recovered by a flush of PyTorch's cache, or raised into the program) and
the moment's figures; the steps that paid a flush; the latest `peak` line
(a process killed before its summary still has its peak and sites).
"""

import collections

from .limits import FIT_POINTS
from .values import as_int, num

FAILURES_KEPT = 64      # failures kept, first and last
NEEDS_KEPT = 4096       # steps whose need is kept for a view's moment


def shape_of(ev):
    """A line's `shape` as a tuple of ints, or None."""
    s = ev.get("shape")
    if not isinstance(s, list) or not s:
        return None
    dims = tuple(as_int(v) for v in s)
    return dims if all(d is not None for d in dims) else None


class Workload(object):
    def __init__(self):
        # steps: (step, tokens, needed, peak, batch, shape), every
        # `stride`-th once FIT_POINTS were kept
        self.points = []
        self.stride = 1
        self.seen = 0
        self.first_shape = None      # (step, shape, tokens)
        self.last_shape = None
        self.longest = None          # (step, shape, tokens, batch) of the most tokens
        self.batches = collections.Counter()   # the batch each step line implies
        self.max_needed = None       # (step, needed)
        # failures (refused, oom) with their outcome, in journal order
        self.failures_head = []
        self.failures_tail = collections.deque(maxlen=FAILURES_KEPT)
        self.recovered_lines = 0     # journaled lines recovered (thinned per site)
        self.raised_count = 0        # lines not recovered (the program saw them)
        self.flush_steps = []        # step lines with flushes, first FIT_POINTS
        self.flush_step_lines = 0
        # what a view's moment needs: the steps that had an incident or a
        # view, and what each needed at its peak (the step line's)
        self.wanted = set()
        self.need_at = {}            # step -> (needed, peak)
        self.peak_line = None        # the latest `peak` line

    # steps ------------------------------------------------------------------

    def step(self, ev, step, peak):
        shape = shape_of(ev)
        tokens = num(ev.get("tokens"))
        needed = num(ev.get("needed"))
        batch = as_int(ev.get("batch"))
        flushes = as_int(ev.get("flushes"))
        if step is None:
            return
        if flushes:
            self.flush_step_lines += 1
            if len(self.flush_steps) < FIT_POINTS:
                self.flush_steps.append(step)
        if needed is not None:
            if self.max_needed is None or needed > self.max_needed[1]:
                self.max_needed = (step, needed)
        if step in self.wanted and len(self.need_at) < NEEDS_KEPT:
            self.need_at[step] = (needed, peak)
        if shape is not None and tokens is not None:
            if self.first_shape is None:
                self.first_shape = (step, shape, tokens)
            self.last_shape = (step, shape, tokens)
            if self.longest is None or tokens > self.longest[2]:
                self.longest = (step, shape, tokens, batch)
            if batch is not None:
                self.batches[batch] += 1
        self.seen += 1
        if self.seen % self.stride == 0:
            self.points.append((step, tokens, needed, peak, batch, shape))
            if len(self.points) >= FIT_POINTS:
                self.points = self.points[1::2]
                self.stride *= 2

    def want(self, step):
        """A step whose need a view or an incident will ask for."""
        if step is not None and len(self.wanted) < NEEDS_KEPT:
            self.wanted.add(step)

    # failures ---------------------------------------------------------------

    def failure(self, ev, t):
        rec = ev.get("recovered")
        f = {"t": t, "ev": ev.get("ev"), "step": as_int(ev.get("step")),
             "bytes": num(ev.get("bytes")), "reserved": num(ev.get("reserved")),
             "recovered": rec if type(rec) is bool else None,
             "retried": ev.get("retried") is True, "freed": num(ev.get("freed")),
             "freed_largest": num(ev.get("freed_largest")), "shape": shape_of(ev),
             "tokens": num(ev.get("tokens")), "used": num(ev.get("used")),
             "limit": num(ev.get("limit")), "total": num(ev.get("total")),
             "line": ev}
        self.want(f["step"])
        if len(self.failures_head) < FAILURES_KEPT:
            self.failures_head.append(f)
        else:
            self.failures_tail.append(f)
        if f["recovered"] is True:
            self.recovered_lines += 1
        else:
            self.raised_count += 1
        return f

    def failures(self):
        return self.failures_head + list(self.failures_tail)

    def recovered(self):
        return [f for f in self.failures() if f["recovered"] is True]
