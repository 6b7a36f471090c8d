"""One device's near misses, refusals or OOMs: counts (with the shim's running
per-site counts), the first in full, groups by Python line and then by stack
(bounded by GROUPS_MAX, then "other stacks"), thinned marks. Also the
incident kinds.
"""

from collections import OrderedDict

from .limits import GROUPS_MAX, SITES_MAX
from .series import Thinned
from .stacks import frame_key, line_of, pyframe_key, stack_lines, where
from .values import as_str, num

STACK_EVENTS = ("near_miss", "refused", "oom")
FAILURES = ("refused", "oom")


def by_count(g):
    """Groups in order: the most frequent first, then the most bytes."""
    return (-g["count"], -g["bytes"])


class Incidents(object):
    """One device's near misses, refusals or OOMs: counts, the first one in
    full, groups by Python line (the innermost Python frame; a stack
    without one by its thread) and under each line by stack (its top
    `nframes` Python and native frames), at most GROUPS_MAX stacks in all
    and then "other stacks", and thinned marks for the timeline. With a
    PyTorch view (`ctx`, gpuguard.journal.pytorch.TorchLog) a stack through
    PyTorch is grouped in its terms instead: under the line outside torch
    that asked (or, on autograd's threads, the backward and its node), by
    its readable entries, and the group keeps its lines."""

    def __init__(self, kind, nframes):
        self.kind = kind
        self.nframes = nframes
        self.journaled = 0
        self.counted = 0         # with the shim's running near-miss counts
        self.groups = OrderedDict()   # stack key -> group
        self.lines = OrderedDict()    # line key -> group of groups
        self.other = None
        self.site_counts = {}
        self.marks = Thinned()
        self.first = None

    def add(self, ev, t, step, ctx=None):
        self.journaled += 1
        stack = ev.get("stack")
        if type(stack) is not list:
            stack = []
        py = ev.get("pystack")
        if type(py) is not list:
            py = []
        # Near misses carry the shim's running count per call site (it writes
        # the first 8, then the 16th, 32nd, ...): each line stands for the
        # near misses since the last one of its site.
        c = ev.get("count")
        n = 1
        if type(c) is int and c >= 1:
            site = tuple(f.get("ip") if isinstance(f, dict) else None for f in stack)
            last = self.site_counts.get(site)
            if last is not None:
                n = c - last if c > last else c
                self.site_counts[site] = c
            elif len(self.site_counts) < SITES_MAX:
                self.site_counts[site] = c
                n = c
        self.counted += n
        b = num(ev.get("bytes")) or 0
        used = num(ev.get("used"))
        view = ctx.view(ev, t) if ctx is not None else None
        if view is None:
            pyf = [f for f in py[:self.nframes] if isinstance(f, dict)]
            natf = [f for f in stack[:self.nframes] if isinstance(f, dict)]
            lkey, llabel = line_of({"pystack": pyf, "stack": natf, "thread": ev.get("thread")})
            key = (lkey,) + tuple(pyframe_key(f) for f in pyf[1:]) + tuple(frame_key(f) for f in natf)
        else:
            lkey, llabel = view.line
            key = view.group_key(self.nframes)
        g = self.groups.get(key)
        if g is None:
            if len(self.groups) < GROUPS_MAX:
                g = self.groups[key] = self._group(t, ev)
                if view is None:
                    g["pyframes"], g["frames"] = pyf, natf
                else:
                    g["lines"] = view.lines(self.nframes)
                ln = self.lines.get(lkey)
                if ln is None:
                    ln = self.lines[lkey] = self._group(t, ev)
                    ln["label"] = llabel
                    ln["subs"] = []
                ln["subs"].append(g)
                g["line"] = ln
            else:
                if self.other is None:
                    self.other = self._group(t, ev)
                    self.other["overflow"] = True
                    self.other["line"] = None
                g = self.other
        api = as_str(ev.get("api"))
        self._tally(g, n, b, t, used, api)
        if g["line"] is not None:
            self._tally(g["line"], n, b, t, used, api)
        if self.marks.want():
            self.marks.add({"t": t, "bytes": num(ev.get("bytes")), "used": used,
                            "limit": num(ev.get("limit")), "total": num(ev.get("total")),
                            "api": api, "where": where(ev) if view is None else view.where,
                            "stack": stack_lines(ev, limit=8) if view is None else view.stack_lines(8)})
        if self.first is None or t < self.first["t"]:
            e = dict(ev)
            e["t"] = t
            e["step"] = step
            self.first = e

    @staticmethod
    def _tally(g, n, b, t, used, api):
        g["count"] += n
        g["journaled"] += 1
        g["bytes"] += b
        if b > g["max_bytes"]:
            g["max_bytes"] = b
        if t < g["first"]:
            g["first"] = t
        if t > g["last"]:
            g["last"] = t
        if used is not None and (g["max_used"] is None or used > g["max_used"]):
            g["max_used"] = used
        if api is not None and api not in g["apis"] and len(g["apis"]) < 8:
            g["apis"].append(api)

    @staticmethod
    def _group(t, ev):
        return {"count": 0, "journaled": 0, "bytes": 0, "max_bytes": 0, "first": t, "last": t,
                "max_used": None, "frames": [], "pyframes": [], "lines": None, "apis": [],
                "limit": num(ev.get("limit")), "overflow": False}

    def sorted_lines(self):
        """The Python-line groups, most frequent first, each with its stacks
        (`subs`) in the same order; "other stacks" last."""
        lines = sorted(self.lines.values(), key=by_count)
        for ln in lines:
            ln["subs"].sort(key=by_count)
        if self.other is not None:
            lines.append(self.other)
        return lines
