"""--recommend: per GPU model, fit peak = fixed + per-sample x batch from the
phases' (batch, peak) points and the refusals' bounds, and propose the
largest batch (and accumulation) that stays under limit - near-miss margin -
others; and its text.
"""

import os
from collections import OrderedDict

from ..journal.values import num
from .formatting import fmt_bytes, fmt_count, plural
from .stepfit import fit as step_fit


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
        self.model = None          # a StepFit, when memory grows with the step
        self.steps = None          # (first, last): the steps the recommendation covers
        self.advised_off = None    # (batch, step): the smallest batch the run was advised off
        self.covers = None         # what the recommendation covers, said
        self.refused_fit = None    # a step fit the run contradicts, said
        self.max_tokens = None     # the largest input a step held under the line ([trainer])

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
        steps, fails, off = [], [], []
        by_shape = 0
        for j, d in devs:
            ph = d.phases
            by_shape += ph.by_shape
            other_d = d.other_max if d.other_max is not None else 0
            steps += ph.fit_points()
            fails += [(b, st, n - other_d) for b, st, n in ph.fail_points()]
            off += ph.advised_off_batches()
            if ph.effective is not None and (eff is None or ph.effective > eff):
                eff = ph.effective
            if not ph.events:
                # a script that never told its batch: the batch its steps'
                # inputs imply (their batch dimension), as phases
                seen(d, peaks, needs, steps)
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
            fit = d.sizing.fit_tokens
            if fit is not None and (r.max_tokens is None or fit > r.max_tokens):
                r.max_tokens = fit
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
            r.need = ("no `batch` events and no step lines with a batch: the trainer never told "
                      "the guard its batch (gpuguard_set_batch, or the Python helper's Guard), "
                      "nor did gpuguard-run see its steps' inputs; run with one of them")
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
        r.advised_off = min(off) if off else None
        if by_shape and r.max_tokens and eff and not r.bounds and not r.advised_off:
            _as_sized(r, eff, by_shape)
            continue
        hi = eff if eff else max(b for b, _, _ in r.points)
        if r.bounds:
            hi = min(hi, min(b for b, _ in r.bounds) - 1)
        if r.advised_off:
            # never a batch the run was advised off: it is what the run left
            hi = min(hi, r.advised_off[0] - 1)
        r.model = step_fit(steps, fails, r.total)
        if r.model is not None and _contradicts(r, steps):
            r.model = None  # a batch the run finished predicted over the line: not this run's
        if r.model is not None:
            _by_step(r, hi, eff)
        else:
            _by_batch(r, hi, eff, pts)
        if r.batch is None:
            _survived(r, hi, eff)
    return recs


def batch_dim(shape, batch):
    """The index of the batch in a shape (its first dimension of that size)."""
    for k, v in enumerate(shape or ()):
        if v == batch:
            return k
    return None


def seen(d, peaks, needs, steps):
    """The batches a device's step lines imply (gpuguard-run saw each step's
    input): per batch the highest step peak that finished, and the need of a
    step that failed (the raised failure's input, its batch at the same
    dimension)."""
    w = d.work
    dim = None
    for st, tokens, needed, peak, b, shape in w.points:
        if b is None or peak is None:
            continue
        dim = batch_dim(shape, b) if dim is None else dim
        if b not in peaks or peak > peaks[b][0]:
            peaks[b] = (peak, "steps")
        steps.append((b, st, peak))
    other = d.other_max if d.other_max is not None else 0
    for f in w.failures():
        if f["recovered"] is True or f["shape"] is None or dim is None or dim >= len(f["shape"]):
            continue
        b = f["shape"][dim]
        if f["used"] is not None and f["bytes"] is not None:
            needs[b] = max(needs.get(b, 0), f["used"] + f["bytes"] - other)


def _contradicts(r, steps):
    """Does the step fit predict a batch that finished its steps over the
    line it had? Then it is not a fit of this run (the run proved it
    wrong), and it is said so."""
    m = r.model
    by = {}
    for b, st, _ in steps:
        lo, hi = by.get(b, (st, st))
        by[b] = (min(lo, st), max(hi, st))
    for b, (s0, s1) in by.items():
        if m.highest(b, s0, s1) > r.cap:
            r.refused_fit = "%s predicts batch %d over %s at its steps %d-%d, which it finished" % (
                m.text(), b, fmt_bytes(r.cap), s0, s1)
            return True
    return False


def _survived(r, hi, eff):
    """No batch the fits can vouch for: propose the largest batch this run
    finished (no refusal or OOM in its phases), which it survived, saying
    why the fit gave none."""
    ok = [(b, p) for b, p, _ in r.points if b <= hi]
    if not ok:
        return
    b, p = max(ok)
    why = r.need or r.refused_fit or "no fit"
    _propose(r, b, eff, p)
    r.why = "the largest batch this run finished (peak %s), which it survived; no larger one " \
            "is proposed: %s" % (fmt_bytes(p), why)
    r.need = None


