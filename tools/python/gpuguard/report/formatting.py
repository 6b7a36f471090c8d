"""Numbers and times as report text: bytes in binary units, a size without a
needless decimal, percents, a time since start in the unit that fits, axis
time units, wall clock, grouped counts, plurals, rough durations.
"""

import time

from ..journal.values import num


def fmt_bytes(n, digits=1):
    n = num(n)
    if n is None:
        return "n/a"
    sign = "-" if n < 0 else ""
    n = abs(float(n))
    if n < 1024:
        return "%s%d B" % (sign, n)
    for unit in ("KiB", "MiB", "GiB", "TiB", "PiB"):
        n /= 1024.0
        if n < 1024 or unit == "PiB":
            return "%s%.*f %s" % (sign, digits, n, unit)


def fmt_pct(part, whole):
    part, whole = num(part), num(whole)
    if part is None or not whole:
        return "n/a"
    return "%.2f%%" % (100.0 * part / whole)


def fmt_t(t):
    """A time since a process's start, in the unit that fits: 12.34 s,
    12.3 min, 5 h 07 min, 3 d 4 h."""
    t = num(t)
    if t is None:
        return "?"
    t = max(t, 0.0)
    if t < 100:
        return "%.2f s" % t
    if t < 6000:
        return "%.1f min" % (t / 60.0)
    if t < 48 * 3600:
        return "%d h %02d min" % (t // 3600, t % 3600 // 60)
    return "%d d %d h" % (t // 86400, t % 86400 // 3600)


def time_unit(span):
    """The axis unit for a time span: (name, seconds)."""
    if span < 120:
        return "s", 1.0
    if span < 2 * 3600:
        return "min", 60.0
    if span < 48 * 3600:
        return "h", 3600.0
    return "days", 86400.0


def fmt_wall(w):
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(w))


def fmt_count(v):
    """A count; thousands grouped with spaces from 10 000 up."""
    v = num(v)
    if v is None:
        return "n/a"
    v = int(v)
    if abs(v) < 10000:
        return "%d" % v
    return "{:,}".format(v).replace(",", " ")


def plural(n, one, many=None):
    return "%s %s" % (fmt_count(n), one if n == 1 else (many or one + "s"))


def fmt_size(n):
    """A size without a needless decimal: 64 MiB, 1.5 GiB."""
    return fmt_bytes(n).replace(".0 ", " ")


def fmt_about(seconds):
    """A rough duration: 40 s, 12 min, 2 h, 2.5 h, 3 days."""
    if seconds < 90:
        return "%d s" % max(1, round(seconds))
    if seconds < 90 * 60:
        return "%d min" % round(seconds / 60.0)
    if seconds < 10 * 3600:
        return ("%.1f h" % (seconds / 3600.0)).replace(".0 ", " ")
    if seconds < 72 * 3600:
        return "%d h" % round(seconds / 3600.0)
    return ("%.1f days" % (seconds / 86400.0)).replace(".0 ", " ")
