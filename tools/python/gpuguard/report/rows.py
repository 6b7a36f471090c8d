"""A device's figures as (label, [lines]) rows, the same in text and HTML: GPU,
mode switches, total, limit and peak, allocations, pools, events, steps and
their trend, batch path, leak details, forecast, device-code check.
"""

from ..journal.device import figures
from ..journal.limits import PATH_HEAD
from ..journal.pytorch import lines_in
from ..journal.values import as_str
from .formatting import fmt_bytes, fmt_count, fmt_pct, fmt_size, fmt_t, plural
from .groups import GROUPS_SHOWN
from .torchtext import expandable_on, expandable_peak
from .verdict import forecast_text, leak_text, outcomes_text, with_outcomes
from .workload import flush_story, shapes_of


def mode_text(d):
    """`auto -> enforce at 0.90 s (trainer registered)`: the mode the device
    started in and what `auto` switched to."""
    if d.mode is None and not d.modes:
        return None
    parts = [d.mode or "?"]
    for t, mode, why in d.modes:
        parts.append("%s at %s%s" % (mode, fmt_t(t), " (%s)" % why if why else ""))
    if d.modes_dropped:
        parts.append("(%s more switches)" % fmt_count(d.modes_dropped))
    return " -> ".join(parts)


def arch_details(j, d):
    """The device-code check of the modules on this GPU: a count line, then
    each module that runs only by JIT compilation of its PTX (slow first
    start, and a sign of a build too old for the GPU) or not at all."""
    mods = [e for e in j.arch.values() if d.dev in e["devs"]]
    if not mods:
        return []
    bad = [e for e in mods if not e["ok"]]
    jit = [e for e in mods if e["jit"]]
    sass = len(mods) - len(bad) - len(jit)
    head = "%s checked: %s SASS" % (plural(len(mods), "module"),
                                    "%s runs" % fmt_count(sass) if sass == 1 else "%s run" % fmt_count(sass))
    if jit:
        head += ", %s only by JIT compilation of PTX" % fmt_count(len(jit))
    if bad:
        head += ", %s not at all" % fmt_count(len(bad))
    if j.arch_dropped:
        head += " (%s more modules not kept)" % fmt_count(j.arch_dropped)
    return [head] + ["%s: %s" % (e["module"], e["message"] or ("runs only by JIT" if e["jit"] else
                                                              "no kernel image"))
                     for e in bad + jit]


def leak_lines(d, nframes, j=None):
    """The leak in detail: the last `leak` line's figures, how it changed,
    and the sites whose live bytes grew, each by its stack (in PyTorch's
    terms with the journal j)."""
    e = d.last_leak
    out = ["live %s at step %s%s" % (
        fmt_bytes(e.get("live")), as_str(e.get("step"), "?"),
        "" if d.leaks == 1 else "; %s lines, the first at step %s (+%s per step since step %s)" % (
            fmt_count(d.leaks), as_str(d.first_leak.get("step"), "?"),
            fmt_size(d.first_leak.get("rate")), as_str(d.first_leak.get("since_step"), "?")))]
    sites = e.get("sites")
    sites = [x for x in sites if isinstance(x, dict)] if isinstance(sites, list) else []
    if sites:
        out.append("sites whose live bytes grew, largest first:")
    for site in sites[:GROUPS_SHOWN]:
        lines = lines_in(j, site, e.get("t"), limit=nframes)
        out.append("  +%-10s %s" % (fmt_size(site.get("bytes")), lines[0]))
        out += ["  %-11s %s" % ("", line) for line in lines[1:]]
    if len(sites) > GROUPS_SHOWN:
        out.append("  (%s more)" % plural(len(sites) - GROUPS_SHOWN, "site"))
    return out


def consistent_trend(tr):
    """Can the trend's lines both be true? Live bytes at a boundary are
    never above the step's peak, nor the tensors' need above the cache's
    peak: lines that cross inside the steps they were fitted on say two
    things that cannot both hold, and are not printed."""
    s0, s1 = tr["steps"]
    for low, high in (("live", "peak"), ("needed", "peak")):
        if low not in tr or "peak" not in tr:
            continue
        for x in (s0, s1):
            lo = tr[low][0] + tr[low][1] * x
            hi = tr[high][0] + tr[high][1] * x
            if lo > hi * 1.02 + (1 << 20):
                return False
    return True


# why the trainer changed its batch (a `batch` event's reason), after the change
BATCH_WHY = {"shape": " (by shape)", "advice": " (advised)", "policy": " (policy)",
             "oom": " (after an OOM)"}


def batch_path(d):
    """`batch 32 x 1 at 0.00 s -> 16 x 2 at 12.0 min`: the trainer's batch
    from `batch` events, else the advised one from the advice."""
    ph = d.phases
    if ph.changes:
        items = [(c["t"], c["batch"], c["accum"], c.get("reason")) for c in ph.path()]
        omitted = ph.changes - len(items)
        src = "trainer's batch x accum"
    else:
        runs = d.advice.kept_runs()
        items = [(r["t0"], r["batch"], r["accum"], None) for r in runs if r["batch"] is not None]
        items = [it for i, it in enumerate(items) if i == 0 or it[1:] != items[i - 1][1:]]
        omitted = 0
        src = "advised batch x accum"
    if len(items) < 2 and src.startswith("advised"):
        return None
    if not items:
        return None
    parts = []
    for i, (t, b, a, why) in enumerate(items):
        if i == PATH_HEAD and omitted:
            parts.append("(%s more changes)" % fmt_count(omitted))
        parts.append("%s x %s at %s%s" % (as_str(b, "?"), as_str(a, "?"), fmt_t(t),
                                          BATCH_WHY.get(why, "")))
    return "%s: %s" % (src, " -> ".join(parts))


