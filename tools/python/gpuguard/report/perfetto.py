"""Chrome trace event JSON for Perfetto: a process per journal, counter tracks
per device value, a slice per training step, instant events for incidents,
advice, leaks and errors, timestamps aligned on wall clocks.
"""

from .. import __version__ as VERSION
from ..journal.incidents import STACK_EVENTS
from ..journal.stacks import python_location
from ..journal.values import as_str
from .formatting import fmt_bytes, fmt_size, fmt_t


STEPS_TID = 1000       # + the device: the thread of a device's step slices

# What a slice over several steps says: the journal has no boundary between
THINNED = ("one slice for these steps: the journal has the boundary of the last only (the shim "
           "writes every step for the first 100, then every 100th and when a value moves by 5% "
           "of the device; the report keeps a bounded number of step lines); peak and live are "
           "the last step's")


def process_name(j):
    """The track group's name: the rank, else the pid, once, then where."""
    if j.rank is not None:
        return "rank %d (host %s, pid %s, %s)" % (j.rank, j.host or "?",
                                                  "?" if j.pid is None else j.pid, j.comm or "?")
    return "pid %s (%s) on host %s" % ("?" if j.pid is None else j.pid, j.comm or "?",
                                       j.host or "?")


def step_slices(points):
    """(first, last, start, end, peak, live) from the `step` points (step,
    peak, live, t), in time order: a step lasts from the boundary before it
    to its own. A slice spans several steps where the boundaries between
    them are not in the journal (thinned). The first step journaled, and the
    first after the step count went back (a second loop), get none: where
    they began is not known."""
    out = []
    prev = None
    for p in sorted(points, key=lambda p: (p[3], p[0])):
        step, peak, live, t = p
        if prev is not None and step > prev[0] and t >= prev[3]:
            out.append((prev[0] + 1, step, prev[3], t, peak, live))
        prev = p
    return out


def trace_report(journals):
    """Chrome trace event format, for Perfetto: one process (track group)
    per journal, named by its rank (else its pid); per used device one
    counter track per value (process bytes, device used, limit, each step's
    peak and live bytes: a counter event with several values is drawn
    stacked, which reads as a sum), a thread of step slices (a complete
    event per step, from the boundary before it to its own; "steps A-B"
    where the journal kept only the last boundary) and a thread for the
    instant events (near misses, refusals, OOMs, advice, leaks). Timestamps
    in microseconds, aligned on the start events' wall clock when every
    journal has it; the timelines are the bounded, min/max-preserving ones."""
    events = []
    pids = [j.pid for j in journals]
    unique = None not in pids and len(set(pids)) == len(pids)
    walls = [j.wall for j in journals]
    t0 = min(walls) if walls and None not in walls else None
    for idx, j in enumerate(journals):
        pid = j.pid if unique else idx + 1
        off = (j.wall - t0) if t0 is not None else 0.0

        def ts(t):
            return round((off + t) * 1e6, 3)

        events.append({"name": "process_name", "ph": "M", "pid": pid, "tid": 0,
                       "args": {"name": process_name(j)}})
        events.append({"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0,
                       "args": {"sort_index": j.rank if j.rank is not None else 100000 + idx}})
        end = j.duration
        for d in j.used_devices():
            dev = d.dev
            events.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": dev,
                           "args": {"name": "%s events" % d.label}})
            for t, cur, used in d.timeline.points():
                if cur is not None:
                    events.append({"name": "GPU%d process" % dev, "ph": "C", "ts": ts(t),
                                   "pid": pid, "cat": "gpuguard", "args": {"bytes": cur}})
                if used is not None:
                    events.append({"name": "GPU%d device used" % dev, "ph": "C", "ts": ts(t),
                                   "pid": pid, "cat": "gpuguard", "args": {"bytes": used}})
            steps = [p[:4] for p in d.step_series.points()]
            for stepno, peak, live, t in steps:
                for name, v in (("step peak", peak), ("step live", live)):
                    if v is not None:
                        events.append({"name": "GPU%d %s" % (dev, name), "ph": "C", "ts": ts(t),
                                       "pid": pid, "cat": "gpuguard", "args": {"bytes": v}})
            slices = step_slices(steps)
            if slices:
                events.append({"name": "thread_name", "ph": "M", "pid": pid,
                               "tid": STEPS_TID + dev, "args": {"name": "%s steps" % d.label}})
            for first, last, begin, end_t, peak, live in slices:
                args = {"peak": peak, "live": live}
                if first == last:
                    name = "step %d" % last
                    args["step"] = last
                else:
                    name = "steps %d-%d" % (first, last)
                    args.update(first_step=first, last_step=last, steps=last - first + 1,
                                note=THINNED)
                events.append({"name": name, "cat": "gpuguard,step", "ph": "X", "ts": ts(begin),
                               "dur": round((end_t - begin) * 1e6, 3), "pid": pid,
                               "tid": STEPS_TID + dev, "args": args})
            for m in d.leak_marks.items:
                events.append({"name": "leak +%s/step" % fmt_size(m["rate"]),
                               "cat": "gpuguard,leak", "ph": "i", "s": "t", "ts": ts(m["t"]),
                               "pid": pid, "tid": dev,
                               "args": {"step": m["step"], "since_step": m["since"],
                                        "rate": m["rate"], "live": m["live"],
                                        "projected_step": m["projected"]}})
            if d.limit is not None:
                for t in (0.0, end):
                    events.append({"name": "GPU%d limit" % dev, "ph": "C", "ts": ts(t),
                                   "pid": pid, "cat": "gpuguard", "args": {"bytes": d.limit}})
            for kind in STACK_EVENTS:
                for e in d.events[kind].marks.items:
                    args = {"dev": dev, "api": e["api"], "bytes": e["bytes"], "used": e["used"],
                            "limit": e["limit"], "total": e["total"], "at": fmt_t(e["t"]),
                            "stack": e["stack"]}
                    events.append({"name": "%s %s" % (kind, fmt_bytes(e["bytes"])),
                                   "cat": "gpuguard," + kind, "ph": "i", "s": "t",
                                   "ts": ts(e["t"]), "pid": pid, "tid": dev, "args": args})
            runs = d.advice.kept_runs()
            for adv in d.advice.marks.items:
                args = {"seq": adv["seq"], "dev": dev, "batch_size": adv["batch"],
                        "grad_accum": adv["accum"], "reason": adv["reason"],
                        "signaled": adv["signaled"], "at": fmt_t(adv["t"])}
                run = next((r for r in runs if r["seq0"] == adv["seq"] and r["note"]), None)
                loc = python_location(run["note"]) if run else None
                if loc:
                    args["trainer_at"] = loc
                events.append({"name": "advice #%s %s" % (as_str(adv["seq"], "?"), adv["reason"]),
                               "cat": "gpuguard,advice", "ph": "i", "s": "t", "ts": ts(adv["t"]),
                               "pid": pid, "tid": dev, "args": args})
        for msg, (t, n) in j.errors.items():
            events.append({"name": "error", "cat": "gpuguard,error", "ph": "i", "s": "p",
                           "ts": ts(t), "pid": pid, "tid": 0,
                           "args": {"message": msg, "count": n}})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"tool": "gpuguard-report", "version": VERSION,
                          "journals": [j.path for j in journals]}}
