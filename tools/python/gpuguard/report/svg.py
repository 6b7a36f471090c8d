"""The two SVG charts of the HTML page: the memory timeline (process and device
use, limit, total, incident and advice marks, legend) and each step's peak
and live bytes with trends, limit, near-miss line, forecasts and leaks; axis
steps and units, envelope downsampling.
"""

import math

from ..journal.device import figures
from ..journal.incidents import STACK_EVENTS
from ..journal.values import as_str, num
from .formatting import fmt_bytes, fmt_count, fmt_size, fmt_t, time_unit
from .markup import esc


def nice_step(span, n):
    if span <= 0:
        return 1.0
    raw = span / float(n)
    mag = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 2.5, 5, 10):
        if raw <= m * mag:
            return m * mag
    return 10 * mag


def byte_unit(v):
    for name, scale in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if v >= scale:
            return name, float(scale)
    return "B", 1.0


def downsample(samples, buckets):
    """At most about 4 points per bucket, keeping each bucket's maxima."""
    if len(samples) <= buckets * 3:
        return samples
    t0, t1 = samples[0][0], samples[-1][0]
    span = (t1 - t0) or 1.0
    out, cur, key = [], [], None
    for s in samples:
        k = int((s[0] - t0) / span * buckets)
        if k != key and cur:
            out.extend(_bucket(cur))
            cur = []
        key = k
        cur.append(s)
    if cur:
        out.extend(_bucket(cur))
    return out


def _bucket(cur):
    pick = [cur[0],
            max(cur, key=lambda s: s[1] if s[1] is not None else -1),
            max(cur, key=lambda s: s[2] if s[2] is not None else -1),
            cur[-1]]
    seen, out = set(), []
    for s in sorted(pick, key=lambda s: s[0]):
        if id(s) not in seen:
            seen.add(id(s))
            out.append(s)
    return out


