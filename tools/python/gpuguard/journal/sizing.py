"""Batches sized by their shape: each step's predicted peak (the `step`
line's `predicted`: what the run's memory model said before the step ran)
beside what it measured, and the model as fitted at exit (the summary's
`model`)."""

from .series import Thinned
from .values import num

#: The most (step, tokens, predicted, measured) points kept for the chart:
#: spread evenly over the run (every step is counted).
POINTS = 400


class Sizing(object):
    """What a device's steps say of the predictions made for them."""
    __slots__ = ("points", "count", "errors", "worst", "fit_tokens")

    def __init__(self):
        #: the largest input (tokens) of a step whose device-wide peak stayed
        #: under the near-miss line: what --recommend proposes as max_tokens
        self.fit_tokens = None
        self.points = Thinned(POINTS)
        self.count = 0           # steps with a prediction (every one)
        self.errors = Thinned(POINTS)   # relative errors, for the median
        self.worst = None        # (relative error, step, predicted, measured)

    def step(self, ev, step, line=None):
        tokens, used = num(ev.get("tokens")), num(ev.get("peak_used"))
        if tokens and line is not None and used is not None and used <= line and \
                (self.fit_tokens is None or tokens > self.fit_tokens):
            self.fit_tokens = int(tokens)
        predicted = num(ev.get("predicted"))
        if predicted is None or step is None:
            return
        measured = measured_need(ev)
        if measured is None or measured <= 0:
            return
        self.count += 1
        err = (predicted - measured) / float(measured)
        if self.worst is None or abs(err) > abs(self.worst[0]):
            self.worst = (err, step, predicted, measured)
        if self.errors.want():
            self.errors.add(abs(err))
        if self.points.want():
            self.points.add((step, num(ev.get("tokens")), predicted, measured))

    def median_error(self):
        errs = sorted(self.errors.items)
        return errs[len(errs) // 2] if errs else None


def measured_need(ev):
    """What the model fits for a step: the tensors' need plus the device's
    use that is not the process's, where the need was told; else the
    step's device-wide peak."""
    needed, peak, used = num(ev.get("needed")), num(ev.get("peak")), num(ev.get("peak_used"))
    if needed is not None:
        others = used - peak if used is not None and peak is not None else 0
        return needed + max(others, 0)
    return used if used is not None else peak


def model_of(summary):
    """The summary's model as a dict of numbers, or None."""
    m = (summary or {}).get("model")
    if not isinstance(m, dict):
        return None
    out = {k: num(m.get(k)) for k in ("steps", "most_tokens", "intercept", "per_token",
                                      "per_token2", "sigma")}
    return out if out["steps"] and out["per_token"] is not None else None
