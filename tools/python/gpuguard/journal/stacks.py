"""Stack frames as the shim writes them (native `stack`, Python `pystack`):
labels (`sym+off (module)`, `file:line in func`), grouping keys, the Python
line a stack is grouped under, where an allocation came from, a whole stack
as lines, and the trainer's location in a note's Python traceback (skipping
the gpuguard helper's own frames).
"""

import re

from .values import as_str, num

PYFRAME_RE = re.compile(r'^\s*File "(?P<file>[^"]*)", line (?P<line>\d+), in (?P<func>.*)$')


def basename(path):
    path = as_str(path, "")
    return path.rsplit("/", 1)[-1] if path else "?"


def fmt_off(off):
    if isinstance(off, str):
        return off
    off = num(off)
    return None if off is None else "0x%x" % int(off)


def frame_label(fr):
    """`sym+off (module)`, or `ip (module)` for an unsymbolized frame."""
    sym = as_str(fr.get("sym"))
    mod = basename(fr.get("module"))
    if sym:
        off = fmt_off(fr.get("off"))
        text = sym if off in (None, "0x0") else "%s+%s" % (sym, off)
    else:
        text = as_str(fr.get("ip"), "?")
    return "%s (%s)" % (text, mod)


def frame_key(fr):
    """Frames of the same function in the same module count as one."""
    sym = as_str(fr.get("sym"))
    return (basename(fr.get("module")), sym if sym else "@" + as_str(fr.get("ip"), "?"))


def pyframe_label(fr):
    return "%s:%s in %s" % (as_str(fr.get("file"), "?"), as_str(fr.get("line"), "?"),
                            as_str(fr.get("func"), "?"))


def pyframe_key(fr):
    return ("py", as_str(fr.get("file"), "?"), as_str(fr.get("line"), "?"))


def frames_of(obj, key="stack"):
    st = obj.get(key) if isinstance(obj, dict) else None
    if type(st) is not list:
        return []
    return [f for f in st if isinstance(f, dict)]


def stack_of(obj):
    return frames_of(obj, "stack")


# The Python helper's own modules: where the trainer was is the frame that
# called into them (a batch boundary, guard.run), not the helper's inside.
HELPER_FILE_RE = re.compile(r"[/\\]gpuguard[/\\](__init__|_\w+|adapters)\.py$")


def python_location(text):
    """`file:line in func` of the innermost frame of a Python stack outside
    the gpuguard helper (the helper's own when there is no other)."""
    loc = helper_loc = None
    lines = as_str(text, "").splitlines()
    for i, line in enumerate(lines):
        m = PYFRAME_RE.match(line)
        if m:
            here = "%s:%s in %s" % (m.group("file"), m.group("line"), m.group("func"))
            if i + 1 < len(lines) and not PYFRAME_RE.match(lines[i + 1]):
                src = lines[i + 1].strip()
                if src:
                    here += ": " + src
            if HELPER_FILE_RE.search(m.group("file")):
                helper_loc = here
            else:
                loc = here
    return loc or helper_loc


def thread_note(obj):
    """What a stack the shim took without Python frames says of its thread:
    autograd's backward threads and NCCL's run no Python code."""
    name = as_str(obj.get("thread")) if isinstance(obj, dict) else None
    return "(no Python frames: thread %s)" % name if name else "(no Python frames)"


def looked_for_python(obj, key="pystack"):
    """Did the shim look for Python frames here? (A journal from before
    Python frames has no `pystack` at all: nothing to say about them.)"""
    return isinstance(obj, dict) and type(obj.get(key)) is list


def line_of(obj, key="pystack", stack_key="stack"):
    """(key, label) of the Python line a stack is grouped under: its
    innermost Python frame; a stack without one is grouped by its thread."""
    py = frames_of(obj, key)
    if py:
        return pyframe_key(py[0]), pyframe_label(py[0])
    thread = as_str(obj.get("thread")) if isinstance(obj, dict) else None
    if not frames_of(obj, stack_key) and not thread:
        return ("none",), "(no stack)"
    return ("thread", thread), thread_note(obj)


def first_native(stack):
    """The frame that best names native code: the first symbolized one of
    the top few, else the top one."""
    for fr in stack[:3]:
        if as_str(fr.get("sym")):
            return fr
    return stack[0]


def where(ev, key="pystack", stack_key="stack"):
    """Where an event's allocation came from: the innermost Python line,
    else the first native frame and, when the shim looked, the thread that
    had no Python frames."""
    py = frames_of(ev, key)
    if py:
        return pyframe_label(py[0])
    st = frames_of(ev, stack_key)
    if not st:
        return None
    text = frame_label(first_native(st))
    if looked_for_python(ev, key):
        text += " " + thread_note(ev)
    return text


def stack_lines(obj, key="pystack", stack_key="stack", limit=None):
    """A whole stack, Python line first: `py#0 file:line in func`, its
    Python callers, then the native frames (`#0 sym+off (module)`); a
    stack without Python frames says so, with its thread."""
    py = frames_of(obj, key)[:limit]
    native = frames_of(obj, stack_key)[:limit]
    out = ["py#%d %s" % (i, pyframe_label(f)) for i, f in enumerate(py)]
    if not py and native and looked_for_python(obj, key):
        out.append(thread_note(obj))
    out += ["#%d %s" % (i, frame_label(f)) for i, f in enumerate(native)]
    return out or ["(no stack)"]
