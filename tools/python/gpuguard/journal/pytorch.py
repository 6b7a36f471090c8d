"""What a journal says in PyTorch's terms, kept bounded: the `backward` lines
(where `.backward()` was called; autograd's threads work for the latest one
until the next), the `torch` lines (PyTorch's caching allocator at a refusal,
an OOM, a near miss or a forecast: reserved, allocated, reserved but
unallocated, the largest free block, segments, and tensors by line when its
history was on), and the readable view of a stack (frames.build) with the
backward it belongs to.
"""

from bisect import bisect_right
from collections import OrderedDict

from .frames import backward_site, build, is_pytorch, user_frame
from .incidents import FAILURES
from .source import source_line
from .stacks import frames_of, looked_for_python, pyframe_key, pyframe_label, stack_lines, where
from .values import as_int, as_str, num

BACKWARD_RUNS = 4096        # runs of backward lines of one site kept (then thinned)
BACKWARD_SITES = 64         # distinct .backward() lines kept with their counts
TORCH_TENSORS = 32          # tensor groups kept per `torch` line
TORCH_SEGMENT_CLASSES = 16  # size classes kept per `torch` line
TORCH_PYFRAMES = 64         # Python frames kept per tensor group
VIEW_CACHE = 4096           # readable views remembered (by stack)
SNAPSHOT_FIELDS = ("reserved", "allocated", "unallocated", "largest_free", "inactive_split",
                   "request")


def backward_source(path, line):
    """The text of the line that called `.backward()`, when it says so."""
    return source_line(path, line, "backward")


class BackwardLog(object):
    """The `backward` lines of a process: runs of lines of one site in time
    order (the latest before a moment is the backward autograd's threads
    worked for), and the sites with their running counts."""

    def __init__(self):
        self.starts = []
        self.runs = []               # [first t, last t, site]
        self.sorted = True
        self.sites = OrderedDict()   # key -> {"site", "calls", "lines", "thread", "step", "first", "last"}
        self.lines = 0

    def add(self, ev, t):
        self.lines += 1
        probe = backward_site(ev)
        entry = self.sites.get(probe["key"])
        if entry is None:
            site = backward_site(ev, backward_source)
            entry = {"site": site, "calls": 0, "lines": 0, "thread": as_str(ev.get("thread")),
                     "step": None, "first": t, "last": t}
            if len(self.sites) < BACKWARD_SITES:
                self.sites[probe["key"]] = entry
        entry["lines"] += 1
        count = as_int(ev.get("count"))
        entry["calls"] = max(entry["calls"], count if count and count > 0 else entry["lines"])
        step = as_int(ev.get("step"))
        if step is not None:
            entry["step"] = step
        entry["last"] = max(entry["last"], t)
        site = entry["site"]
        if self.runs and self.runs[-1][2] is site and t >= self.runs[-1][0]:
            self.runs[-1][1] = max(self.runs[-1][1], t)
            return
        if self.starts and t < self.starts[-1]:
            self.sorted = False
        self.starts.append(t)
        self.runs.append([t, t, site])
        if len(self.runs) > BACKWARD_RUNS:
            self._sort()
            self.runs = self.runs[::2]
            self.starts = [r[0] for r in self.runs]

    def _sort(self):
        if not self.sorted:
            self.runs.sort(key=lambda r: r[0])
            self.starts = [r[0] for r in self.runs]
            self.sorted = True

    def at(self, t, nearest=False):
        """The site of the latest backward line at or before t, or None;
        nearest: the first one when none was before t (a time known only
        roughly, the peak's from the samples)."""
        if not self.runs:
            return None
        self._sort()
        i = bisect_right(self.starts, t) - 1
        if i < 0:
            return self.runs[0][2] if nearest else None
        return self.runs[i][2]


