"""--recommend's fit with the step as a variable, for runs whose memory grows
with the step (a sequence length, a cache) as well as with the batch:

    peak = fixed + batch x (per sample + per sample per step x step) + per step x step

by least squares over the step lines of every phase (a term the points
cannot tell apart is left out), then lifted to lie on or above each step
line and each refusal's need: it errs high, never low.
"""

from .formatting import fmt_bytes

# The terms, in the order they are tried: all four, then without the ones
# the points may not separate.
TERMS = {
    "fixed": lambda b, s: 1.0,
    "per_sample": lambda b, s: float(b),
    "per_sample_step": lambda b, s: float(b) * s,
    "per_step": lambda b, s: float(s),
}
MODELS = (
    ("fixed", "per_sample", "per_sample_step", "per_step"),
    ("fixed", "per_sample", "per_sample_step"),
    ("fixed", "per_sample", "per_step"),
)


def solve(a, y):
    """x with a x = y (Gaussian elimination, partial pivoting); None when a
    is singular."""
    n = len(a)
    m = [list(row) + [v] for row, v in zip(a, y)]
    scale = max(abs(v) for row in a for v in row) or 1.0
    for col in range(n):
        piv = max(range(col, n), key=lambda r: abs(m[r][col]))
        if abs(m[piv][col]) <= 1e-9 * scale:
            return None
        m[col], m[piv] = m[piv], m[col]
        for r in range(n):
            if r != col:
                f = m[r][col] / m[col][col]
                for k in range(col, n + 1):
                    m[r][k] -= f * m[col][k]
    return [m[i][n] / m[i][i] for i in range(n)]


def least_squares(terms, points):
    """The coefficients of terms fitted to (batch, step, peak) points, or
    None. Columns are scaled to 1 before solving (batch x step and bytes
    span twelve orders of magnitude)."""
    cols = [TERMS[t] for t in terms]
    rows = [[f(b, s) for f in cols] for b, s, _ in points]
    scale = [max(abs(r[i]) for r in rows) or 1.0 for i in range(len(cols))]
    rows = [[v / scale[i] for i, v in enumerate(r)] for r in rows]
    ys = [p for _, _, p in points]
    n = len(cols)
    ata = [[sum(r[i] * r[j] for r in rows) for j in range(n)] for i in range(n)]
    aty = [sum(r[i] * y for r, y in zip(rows, ys)) for i in range(n)]
    x = solve(ata, aty)
    if x is None:
        return None
    return {t: v / scale[i] for i, (t, v) in enumerate(zip(terms, x))}


class StepFit(object):
    def __init__(self, coef, npoints, batches, steps):
        self.coef = coef
        self.npoints = npoints
        self.batches = batches      # the batch sizes the points came from
        self.steps = steps          # (first, last) step of the points

    def predict(self, b, s):
        return sum(v * TERMS[t](b, s) for t, v in self.coef.items())

    def growth(self, b):
        """Bytes a step at batch b."""
        return self.coef.get("per_sample_step", 0.0) * b + self.coef.get("per_step", 0.0)

    def highest(self, b, s0, s1):
        """The most it predicts at batch b over steps s0..s1 (it is linear in
        the step: at one end)."""
        return max(self.predict(b, s0), self.predict(b, s1))

    def reaches(self, b, cap):
        """The first step at which batch b is predicted over cap, or None
        when it does not grow."""
        g = self.growth(b)
        if g <= 0:
            return None
        return int((cap - self.predict(b, 0)) // g) + 1

    def text(self):
        c = self.coef
        per = fmt_bytes(c.get("per_sample", 0.0), 2)
        if "per_sample_step" in c:
            per = "(%s + %s x step)" % (per, fmt_bytes(c["per_sample_step"], 2))
        out = "%s + batch x %s" % (fmt_bytes(c["fixed"], 2), per)
        if "per_step" in c:
            out += " %s %s x step" % ("-" if c["per_step"] < 0 else "+",
                                      fmt_bytes(abs(c["per_step"]), 2))
        return "peak = " + out


def grows_within_a_batch(points, span, total):
    """Does the peak grow with the step while the batch stays the same? (A
    run whose batch fell as its steps went on would otherwise lend the
    step what the batch did.) True when some batch's own steps rise by 1%
    of total over the run's span of steps."""
    by = {}
    for b, s, p in points:
        by.setdefault(b, []).append((s, p))
    for pts in by.values():
        if len({s for s, _ in pts}) < 2:
            continue
        n = float(len(pts))
        ms = sum(s for s, _ in pts) / n
        mp = sum(p for _, p in pts) / n
        var = sum((s - ms) ** 2 for s, _ in pts)
        slope = sum((s - ms) * (p - mp) for s, p in pts) / var
        if slope * span >= (total or 0) // 100:
            return True
    return False


def fit(points, needs, total):
    """A StepFit of (batch, step, peak) points, lifted over them and over
    the (batch, step, need) of refusals; None when the points cannot give
    one (fewer than two batch sizes, or steps that do not vary) or show no
    growth worth a step term (under 1% of total over the run at its largest
    batch): the batch-only fit then applies."""
    batches = sorted({b for b, _, _ in points})
    if len(batches) < 2 or len(points) < 4:
        return None
    s0, s1 = min(s for _, s, _ in points), max(s for _, s, _ in points)
    if s1 <= s0 or not grows_within_a_batch(points, s1 - s0, total):
        return None
    small = max((total or 0) // 1000, 1 << 20)     # a term worth less over the run: left out
    for terms in MODELS:
        coef = least_squares(terms, points)
        if coef is None:
            continue
        for t, span in (("per_step", s1 - s0), ("per_sample_step", batches[-1] * (s1 - s0))):
            if t in coef and abs(coef[t]) * span < small and len(coef) > 3:
                terms = tuple(x for x in terms if x != t)
                coef = least_squares(terms, points) or coef
        # A batch term that is not positive says a larger batch needs no
        # more: a fit the run's points cannot support, not one to act on.
        if coef["per_sample"] <= 0 or coef["per_sample"] + coef.get("per_sample_step", 0.0) * s1 <= 0:
            continue
        f = StepFit(coef, len(points), batches, (s0, s1))
        if f.growth(batches[-1]) * (s1 - s0) < (total or 0) // 100:
            return None
        lift = max([p - f.predict(b, s) for b, s, p in points] +
                   [n - f.predict(b, s) for b, s, n in needs] + [0.0])
        coef["fixed"] += lift
        return f
    return None
