"""The report in PyTorch's terms, the same in text and HTML: the first
failure's sentence (which op or backward node asked, at which step, which
tensors held the memory by line, fragmentation or real demand, and whether
expandable segments would have fit it), the device section's blocks
"PyTorch's allocator at ...", the peak that expandable segments' failed
growth explains, and where `.backward()` was called.
"""

from ..journal.incidents import STACK_EVENTS
from ..journal.frames import user_frame
from ..journal.pytorch import tensors_by_line, view_of
from ..journal.stacks import frames_of, pyframe_key, pyframe_label
from ..journal.values import as_int, as_str, num
from .formatting import fmt_bytes, fmt_count, fmt_size, fmt_t, plural
from .workload import judge_snapshot

EXPANDABLE_ADVICE = "`PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` would have fit it"
WHY = {"refused": "the refusal", "oom": "the OOM", "near_miss": "the first near miss of its step",
       "forecast": "the forecast",
       "leak": "a leak check (the tensors one step allocated that the next did not free)"}
EXPANDABLE_APIS = ("cuMemCreate", "cuMemMap")


def torch_device(j, d):
    pt = getattr(j, "pt", None)
    return pt.devices.get(d.dev) if pt is not None else None


def why_text(snap):
    return WHY.get(snap["why"], "a `%s` request" % snap["why"])


def is_forward(func):
    """A function of a module's forward pass (`Block.forward`, `forward`)."""
    return func == "forward" or func.endswith(".forward")


def held_text(snap, backward):
    """`18.5 GiB held by 27 activations from model.py:18 in Block.forward`:
    the line whose tensors held the most (tensors a forward made that a
    backward still holds are its activations)."""
    groups = [g for g in tensors_by_line(snap) if g["line"]]
    if not groups:
        return None
    g = groups[0]
    noun = "activation" if backward and is_forward(g["func"]) else "tensor"
    return "%s held by %s from %s" % (fmt_size(g["bytes"]), plural(g["count"], noun), g["label"])


def held_at_peak(d, e, backward):
    """Without PyTorch's history: when the failure came at the process's
    peak (what it held then is the peak), the Python line that grew
    PyTorch's cache the most among the shim's peak sites (the segments it
    asked CUDA for, which its blocks live in), `128 MiB of PyTorch's cache
    grown for activations at model.py:45 in Block.forward (4 segments)`;
    None otherwise (a peak elsewhere says nothing of this moment)."""
    peak = num((d.summary or {}).get("peak"))
    held = num(e.get("allocated"))
    sites = (d.summary or {}).get("peak_sites")
    if peak is None or held is None or held < peak or not isinstance(sites, list):
        return None
    groups = {}
    for site in sites:
        if not isinstance(site, dict):
            continue
        _, fr = user_frame(frames_of(site, "pystack"))
        if fr is None:
            continue
        g = groups.setdefault(pyframe_key(fr), {"label": pyframe_label(fr), "bytes": 0, "allocs": 0,
                                                "func": as_str(fr.get("func"), "")})
        g["bytes"] += num(site.get("bytes")) or 0
        g["allocs"] += num(site.get("allocs")) or 0
    if not groups:
        return None
    g = max(groups.values(), key=lambda g: (g["bytes"], g["label"]))
    what = "for activations " if backward and is_forward(g["func"]) else ""
    return "%s of PyTorch's cache grown %sat %s (%s)" % (
        fmt_size(g["bytes"]), what, g["label"], plural(g["allocs"], "segment"))


def fragmentation_text(snap, expandable):
    """`as PyTorch raised (its cache emptied): 3.9 GiB reserved but
    unallocated, largest free block 512 MiB: fragmentation; ... would have
    fit it`, or real demand, or the figures alone (with their moment) when
    they do not say (workload.judge_snapshot)."""
    parts = []
    if snap["unallocated"] is not None:
        parts.append("%s reserved but unallocated" % fmt_size(snap["unallocated"]))
    if snap["largest_free"] is not None:
        parts.append("largest free block %s" % fmt_size(snap["largest_free"]))
    if not parts:
        return None
    judged = judge_snapshot(snap)
    text = moment_text(snap) + ": " + ", ".join(parts)
    if judged.kind == "fragmentation":
        text += ": fragmentation; " + ("expandable segments were already on" if expandable
                                       else EXPANDABLE_ADVICE)
    elif judged.kind == "demand":
        text += ": real demand (it would not have fit had the free bytes been one block)"
    return text


