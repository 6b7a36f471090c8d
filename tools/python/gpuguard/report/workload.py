"""What the workload did, in the user's terms, the same in text and HTML:

- the steps' inputs: whether their shapes grow with the step, vary, or stay
  fixed; the fit of what the tensors needed against the tokens
  (`needed = a + b x tokens`, over how many steps, how good); the step
  whose shape broke the run against the longest before it; the largest
  shape that fits under the limit;
- the cache flushes: failures PyTorch recovered from by emptying its cache
  and retrying, how many steps paid one, what the cache held and what the
  flush released, why, and the fix;
- each verdict on a moment (cache bloat, fragmentation, real demand), with
  the figures of that moment it rests on: `judge_*` build them, `check`
  says when one contradicts its own figures (a test runs it over every
  journal of the real-PyTorch rig).
"""

from ..journal.values import num
from .formatting import fmt_bytes, fmt_count, fmt_size, plural

EXPANDABLE = "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"


# ---- the steps' inputs ----------------------------------------------------------------

def kendall(xs, ys):
    """Kendall's tau of two sequences (ties count for neither side)."""
    n = len(xs)
    s = pairs = 0
    for i in range(n):
        for j in range(i + 1, n):
            dx, dy = xs[j] - xs[i], ys[j] - ys[i]
            if dx and dy:
                s += 1 if (dx > 0) == (dy > 0) else -1
            pairs += 1
    return float(s) / pairs if pairs else 0.0


def least_squares(points):
    """(a, b, r2) of y = a + b x over (x, y) points, or None."""
    n = len(points)
    if n < 2:
        return None
    mx = sum(p[0] for p in points) / float(n)
    my = sum(p[1] for p in points) / float(n)
    sxx = sum((p[0] - mx) ** 2 for p in points)
    if sxx <= 0:
        return None
    b = sum((p[0] - mx) * (p[1] - my) for p in points) / sxx
    a = my - b * mx
    syy = sum((p[1] - my) ** 2 for p in points)
    res = sum((p[1] - a - b * p[0]) ** 2 for p in points)
    return a, b, (1.0 - res / syy) if syy > 0 else 1.0


def shape_text(shape):
    """[16, 7556] as `16 x 7 556`."""
    return " x ".join(fmt_count(v) for v in shape)


def varying_dim(shapes):
    """The dimension whose size varies most across the shapes (the
    sequence), or None."""
    if not shapes:
        return None
    n = min(len(s) for s in shapes)
    best, most = None, 1
    for k in range(n):
        distinct = len({s[k] for s in shapes})
        if distinct > most:
            best, most = k, distinct
    return best


def shapes_of(d):
    """The device's Shapes, built once for the steps it has read: the text's
    rows, the verdict and the page all ask (a fit over up to FIT_POINTS
    steps, and a rank correlation over their pairs)."""
    kept = d.shapes
    if kept is None or kept[0] != d.work.seen:
        kept = d.shapes = (d.work.seen, Shapes(d))
    return kept[1]