def snapshot(ev, t):
    """A `torch` line's figures, leniently: numbers or None, a bool or None,
    bounded segments and tensors."""
    s = {"t": t, "why": (as_str(ev.get("why"), "?") or "?")[:24], "step": as_int(ev.get("step"))}
    for k in SNAPSHOT_FIELDS:
        v = num(ev.get(k))
        s[k] = v if v is not None and v >= 0 else None
    fits = ev.get("fits_unfragmented")
    s["fits"] = fits if type(fits) is bool else None
    s["raised"] = ev.get("raised") is True
    # the moment it was asked about (read later, at t); None: PyTorch's OOM
    # observer's, read as PyTorch raised
    s["asked"] = num(ev.get("asked"))
    kept = num(ev.get("kept"))
    s["kept"] = kept if kept is not None and kept >= 0 else None
    segs = ev.get("segments")
    s["segments"] = OrderedDict()
    if isinstance(segs, dict):
        for k, v in segs.items():
            v = as_int(v)
            if v is not None and v >= 0 and len(s["segments"]) < TORCH_SEGMENT_CLASSES:
                s["segments"][as_str(k, "?")[:24]] = v
    tensors = ev.get("tensors")
    s["tensors"] = None
    if isinstance(tensors, list):
        s["tensors"] = []
        for x in tensors:
            if not isinstance(x, dict):
                continue
            if len(s["tensors"]) >= TORCH_TENSORS:
                break
            b = num(x.get("bytes"))
            py = frames_of(x, "pystack")[:TORCH_PYFRAMES]
            op = as_str(x.get("op"))
            s["tensors"].append({"bytes": b if b is not None and b >= 0 else 0,
                                 "count": as_int(x.get("count")), "pystack": py,
                                 "op": op[:80] if op else None})
    return s


BEFORE_HISTORY = "(allocated before PyTorch's history was on)"
LIVE_BESIDES = "(everything else live: allocated in other steps)"


def tensors_by_line(snap):
    """The snapshot's tensors grouped by the line that allocated them (the
    innermost Python frame outside torch's own package; an entry without
    Python frames holds what was allocated before the history was on), most
    bytes first: [{"label", "bytes", "count", "ops", "func", "line"}]."""
    groups = OrderedDict()
    for x in snap.get("tensors") or []:
        _, fr = user_frame(x["pystack"])
        key = pyframe_key(fr) if fr is not None else ("before",)
        g = groups.get(key)
        if g is None:
            g = groups[key] = {"label": pyframe_label(fr) if fr is not None else
                               (LIVE_BESIDES if snap.get("why") == "leak" else BEFORE_HISTORY),
                               "line": fr is not None,
                               "func": as_str(fr.get("func"), "") if fr is not None else "",
                               "bytes": 0, "count": 0, "ops": []}
        g["bytes"] += x["bytes"]
        g["count"] += x["count"] if x["count"] is not None and x["count"] > 0 else 1
        if x["op"] and x["op"] not in g["ops"] and len(g["ops"]) < 3:
            g["ops"].append(x["op"])
    return sorted(groups.values(), key=lambda g: (-g["bytes"], g["label"]))


def raised_attempts(failures):
    """(the last failure, the first of its attempts): PyTorch's allocator
    tries again after emptying its cache, so one OutOfMemoryError it raises
    can follow several refusals of the same request from the same thread;
    the trailing run of failures of the same bytes and thread is one."""
    last = failures[-1]
    first = last
    for e in reversed(failures):
        if e.get("bytes") != last.get("bytes") or e.get("thread") != last.get("thread"):
            break
        first = e
    return last, first


