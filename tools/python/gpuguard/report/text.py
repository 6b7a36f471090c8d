"""The text report: header, verdict, the multi-device table, per journal its
facts, errors and unused devices, per device its rows, the peak tree or peak
stack, incidents by Python line, the advice history with the trainer's
location, notes; or, with --recommend, the recommendation instead of the
sections.
"""

from ..journal.device import figures
from ..journal.incidents import STACK_EVENTS
from ..journal.reader import left_out, sections
from ..journal.pytorch import lines_in, view_of
from ..journal.stacks import frames_of, python_location
from ..journal.values import as_str
from .formatting import fmt_bytes, fmt_count, fmt_t, fmt_wall, plural
from .groups import GROUPS_SHOWN, group_line, line_group_lines
from .recommendation import recommend_text
from .rows import device_rows
from .sizing import sizing_lines
from .torchtext import backward_lines, torch_block_text, torch_blocks
from .tree import peak_tree_lines, site_tree
from .verdict import outcomes_text, verdict, with_outcomes


def segments_note(j, d, sites):
    """Do the sites hold PyTorch's cache (segments it grew the cache by,
    whatever tensors the blocks cut from them hold now)?"""
    if not isinstance(sites, list):
        return False
    for site in sites:
        v = view_of(j, site, peak_time(j, d), nearest=True) if isinstance(site, dict) else None
        if v is not None and v.through_cache:
            return True
    return False


def peak_time(j, d):
    """When the peak was (the highest sample), else the journal's end: the
    moment a site without Python frames is tied to a backward line."""
    return d.peak_t if d.peak_t is not None else j.last_t


def site_views(j, d):
    """A peak site's View in PyTorch's terms (or None), for site_tree."""
    t = peak_time(j, d)
    return lambda site: view_of(j, site, t, nearest=True)


def advice_run_line(run):
    if run["n"] == 1:
        head = "%11s  #%s" % (fmt_t(run["t0"]), as_str(run["seq0"], "?"))
    else:
        head = "%11s  #%s-#%s %sx until %s" % (
            fmt_t(run["t0"]), as_str(run["seq0"], "?"), as_str(run["seq1"], "?"),
            fmt_count(run["n"]), fmt_t(run["t1"]))
    text = "%s  %-9s %sbatch %s x accum %s%s" % (
        head, run["reason"], "" if run.get("heard", True) else "would have advised ",
        as_str(run["batch"], "?"), as_str(run["accum"], "?"),
        ", signaled" if run["signaled"] else (", not signaled" if run.get("heard", True)
                                              else ", no trainer heard it"))
    fc = run["forecast"]
    if fc:
        text += "; forecast: step %s would peak at %s" % (as_str(fc.get("step"), "?"),
                                                           fmt_bytes(fc.get("bytes")))
    return text


def journal_notes(j):
    """What the reader of a journal should know about the journal itself: no
    summary, lines cut, unreadable, unknown, left out by the shim's budgets,
    lost to a full disk."""
    notes = []
    if j.summary is None and j.lines:
        notes.append("no summary: the process ended without one (killed?); "
                     "figures from the last samples and the journaled events")
    if j.partial:
        notes.append("the summary is incomplete: " + j.partial)
    if j.truncated:
        notes.append("the last line is truncated (skipped)")
    if j.bad_lines:
        notes.append("%s unreadable (skipped)" % plural(j.bad_lines, "line"))
    if j.unknown:
        notes.append("unknown events skipped: " + ", ".join(
            "%s x%d" % (k or "(none)", v) for k, v in sorted(j.unknown.items())))
    if j.suppressed:
        kinds = sorted(j.suppressed.items(), key=lambda kv: (-kv[1], kv[0]))
        notes.append("%s left out by the journal's budgets (counted, not written): %s" % (
            plural(sum(j.suppressed.values()), "line"),
            ", ".join("%s %s" % (k, fmt_count(v)) for k, v in kinds)))
    if j.lost_lines:
        notes.append("%s lost: the journal could not be written (full disk?)"
                     % plural(j.lost_lines, "line"))
    return notes


