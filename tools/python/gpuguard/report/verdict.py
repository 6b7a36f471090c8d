"""The report's opening verdict: modules with device code no GPU runs, leaks
and forecasts, the first refusal or OOM of all processes (by wall clock when
aligned), one line per process, errors; plus the leak and forecast sentences
that the device rows reuse.
"""

from collections import OrderedDict

from ..journal.device import figures
from ..journal.incidents import FAILURES
from ..journal.pytorch import where_in
from ..journal.reader import shared_gpus
from ..journal.values import as_int, as_str, num
from ..journal.workload import shape_of
from .formatting import fmt_about, fmt_bytes, fmt_count, fmt_pct, fmt_size, fmt_t, fmt_wall, plural
from .torchtext import (expandable_on, failure_sentence, forecast_tensors, leak_tensors,
                        raised_lines)
from .workload import flush_story, shape_text, shapes_of


def aligned(journals):
    """True when every journal has its start's wall clock: times compare
    across processes."""
    return bool(journals) and all(j.wall is not None for j in journals)


def died_of_failure(j):
    """Did the process die of an out-of-memory error it was handed (its
    instrumentation saw it uncaught)?"""
    u = (j.uncaught or "").lower()
    return "outofmemoryerror" in u or "out of memory" in u


def with_outcomes(d):
    """Do the device's failure lines say what came of them (recovered)?"""
    return any("retried" in f["line"] for f in d.work.failures())


def outcomes_text(recovered, raised):
    """What came of so many failures: "2 recovered by a cache flush, 1
    raised", or all of them one way."""
    if not recovered:
        return "raised" if raised == 1 else "all raised"
    if not raised:
        return ("recovered by a cache flush" if recovered == 1
                else "all recovered by a cache flush")
    return "%s recovered by a cache flush, %s raised" % (fmt_count(recovered), fmt_count(raised))


def headline(journals):
    """(journal, device, event, how) of the failure the report leads with,
    or None. Where the journals say what came of each failure, a failure
    PyTorch recovered from (its cache flushed, the retry fit) is a cost,
    not the failure: the one that ended the run leads (how "ended": the
    process died of it), else the first one the program saw ("saw");
    journals without outcomes lead with their first failure ("first")."""
    wall = aligned(journals)
    best, best_key = None, None
    for j in journals:
        for d in j.devices.values():
            if not d.work.failures():
                continue
            if with_outcomes(d):
                raised = [f for f in d.work.failures() if f["recovered"] is not True]
                if not raised:
                    continue
                if died_of_failure(j):
                    f, how = raised[-1], "ended"
                else:
                    f, how = raised[0], "saw"
                e = dict(f["line"], t=f["t"], step=f["step"])
            else:
                cand = [d.events[k].first for k in FAILURES if d.events[k].first is not None]
                e, how = min(cand, key=lambda x: x["t"]), "first"
            key = (0 if how == "ended" else 1, (j.wall if wall else 0.0) + e["t"], j.sort_key())
            if best_key is None or key < best_key:
                best, best_key = (j, d, e, how), key
    return best


def when(j, t):
    """`at 2026-11-23 14:03:12, 1 h 05 min into the run` (the wall clock
    when the journal has it)."""
    if j.wall is not None:
        return "at %s, %s into the run" % (fmt_wall(j.wall + t), fmt_t(t))
    return "%s into the run" % fmt_t(t)


def failure_text(j, d, e):
    """The first failure's lines: who, when; what it asked against what was
    free and from where; in PyTorch's terms when the instrumentation
    answered it (torchtext.failure_sentence)."""
    kind = e["ev"]
    b, used = num(e.get("bytes")), num(e.get("used"))
    limit = num(e.get("limit"))
    limit = d.limit if limit is None else limit
    total = num(e.get("total"))
    total = d.total if total is None else total
    api = as_str(e.get("api"), "an allocation")
    peers = num(e.get("peers"))
    held = ", %s of it by this user's other guarded processes on the GPU" % fmt_bytes(peers) \
        if peers else ""
    if kind == "refused":
        free = None if used is None or limit is None else max(limit - used, 0)
        what = "refused %s of %s with %s free under the limit (device used %s%s, limit %s, total %s)" % (
            api, fmt_bytes(b), fmt_bytes(free), fmt_bytes(used), held, fmt_bytes(limit),
            fmt_bytes(total))
    else:
        free = None if used is None or total is None else max(total - used, 0)
        what = "out of memory: %s of %s with %s free on the device (used %s of %s)" % (
            api, fmt_bytes(b), fmt_bytes(free), fmt_bytes(used), fmt_bytes(total))
    head = "%s %s (host %s, pid %s) %s" % (
        j.who, d.label, j.host or "?", "?" if j.pid is None else j.pid, when(j, e["t"]))
    if "retried" in e and num(e.get("step")) is not None:
        head += ", in step %s" % fmt_count(e["step"])  # the step in progress, the line's own
        shape = shape_of(e)
        if shape is not None:
            head += " (input %s)" % list(shape)
    elif e.get("step") is not None:
        head += ", after step %s" % fmt_count(e["step"])
    loc = where_in(j, e, e["t"])
    if loc:
        what += ", asked from %s" % loc
    sentence = failure_sentence(j, d, e)
    out = [head + ":", "  " + what] + (["  " + sentence] if sentence else [])
    if "retried" not in e:  # a journal that does not say what came of its failures
        out += ["  " + line for line in raised_lines(j, d, e)]
    return out


