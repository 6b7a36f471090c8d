"""One device's advice as runs (same reason, batch, accumulation and signal
merge): head and tail runs kept, forecasts, thinned marks, and the run that
holds an advice seq (for notes).
"""

import collections

from .limits import RUNS_HEAD, RUNS_TAIL
from .series import Thinned
from .values import as_int, as_str


class AdviceLog(object):
    """One device's advice as runs: consecutive advice with the same reason,
    batch, accumulation and signal merge into one run. The first and last
    runs are kept; what lies between is counted."""

    def __init__(self):
        self.n = 0                   # advice lines (thinned per reason and batch)
        self.heard = 0               # ... of them a trainer could hear
        self.unheard = 0             # ... no one could: what would have been advised
        self.first_unheard = None
        self.by_reason = {}
        self.head = []
        self.tail = collections.deque(maxlen=RUNS_TAIL)
        self.runs = 0
        self.marks = Thinned()
        self.forecasts = 0
        self.first_forecast = None
        self.last_forecast = None
        self.forecast_marks = Thinned()
        self.current = None
        self.max_seq = None

    def add(self, ev, t, step=None):
        """`step`: the last step the trainer reported before this advice."""
        self.n += 1
        heard = ev.get("heard") is not False   # shims before `heard`: a trainer's
        reason = as_str(ev.get("reason"), "?")
        if heard:
            self.heard += 1
        else:
            self.unheard += 1
            if self.first_unheard is None:
                self.first_unheard = {"t": t, "at": step, "reason": reason,
                                      "batch": as_int(ev.get("batch_size")),
                                      "accum": as_int(ev.get("grad_accum"))}
        self.by_reason[reason] = self.by_reason.get(reason, 0) + 1
        seq = as_int(ev.get("seq"))
        if seq is not None and (self.max_seq is None or seq > self.max_seq):
            self.max_seq = seq
        batch, accum = as_int(ev.get("batch_size")), as_int(ev.get("grad_accum"))
        signaled = ev.get("signaled") is True
        key = (reason, batch, accum, signaled, heard)
        run = self.current
        if run is not None and run["key"] == key:
            run["n"] += 1
            run["t1"] = t
            if seq is not None:
                run["seq1"] = seq
        else:
            run = {"key": key, "reason": reason, "batch": batch, "accum": accum,
                   "signaled": signaled, "heard": heard, "n": 1, "t0": t, "t1": t, "seq0": seq,
                   "seq1": seq, "note": None, "forecast": None}
            self.runs += 1
            if len(self.head) < RUNS_HEAD:
                self.head.append(run)
            else:
                self.tail.append(run)
            self.current = run
        fc = ev.get("forecast")
        if reason == "forecast":
            fc = fc if isinstance(fc, dict) else {}
            self.forecasts += 1
            if run["forecast"] is None:
                run["forecast"] = fc
            self.last_forecast = {"t": t, "at": step, "batch": batch, "accum": accum,
                                  "forecast": fc, "heard": heard}
            if self.first_forecast is None:
                self.first_forecast = self.last_forecast
            if self.forecast_marks.want():
                self.forecast_marks.add(self.last_forecast)
        if self.marks.want():
            self.marks.add({"t": t, "seq": seq, "reason": reason, "batch": batch,
                            "accum": accum, "signaled": signaled})
        return run

    def kept_runs(self):
        return self.head + list(self.tail)

    @property
    def omitted_runs(self):
        return self.runs - len(self.head) - len(self.tail)

    def run_of(self, seq):
        for run in reversed(self.kept_runs()):
            if run["seq0"] is not None and run["seq0"] <= seq <= run["seq1"]:
                return run
        return None