def header(journals, secs):
    text = "gpuguard report: %s, %s" % (plural(len(journals), "journal"),
                                        plural(len(secs), "device section"))
    n = left_out(journals)
    if n:
        text += "; %s left out (nothing allocated there)" % plural(n, "unused device")
    return text


def text_report(journals, failed, opts):
    out = []
    w = out.append
    secs = sections(journals)
    w(header(journals, secs))
    for line in verdict(journals, secs):
        w("  " + line)
    for path, why in failed:
        w("  cannot read %s: %s" % (path, why))
    if len(secs) > 1:
        w("")
        w("%-14s %-5s %-8s %-5s %10s %10s %10s %10s %5s %5s %5s %6s" % (
            "host", "rank", "pid", "GPU", "peak", "device", "limit", "total",
            "near", "ref", "oom", "advice"))
        for j, d in secs:
            f = figures(j, d)
            w("%-14s %-5s %-8s %-5s %10s %10s %10s %10s %5s %5s %5s %6s" % (
                (j.host or "?")[:14], "-" if j.rank is None else j.rank,
                "?" if j.pid is None else j.pid, "GPU%d" % d.dev,
                fmt_bytes(f["peak"]), fmt_bytes(f["peak_used"]), fmt_bytes(d.limit),
                fmt_bytes(d.total), fmt_count(f["near_misses"]), fmt_count(f["refusals"]),
                fmt_count(f["ooms"]), fmt_count(d.advice.n)))
    if getattr(opts, "recommend", False):
        w("")
        out.extend(recommend_text(opts.recs, opts.written))
        return "\n".join(out) + "\n"
    for j in journals:
        w("")
        w("=" * 78)
        w("%s  journal %s" % (j.ident, j.path))
        bits = []
        if j.version:
            bits.append("gpuguard %s" % j.version)
        if j.mode:
            bits.append("mode %s" % j.mode)
        bits.append("duration %s" % fmt_t(j.duration))
        if j.wall is not None:
            bits.append("started %s" % fmt_wall(j.wall))
        w("  " + ", ".join(bits))
        if j.lines == 0:
            w("  empty journal: no events")
        for note in journal_notes(j):
            w("  " + note)
        for msg, (t, n) in j.errors.items():
            w("  error at %s: %s%s" % (fmt_t(t), msg, "" if n == 1 else " (x%s)" % fmt_count(n)))
        if j.errors_dropped:
            w("  %s more errors with other messages" % fmt_count(j.errors_dropped))
        unused = [d for d in j.devices.values() if not d.used]
        if unused:
            w("  %s left out: %s" % (plural(len(unused), "unused device"),
                                     ", ".join("GPU%d" % d.dev for d in unused[:16])
                                     + (", ..." if len(unused) > 16 else "")))
        for line in backward_lines(j):
            w("  backward     " + line)
        for d in j.used_devices():
            device_text(w, j, d, opts)
        if j.notes:
            w("")
            w("  Notes:")
            for t, text in j.notes[:10]:
                first = text.splitlines()[0] if text else ""
                w("    %s  %s" % (fmt_t(t), first))
                loc = python_location(text)
                if loc:
                    w("             at " + loc)
            more = len(j.notes) - 10 + j.notes_dropped
            if more > 0:
                w("    (%s more)" % plural(more, "note"))
    return "\n".join(out) + "\n"


