"""The text of a Python source line, for the report to quote (the line that
called `.backward()`), read the way a traceback reads it: from the file named
in the frame, when the report's machine can read it. Lenient and bounded: only
regular files up to SOURCE_MAX_BYTES (under --substitute-path's TO
when it names one), read up to the line; never raises; the
text is stripped, without control characters, cut at SOURCE_CHARS; at most
SOURCE_CACHE lines remembered.
"""

import os
import stat
from collections import OrderedDict

SOURCE_MAX_BYTES = 8 << 20
SOURCE_CHARS = 100
SOURCE_CACHE = 256

_cache = OrderedDict()
_substitutions = []


def set_substitutions(pairs):
    """[(FROM, TO)]: a path under FROM is read under TO instead (the first
    pair whose FROM is a whole-component prefix of the path); the journal's
    own paths are shown as they are."""
    del _substitutions[:]
    for old, new in pairs or ():
        if isinstance(old, str) and isinstance(new, str) and old:
            _substitutions.append((old.rstrip("/") or "/", new))
    _cache.clear()


def substituted(path):
    """Where to read path: under the first substitution whose FROM holds it."""
    for old, new in _substitutions:  # old: "/", or without a trailing "/"
        if old == "/" and path.startswith("/"):
            return os.path.join(new, path[1:])
        if path == old or path.startswith(old + "/"):
            return new.rstrip("/") + path[len(old):]
    return path


def _read(path, line):
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)
    try:
        fd = os.open(path, flags)
    except (OSError, ValueError, TypeError):
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > SOURCE_MAX_BYTES:
            return None
        with os.fdopen(fd, "r", encoding="utf-8", errors="replace") as f:
            fd = None
            for i, text in enumerate(f, 1):
                if i == line:
                    return text
    except (OSError, ValueError):
        return None
    finally:
        if fd is not None:
            os.close(fd)
    return None


def source_line(path, line, must_contain=None):
    """The stripped text of line `line` of `path`, or None (unreadable, no
    such line, or without `must_contain`: the file is not what ran)."""
    if not isinstance(path, str) or not path or type(line) is not int or line < 1:
        return None
    key = (path, line)
    if key in _cache:
        text = _cache[key]
    else:
        raw = _read(substituted(path), line)
        text = None
        if raw is not None:
            text = "".join(c if c.isprintable() else " " for c in raw.strip())
            if len(text) > SOURCE_CHARS:
                text = text[:SOURCE_CHARS - 3] + "..."
            text = text or None
        _cache[key] = text
        while len(_cache) > SOURCE_CACHE:
            _cache.popitem(last=False)
    if text is not None and must_contain and must_contain not in text:
        return None
    return text