def last_step(j):
    """The last step that ended on any of the process's devices, or None."""
    steps = [figures(j, d)["last_step"] for d in j.devices.values()]
    steps = [s for s in steps if s is not None]
    if j.killed is not None and j.killed.get("step") is not None:
        steps.append(j.killed["step"])
    return max(steps) if steps else None


def status_text(j):
    """How the process ended: finished (exit status 0), died of the error
    it was handed, exited with a status, killed by a signal, or killed
    without a trace (SIGKILL, a crash)."""
    if j.lines == 0:
        return "empty journal"
    step = last_step(j)
    at = ", after step %s" % fmt_count(step) if step is not None else ""
    if j.killed is not None:
        return "killed by %s after %s%s (no summary)" % (j.killed["signal"], fmt_t(j.duration), at)
    if not j.finished:
        return "killed after %s%s (no summary: SIGKILL, os._exit or a crash)" % (
            fmt_t(j.duration), at)
    if j.uncaught:
        name = j.uncaught.split(":", 1)[0]
        status = "" if j.status is None else "; exit status %d" % j.status
        return "died of %s after %s%s (uncaught%s)" % (name, fmt_t(j.duration), at, status)
    if j.status is not None and j.status != 0:
        return "exited with status %d after %s%s" % (j.status, fmt_t(j.duration), at)
    return "finished after %s%s" % (fmt_t(j.duration),
                                   " (exit status 0)" if j.status == 0 else "")


def device_brief(j, d):
    f = figures(j, d)
    bits = ["peak %s" % fmt_bytes(f["peak"])]
    if d.limit is not None:
        bits[0] += " of limit %s" % fmt_bytes(d.limit)
        if f["peak_used"] is not None and d.limit:
            bits[0] += " (device %s, %s of the limit)" % (
                fmt_bytes(f["peak_used"]), fmt_pct(f["peak_used"], d.limit))
    counts = []
    for key, one, many in (("near_misses", "near miss", "near misses"),
                           ("refusals", "refusal", None), ("ooms", "OOM", None)):
        if f[key]:
            counts.append(plural(int(f[key]), one, many))
    if (f["refusals"] or f["ooms"]) and with_outcomes(d):
        said = outcomes_text(f["recovered"], f["raised"])
        if f["refusals"] and f["ooms"]:
            counts.append("of these failures, " + said)
        else:
            counts[-1] += " (%s)" % said
    if f["advice"]:
        counts.append(plural(int(f["advice"]), "advice", "advice"))
    if f["advice_unheard"]:
        counts.append("%s no trainer heard" % plural(int(f["advice_unheard"]), "advice", "advice"))
    return "%s: %s" % (d.label, "; ".join(bits + counts))


