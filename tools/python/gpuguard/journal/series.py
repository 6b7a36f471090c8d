"""Bounded series: the min/max-preserving timeline of (t, current, used)
samples in at most TIMELINE_BUCKETS buckets, the step series bucketed by step
number, evenly thinned marks, and the least-squares line used for trends.
"""

from .limits import MARKS, TIMELINE_BUCKETS


def _later(a, b):
    return b if b[0] >= a[0] else a


def _pick(a, b, idx, bigger):
    va, vb = a[idx], b[idx]
    if va is None:
        return b
    if vb is None:
        return a
    if bigger:
        return b if vb > va else a
    return b if vb < va else a


def _merge(a, b):
    if a is None:
        return b
    if b is None:
        return a
    return [a[0] if a[0][0] <= b[0][0] else b[0], _later(a[1], b[1]),
            _pick(a[2], b[2], 1, True), _pick(a[3], b[3], 1, False),
            _pick(a[4], b[4], 2, True), _pick(a[5], b[5], 2, False)]


class Timeline(object):
    """Samples (t, current, used) in at most TIMELINE_BUCKETS buckets of one
    width; when a sample falls past the last bucket, neighbours merge and the
    width doubles. A bucket keeps its first and last sample and the samples
    holding each series' minimum and maximum, so a spike survives any
    length of run and the drawing stays a true envelope."""
    __slots__ = ("width", "b", "n")

    def __init__(self, width=1e-3):
        self.width = width
        self.b = [None] * TIMELINE_BUCKETS
        self.n = 0

    def add(self, t, cur, used):
        self.put((t, cur, used))

    def put(self, s):
        """A point (x, a, b, ...): x orders and buckets it, a and b are the
        two series kept at their extremes; what follows rides along."""
        t = s[0]
        i = int(t / self.width)
        if i >= TIMELINE_BUCKETS:
            self._widen(t)
            i = int(t / self.width)
        self.n += 1
        b = self.b[i]
        if b is None:
            self.b[i] = [s, s, s, s, s, s]
            return
        if t < b[0][0]:
            b[0] = s
        if t >= b[1][0]:
            b[1] = s
        cur = s[1]
        if cur is not None:
            v = b[2][1]
            if v is None or cur > v:
                b[2] = s
            v = b[3][1]
            if v is None or cur < v:
                b[3] = s
        used = s[2]
        if used is not None:
            v = b[4][2]
            if v is None or used > v:
                b[4] = s
            v = b[5][2]
            if v is None or used < v:
                b[5] = s

    def _widen(self, t):
        half = TIMELINE_BUCKETS // 2
        while int(t / self.width) >= TIMELINE_BUCKETS:
            old = self.b
            self.b = [_merge(old[2 * k], old[2 * k + 1]) for k in range(half)] + [None] * half
            self.width *= 2

    def points(self):
        """The kept samples in time order."""
        out = []
        for b in self.b:
            if b is None:
                continue
            seen = set()
            for s in sorted(b, key=lambda s: s[0]):
                if id(s) not in seen:
                    seen.add(id(s))
                    out.append(s)
        return out


class StepSeries(Timeline):
    """The `step` lines as points (step, peak, live, t), bucketed by step
    number like the timeline by time: every step while there are at most
    TIMELINE_BUCKETS of them, then each bucket's first, last, highest and
    lowest peak and live."""
    __slots__ = ()

    def __init__(self):
        Timeline.__init__(self, width=1.0)


def fit_line(points):
    """Least squares y = a + b x over (x, y) points: (a, b), or None with
    fewer than two distinct x."""
    n = len(points)
    if n < 2:
        return None
    mx = sum(p[0] for p in points) / float(n)
    my = sum(p[1] for p in points) / float(n)
    sxx = sum((p[0] - mx) ** 2 for p in points)
    if sxx <= 0:
        return None
    b = sum((p[0] - mx) * (p[1] - my) for p in points) / sxx
    return my - b * mx, b


class Thinned(object):
    """At most `cap` items spread evenly over everything offered: every
    `stride`-th is kept, and when the list fills up every other one goes and
    the stride doubles. Callers ask want() first, so an item is built only
    when it will be kept."""
    __slots__ = ("cap", "items", "stride", "seen")

    def __init__(self, cap=MARKS):
        self.cap = cap
        self.items = []
        self.stride = 1
        self.seen = 0

    def want(self):
        self.seen += 1
        return (self.seen - 1) % self.stride == 0

    def add(self, item):
        self.items.append(item)
        if len(self.items) >= self.cap:
            self.items = self.items[::2]
            self.stride *= 2
