"""The self-contained HTML page: CSS, verdict list, the sections table, the
recommendation, per device its rows table, SVG charts, peak tree, incident
tables, advice table, notes, footer.
"""

from .. import __version__ as VERSION
from ..journal.device import figures
from ..journal.reader import sections
from ..journal.pytorch import lines_in
from ..journal.stacks import frames_of, python_location
from ..journal.values import as_str
from .formatting import fmt_bytes, fmt_count, fmt_t, plural
from .groups import GROUPS_SHOWN, line_group_lines
from .markup import esc
from .recommendation import recommend_text
from .rows import device_rows
from .sizing import sizing_lines, svg_sizing
from .svg import svg_steps, svg_timeline
from .text import header, journal_notes, peak_time, site_views
from .torchtext import backward_lines, torch_blocks
from .tree import peak_tree_lines, site_tree
from .verdict import verdict

CSS = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.4em; } h2 { font-size: 1.2em; margin-top: 2em; border-bottom: 1px solid #ccc; }
h3 { font-size: 1.05em; margin-top: 1.6em; }
table { border-collapse: collapse; margin: .5em 0; }
td, th { padding: 2px 10px; border-bottom: 1px solid #eee; text-align: left; vertical-align: top; }
td.n { text-align: right; font-variant-numeric: tabular-nums; }
pre { background: #f6f6f6; padding: .6em; overflow-x: auto; font-size: 12px; }
.warn { color: #a40; }
ul.verdict { font-family: ui-monospace, monospace; font-size: 13px; }
svg.timeline { font: 11px sans-serif; }
svg .plot { fill: #fcfcfc; stroke: #bbb; }
svg .grid { stroke: #e6e6e6; }
svg .tick, svg .legend { fill: #444; }
svg .line-used { fill: none; stroke: #1f5fbf; stroke-width: 1.5; }
svg .line-current { fill: none; stroke: #2a9d4b; stroke-width: 1.5; }
svg .area-current { fill: #2a9d4b; fill-opacity: .15; stroke: none; }
svg .line-limit { stroke: #d62728; stroke-width: 1.5; stroke-dasharray: 6 4; }
svg .line-total { stroke: #555; stroke-width: 1; }
svg .mark-near_miss { fill: #ff9900; stroke: #a05a00; }
svg .mark-refused { fill: #d62728; stroke: #700; }
svg .mark-oom { fill: none; stroke: #700; stroke-width: 2.5; }
svg .mark-advice { stroke: #7b3fbf; stroke-dasharray: 2 3; }
svg.steps { font: 11px sans-serif; }
svg .line-step-peak { fill: none; stroke: #e07b00; stroke-width: 1.5; }
svg .line-step-live { fill: none; stroke: #1f5fbf; stroke-width: 1.5; }
svg .trend-peak { stroke: #e07b00; stroke-width: 1.5; stroke-dasharray: 5 3; }
svg .trend-live { stroke: #1f5fbf; stroke-width: 1.5; stroke-dasharray: 5 3; }
svg .line-near { stroke: #ff9900; stroke-width: 1; stroke-dasharray: 3 3; }
svg .mark-predicted { fill: #7b3fbf; stroke: none; }
svg .mark-forecast { fill: #7b3fbf; stroke: #3d1f60; }
svg .mark-leak { fill: #d62728; stroke: #700; }
"""


def html_report(journals, failed, opts):
    o = []
    a = o.append
    secs = sections(journals)
    a("<!DOCTYPE html>")
    a('<html lang="en"><head><meta charset="utf-8"/>')
    a("<title>gpuguard report</title>")
    a("<style>%s</style></head><body>" % CSS)
    a("<h1>gpuguard report</h1>")
    a("<p>%s</p>" % esc(header(journals, secs)[len("gpuguard report: "):] + "."))
    lines = verdict(journals, secs)
    if lines:
        a('<h2>Verdict</h2><ul class="verdict">%s</ul>' % "".join(
            "<li>%s</li>" % esc(line) for line in lines))
    for path, why in failed:
        a('<p class="warn">cannot read %s: %s</p>' % (esc(path), esc(why)))
    if secs:
        a("<table><tr><th>host</th><th>rank</th><th>pid</th><th>GPU</th><th>peak</th>"
          "<th>device peak</th><th>limit</th><th>total</th><th>near misses</th>"
          "<th>refused</th><th>OOMs</th><th>advice</th></tr>")
        for j, d in secs:
            f = figures(j, d)
            a("<tr><td>%s</td><td>%s</td><td>%s</td><td>%s</td>%s</tr>" % (
                esc(j.host or "?"), esc("-" if j.rank is None else j.rank),
                esc("?" if j.pid is None else j.pid), esc(d.label),
                "".join('<td class="n">%s</td>' % esc(v) for v in (
                    fmt_bytes(f["peak"]), fmt_bytes(f["peak_used"]), fmt_bytes(d.limit),
                    fmt_bytes(d.total), fmt_count(f["near_misses"]), fmt_count(f["refusals"]),
                    fmt_count(f["ooms"]), fmt_count(d.advice.n)))))
        a("</table>")
    if getattr(opts, "recommend", False):
        a("<h2>Recommendation</h2><pre>%s</pre>" % esc("\n".join(
            recommend_text(opts.recs, opts.written))))
    for j in journals:
        a("<h2>%s</h2>" % esc(j.ident))
        bits = ["journal %s" % j.path]
        if j.version:
            bits.append("gpuguard %s" % j.version)
        if j.mode:
            bits.append("mode %s" % j.mode)
        bits.append("duration %s" % fmt_t(j.duration))
        a("<p>%s</p>" % esc(", ".join(bits)))
        for note in journal_notes(j):
            a('<p class="warn">%s.</p>' % esc(note[0].upper() + note[1:]))
        for msg, (t, n) in j.errors.items():
            a('<p class="warn">error at %s: %s%s</p>' % (
                esc(fmt_t(t)), esc(msg), "" if n == 1 else esc(" (x%s)" % fmt_count(n))))
        for line in backward_lines(j):
            a("<p>backward: %s</p>" % esc(line))
        for d in j.used_devices():
            f = figures(j, d)
            a("<h3>%s</h3>" % esc(d.label))
            a("<table>%s</table>" % "".join(
                "<tr><th>%s</th><td>%s</td></tr>" % (
                    esc(k), esc(v[0]) if len(v) == 1 else "<pre>%s</pre>" % esc("\n".join(v)))
                for k, v in device_rows(j, d, opts)))
            for title, lines, rows in torch_blocks(j, d):
                a("<h4>%s</h4>" % esc(title))
                a('<p class="torch">%s</p>' % "<br/>".join(esc(line) for line in lines))
                if rows is None:
                    a("<p>tensors: not recorded (PyTorch's allocation history was off then)</p>")
                elif rows:
                    a('<table class="tensors"><tr><th>bytes</th><th>tensors</th>'
                      '<th>line</th><th>ops</th></tr>%s</table>' % "".join(
                          '<tr><td class="n">%s</td><td class="n">%s</td><td>%s</td><td>%s</td></tr>'
                          % tuple(esc(v) for v in r) for r in rows))
            a(svg_timeline(j, d))
            if d.step_series.n:
                a(svg_steps(j, d))
            chart = svg_sizing(d)
            if chart is not None or sizing_lines(d):
                a("<h4>Batches sized by their shape</h4>")
                a("<pre>%s</pre>" % esc("\n".join(sizing_lines(d))))
                if chart is not None:
                    a(chart)
            sites = (d.summary or {}).get("peak_sites")
            tree = site_tree(sites, opts.depth, opts.top_down, site_views(j, d)) \
                if isinstance(sites, list) else None
            s = d.summary or {}
            if tree is not None and tree.bytes > 0:
                a("<h4>Allocation sites at the peak</h4>")
                a('<pre class="tree">%s</pre>' % esc("\n".join(peak_tree_lines(f, sites, tree, opts))))
            elif frames_of(s, "peak_stack") or frames_of(s, "peak_pystack"):
                a("<h4>Stack of the allocation that made the peak</h4>")
                a("<pre>%s</pre>" % esc("\n".join(
                    lines_in(j, s, peak_time(j, d), "peak_pystack", "peak_stack", opts.frames * 2,
                             nearest=True))))
            for kind, title in (("near_miss", "Near misses"), ("refused", "Refused"),
                                ("oom", "Out of memory")):
                inc = d.events[kind]
                if not inc.journaled:
                    continue
                a("<h4>%s (%s journaled), by Python line</h4>" % (
                    esc(title), esc(fmt_count(inc.journaled))))
                a("<table><tr><th>count</th><th>largest</th><th>first</th><th>last</th>"
                  "<th>device used up to</th><th>Python line, then the stack</th></tr>")
                for ln in inc.sorted_lines()[:GROUPS_SHOWN * 4]:
                    a('<tr><td class="n">%s</td><td class="n">%s</td><td class="n">%s</td>'
                      '<td class="n">%s</td><td class="n">%s</td><td><pre class="group">%s</pre>'
                      '</td></tr>' % (
                          esc(fmt_count(ln["count"])), esc(fmt_bytes(ln["max_bytes"])),
                          esc(fmt_t(ln["first"])), esc(fmt_t(ln["last"])),
                          esc(fmt_bytes(ln["max_used"])), esc("\n".join(line_group_lines(ln, d)))))
                a("</table>")
            if d.advice.n:
                adv = d.advice
                a("<h4>Advice history (%s)</h4>" % esc(plural(adv.n, "advice", "advice")))
                a("<table><tr><th>time</th><th>seq</th><th>count</th><th>reason</th><th>batch</th>"
                  "<th>accum</th><th>signaled</th><th>trainer at</th></tr>")
                for i, run in enumerate(adv.kept_runs()):
                    if i == len(adv.head) and adv.omitted_runs:
                        a('<tr><td colspan="8">... %s not shown ...</td></tr>' % esc(
                            plural(adv.omitted_runs, "run")))
                    loc = python_location(run["note"]) if run["note"] else None
                    seq = as_str(run["seq0"], "?")
                    if run["n"] > 1:
                        seq += "-" + as_str(run["seq1"], "?")
                    a('<tr><td class="n">%s</td><td class="n">%s</td><td class="n">%s</td><td>%s</td>'
                      '<td class="n">%s</td><td class="n">%s</td><td>%s</td><td>%s</td></tr>' % (
                          esc(fmt_t(run["t0"])), esc(seq), esc(fmt_count(run["n"])),
                          esc(run["reason"]), esc(as_str(run["batch"], "?")),
                          esc(as_str(run["accum"], "?")),
                          "yes" if run["signaled"] else "no", esc(loc or "")))
                a("</table>")
        if j.notes:
            a("<h4>Notes</h4>")
            for t, text in j.notes[:10]:
                a("<p>%s</p><pre>%s</pre>" % (esc(fmt_t(t)), esc(text)))
    a("<p><small>gpuguard-report %s</small></p>" % esc(VERSION))
    a("</body></html>")
    return "\n".join(o) + "\n"