def device_rows(j, d, opts):
    """The device's figures as (label, [lines]), the same in the text and
    the HTML."""
    f = figures(j, d)
    rows = []
    extra = []
    if d.cc:
        extra.append("cc %s" % d.cc)
    if d.policy:
        extra.append("policy %s" % d.policy)
    if extra:
        rows.append(("GPU", [", ".join(extra)]))
    mode = mode_text(d)
    if mode:
        rows.append(("mode", [mode]))
    rows.append(("total", [fmt_bytes(d.total)]))
    if d.limit is not None and d.total:
        rows.append(("limit", ["%s (headroom %s, %s of total)" % (
            fmt_bytes(d.limit), fmt_bytes(d.total - d.limit), fmt_pct(d.limit, d.total))]))
    else:
        rows.append(("limit", [fmt_bytes(d.limit)]))
    rows.append(("peak", ["%s process (%s of total), %s device-wide (%s)" % (
        fmt_bytes(f["peak"]), fmt_pct(f["peak"], d.total),
        fmt_bytes(f["peak_used"]), fmt_pct(f["peak_used"], d.total))]))
    why = expandable_peak(j, d, f)
    if why:
        rows[-1][1].append(why)
    if f["peak_t"] is not None:
        rows.append(("peak time", ["about %s (the highest sample)" % fmt_t(f["peak_t"])]))
    if d.summary is not None:
        rows.append(("allocations", ["%s, %s" % (plural(f["allocs"], "alloc"),
                                                 plural(f["frees"], "free"))]))
        if f["live_allocs"] is None:
            rows.append(("live at exit", [fmt_bytes(f["live_bytes"])]))
        else:
            rows.append(("live at exit", ["%s in %s" % (
                fmt_bytes(f["live_bytes"]), plural(int(f["live_allocs"]), "allocation"))]))
        if f["peak_pool_reserved"] or f["pool_reserved"]:
            # stream-ordered pools: what they hold on the device (counted, as
            # the device sees it) beside what they have handed out
            rows.append(("pools", ["%s reserved, %s allocated at exit; at most %s reserved" % (
                fmt_bytes(f["pool_reserved"] or 0), fmt_bytes(f["pool_allocated"] or 0),
                fmt_bytes(f["peak_pool_reserved"] or 0))]))
    elif f["last"] is not None:
        t, cur, used = f["last"]
        rows.append(("last sample", ["at %s: process %s, device %s" % (
            fmt_t(t), fmt_bytes(cur), fmt_bytes(used))]))
    failures = [plural(int(f["refusals"]), "refusal"), plural(int(f["ooms"]), "OOM")]
    if (f["refusals"] or f["ooms"]) and with_outcomes(d):
        said = outcomes_text(f["recovered"], f["raised"])
        if f["refusals"] and f["ooms"]:
            failures[-1] += " (of these failures, %s)" % said
        else:
            failures[0 if f["refusals"] else 1] += " (%s)" % said
    events = "%s, %s" % (plural(int(f["near_misses"]), "near miss", "near misses"),
                         ", ".join(failures))
    events += ", " + plural(int(f["advice"] or 0), "advice", "advice")
    if f["advice_unheard"]:
        events += " (and %s no trainer heard)" % fmt_count(f["advice_unheard"])
    rows.append(("events", [events]))
    shapes = shapes_of(d)
    if d.steps:
        rate = d.step_rate()
        last = f["last_step"] if f["last_step"] is not None else (
            d.last_step[0] if d.last_step else None)
        total = "%s, %s journaled" % (plural(f["steps"], "step"), fmt_count(d.steps)) \
            if f["steps"] is not None else "%s journaled" % fmt_count(d.steps)
        rows.append(("steps", ["%s .. %s (%s%s), highest step peak %s" % (
            fmt_count(d.first_step[0]) if d.first_step else "?", fmt_count(last), total,
            "; %s steps/s" % ("%.3g" % rate) if rate else "", fmt_bytes(d.step_peak))]))
        inputs = shapes.inputs_text()
        if inputs:
            rows.append(("inputs", [inputs]))
        if d.work.max_needed is not None:
            rows.append(("needed", ["what the tensors held at a step's peak (PyTorch's "
                                    "allocated), beside the cache's reserved peak: at most %s, "
                                    "at step %s" % (fmt_bytes(d.work.max_needed[1]),
                                                    fmt_count(d.work.max_needed[0]))]))
        tr = d.trends() if shapes.trend_by_step else None
        if tr and consistent_trend(tr):
            b = d.phases.path()[-1] if d.phases.path() else None
            rows.append(("trend", ["over steps %s .. %s%s (least squares): %s" % (
                fmt_count(tr["steps"][0]), fmt_count(tr["steps"][1]),
                ", at batch %s x accum %s" % (b["batch"], b["accum"]) if b else "", ", ".join(
                    "%s %s%s/step" % (name, "+" if tr[name][1] >= 0 else "-",
                                      fmt_size(abs(tr[name][1])))
                    for name in ("peak", "needed", "live") if name in tr))]))
        fit = shapes.fit_text()
        if fit and shapes.kind == "vary":
            rows.append(("by tokens", [fit]))
    flushes = flush_story(d, f, shapes, expandable_on(j, d))
    if flushes:
        rows.append(("flushes", [flushes]))
    path = batch_path(d)
    if path:
        rows.append(("batch", [path]))
    if d.leaks:
        rows.append(("leak", [leak_text(d, j)[len("leak: "):]] + leak_lines(d, opts.frames, j)))
    if d.advice.first_forecast is not None:
        rows.append(("forecast", [forecast_text(j, d)]))
    arch = arch_details(j, d)
    if arch:
        rows.append(("device code", arch))
    return rows
