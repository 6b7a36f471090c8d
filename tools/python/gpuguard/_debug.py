"""What gpuguard's Python side swallows, counted.

The helper and the instrumentation run inside the user's program, often from
a hook (a signal handler, an optimizer or autograd hook, an import hook, at
exit): an error of theirs must never reach the user's code. Where they cannot
name the exceptions they expect (a call into torch, which may raise anything)
they catch them all, and count them here, by place. With GPUGUARD_DEBUG=1
(or yes, true, on), the first of each kind at each place
is said on stderr, and the counts at exit; otherwise nothing is printed.
"""

import atexit
import os
import sys
import threading

#: Read once: GPUGUARD_DEBUG set to a true value.
ON = os.environ.get("GPUGUARD_DEBUG", "").strip().lower() in ("1", "yes", "true", "on")

#: (place, exception type name) -> how many times it was swallowed.
counts = {}
_lock = threading.Lock()


def swallowed(where, exc):
    """Counts `exc`, caught and dropped at `where`; says it under
    GPUGUARD_DEBUG the first time that place drops that type. Never raises."""
    try:
        key = (where, type(exc).__name__)
        with _lock:
            n = counts[key] = counts.get(key, 0) + 1
        if ON and n == 1:
            sys.stderr.write("gpuguard: debug: %s swallowed %s: %s\n" % (
                where, key[1], str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""))
    except Exception:  # noqa: the counter itself must not raise (stderr closed, ...)
        pass


def total():
    """Every exception swallowed so far, all places together."""
    with _lock:
        return sum(counts.values())


def _say_counts():
    if ON and counts:
        try:
            sys.stderr.write("gpuguard: debug: swallowed %d exception(s): %s\n" % (
                total(), ", ".join("%s %s x%d" % (w, t, n) for (w, t), n in sorted(counts.items()))))
        except (OSError, ValueError):
            pass


atexit.register(_say_counts)
