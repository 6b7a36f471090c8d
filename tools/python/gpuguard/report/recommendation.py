"""--recommend: per GPU model, fit peak = fixed + per-sample x batch from the
phases' (batch, peak) points and the refusals' bounds, and propose the
largest batch (and accumulation) that stays under limit - near-miss margin -
others; and its text.
"""

import os
from collections import OrderedDict

from ..journal.values import num
from .formatting import fmt_bytes, plural


class Recommendation(object):
    """What --recommend proposes for one GPU model."""

    def __init__(self, name):
        self.name = name
        self.batch = None
        self.accum = None
        self.effective = None
        self.predicted = None      # the process peak the fit predicts at `batch`
        self.line = None           # (fixed, per_sample)
        self.points = []           # [(batch, peak, source)]
        self.bounds = []           # [(batch, need)] from refusals and OOMs
        self.cap = None            # the process bytes that stay outside the near-miss zone
        self.other = 0
        self.limit = None
        self.near = None
        self.total = None
        self.headroom = None
        self.mode = None
        self.why = None
        self.need = None           # what it would need, when it cannot recommend

    def predict(self, b):
        c, k = self.line
        p = c + k * b
        for bb, need in self.bounds:
            # a line through the highest fitted point below a refused batch
            # and what that batch needed: a refusal says the fit is too low
            below = [x for x in self.points if x[0] < bb]
            if not below:
                continue
            b0 = max(below)[0]
            p0 = c + k * b0
            if need > c + k * bb:
                p = max(p, p0 + (need - p0) * (b - b0) / float(bb - b0))
        return p


UNKNOWN_GPU = "(unknown device)"


def recommend(journals):
    """One Recommendation per GPU model that has `batch` events or a used
    device, from the (batch, peak) points of every process on that model."""
    models = OrderedDict()
    for j in journals:
        for d in j.used_devices():
            models.setdefault(d.name or UNKNOWN_GPU, []).append((j, d))
    recs = []
    for name, devs in models.items():
        r = Recommendation(name)
        recs.append(r)
        peaks, needs, eff = {}, {}, None
        for j, d in devs:
            ph = d.phases
            if ph.effective is not None and (eff is None or ph.effective > eff):
                eff = ph.effective
            for b, e in ph.by_batch.items():
                if e["peak"] is not None and (b not in peaks or e["peak"] > peaks[b][0]):
                    peaks[b] = (e["peak"], e["source"])
                if e["failed"]:
                    need = e["failed_peak"]
                    if e["need"] is not None:
                        other = d.other_max if d.other_max is not None else 0
                        need = max(need or 0, e["need"] - other)
                    if need is not None:
                        needs[b] = max(needs.get(b, 0), need)
                    else:
                        needs.setdefault(b, 0)
            if d.other_max is not None:
                r.other = max(r.other, d.other_max)
            elif d.summary is not None:
                pu, pk = num(d.summary.get("peak_used")), num(d.summary.get("peak"))
                if pu is not None and pk is not None:
                    r.other = max(r.other, pu - pk)
            if d.limit is not None and d.near is not None:
                room = d.limit - d.near
                if r.cap is None or room - r.other < r.cap:
                    r.limit, r.near, r.total, r.mode = d.limit, d.near, d.total, d.mode
                    r.headroom = d.headroom if d.headroom is not None else (
                        d.total - d.limit if d.total is not None else None)
                    r.cap = room
        if r.cap is not None:
            r.cap -= r.other
        # A batch both fitted (one phase) and failed (another): it failed.
        if name == UNKNOWN_GPU:
            r.need = "the journals do not name this GPU (no start event)"
            continue
        r.points = sorted((b, p, s) for b, (p, s) in peaks.items() if b not in needs)
        r.bounds = sorted(needs.items())
        r.effective = eff
        pts = ", ".join("%d: %s" % (b, fmt_bytes(p)) for b, p, _ in r.points)
        if not r.points and not r.bounds:
            r.need = ("no `batch` events: the trainer never told the guard its batch "
                      "(gpuguard_set_batch, or the Python helper's Guard); run with it")
            continue
        if len({b for b, _, _ in r.points}) < 2:
            r.need = ("%s (%s) is not enough to fit peak = fixed + per sample x batch: "
                      "it needs phases at two batch sizes that fitted; run some steps at "
                      "another batch (the helper's set_batch, or after an advice)" % (
                          plural(len(r.points), "fitted point"), pts or "none"))
            if r.bounds:
                r.need += "; refused: batch %s" % ", ".join(str(b) for b, _ in r.bounds)
            continue
        if r.cap is None:
            r.need = "the journals do not give this GPU's limit and near-miss margin (start event)"
            continue
        n = float(len(r.points))
        mb = sum(b for b, _, _ in r.points) / n
        mp = sum(p for _, p, _ in r.points) / n
        var = sum((b - mb) ** 2 for b, _, _ in r.points)
        k = sum((b - mb) * (p - mp) for b, p, _ in r.points) / var
        if k <= 0:
            r.need = ("the peak does not grow with the batch in these points (%s): a fit "
                      "would not bound larger batches; it needs phases whose peaks the batch "
                      "drives" % pts)
            continue
        # The least-squares slope, lifted to lie on or above every point.
        c = max(p - k * b for b, p, _ in r.points)
        r.line = (c, k)
        # predict() grows with the batch: the largest batch that fits, by
        # bisection, up to the effective batch and below any refused batch
        hi = eff if eff else max(b for b, _, _ in r.points)
        if r.bounds:
            hi = min(hi, min(b for b, _ in r.bounds) - 1)
        best = None
        if hi >= 1 and r.predict(1) <= r.cap:
            lo = 1
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if r.predict(mid) <= r.cap:
                    lo = mid
                else:
                    hi = mid - 1
            best = lo
        margin = "limit %s - near-miss margin %s - others %s = %s" % (
            fmt_bytes(r.limit), fmt_bytes(r.near), fmt_bytes(r.other), fmt_bytes(r.cap))
        fit = "fit peak = %s + %s x batch from %s (%s)" % (
            fmt_bytes(c, 2), fmt_bytes(k, 2), plural(len(r.points), "point"), pts)
        if r.bounds:
            fit += ", refused at %s" % ", ".join(
                "%d (needed >= %s)" % (b, fmt_bytes(nd)) for b, nd in r.bounds)
        if best is None:
            if hi < 1:
                r.need = "even batch 1 was refused; %s" % fit
            else:
                r.need = "even batch 1 is predicted to need %s, more than %s; %s" % (
                    fmt_bytes(r.predict(1)), margin, fit)
            continue
        r.batch = best
        r.effective = eff or best
        r.accum = max(1, -(-r.effective // best))
        r.predicted = r.predict(best)
        r.why = "%s; predicted %s <= %s" % (fit, fmt_bytes(r.predicted, 2), margin)
    return recs


def recommend_text(recs, written=None):
    out = ["Recommendation for the next run (--recommend):"]
    if not recs:
        out.append("  no GPU was used: nothing to recommend")
    for r in recs:
        if r.batch is None:
            out.append("  %s: no recommendation: %s" % (r.name, r.need))
            continue
        out.append("  %s: batch %d x accum %d (effective %d)" % (
            r.name, r.batch, r.accum, r.batch * r.accum))
        out.append("    why: %s" % r.why)
        if written and r.name in written:
            out.append("    policy: %s" % written[r.name])
    if written:
        out.append("  next run: GPUGUARD_POLICY=%s" % os.path.dirname(next(iter(written.values()))))
    elif written is not None:
        out.append("  no policy written: nothing to recommend")
    return out