def svg_timeline(j, d, width=960, height=320):
    f = figures(j, d)
    L, R, T, B = 78, 150, 16, 40
    pw, ph = width - L - R, height - T - B
    samples = d.timeline.points()
    marks = [(k, e) for k in STACK_EVENTS for e in d.events[k].marks.items]
    advice = d.advice.marks.items
    tmax = max([j.duration] + [s[0] for s in samples[-1:]] + [e["t"] for _, e in marks]
               + [a["t"] for a in advice] + [0.0]) or 1.0
    vals = [d.total, d.limit, f["peak"], f["peak_used"]]
    vals += [v for s in samples for v in s[1:]]
    vals += [e["used"] for _, e in marks]
    ymax = max([v for v in vals if num(v) is not None] + [1]) * (1.0 if d.total else 1.05)

    def x(t):
        return L + pw * (t / tmax)

    def y(v):
        return T + ph - ph * (float(v) / ymax)

    o = []
    a = o.append
    a('<svg xmlns="http://www.w3.org/2000/svg" class="timeline" width="%d" height="%d" '
      'viewBox="0 0 %d %d" role="img" aria-label="%s">' % (
          width, height, width, height, esc("memory timeline of " + d.label)))
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
    tname, tscale = time_unit(tmax)
    tstep = nice_step(tmax / tscale, 8)
    t = 0.0
    while t * tscale <= tmax + 1e-9:
        xx = x(t * tscale)
        a('<line x1="%.1f" x2="%.1f" y1="%d" y2="%d" class="grid"/>' % (xx, xx, T, T + ph))
        a('<text x="%.1f" y="%d" class="tick" text-anchor="middle">%g %s</text>' % (
            xx, T + ph + 16, round(t, 6), tname))
        t += tstep
    a('<text x="%d" y="%d" class="tick" text-anchor="middle">time since start (%s)</text>' % (
        L + pw // 2, height - 4, tname))

    pts = downsample(samples, pw)
    for idx, cls in ((2, "used"), (1, "current")):
        seq = [(s[0], s[idx]) for s in pts if s[idx] is not None]
        if not seq:
            continue
        path = ["M%.1f,%.1f" % (x(seq[0][0]), y(seq[0][1]))]
        for t2, v2 in seq[1:]:
            path.append("H%.1fV%.1f" % (x(t2), y(v2)))
        path.append("H%.1f" % x(max(tmax, seq[-1][0])))
        line = "".join(path)
        if cls == "current":
            a('<path d="%s V%.1f H%.1f Z" class="area-current"/>' % (line, y(0), x(seq[0][0])))
        a('<path d="%s" class="line-%s"><title>%s</title></path>' % (
            line, cls, "device used" if cls == "used" else "process current"))
    for val, cls, label in ((d.total, "total", "total"), (d.limit, "limit", "limit")):
        if val is None:
            continue
        yy = y(val)
        a('<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" class="line-%s"><title>%s %s</title></line>' % (
            L, L + pw, yy, yy, cls, label, esc(fmt_bytes(val))))
    for adv in advice:
        xx = x(adv["t"])
        a('<line x1="%.1f" x2="%.1f" y1="%d" y2="%d" class="mark-advice"><title>%s</title></line>' % (
            xx, xx, T, T + ph, esc("advice #%s at %s: %s, batch %s x accum %s" % (
                as_str(adv["seq"], "?"), fmt_t(adv["t"]), adv["reason"],
                as_str(adv["batch"], "?"), as_str(adv["accum"], "?")))))
    for kind, e in marks:
        used = e["used"]
        xx, yy = x(e["t"]), y(used if used is not None else (d.limit or 0))
        tip = esc("%s at %s: %s of %s, device used %s%s" % (
            kind, fmt_t(e["t"]), e["api"] or "?", fmt_bytes(e["bytes"]),
            fmt_bytes(used), ("; " + e["where"]) if e["where"] else ""))
        if kind == "near_miss":
            a('<circle cx="%.1f" cy="%.1f" r="4" class="mark-near_miss"><title>%s</title></circle>' % (
                xx, yy, tip))
        elif kind == "refused":
            a('<path d="M%.1f,%.1f l5,8 h-10 Z" class="mark-refused"><title>%s</title></path>' % (
                xx, yy - 5, tip))
        else:
            a('<path d="M%.1f,%.1f l8,8 m0,-8 l-8,8" class="mark-oom"><title>%s</title></path>' % (
                xx - 4, yy - 4, tip))
    legend = [("line-used", "device used"), ("line-current", "process"),
              ("line-limit", "limit"), ("line-total", "total"),
              ("mark-near_miss", "near miss"), ("mark-refused", "refused"),
              ("mark-oom", "OOM"), ("mark-advice", "advice")]
    lx, ly = L + pw + 14, T + 8
    for i, (cls, label) in enumerate(legend):
        yy = ly + 18 * i
        if cls.startswith("line") or cls == "mark-advice":
            a('<line x1="%d" x2="%d" y1="%d" y2="%d" class="%s"/>' % (lx, lx + 18, yy, yy, cls))
        elif cls == "mark-near_miss":
            a('<circle cx="%d" cy="%d" r="4" class="%s"/>' % (lx + 9, yy, cls))
        elif cls == "mark-refused":
            a('<path d="M%d,%d l5,8 h-10 Z" class="%s"/>' % (lx + 9, yy - 5, cls))
        else:
            a('<path d="M%d,%d l8,8 m0,-8 l-8,8" class="%s"/>' % (lx + 5, yy - 4, cls))
        a('<text x="%d" y="%d" class="legend">%s</text>' % (lx + 24, yy + 4, esc(label)))
    if not samples:
        a('<text x="%d" y="%d" class="tick" text-anchor="middle">no samples</text>' % (
            L + pw // 2, T + ph // 2))
    a("</svg>")
    return "\n".join(o)


def envelope(points, buckets):
    """At most about 6 points per bucket of x: each bucket's first and last
    and those holding the highest and lowest of both series (index 1, 2),
    so a line through them stays a true envelope."""
    if len(points) <= buckets * 3:
        return points
    x0, x1 = points[0][0], points[-1][0]
    span = float(x1 - x0) or 1.0
    out, cur, key = [], [], None

    def flush():
        pick = [cur[0], cur[-1]]
        for idx in (1, 2):
            vals = [p for p in cur if p[idx] is not None]
            if vals:
                pick.append(max(vals, key=lambda p: p[idx]))
                pick.append(min(vals, key=lambda p: p[idx]))
        seen = set()
        for p in sorted(pick, key=lambda p: p[0]):
            if id(p) not in seen:
                seen.add(id(p))
                out.append(p)

    for p in points:
        k = int((p[0] - x0) / span * buckets)
        if k != key and cur:
            flush()
            cur = []
        key = k
        cur.append(p)
    if cur:
        flush()
    return out


def svg_steps(j, d, width=960, height=300):
    """Each step's peak and the live bytes at its boundary against the step
    number, the least-squares trends of the recent steps carried a fifth of
    the run ahead, the limit and the near-miss line, the forecasts (where
    each said a step would peak) and the leak reports."""
    L, R, T, B = 78, 150, 16, 40
    pw, ph = width - L - R, height - T - B
    pts = d.step_series.points()
    trends = d.trends()
    first, last = pts[0][0], pts[-1][0]
    ahead = last + max(1, (last - first) // 5) if trends else last
    fmarks = [m for m in d.advice.forecast_marks.items
              if num(m["forecast"].get("step")) is not None and num(m["forecast"].get("bytes")) is not None]
    lmarks = [m for m in d.leak_marks.items if m["step"] is not None and m["live"] is not None]
    xmax = max([ahead] + [int(m["forecast"]["step"]) for m in fmarks
                          if m["forecast"]["step"] <= last + (last - first + 1)])
    xmin = min(first, min([int(m["forecast"]["step"]) for m in fmarks] or [first]))
    vals = [d.total, d.limit] + [v for p in pts for v in p[1:3]] + \
        [m["forecast"]["bytes"] for m in fmarks]
    ymax = max([v for v in vals if num(v) is not None] + [1]) * (1.0 if d.total else 1.05)
    xspan = float(xmax - xmin) or 1.0

    def x(v):
        return L + pw * ((v - xmin) / xspan)

    def y(v):
        return T + ph - ph * (min(max(float(v), 0.0), ymax) / ymax)

    o = []
    a = o.append
    a('<svg xmlns="http://www.w3.org/2000/svg" class="steps" width="%d" height="%d" '
      'viewBox="0 0 %d %d" role="img" aria-label="%s">' % (
          width, height, width, height, esc("peak and live bytes per step of " + d.label)))
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
    sstep = max(1, int(nice_step(xspan, 8)))
    k = (xmin + sstep - 1) // sstep * sstep
    while k <= xmax:
        xx = x(k)
        a('<line x1="%.1f" x2="%.1f" y1="%d" y2="%d" class="grid"/>' % (xx, xx, T, T + ph))
        a('<text x="%.1f" y="%d" class="tick" text-anchor="middle">%d</text>' % (xx, T + ph + 16, k))
        k += sstep
    a('<text x="%d" y="%d" class="tick" text-anchor="middle">step</text>' % (L + pw // 2, height - 4))
    drawn = envelope(pts, pw)
    for idx, cls, what in ((1, "step-peak", "peak of each step"),
                           (2, "step-live", "live bytes at each step's end")):
        seq = [(p[0], p[idx]) for p in drawn if p[idx] is not None]
        if not seq:
            continue
        path = "M%.1f,%.1f" % (x(seq[0][0]), y(seq[0][1])) + "".join(
            "L%.1f,%.1f" % (x(s0), y(s1)) for s0, s1 in seq[1:])
        a('<path d="%s" class="line-%s"><title>%s</title></path>' % (path, cls, what))
    # A trend per batch phase over its own steps; the last phase's over its
    # recent steps (the report's "trend" row), carried ahead.
    phases = d.phase_trends()
    if trends:
        last_phase = dict(phases[-1]) if phases else {"batch": None, "accum": None}
        last_phase.update(trends)
        phases[-1:] = [last_phase]
    for i, phase in enumerate(phases):
        for name in ("peak", "live"):
            if name not in phase:
                continue
            c, slope = phase[name]
            x0, x1 = phase["steps"]
            if i == len(phases) - 1:
                x1 = max(x1, ahead)
            y0, y1 = c + slope * x0, c + slope * x1
            if slope > 0 and y1 > ymax:         # stop where it leaves the plot
                x1 = (ymax - c) / slope
                y1 = ymax
            a('<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" class="trend-%s"><title>%s</title>'
              '</line>' % (x(x0), x(max(x1, x0)), y(y0), y(y1), name, esc(
                  "%s trend over steps %s .. %s%s: %s%s per step" % (
                      name, fmt_count(phase["steps"][0]), fmt_count(phase["steps"][1]),
                      "" if phase["batch"] is None else ", batch %s x accum %s" % (
                          phase["batch"], phase["accum"]),
                      "+" if slope >= 0 else "-", fmt_size(abs(slope))))))
    for val, cls, label in ((d.total, "total", "total"), (d.limit, "limit", "limit"),
                            (d.near_line, "near", "near-miss line")):
        if val is None:
            continue
        yy = y(val)
        a('<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" class="line-%s"><title>%s %s</title></line>' % (
            L, L + pw, yy, yy, cls, label, esc(fmt_bytes(val))))
    for m in fmarks:
        fc = m["forecast"]
        xx, yy = x(fc["step"]), y(fc["bytes"])
        a('<path d="M%.1f,%.1f l5,5 l-5,5 l-5,-5 Z" class="mark-forecast"><title>%s</title></path>' % (
            xx, yy - 5, esc("forecast%s: step %s would peak at %s; advised batch %s x accum %s" % (
                "" if m["at"] is None else " at step %s" % fmt_count(m["at"]), fmt_count(fc["step"]),
                fmt_bytes(fc["bytes"]), as_str(m["batch"], "?"), as_str(m["accum"], "?")))))
    for m in lmarks:
        xx, yy = x(m["step"]), y(m["live"])
        a('<path d="M%.1f,%.1f l5,-8 h-10 Z" class="mark-leak"><title>%s</title></path>' % (
            xx, yy, esc("leak at step %s: +%s per step since step %s%s" % (
                fmt_count(m["step"]), fmt_size(m["rate"]), as_str(m["since"], "?"),
                "" if m["projected"] is None else "; the limit at step %s" % fmt_count(m["projected"])))))
    legend = [("line-step-peak", "step peak"), ("line-step-live", "live at step end"),
              ("trend-peak", "peak trend"), ("trend-live", "live trend"),
              ("line-near", "near-miss line"), ("line-limit", "limit"),
              ("mark-forecast", "forecast"), ("mark-leak", "leak")]
    lx, ly = L + pw + 14, T + 8
    for i, (cls, label) in enumerate(legend):
        yy = ly + 18 * i
        if cls == "mark-forecast":
            a('<path d="M%d,%d l5,5 l-5,5 l-5,-5 Z" class="%s"/>' % (lx + 9, yy - 5, cls))
        elif cls == "mark-leak":
            a('<path d="M%d,%d l5,-8 h-10 Z" class="%s"/>' % (lx + 9, yy + 4, cls))
        else:
            a('<line x1="%d" x2="%d" y1="%d" y2="%d" class="%s"/>' % (lx, lx + 18, yy, yy, cls))
        a('<text x="%d" y="%d" class="legend">%s</text>' % (lx + 24, yy + 4, esc(label)))
    a("</svg>")
    return "\n".join(o)
