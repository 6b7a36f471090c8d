"""Incident groups as lines, the same in text and HTML: a group's figures, a
stack under its Python line, a Python-line group with its stacks; and how
many of them are shown.
"""

from ..journal.limits import GROUPS_MAX
from ..journal.stacks import frame_label, pyframe_label
from .formatting import fmt_bytes, fmt_count, fmt_t, plural

GROUPS_SHOWN = 6            # Python-line groups printed per kind
STACKS_SHOWN = 4            # stacks printed under one Python line


def group_line(g, d, sub=False):
    """A group's figures: `3x  largest 512.0 MiB, 768.0 MiB in all; ...`;
    a stack under a Python line (`sub`) without the device's figures."""
    what = "%sx" % fmt_count(g["count"])
    if g["journaled"] != g["count"]:
        what += " (%s journaled)" % fmt_count(g["journaled"])
    text = "%s  largest %s, %s in all; %s .. %s" % (
        what, fmt_bytes(g["max_bytes"]), fmt_bytes(g["bytes"]), fmt_t(g["first"]),
        fmt_t(g["last"]))
    if not sub:
        text += "; device used up to %s (limit %s)" % (
            fmt_bytes(g["max_used"]), fmt_bytes(g["limit"] if g["limit"] is not None else d.limit))
    if g["apis"]:
        text += "; " + ", ".join(g["apis"])
    return text


def sub_frames(g):
    """A stack under its Python line: the Python callers (`py#1` ...), then
    the native frames; a stack without Python frames says so in its line.
    A stack read in PyTorch's terms keeps its own lines (merged, collapsed)."""
    if g.get("lines") is not None:
        return list(g["lines"])
    lines = ["py#%d %s" % (i, pyframe_label(f)) for i, f in enumerate(g["pyframes"][1:], 1)]
    lines += ["#%d %s" % (i, frame_label(f)) for i, f in enumerate(g["frames"])]
    return lines


def line_group_lines(ln, d):
    """The lines under a Python-line group's figures, the same in the text
    and the HTML: the Python line, then its stack, or each of its stacks
    with its own figures."""
    if ln["overflow"]:
        return ["(other stacks, beyond the %d grouped)" % GROUPS_MAX]
    subs = ln["subs"]
    if len(subs) == 1:
        return [ln["label"]] + ["  " + line for line in sub_frames(subs[0])]
    out = ["%s, from %s:" % (ln["label"], plural(len(subs), "stack"))]
    for g in subs[:STACKS_SHOWN]:
        out.append("  " + group_line(g, d, sub=True))
        out += ["      " + line for line in sub_frames(g)]
    rest = subs[STACKS_SHOWN:]
    if rest:
        out.append("  %s more from %s" % (fmt_count(sum(g["count"] for g in rest)),
                                          plural(len(rest), "other stack")))
    return out