def device_text(w, j, d, opts):
    f = figures(j, d)
    w("")
    w("-- %s" % d.label)
    for label, lines in device_rows(j, d, opts):
        w("   %-12s %s" % (label, lines[0]))
        for line in lines[1:]:
            w("   %-12s %s" % ("", line))

    for block in torch_blocks(j, d):
        w("")
        for line in torch_block_text(block):
            w("   " + line)

    s = d.summary or {}
    sites = s.get("peak_sites")
    heading = "Allocation sites at the peak"
    if d.summary is None and d.work.peak_line is not None:
        # killed before its summary: the last `peak` line the shim wrote
        sites = d.work.peak_line.get("sites")
        step = d.work.peak_line.get("step")
        heading += " (the last written before the process was killed: %s%s)" % (
            fmt_bytes(d.work.peak_line.get("peak")),
            ", step %s" % fmt_count(step) if isinstance(step, int) else "")
    tree = site_tree(sites, opts.depth, opts.top_down, site_views(j, d)) \
        if isinstance(sites, list) else None
    if tree is not None and tree.bytes > 0:
        w("")
        if segments_note(j, d, sites):
            heading = heading.replace("Allocation sites at the peak",
                                      "Segments of PyTorch's cache at the peak, by the line "
                                      "that grew the cache for them (segments, not tensors: "
                                      "the blocks cut from them may hold other lines' tensors "
                                      "since; PyTorch's history names tensors)", 1)
        w("   " + heading + ":")
        for line in peak_tree_lines(f, sites, tree, opts):
            w("     " + line)
    elif frames_of(s, "peak_stack") or frames_of(s, "peak_pystack"):
        w("")
        w("   Stack of the allocation that made the peak:")
        for line in lines_in(j, s, peak_time(j, d), "peak_pystack", "peak_stack", opts.frames * 2,
                             nearest=True):
            w("     " + line)

    titles = {"near_miss": "Near misses", "refused": "Refused", "oom": "Out of memory (real allocator)"}
    for kind in STACK_EVENTS:
        inc = d.events[kind]
        if not inc.journaled:
            continue
        w("")
        total = f[{"near_miss": "near_misses", "refused": "refusals", "oom": "ooms"}[kind]]
        said = [] if total == inc.journaled else ["%s journaled" % fmt_count(inc.journaled)]
        if kind != "near_miss" and with_outcomes(d):
            rec = sum(1 for x in d.work.failures() if x["ev"] == kind and x["recovered"] is True)
            said.append(outcomes_text(rec, sum(1 for x in d.work.failures()
                                               if x["ev"] == kind and x["recovered"] is not True)))
        more = " (%s)" % ": ".join(said) if said else ""
        w("   %s: %s%s, by Python line:" % (titles[kind], fmt_count(total), more))
        lines = inc.sorted_lines()
        for ln in lines[:GROUPS_SHOWN]:
            w("     " + group_line(ln, d))
            for line in line_group_lines(ln, d):
                w("         " + line)
        rest = lines[GROUPS_SHOWN:]
        if rest:
            w("     %s more from %s" % (fmt_count(sum(g["count"] for g in rest)),
                                        plural(len(rest), "other Python line")))

    said = sizing_lines(d)
    if said:
        w("")
        for line in said:
            w("   " + line)

    if d.advice.n:
        adv = d.advice
        w("")
        given, unheard = f["advice"] or 0, f["advice_unheard"] or 0
        what = []
        if given or not unheard:
            what.append(plural(given, "advice", "advice") + (" given" if unheard else ""))
        if unheard:
            what.append("%s no trainer heard (would have advised)" %
                        plural(unheard, "advice", "advice"))
        reasons = ", ".join("%s %s" % (fmt_count(v), k) for k, v in sorted(adv.by_reason.items()))
        if given + unheard != adv.n:
            reasons += "; %s journaled" % fmt_count(adv.n)
        w("   Advice history: %s (%s)" % (", ".join(what), reasons))
        runs = adv.kept_runs()
        for i, run in enumerate(runs):
            if i == len(adv.head) and adv.omitted_runs:
                w("     ... %s not shown ..." % plural(adv.omitted_runs, "run"))
            w("     " + advice_run_line(run))
            loc = python_location(run["note"]) if run["note"] else None
            if loc:
                w("                   trainer at " + loc)