def verdict(journals, secs):
    """The verdict's lines (without indentation): device code no GPU runs,
    leaks and forecasts first, then the first failure, a line per process,
    errors."""
    out = arch_verdict(journals)
    later = []
    for j in journals:
        for d in j.used_devices():
            f = figures(j, d)
            if d.last_leak is not None:
                out.append("%s %s: %s" % (j.who, d.label, leak_text(d, j)))
            if d.advice.first_forecast is not None:
                out.append("%s %s: %s" % (j.who, d.label, forecast_text(j, d)))
                tensors = forecast_tensors(j, d)
                if tensors:
                    out.append("  " + tensors)
            shapes = shapes_of(d)
            broke = shape_breaking_text(j, d, shapes)
            if broke:
                later.append("%s %s: %s" % (j.who, d.label, broke))
            flushes = flush_story(d, f, shapes, expandable_on(j, d))
            if flushes:
                later.append("%s %s: cache flushes: %s" % (j.who, d.label, flushes))
    top = headline(journals)
    if top is not None:
        lines = failure_text(*top[:3])
        label = {"ended": "the failure that ended the run: ",
                 "saw": "the first failure the program saw: "}.get(top[3], "first failure: ")
        out += [label + lines[0]] + lines[1:]
    elif secs and any(figures(j, d)["recovered"] for j in journals for d in j.used_devices()):
        out.append("no failure reached the program: every refusal and OOM was recovered by a "
                   "cache flush")
    elif secs:
        out.append("no refusal and no OOM in any journal")
    out += later
    rows = []
    for j in journals:
        devs = j.used_devices()
        desc = "; ".join(device_brief(j, d) for d in devs) if devs else "no GPU memory used"
        rows.append((j.who, j.host or "?", status_text(j), desc))
    if rows:
        w = [max(len(r[i]) for r in rows) for i in range(3)]
        for r in rows:
            out.append("%-*s  %-*s  %-*s  %s" % (w[0], r[0], w[1], r[1], w[2], r[2], r[3]))
    for j in journals:
        for d in j.used_devices():
            unheard = unheard_text(d, figures(j, d))
            if unheard:
                out.append("%s %s: %s" % (j.who, d.label, unheard))
    out += shared_lines(journals)
    if not aligned(journals) and len(journals) > 1:
        out.append("(not every journal has the start's wall clock: times are since each process's start)")
    for j in journals:
        if j.errors:
            msg, (t, n) = next(iter(j.errors.items()))
            more = sum(v[1] for v in j.errors.values()) - 1 + j.errors_dropped
            out.append("%s: error %s: %s%s" % (j.who, fmt_t(t), msg,
                                               " (and %s more)" % fmt_count(more) if more else ""))
    return out


def shared_lines(journals):
    """Which processes shared a GPU (their journals merged by its UUID), and
    devices whose journals say others were there, theirs not given."""
    shared, alone = shared_gpus(journals)
    out = []
    for uuid, jd in shared:
        d0 = jd[0][1]
        out.append("%s (%s) was shared by %s: %s" % (
            uuid, d0.name or "unknown device", plural(len(jd), "process", "processes"),
            "; ".join("%s GPU%d peak %s" % (j.who, d.dev, fmt_bytes(figures(j, d)["peak"]))
                      for j, d in jd)))
    for j, d in alone:
        out.append("%s %s shared its GPU with %s not in these journals (at most %s held or "
                   "claimed)" % (j.who, d.label, plural(d.peers, "other guarded process",
                                                        "other guarded processes"),
                                 fmt_bytes(d.peers_peak)))
    return out


def whos(journals):
    """`rank 3`, `ranks 0-3, 6`, or the pids of processes without a rank."""
    ranks = sorted({j.rank for j in journals if j.rank is not None})
    others = [j.who for j in journals if j.rank is None]
    parts = []
    if ranks:
        runs, start, prev = [], ranks[0], ranks[0]
        for r in ranks[1:] + [None]:
            if r is not None and r == prev + 1:
                prev = r
                continue
            runs.append("%d" % start if start == prev else "%d-%d" % (start, prev))
            if r is not None:
                start = prev = r
        parts.append(("rank " if len(ranks) == 1 else "ranks ") + ", ".join(runs))
    if len(others) > 3:
        others = others[:3] + ["%s more" % fmt_count(len(others) - 3)]
    return ", ".join(parts + others)


def arch_verdict(journals):
    """One line per module whose device code a GPU of the process cannot
    run ("no kernel image is available" at its first kernel), merged over
    the processes that loaded it."""
    merged = OrderedDict()
    for j in journals:
        runs = {e["module"] for e in j.arch.values() if e["ok"]}
        for e in j.arch.values():
            if e["ok"]:
                continue
            key = (e["module"], e["cc"], e["message"], tuple(e["devs"]), e["module"] in runs)
            merged.setdefault(key, (e, j, []))[2].append(j)
    out = []
    for (module, cc, message, devs, elsewhere), (e, j, js) in merged.items():
        names = {j.devices[v].name for v in devs if v in j.devices and j.devices[v].name}
        gpus = ", ".join("GPU%d" % v for v in devs) or "GPU?"
        if len(names) == 1:
            gpus += " " + names.pop()
        where_ok = "another GPU of the process runs it" if elsewhere else "no GPU of the process runs it"
        out.append("%s %s (cc %s): no kernel image in %s (%s): %s" % (
            whos(js), gpus, cc, module, where_ok, message or "see its arch event"))
    return out


