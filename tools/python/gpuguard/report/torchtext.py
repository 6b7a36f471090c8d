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
from ..journal.values import as_str, num
from .formatting import fmt_bytes, fmt_count, fmt_size, fmt_t, plural

EXPANDABLE_ADVICE = "`PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` would have fit it"
WHY = {"refused": "the refusal", "oom": "the OOM", "near_miss": "the first near miss of its step",
       "forecast": "the forecast", "leak": "a leak (the tensors one step allocated that the next did not free)"}
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
    """`3.9 GiB reserved but unallocated, largest free block 512 MiB:
    fragmentation; ... would have fit it`, or real demand, or the figures
    alone when the instrumentation could not judge."""
    parts = []
    if snap["unallocated"] is not None:
        parts.append("%s reserved but unallocated" % fmt_size(snap["unallocated"]))
    if snap["largest_free"] is not None:
        parts.append("largest free block %s" % fmt_size(snap["largest_free"]))
    if not parts:
        return None
    text = ", ".join(parts)
    if snap["fits"] is True:
        text += ": fragmentation; " + ("expandable segments were already on" if expandable
                                       else EXPANDABLE_ADVICE)
    elif snap["fits"] is False:
        text += ": real demand (it would not have fit had the free bytes been one block)"
    return text


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
        snap = td.answer if td is not None else None
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
    parts = [p for p in (held, fragmentation_text(snap, td.expandable)) if p]
    if parts:
        text += ": " + "; ".join(parts)
    return text


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
    for snap in td.shown():
        if snap["t"] >= ff["t"] and snap["tensors"]:
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
    """`PyTorch's allocator at the OOM (step 812), 12.03 s`."""
    step = " (step %s)" % fmt_count(snap["step"]) if snap["step"] is not None else ""
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
    if snap["request"] is not None or snap["fits"] is not None:
        text = "asked %s" % fmt_bytes(snap["request"]) if snap["request"] is not None else "the request"
        if snap["fits"] is True:
            text += ": fragmentation: it would have fit had the free bytes been one block; " + (
                "expandable segments were already on" if expandable else EXPANDABLE_ADVICE)
        elif snap["fits"] is False:
            text += ": real demand: it would not have fit had the free bytes been one block"
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
    \\`loss.backward()\\` (train.py:57 in main)`."""
    pt = getattr(j, "pt", None)
    if pt is None or not pt.backward.lines:
        return []
    out = []
    for e in pt.backward.sites.values():
        out.append("%s: %s%s" % (plural(e["calls"], "call"), e["site"]["phrase"],
                                 ", last at step %s" % fmt_count(e["step"])
                                 if e["step"] is not None else ""))
    return out
