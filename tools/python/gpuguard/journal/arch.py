"""Whether a module's device code runs on a GPU: SASS `sm_XY[a|f]` against a
compute capability, and whether an `arch` event's module runs only by JIT
compilation of its PTX.
"""

import re

from .values import as_str

CODE_RE = re.compile(r"^(sm|compute)_(\d+)([af]?)$")


def sass_runs(name, cc):
    """Does SASS `sm_XY[a|f]` run on compute capability `cc` ("8.6")? Same
    major and a minor no higher; `a` code only on its exact arch, `f` code
    on its family (same major)."""
    m = CODE_RE.match(as_str(name, ""))
    try:
        major, minor = (int(v) for v in cc.split("."))
    except (ValueError, AttributeError):
        return False
    if not m or m.group(1) != "sm":
        return False
    amaj, amin = divmod(int(m.group(2)), 10)
    if m.group(3) == "a":
        return (amaj, amin) == (major, minor)
    return amaj == major and amin <= minor


def runs_only_by_jit(ev, cc, message):
    """An `arch` event of a module that runs: does it run only by JIT
    compilation of its PTX? The shim says so in its message; an event
    without one is judged from its SASS list."""
    if "JIT" in message:
        return True
    sass = ev.get("sass")
    if message or not isinstance(sass, list):
        return False
    return not any(sass_runs(n, cc) for n in sass)
