"""The report's account of batches sized by their shape: how each step's
predicted peak compared with what it measured, the model as fitted at
exit, and a chart of predicted against measured peaks."""

from ..journal.sizing import model_of
from .formatting import fmt_bytes, fmt_count, fmt_size, plural
from .markup import esc
from .svg import byte_unit, nice_step


def sizing_lines(d):
    """Text lines (none when no step was predicted and there is no model)."""
    s, model = d.sizing, model_of(d.summary)
    if not s.count and model is None:
        return []
    out = []
    if s.count:
        med = s.median_error()
        err, step, predicted, measured = s.worst
        out.append("Batches sized by their shape: %s predicted before they ran; predicted "
                   "against measured: median error %.1f%%, the largest %+.1f%% (step %s: "
                   "predicted %s, measured %s)" % (
                       plural(s.count, "step"),
                       100 * med, 100 * err, fmt_count(step), fmt_bytes(predicted),
                       fmt_bytes(measured)))
    if model is not None:
        quad = model["per_token2"] or 0
        out.append("  the run's memory model at exit: %s + %s per token%s (+- %s), from %s "
                   "with a shape, the largest %s tokens" % (
                       fmt_size(model["intercept"]), fmt_size(model["per_token"]),
                       " + %.3g B per token squared" % quad if quad > 0 else "",
                       fmt_size(model["sigma"] or 0), plural(model["steps"], "step"),
                       fmt_count(model["most_tokens"])))
    return out


def svg_sizing(d, width=960, height=280):
    """Each predicted step's predicted peak (points) and measured need (a
    line) against the step number, with the near-miss line; None when no
    step was predicted."""
    pts = d.sizing.points.items
    if not pts:
        return None
    L, R, T, B = 78, 150, 16, 40
    pw, ph = width - L - R, height - T - B
    xmin, xmax = pts[0][0], pts[-1][0]
    ymax = max([p[2] for p in pts] + [p[3] for p in pts] + [d.near_line or 0]) * 1.05 or 1.0
    xspan = float(xmax - xmin) or 1.0

    def x(v):
        return L + pw * ((v - xmin) / xspan)

    def y(v):
        return T + ph - ph * (min(max(float(v), 0.0), ymax) / ymax)

    o = []
    a = o.append
    a('<svg xmlns="http://www.w3.org/2000/svg" class="steps" width="%d" height="%d" '
      'viewBox="0 0 %d %d" role="img" aria-label="%s">' % (
          width, height, width, height,
          esc("predicted and measured peak of each step sized by its shape, " + d.label)))
    a('<rect x="%d" y="%d" width="%d" height="%d" class="plot"/>' % (L, T, pw, ph))
    unit, scale = byte_unit(ymax)
    step = nice_step(ymax / scale, 5)
    v = 0.0
    while v * scale <= ymax + 1e-9:
        yy = y(v * scale)
        a('<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" class="grid"/>' % (L, L + pw, yy, yy))
        a('<text x="%d" y="%.1f" class="tick" text-anchor="end">%s %s</text>' % (
            L - 6, yy + 4, ("%g" % round(v, 6)), unit))
        v += step
    a('<text x="%d" y="%d" class="tick" text-anchor="middle">step</text>' % (L + pw // 2, height - 4))
    path = "M%.1f,%.1f" % (x(pts[0][0]), y(pts[0][3])) + "".join(
        "L%.1f,%.1f" % (x(p[0]), y(p[3])) for p in pts[1:])
    a('<path d="%s" class="line-step-peak"><title>measured</title></path>' % path)
    for st, tokens, predicted, measured in pts:
        a('<circle cx="%.1f" cy="%.1f" r="2.5" class="mark-predicted"><title>%s</title></circle>'
          % (x(st), y(predicted), esc("step %s%s: predicted %s, measured %s" % (
              fmt_count(st), "" if tokens is None else " (%s tokens)" % fmt_count(tokens),
              fmt_bytes(predicted), fmt_bytes(measured)))))
    if d.near_line is not None:
        yy = y(d.near_line)
        a('<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" class="line-near"><title>near-miss line %s'
          '</title></line>' % (L, L + pw, yy, yy, esc(fmt_bytes(d.near_line))))
    lx, ly = L + pw + 14, T + 8
    for i, (cls, label) in enumerate((("line-step-peak", "measured"),
                                      ("mark-predicted", "predicted"),
                                      ("line-near", "near-miss line"))):
        yy = ly + 18 * i
        if cls == "mark-predicted":
            a('<circle cx="%d" cy="%d" r="3" class="%s"/>' % (lx + 9, yy, cls))
        else:
            a('<line x1="%d" x2="%d" y1="%d" y2="%d" class="%s"/>' % (lx, lx + 18, yy, yy, cls))
        a('<text x="%d" y="%d" class="legend">%s</text>' % (lx + 24, yy + 4, esc(label)))
    a("</svg>")
    return "\n".join(o)
