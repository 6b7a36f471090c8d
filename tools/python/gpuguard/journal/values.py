"""Lenient reading of JSON field values: a finite number or None, an int or a
default, a str or a default. Every reader and renderer uses these; they never
raise on odd input.
"""

import math


def num(v):
    """v when it is a finite number (not a bool), else None."""
    t = type(v)
    if t is int:
        return v
    if t is float:
        return v if math.isfinite(v) else None
    return None


def as_int(v, default=None):
    if type(v) is int:
        return v
    v = num(v)
    return default if v is None else int(v)


def as_str(v, default=None):
    if v is None:
        return default
    return v if isinstance(v, str) else str(v)
