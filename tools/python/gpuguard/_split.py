"""Splitting a batch into micro-batches along its first dimension.

A batch is a tensor (anything with a ``shape`` of at least one dimension that
slices along it: torch, NumPy, JAX arrays), or nested dicts (any Mapping),
lists and tuples of them. Its length is the first dimension of its first
array, depth first. A list or tuple that holds an array anywhere inside is a
container and keeps its shape; one that holds none (strings, token id lists)
is a sequence of samples and is cut like an array. Everything else (scalars,
strings, None, arrays and sequences whose length is not the batch's) goes
whole to every piece.

Standard library only: arrays are recognised by their ``shape``.
"""

from collections.abc import Mapping

__all__ = ["batch_length", "input_shape", "split"]


def _is_array(x):
    if isinstance(x, (str, bytes)):
        return False
    shape = getattr(x, "shape", None)
    if shape is None:
        return False
    try:
        return len(shape) >= 1
    except TypeError:
        return False


def _holds_array(x):
    if _is_array(x):
        return True
    if isinstance(x, Mapping):
        return any(_holds_array(v) for v in x.values())
    if isinstance(x, (list, tuple)):
        return any(_holds_array(v) for v in x)
    return False


def _first_array_length(x):
    if _is_array(x):
        return int(x.shape[0])
    values = x.values() if isinstance(x, Mapping) else x if isinstance(x, (list, tuple)) else ()
    for v in values:
        n = _first_array_length(v)
        if n is not None:
            return n
    return None


def batch_length(batch):
    """The number of samples in `batch`, or None when nothing in it can be
    split (a scalar, a string, a mapping of scalars)."""
    n = _first_array_length(batch)
    if n is not None:
        return n
    if isinstance(batch, (list, tuple)):
        return len(batch)  # a plain sequence of samples
    return None


def _arrays(x):
    if _is_array(x):
        yield x
    elif isinstance(x, Mapping):
        for v in x.values():
            yield from _arrays(v)
    elif isinstance(x, (list, tuple)):
        for v in x:
            yield from _arrays(v)


def input_shape(batch):
    """The shape (a tuple of ints, batch first) of the largest array in
    `batch` by elements whose first dimension is the batch's: the input a
    step's memory follows (token ids [8, 7556]; an image batch [32, 3, 224,
    224]). None when the batch holds no array."""
    n = _first_array_length(batch)
    best, most = None, -1
    for a in _arrays(batch):
        try:
            shape = tuple(int(d) for d in a.shape)
        except (TypeError, ValueError):
            continue
        if not shape or shape[0] != n:
            continue
        elems = 1
        for d in shape:
            elems *= d
        if elems > most:
            best, most = shape, elems
    return best


def _rebuild(like, items):
    """A container of the same type as `like` holding `items`."""
    if isinstance(like, tuple) and hasattr(like, "_fields"):  # a namedtuple
        return type(like)(*items)
    try:
        return type(like)(items)
    except (TypeError, ValueError):  # a container type with another constructor
        return list(items) if isinstance(like, list) else tuple(items)


def _rebuild_mapping(like, pairs):
    try:
        return type(like)(pairs)
    except (TypeError, ValueError):  # e.g. a Mapping whose constructor wants more
        return dict(pairs)


def _cut(x, n, start, stop):
    if _is_array(x):
        return x[start:stop] if int(x.shape[0]) == n else x
    if isinstance(x, Mapping):
        return _rebuild_mapping(x, [(k, _cut(v, n, start, stop)) for k, v in x.items()])
    if isinstance(x, (list, tuple)):
        if _holds_array(x):
            return _rebuild(x, [_cut(v, n, start, stop) for v in x])
        return x[start:stop] if len(x) == n else x
    return x


def split(batch, pieces):
    """`batch` cut into at most `pieces` consecutive pieces of nearly equal
    size (the first ones one sample larger): a list of (piece, size). One
    piece is the batch itself, untouched; so is a batch that cannot be split."""
    n = batch_length(batch)
    if n is None or n <= 1 or pieces <= 1:
        return [(batch, n if n is not None else 1)]
    pieces = min(int(pieces), n)
    base, extra = divmod(n, pieces)
    out, start = [], 0
    for i in range(pieces):
        size = base + (1 if i < extra else 0)
        out.append((_cut(batch, n, start, start + size), size))
        start += size
    return out