def moment_text(snap, who="PyTorch"):
    """Which moment a view's figures are of: `as PyTorch raised (its cache
    emptied)`, `read 0.21 s after the first near miss of its step`."""
    if snap.get("asked") is not None:
        return "read %s after %s (the main thread's next safe point)" % (
            fmt_t(max(0.0, snap["t"] - snap["asked"])), why_text(snap))
    if snap.get("raised"):
        return "as %s raised OutOfMemoryError (its cache emptied, its retry failed)" % who
    return "at %s" % why_text(snap)


def failure_sentence(j, d, e, snap=None):
    """The first failure in PyTorch's terms, when the instrumentation
    answered it with a `torch` line: "OOM at step 812 in backward of
    `loss.backward()` (train.py:57 in main), `MmBackward0` asked 1.2 GiB:
    18.5 GiB held by 27 activations from model.py:18 in Block.forward;
    3.9 GiB reserved but unallocated, largest free block 512 MiB:
    fragmentation; `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` would
    have fit it"."""
    td = torch_device(j, d)
    if snap is None:
        # a journal that says what came of each failure: the view about this
        # one; else (an older shim's) the first view after the first failure
        snap = view_for(td, e) if "retried" in e else (td.answer if td is not None else None)
    if snap is None:
        return None
    text = "OOM" if e.get("ev") == "oom" else "Refusal"
    if snap["step"] is not None:
        text += " at step %s" % fmt_count(snap["step"])
    elif e.get("step") is not None:
        text += " after step %s" % fmt_count(e["step"])
    view = view_of(j, e, e.get("t"))
    who = None
    backward = False
    if view is not None:
        backward = view.in_backward
        text += (" in " if backward else " at ") + view.head
        who = (view.node or view.op) if backward else view.op
    asked = snap["request"] if snap["request"] is not None else num(e.get("bytes"))
    if who:
        text += ", `%s` asked %s" % (who, fmt_size(asked))
    else:
        text += ", asking %s" % fmt_size(asked)
    held = held_text(snap, backward) or held_at_peak(d, e, backward)
    parts = [p for p in (held, ledger_text(e), fragmentation_text(snap, td.expandable)) if p]
    if parts:
        text += ": " + "; ".join(parts)
    return text


def ledger_text(e):
    """What the shim knew at the failure itself (no Python runs then):
    `at the failure the process held 24.4 GiB on the device (gpuguard's
    ledger) and PyTorch's flush released 17.0 GiB before its retry`."""
    reserved, freed = num(e.get("reserved")), num(e.get("freed"))
    if reserved is None or e.get("recovered") not in (True, False):
        return None
    text = "at the failure the process held %s on the device (gpuguard's ledger)" % (
        fmt_size(reserved))
    if e.get("retried"):
        text += " and PyTorch's flush released %s before its retry" % fmt_size(freed or 0)
    return text


def view_for(td, e):
    """The `torch` line about failure e: PyTorch's OOM observer's (raised)
    at or after it, else the first failure view after it."""
    if td is None:
        return None
    t = e.get("t", 0.0)
    later = [s for s in td.failure_views if s["t"] >= t - 1e-6]
    for s in later:
        if s["raised"]:
            return s
    if later:
        return later[0]
    return td.answer


def raised_lines(j, d, first):
    """When PyTorch raised OutOfMemoryError at a later failure than the
    first (the ones before were recovered: it emptied its cache and the
    retry fit): [`PyTorch raised torch.OutOfMemoryError 0.66 s into the run,
    at a later failure; ...:`, that failure's sentence]; [] otherwise."""
    td = torch_device(j, d)
    if td is None or td.raised is None:
        return []
    snap, e, attempt = td.raised
    if first is not None and attempt["t"] <= first["t"]:
        return []  # the first failure is (a try of) the one PyTorch raised
    head = ("PyTorch raised torch.OutOfMemoryError %s into the run, at a later failure; the ones "
            "before it were recovered (PyTorch emptied its cache and the retry fit):"
            % fmt_t(e["t"]))
    sentence = failure_sentence(j, d, e, snap)
    return [head] + (["  " + sentence] if sentence else [])