def leak_text(d, j=None):
    """`leak: +64 MiB per step since step 3 from train.py:57 in train_step;
    at this rate the limit is reached at step 256, in about 2 h`: the last
    `leak` line, the time from the steps' recent wall-clock rate (its site
    in PyTorch's terms with the journal j). A leak no history confirmed is
    said as what it is: live bytes that grow."""
    e = d.last_leak
    text = "leak: +%s per step since step %s" % (fmt_size(e.get("rate")),
                                                  as_str(e.get("since_step"), "?"))
    kept = leak_tensors(j, d) if j is not None else None
    sites = e.get("sites")
    if kept:
        text += ": " + kept
    elif isinstance(sites, list) and sites and isinstance(sites[0], dict):
        loc = where_in(j, sites[0], e.get("t"))
        if loc:
            text += " from " + loc
    ps, step = as_int(e.get("projected_step")), as_int(e.get("step"))
    if ps is not None:
        text += "; at this rate the limit is reached at step %s" % fmt_count(ps)
        rate = d.step_rate()
        if rate and step is not None and ps > step:
            text += ", in about %s" % fmt_about((ps - step) / rate)
    if e.get("confirmed") is False:
        text += " (from the live bytes at step boundaries, not confirmed by PyTorch's history: " \
                "a caching allocator that keeps what it reserved, or inputs that grow, look " \
                "the same)"
    return text


def forecast_text(j, d):
    """The first forecast: when, what it predicted, what it advised, and
    whether it came before the near misses it was meant to spare."""
    ff = d.advice.first_forecast
    fc = ff["forecast"]
    at = "at step %s (%s)" % (fmt_count(ff["at"]), when(j, ff["t"])) if ff["at"] is not None \
        else when(j, ff["t"])
    text = "forecast %s: step %s would peak at %s" % (at, as_str(fc.get("step"), "?"),
                                                     fmt_bytes(fc.get("bytes")))
    if d.near_line is not None:
        over = isinstance(fc.get("bytes"), (int, float)) and fc["bytes"] > d.near_line
        # A forecast's bytes are over the line by construction; a journal
        # that says otherwise gets its figures side by side, no verdict.
        text += (", over the near-miss line (%s)" if over else " (the near-miss line: %s)") \
            % fmt_bytes(d.near_line)
    what = "batch %s x accum %s" % (as_str(ff["batch"], "?"), as_str(ff["accum"], "?")) \
        if ff["batch"] else "halving the batch (never told, nor seen)"
    text += "; %s %s" % ("advised" if ff.get("heard", True) else
                         "would have advised (no trainer heard it)", what)
    nm = d.events["near_miss"].first
    if nm is None or nm["t"] > ff["t"]:
        text += ", before any near miss"
    else:
        text += ", after the first near miss (%s)" % fmt_t(nm["t"])
    if d.advice.forecasts > 1:
        text += " (%s in all)" % plural(d.advice.forecasts, "forecast")
    return text


def shape_breaking_text(j, d, shapes):
    """When shapes vary: the step whose input broke the run against the
    longest before it, the fit of the need on the tokens, and the largest
    input that fits: `step 18 broke the run: input 16 x 7 556 (120 896
    tokens), 3.8x the longest before it; needed = ... ; the largest that
    fits: 16 x 3 100`; None otherwise."""
    if shapes.kind != "vary":
        return None
    top = headline([j])
    failure = None
    if top is not None and top[1] is d and top[3] in ("ended", "saw"):
        failure = top[2]
    broke = shapes.breaking(failure) if failure is not None else None
    parts = []
    if broke is not None:
        step, shape, tokens, ratio = broke
        text = "step %s broke the run: input %s (%s tokens)" % (
            fmt_count(step) if step is not None else "?", shape_text(shape), fmt_count(tokens))
        if ratio:
            text += ", %.1fx the longest before it" % ratio
        parts.append(text)
    fit = shapes.fit_text()
    if fit:
        parts.append("shapes vary; " + fit)
    cap = fits_cap(j, d)
    big = shapes.largest(cap)
    if big is not None:
        shape, tokens = big
        parts.append("the largest input that fits under the limit: %s (%s tokens)" % (
            shape_text(shape) if shape else "?", fmt_count(tokens)))
    return "; ".join(parts) if parts else None


def fits_cap(j, d):
    """What the process may hold on the device: the limit less the use that
    is not the process's."""
    if d.limit is None:
        return None
    return d.limit - max(0, d.other_max or 0)


def unheard_text(d, f):
    """Advice no trainer heard, as what would have been advised and how to
    act on it."""
    u = d.advice.first_unheard
    n = f.get("advice_unheard") or 0
    if u is None or not n:
        return None
    at = " after step %s" % fmt_count(u["at"]) if u["at"] is not None else ""
    what = "batch %s x accum %s" % (as_str(u["batch"], "?"), as_str(u["accum"], "?")) \
        if u["batch"] else "halving the batch (it was never told, nor seen)"
    start = "start from batch %s" % u["batch"] if u["batch"] else "start from half the batch"
    return ("would have advised %s%s (%s; %s in all), but no trainer heard it (no gpuguard "
            "helper registered, no handler for the signal): run the loop through the helper "
            "(gpuguard.Guard splits each batch on advice), or %s"
            % (what, at, u["reason"], plural(n, "advice", "advice"), start))