class TorchDevice(object):
    """One device's `torch` lines: how many, by why; the first and the last
    of each why; the one that answered the device's first refusal or OOM;
    the most PyTorch reported reserved; whether it had expandable segments."""

    def __init__(self):
        self.n = 0
        self.by_why = OrderedDict()
        self.first = OrderedDict()
        self.last = OrderedDict()
        self.answer = None
        self.raised = None       # (the first snapshot PyTorch raised at, its failure, its first attempt)
        self.failure_views = []  # the first and the last views of failures (refused, oom)
        self.with_tensors = []   # the first views with tensors (not a leak check's)
        self.max_reserved = None
        self.expandable = False

    def add(self, snap, failed_at):
        self.n += 1
        why = snap["why"]
        self.by_why[why] = self.by_why.get(why, 0) + 1
        self.first.setdefault(why, snap)
        self.last[why] = snap
        r = snap["reserved"]
        if r is not None and (self.max_reserved is None or r > self.max_reserved):
            self.max_reserved = r
        if snap["segments"].get("expandable"):
            self.expandable = True
        if (self.answer is None and why in FAILURES and failed_at is not None
                and snap["t"] >= failed_at):
            self.answer = snap
        if snap["tensors"] and why != "leak" and len(self.with_tensors) < 16:
            self.with_tensors.append(snap)
        if why in FAILURES:
            if len(self.failure_views) >= 32:
                del self.failure_views[16]  # the first 16 and the latest
            self.failure_views.append(snap)

    def shown(self):
        """The snapshots a device section shows, in time order: the answer
        to its first failure, and the first of each why."""
        out = [self.answer] if self.answer is not None else []
        for snap in self.first.values():
            if all(snap is not s for s in out):
                out.append(snap)
        return sorted(out, key=lambda s: s["t"])


class TorchLog(object):
    """A journal's PyTorch view: the backward lines, each device's `torch`
    lines, and stacks read in PyTorch's terms (none with native=True)."""

    def __init__(self, native=False):
        self.native = native
        self.backward = BackwardLog()
        self.devices = {}
        self._views = {}

    def device(self, dev):
        td = self.devices.get(dev)
        if td is None:
            td = self.devices[dev] = TorchDevice()
        return td

    def torch(self, ev, t, d):
        """A `torch` line of device d (gpuguard.journal.Device)."""
        firsts = [d.events[k].first["t"] for k in FAILURES if d.events[k].first is not None]
        snap = snapshot(ev, t)
        td = self.device(d.dev)
        td.add(snap, min(firsts) if firsts else None)
        if snap["raised"] and td.raised is None and d.recent_failures:
            td.raised = (snap,) + raised_attempts(d.recent_failures)

    def view(self, obj, t=None, key="pystack", stack_key="stack", nearest=False):
        """The readable View of a stack (an incident, a site, the summary's
        peak), or None: with --native, or for a stack not through PyTorch.
        A stack without Python frames is tied to the latest backward line
        before t (nearest: BackwardLog.at)."""
        if self.native or not isinstance(obj, dict):
            return None
        stack = frames_of(obj, stack_key)
        if not stack or not is_pytorch(stack):
            return None
        py = frames_of(obj, key)
        thread = as_str(obj.get("thread"))
        bw = self.backward.at(t, nearest) if not py and t is not None else None
        ck = (tuple((as_str(f.get("ip")), as_str(f.get("sym"))) for f in stack),
              tuple(pyframe_key(f) for f in py),
              thread, None if bw is None else bw["key"], looked_for_python(obj, key))
        v = self._views.get(ck)
        if v is None:
            if len(self._views) >= VIEW_CACHE:
                self._views.clear()
            v = self._views[ck] = build(stack, py, thread, bw, looked_for_python(obj, key))
        return v


def view_of(j, obj, t=None, key="pystack", stack_key="stack", nearest=False):
    """A journal's readable View of a stack, or None (see TorchLog.view)."""
    pt = getattr(j, "pt", None)
    return pt.view(obj, t, key, stack_key, nearest) if pt is not None else None


def where_in(j, obj, t=None, key="pystack", stack_key="stack"):
    """Where an allocation came from, in PyTorch's terms when its stack runs
    through PyTorch (the line outside torch and the op; on autograd's
    threads the backward and its node), else as stacks.where says it."""
    v = view_of(j, obj, t, key, stack_key)
    return v.where if v is not None else where(obj, key, stack_key)


def lines_in(j, obj, t=None, key="pystack", stack_key="stack", limit=None, nearest=False):
    """A whole stack as lines, merged and collapsed when it runs through
    PyTorch (limit: the Python callers shown past the line), else as
    stacks.stack_lines says it (limit: frames of each half)."""
    v = view_of(j, obj, t, key, stack_key, nearest)
    if v is not None:
        return v.stack_lines(limit or 4)
    return stack_lines(obj, key, stack_key, limit)