def forecast_tensors(j, d):
    """After a forecast, the first snapshot with tensors (PyTorch's history
    on for the forecast step): `its step's tensors at the first near miss of
    its step (step 9): 12 GiB held by 40 tensors from ...`, or None."""
    td = torch_device(j, d)
    ff = d.advice.first_forecast
    if td is None or ff is None:
        return None
    named = as_int(ff["forecast"].get("step"))
    cands = [s for s in td.with_tensors if s["t"] >= ff["t"]]
    cands.sort(key=lambda s: (s["step"] != named, s["t"]))  # the named step's first
    for snap in cands:
        if snap["tensors"]:
            held = held_text(snap, False)
            if held:
                step = " (step %s)" % fmt_count(snap["step"]) if snap["step"] is not None else ""
                return "the forecast step's tensors at %s%s: %s" % (why_text(snap), step, held)
    return None


def leak_tensors(j, d):
    """After a leak, what PyTorch's history caught: `19 MiB a step kept in
    40 tensors, most from model.py:45 in forward (9 MiB, 10 tensors;
    torch.nn.modules.linear.forward)`: the tensors one step allocated that
    the next did not free, by line; None without that view."""
    td = torch_device(j, d)
    leak = d.last_leak
    if td is None or leak is None:
        return None
    snap = td.last.get("leak")
    if snap is None or not snap["tensors"]:
        return None
    groups = [g for g in tensors_by_line(snap) if g["line"]]
    if not groups:
        return None
    kept, count = sum(g["bytes"] for g in groups), sum(g["count"] for g in groups)
    g = groups[0]
    text = "%s a step kept in %s, most from %s (%s, %s%s)" % (
        fmt_size(kept), plural(count, "tensor"), g["label"], fmt_size(g["bytes"]),
        plural(g["count"], "tensor"), "; " + ", ".join(g["ops"]) if g["ops"] else "")
    if len(groups) > 1:
        more = len(groups) - 1
        text += " and %s more line%s" % (fmt_count(more), "" if more == 1 else "s")
    return text


def snapshot_title(snap):
    """`PyTorch's allocator as it raised OutOfMemoryError (...) (step 812),
    12.03 s`: the moment its figures are of."""
    step = " (step %s)" % fmt_count(snap["step"]) if snap["step"] is not None else ""
    if snap.get("asked") is not None or snap.get("raised"):
        return "PyTorch's allocator %s%s, %s" % (moment_text(snap, "it"), step, fmt_t(snap["t"]))
    return "PyTorch's allocator at %s%s, %s" % (why_text(snap), step, fmt_t(snap["t"]))


def snapshot_lines(snap, expandable):
    """A snapshot's figures as lines (the tensors aside)."""
    figures = []
    for key, label in (("reserved", "reserved"), ("allocated", "allocated"),
                       ("unallocated", "reserved but unallocated"),
                       ("largest_free", "largest free block"),
                       ("inactive_split", "inactive split")):
        if snap[key] is not None:
            figures.append("%s %s" % (label, fmt_bytes(snap[key])))
    out = [", ".join(figures)] if figures else ["(no figures)"]
    if snap["segments"]:
        out.append("segments: " + ", ".join("%s %s" % (fmt_count(v), k)
                                            for k, v in snap["segments"].items()))
    if snap.get("kept") is not None:
        out.append("kept: %s of the tensors one step allocated were still held at the end of "
                   "the next%s" % (fmt_bytes(snap["kept"]), "" if snap["kept"] else
                                   ": nothing kept, no leak (the live bytes grew for another "
                                   "reason: growing inputs, or a cache that keeps what it "
                                   "reserved)"))
    if snap["request"] is not None or snap["fits"] is not None:
        text = "asked %s" % fmt_bytes(snap["request"]) if snap["request"] is not None else "the request"
        judged = judge_snapshot(snap)
        if judged.kind == "fragmentation":
            text += ": fragmentation: it would have fit had the free bytes been one block; " + (
                "expandable segments were already on" if expandable else EXPANDABLE_ADVICE)
        elif judged.kind == "demand":
            text += ": real demand: it would not have fit had the free bytes been one block"
        elif judged.why:
            text += ": " + judged.why
        elif snap.get("asked") is not None:
            text += " (these figures are of a later moment than the request: no verdict from them)"
        out.append(text)
    return out


