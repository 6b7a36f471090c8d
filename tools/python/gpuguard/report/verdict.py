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
from .formatting import fmt_about, fmt_bytes, fmt_count, fmt_pct, fmt_size, fmt_t, fmt_wall, plural
from .torchtext import failure_sentence, forecast_tensors, leak_tensors, raised_lines


def aligned(journals):
    """True when every journal has its start's wall clock: times compare
    across processes."""
    return bool(journals) and all(j.wall is not None for j in journals)


def first_failure(journals):
    """(journal, device, event) of the first refusal or OOM of all the
    journals, by wall clock when every journal has it."""
    wall = aligned(journals)
    best, best_key = None, None
    for j in journals:
        for d in j.devices.values():
            for kind in FAILURES:
                e = d.events[kind].first
                if e is None:
                    continue
                key = ((j.wall if wall else 0.0) + e["t"], j.sort_key())
                if best_key is None or key < best_key:
                    best, best_key = (j, d, e), key
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
    if e.get("step") is not None:
        head += ", after step %s" % fmt_count(e["step"])
    loc = where_in(j, e, e["t"])
    if loc:
        what += ", asked from %s" % loc
    sentence = failure_sentence(j, d, e)
    return [head + ":", "  " + what] + (["  " + sentence] if sentence else []) + \
        ["  " + line for line in raised_lines(j, d, e)]


def status_text(j):
    if j.lines == 0:
        return "empty journal"
    if j.finished:
        return "finished after %s" % fmt_t(j.duration)
    return "killed after %s (no summary)" % fmt_t(j.duration)


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
    if d.advice.n:
        counts.append(plural(d.advice.n, "advice", "advice"))
    return "%s: %s" % (d.label, "; ".join(bits + counts))


def verdict(journals, secs):
    """The verdict's lines (without indentation): device code no GPU runs,
    leaks and forecasts first, then the first failure, a line per process,
    errors."""
    out = arch_verdict(journals)
    for j in journals:
        for d in j.used_devices():
            if d.last_leak is not None:
                out.append("%s %s: %s" % (j.who, d.label, leak_text(d, j)))
            if d.advice.first_forecast is not None:
                out.append("%s %s: %s" % (j.who, d.label, forecast_text(j, d)))
                tensors = forecast_tensors(j, d)
                if tensors:
                    out.append("  " + tensors)
    first = first_failure(journals)
    if first is not None:
        lines = failure_text(*first)
        out += ["first failure: " + lines[0]] + lines[1:]
    elif secs:
        out.append("no refusal and no OOM in any journal")
    rows = []
    for j in journals:
        devs = j.used_devices()
        desc = "; ".join(device_brief(j, d) for d in devs) if devs else "no GPU memory used"
        rows.append((j.who, j.host or "?", status_text(j), desc))
    if rows:
        w = [max(len(r[i]) for r in rows) for i in range(3)]
        for r in rows:
            out.append("%-*s  %-*s  %-*s  %s" % (w[0], r[0], w[1], r[1], w[2], r[2], r[3]))
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
    in PyTorch's terms with the journal j)."""
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
        text += ", over the near-miss line (%s)" % fmt_bytes(d.near_line)
    text += "; advised batch %s x accum %s" % (as_str(ff["batch"], "?"), as_str(ff["accum"], "?"))
    nm = d.events["near_miss"].first
    if nm is None or nm["t"] > ff["t"]:
        text += ", before any near miss"
    else:
        text += ", after the first near miss (%s)" % fmt_t(nm["t"])
    if d.advice.forecasts > 1:
        text += " (%s in all)" % plural(d.advice.forecasts, "forecast")
    return text