def _largest(ok, hi):
    """The largest batch in 1..hi for which ok(batch) holds (ok falls as
    the batch grows), or None."""
    if hi < 1 or not ok(1):
        return None
    lo = 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if ok(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def _margin(r):
    return "limit %s - near-miss margin %s - others %s = %s" % (
        fmt_bytes(r.limit), fmt_bytes(r.near), fmt_bytes(r.other), fmt_bytes(r.cap))


def _advised_off_text(r):
    b, st = r.advised_off
    return "batch %d was advised off%s" % (b, "" if st is None else " at step %d" % st)


def _by_step(r, hi, eff):
    """The run's memory grows with the step: the largest batch whose peak
    stays under the cap through the run's last step."""
    m = r.model
    s0, s1 = m.steps
    r.steps = (s0, s1)
    best = _largest(lambda b: m.highest(b, s0, s1) <= r.cap, hi)
    fit = "fit %s from %s at batches %s" % (
        m.text(), plural(m.npoints, "step line"), ", ".join(str(b) for b in m.batches))
    if best is None:
        r.need = ("even batch 1 is predicted to need %s by step %d, more than %s; %s" % (
            fmt_bytes(m.highest(1, s0, s1)), s1, _margin(r), fit) if hi >= 1 else
            "even batch 1 was refused; %s" % fit)
        return
    _propose(r, best, eff, m.highest(best, s0, s1))
    r.why = "%s; predicted %s at step %d <= %s" % (fit, fmt_bytes(r.predicted, 2), s1,
                                                   _margin(r))
    covers = "steps %d-%d, this run's" % (s0, s1)
    at = m.reaches(best, r.cap)
    if at is not None:
        covers += "; batch %d reaches %s at step %d (%s a step)" % (
            best, fmt_bytes(r.cap), at, fmt_bytes(m.growth(best), 2))
    if r.advised_off:
        covers += "; " + _advised_off_text(r)
    r.covers = covers


def _by_batch(r, hi, eff, pts):
    """peak = fixed + per sample x batch from the phases' peaks."""
    n = float(len(r.points))
    mb = sum(b for b, _, _ in r.points) / n
    mp = sum(p for _, p, _ in r.points) / n
    var = sum((b - mb) ** 2 for b, _, _ in r.points)
    k = sum((b - mb) * (p - mp) for b, p, _ in r.points) / var
    if k <= 0:
        r.need = ("the peak does not grow with the batch in these points (%s): a fit "
                  "would not bound larger batches; it needs phases whose peaks the batch "
                  "drives" % pts)
        return
    # The least-squares slope, lifted to lie on or above every point.
    c = max(p - k * b for b, p, _ in r.points)
    r.line = (c, k)
    # predict() grows with the batch: the largest batch that fits, up to the
    # effective batch and below any refused batch
    best = _largest(lambda b: r.predict(b) <= r.cap, hi)
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
                fmt_bytes(r.predict(1)), _margin(r), fit)
        return
    _propose(r, best, eff, r.predict(best))
    r.why = "%s; predicted %s <= %s" % (fit, fmt_bytes(r.predicted, 2), _margin(r))
    if r.advised_off and best == r.advised_off[0] - 1 and r.predict(best + 1) <= r.cap:
        r.covers = _advised_off_text(r)    # the fit alone would have said more


def _as_sized(r, eff, changes):
    """A run whose helper sized each batch by its shape: its batch sizes are
    pieces of long inputs, not choices of the batch, so no line through
    them; the batch it ran, with its largest input as the bound."""
    _propose(r, eff, eff, None)
    r.why = ("the run sized each batch by its shape (%s): a batch's peak followed its "
             "tokens, not its batch size, so no fit against the batch; batch %d ran whole "
             "while its input held at most max_tokens, and with max_tokens the helper splits "
             "any longer batch before it runs, as this run did" % (
                 plural(changes, "change") + " of the split", eff))


def _propose(r, best, eff, predicted):
    r.batch = best
    r.effective = eff or best
    r.accum = max(1, -(-r.effective // best))
    r.predicted = predicted


def shape_text(r):
    """What the next run does with each batch, in the helper's words: it
    keeps the loader's batch (the effective one) and splits it into the
    fewest pieces of at most `batch` samples, as evenly as it can (32 at
    batch 11: 3 pieces of at most 11, 11 + 11 + 10; at batch 10: 4 of at most
    8), never batch x accum samples."""
    if r.accum > 1:
        micro = -(-r.effective // r.accum)
        text = "each batch of %d as %d micro-batches of at most %d (effective %d" % (
            r.effective, r.accum, micro, r.effective)
        if micro < r.batch:
            text += "; up to %d would fit" % r.batch
        return text + ")"
    return "each batch of %d whole (effective %d)" % (r.effective, r.effective)


def max_tokens_text(r):
    return ("max_tokens: %s (the largest input, in elements, a step of the run held under the "
            "near-miss line; the helper splits any batch larger from the start)"
            % fmt_count(r.max_tokens))


def recommend_text(recs, written=None):
    out = ["Recommendation for the next run (--recommend):"]
    if not recs:
        out.append("  no GPU was used: nothing to recommend")
    for r in recs:
        if r.batch is None:
            out.append("  %s: no recommendation: %s" % (r.name, r.need))
            if r.max_tokens:
                out.append("    " + max_tokens_text(r))
            continue
        out.append("  %s: %s" % (r.name, shape_text(r)))
        out.append("    why: %s" % r.why)
        if r.max_tokens:
            out.append("    " + max_tokens_text(r))
        if r.covers:
            out.append("    covers: %s" % r.covers)
        if written and r.name in written:
            out.append("    policy: %s" % written[r.name])
    if written:
        out.append("  next run: GPUGUARD_POLICY=%s" % os.path.dirname(next(iter(written.values()))))
    elif written is not None:
        out.append("  no policy written: nothing to recommend")
    return out