def tensor_rows(snap):
    """(bytes, count, line, ops) per line of the snapshot's tensors, most
    bytes first; None when PyTorch's history was off."""
    if snap["tensors"] is None:
        return None
    return [(fmt_bytes(g["bytes"]), plural(g["count"], "tensor"), g["label"], ", ".join(g["ops"]))
            for g in tensors_by_line(snap)]


def torch_blocks(j, d):
    """The device's blocks: [(title, lines, tensor rows or None)]."""
    td = torch_device(j, d)
    if td is None or not td.n:
        return []
    shown = td.shown()
    out = [(snapshot_title(s), snapshot_lines(s, td.expandable), tensor_rows(s)) for s in shown]
    if td.n > len(shown):
        out[-1][1].append("(%s in all: %s)" % (plural(td.n, "snapshot"), ", ".join(
            "%s %s" % (fmt_count(v), k) for k, v in td.by_why.items())))
    return out


def torch_block_text(block):
    """A block as the text report's lines (without indentation)."""
    title, lines, rows = block
    out = [title + ":"] + ["  " + line for line in lines]
    if rows is None:
        out.append("  tensors: not recorded (PyTorch's allocation history was off then)")
    elif rows:
        out.append("  tensors by line, most bytes first:")
        w = [max(len(r[i]) for r in rows) for i in range(2)]
        for r in rows:
            out.append("    %*s  %-*s  %s%s" % (w[0], r[0], w[1], r[1], r[2],
                                                 "  (%s)" % r[3] if r[3] else ""))
    return out


def incident_apis(d):
    apis = set()
    for kind in STACK_EVENTS:
        inc = d.events[kind]
        for g in list(inc.groups.values()) + ([inc.other] if inc.other else []):
            apis.update(g["apis"])
    return apis


def expandable_on(j, d):
    """Did the process run PyTorch's expandable segments (a `torch` line's
    segments, or incidents of cuMemCreate / cuMemMap)?"""
    td = torch_device(j, d)
    if td is not None and td.expandable:
        return True
    return bool(incident_apis(d).intersection(EXPANDABLE_APIS))


def expandable_peak(j, d, f):
    """One line when the process's peak is above the most PyTorch reported
    reserved and expandable segments were in use: a growth that fails
    midway maps chunks and releases them, which the device held for that
    moment and torch.cuda.max_memory_reserved() never counts."""
    td = torch_device(j, d)
    peak = f.get("peak")
    if td is None or td.max_reserved is None or peak is None or peak <= td.max_reserved:
        return None
    if not td.expandable and not incident_apis(d).intersection(EXPANDABLE_APIS):
        return None
    return ("%s above the most PyTorch reported reserved (%s): with expandable segments a growth "
            "that fails midway maps its chunks and releases them; the device held them for that "
            "moment, torch.cuda.max_memory_reserved() never counts them"
            % (fmt_bytes(peak - td.max_reserved), fmt_bytes(td.max_reserved)))


def backward_lines(j):
    """Where `.backward()` was called, per line: `812 calls: backward of
    \\`loss.backward()\\` (train.py:57 in main)`. The shim thins the lines per
    call site (each carries its site's running count): with one site, the
    summary's total is its calls; with several, each is at least its count."""
    pt = getattr(j, "pt", None)
    if pt is None or not pt.backward.lines:
        return []
    out = []
    sites = list(pt.backward.sites.values())
    total = getattr(j, "backward_calls", None)
    for e in sites:
        calls = plural(e["calls"], "call")
        if total is not None and len(sites) == 1:
            calls = plural(max(total, e["calls"]), "call")
        elif total is not None and total > e["calls"]:
            calls = "at least " + calls
        out.append("%s: %s%s" % (calls, e["site"]["phrase"],
                                 ", last at step %s" % fmt_count(e["step"])
                                 if e["step"] is not None else ""))
    if total is not None and len(sites) > 1:
        out.append("%s in all" % plural(total, "call"))
    return out