class Shapes(object):
    """A device's steps against their inputs."""

    def __init__(self, d):
        w = d.work
        self.d = d
        pts = [p for p in w.points if p[1] is not None and p[5] is not None]
        self.points = pts
        self.kind = None            # "grow", "vary" or "fixed"
        self.fit = None             # (a, b, r2, n, what) of need (or peak) against tokens
        self.trend_by_step = True   # a trend per step means something
        if len(pts) < 2:
            return
        steps, tokens = [p[0] for p in pts], [p[1] for p in pts]
        if len(set(tokens)) == 1:
            self.kind = "fixed"
        elif kendall(steps, tokens) >= 0.8:
            self.kind = "grow"
        else:
            self.kind = "vary"
            self.trend_by_step = False
        needs = [(p[1], p[2]) for p in pts if p[2] is not None]
        what = "needed"
        if len(needs) < 2:
            needs, what = [(p[1], p[3]) for p in pts if p[3] is not None], "peak"
        if self.kind != "fixed" and len({x for x, _ in needs}) >= 3:
            fit = least_squares(needs)
            if fit is not None and fit[1] > 0:
                self.fit = fit + (len(needs), what)

    def predict(self, tokens):
        a, b = self.fit[0], self.fit[1]
        return a + b * tokens

    def fit_text(self):
        """`needed = 1.1 GiB + 160.0 KiB x tokens over 34 steps (R² 0.999)`."""
        if self.fit is None:
            return None
        a, b, r2, n, what = self.fit
        return "%s = %s %s %s x tokens over %s (R\u00b2 %.3f)" % (
            what, fmt_bytes(a), "-" if b < 0 else "+", fmt_bytes(abs(b)), plural(n, "step"), r2)

    def largest(self, cap):
        """The largest input whose need fits under `cap` bytes of the
        process (the device's limit less what is not the process's): (shape,
        tokens), the shape keeping the dimensions the run did not vary; or
        None."""
        if self.fit is None or cap is None:
            return None
        a, b = self.fit[0], self.fit[1]
        if b <= 0 or cap <= a:
            return None
        tokens = int((cap - a) / b)
        shapes = [p[5] for p in self.points]
        k = varying_dim(shapes)
        template = max(shapes, key=len)
        if k is None or k >= len(template):
            return None, tokens
        rest = 1
        for i, v in enumerate(template):
            if i != k:
                rest *= max(1, v)
        shape = list(template)
        shape[k] = max(1, tokens // rest)
        return tuple(shape), tokens

    def breaking(self, failure):
        """The step whose input broke the run: the failure that reached the
        program, its step and shape, and its tokens against the most any
        step before it had: (step, shape, tokens, ratio) or None."""
        if failure is None or failure.get("tokens") is None or failure.get("shape") is None:
            return None
        step = failure.get("step")
        before = [p[1] for p in self.d.work.points
                  if p[1] is not None and (step is None or p[0] < step)]
        most = max(before) if before else None
        ratio = failure["tokens"] / float(most) if most else None
        return step, failure["shape"], failure["tokens"], ratio

    def inputs_text(self):
        """`[16, 256] at step 1 .. [16, 8704] at step 34, growing with the step`."""
        w = self.d.work
        if w.first_shape is None:
            return None
        (s0, sh0, _), (s1, sh1, _) = w.first_shape, w.last_shape
        how = {"grow": "growing with the step", "vary": "varying from step to step",
               "fixed": "the same every step"}.get(self.kind, "")
        text = "%s at step %s" % (list(sh0), fmt_count(s0))
        if (s1, sh1) != (s0, sh0):
            text += " .. %s at step %s" % (list(sh1), fmt_count(s1))
        if w.longest is not None and self.kind == "vary":
            text += "; the longest %s at step %s" % (list(w.longest[1]), fmt_count(w.longest[0]))
        if how:
            text += " (%s)" % how
        if w.batches:
            b, _ = w.batches.most_common(1)[0]
            text += "; batch %s" % fmt_count(b)
        return text


# ---- cache flushes -------------------------------------------------------------------

def flush_story(d, f, shapes, expandable):
    """The failures PyTorch recovered from, as a cost: `20 OOMs PyTorch
    recovered from by emptying its cache and retrying, in 19 steps (10 ..
    34): ...; cause ...; fix ...`; None when there were none."""
    n = f.get("recovered") or 0
    if not n:
        return None
    w = d.work
    rec = w.recovered()
    steps = sorted(set(w.flush_steps))  # the steps that finished
    text = "%s PyTorch recovered from by emptying its cache and retrying (each a full flush, " \
           "a slowdown the program never sees)" % plural(n, "failure")
    ns = f.get("flush_steps")
    if ns:
        text += ", in %s" % plural(ns, "step")
        if steps:
            text += " (%s .. %s)" % (fmt_count(steps[0]), fmt_count(steps[-1]))
    first = rec[0] if rec else None
    if first is not None:
        text += "; at the first%s the cache held %s and its flush released %s" % (
            " (step %s)" % fmt_count(first["step"]) if first["step"] is not None else "",
            fmt_bytes(first["reserved"]), fmt_bytes(first["freed"]))
        j_ = judge_failure(d, first)
        if j_ is not None and j_.kind == "bloat":
            text += ": " + j_.why
    cause = None
    if shapes is not None and shapes.kind == "grow":
        (s0, sh0, _), (s1, sh1, _) = w.first_shape, w.last_shape
        cause = "the step's input grows (%s at step %s to %s at step %s): each step's tensors " \
                "are larger than the blocks the cache kept" % (
                    list(sh0), fmt_count(s0), list(sh1), fmt_count(s1))
    elif shapes is not None and shapes.kind == "vary":
        cause = "the inputs' shapes vary from step to step: blocks cut for one shape do " \
                "not fit the next"
    if cause:
        text += "; why: " + cause
    fixes = []
    if not expandable:
        fixes.append("`%s` (the cache grows its segments in place instead)" % EXPANDABLE)
    if shapes is not None and shapes.kind in ("grow", "vary"):
        fixes.append("bucketed or capped lengths (a few shapes the cache can reuse)")
    if fixes:
        text += "; fix: " + ", or ".join(fixes)
    return text


# ---- verdicts of a moment ----------------------------------------------------------------

class Judged(object):
    """A verdict on one moment and the figures it rests on: kind is
    "bloat" (the cache held at least the request unused: blocks too small
    or split), "fragmentation" (it did not fit the largest free block but
    would have fit the free bytes as one), "demand" (it would not have fit
    even then), or None (the moment's figures do not say)."""

    def __init__(self, kind, moment, figures, why):
        self.kind = kind
        self.moment = moment
        self.figures = figures
        self.why = why

    def __repr__(self):
        return "Judged(%r, %r, %r)" % (self.kind, self.moment, self.figures)


def judge_failure(d, f):
    """A refusal's or an OOM's verdict from its own moment (the shim's
    ledger, and what its caller's flush released before the retry)."""
    req, reserved, freed = f.get("bytes"), f.get("reserved"), f.get("freed")
    largest = f.get("freed_largest")
    if req is None:
        return None
    figures = {"request": req, "reserved": reserved, "freed": freed, "freed_largest": largest,
               "recovered": f.get("recovered")}
    if f.get("recovered") is True:
        # the same request fit once the cache let go of what no tensor used
        how = "blocks too small" if largest is not None and largest < req else \
            "free blocks it could not use"
        why = "cache bloat: %s of it unused, %s (the largest %s, the request %s); the retry " \
              "fit" % (fmt_size(freed), how, fmt_size(largest), fmt_size(req)) \
            if freed is not None and largest is not None else "cache bloat: the retry fit"
        return Judged("bloat", "failure", figures, why)
    return None


def judge_near_miss(d, ev):
    """A near miss's verdict: the cache reserved R before this segment, and
    the step's tensors needed at most N at any moment of it: R - N >= the
    request means the cache held the request unused (bloat, whatever came
    after). None when the step's need is not known or does not say."""
    req, reserved, step = num(ev.get("bytes")), num(ev.get("reserved")), ev.get("step")
    need = d.work.need_at.get(step, (None, None))[0] if step is not None else None
    if req is None or reserved is None or need is None:
        return None
    before = reserved - req
    figures = {"request": req, "reserved_before": before, "needed": need}
    if before - need >= req:
        return Judged("bloat", "near miss", figures,
                      "cache bloat: %s reserved before this segment while the step's tensors "
                      "needed at most %s: at least %s of the cache unused, more than the %s "
                      "asked" % (fmt_size(before), fmt_size(need), fmt_size(before - need),
                                 fmt_size(req)))
    return None


def judge_snapshot(snap):
    """A `torch` line's verdict: only the OOM observer's view (read as
    PyTorch raised, after its cache was emptied) is of the failure's own
    moment; a view read later has figures and no verdict."""
    figures = {k: snap.get(k) for k in ("request", "unallocated", "largest_free", "reserved",
                                        "allocated")}
    if snap.get("asked") is not None or not snap.get("raised") or snap.get("fits") is None:
        return Judged(None, "later", figures, None)
    req, largest = figures["request"], figures["largest_free"]
    if req is None or largest is None or req <= largest:
        return Judged(None, "raised", figures, "it fit the largest free block (of another "
                      "pool or stream, or freed since)")
    if snap["fits"]:
        return Judged("fragmentation", "raised", figures,
                      "fragmentation: it would have fit had the free bytes been one block")
    return Judged("demand", "raised", figures,
                  "real demand: it would not have fit had the free bytes been one block")


def check(judged):
    """The contradictions between a verdict and its own figures: [] when it
    holds. Bloat needs the cache to have held the request unused
    (the flush released at least it, or the retry fit, or the reserved
    bytes before it less the step's need were at least it); fragmentation
    a request over the largest free block; real demand a request over both
    the largest free block and the cache's unallocated bytes."""
    if judged is None or judged.kind is None:
        return []
    f = judged.figures
    out = []
    req = f.get("request")
    if judged.kind == "bloat":
        ok = f.get("recovered") is True or (f.get("freed") or 0) >= (req or 0) or (
            f.get("reserved_before") is not None and f.get("needed") is not None
            and f["reserved_before"] - f["needed"] >= req)
        if not ok:
            out.append("bloat, but the cache did not hold %s unused" % req)
    elif judged.kind == "fragmentation":
        if req is None or f.get("largest_free") is None or req <= f["largest_free"]:
            out.append("fragmentation, but the request fit the largest free block")
        if judged.moment != "raised":
            out.append("fragmentation judged from a view of a later moment")
    elif judged.kind == "demand":
        if req is None or f.get("largest_free") is None or req <= f["largest_free"]:
            out.append("real demand, but the request fit the largest free block")
        if f.get("unallocated") is not None and req is not None and req <= f["unallocated"]:
            out.append("real demand, but the cache held the request unallocated")
        if judged.moment != "raised":
            out.append("real demand judged from a view of a later moment")
    return out


def judgements(j):
    """Every verdict the report gives on journal j's moments, for the test
    that holds them to their figures."""
    out = []
    pt = getattr(j, "pt", None)
    for d in j.devices.values():
        for f in d.work.failures():
            out.append(judge_failure(d, f))
        first = d.events["near_miss"].first
        if first is not None:
            out.append(judge_near_miss(d, first))
        td = pt.devices.get(d.dev) if pt is not None else None
        if td is not None:
            for snap in td.shown():
                out.append(judge_snapshot(snap))
    return [x for x in out if x is not None]
