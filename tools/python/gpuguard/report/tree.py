"""The massif-style tree of the allocation sites at the peak: each site's path
(Python line first, native frames cut at the interpreter; top-down on
request), merged to a depth, rendered with a threshold fold, with its title
(which says the tree's direction) and what the listed sites leave out.
"""

import os
from collections import OrderedDict

from ..journal.frames import PY
from ..journal.stacks import (basename, frame_key, frame_label, frames_of, line_of,
                              looked_for_python, pyframe_key, pyframe_label, stack_of)
from ..journal.values import as_str, num
from .formatting import fmt_bytes, fmt_pct, plural


def is_interpreter(fr):
    """A frame of CPython's own code (libpython, or the python executable)."""
    mod = basename(fr.get("module"))
    return mod.startswith(("libpython", "python"))


class Node(object):
    __slots__ = ("label", "bytes", "allocs", "children", "cut")

    def __init__(self, label):
        self.label = label
        self.bytes = 0
        self.allocs = 0
        self.children = OrderedDict()
        self.cut = False


def short_line(label):
    """`model.py:18` of a Python line's label `/home/me/model.py:18 in f`."""
    where = label.split(" in ", 1)[0]
    return os.path.basename(where) or where


def inside(line_label, label):
    """The label of the first level, in a bottom-up tree, of what ran inside
    a Python line: it hangs under the line's outermost caller, and is no
    caller of it. The direction turns there, and the label says so."""
    return "inside %s, from the allocation out: %s" % (short_line(line_label), label)


def site_path(site, top_down=False, view=None):
    """A peak site's (key, label) levels. Bottom-up (massif's orientation):
    the innermost Python line, its Python callers outwards, then the native
    frames from the one that called the CUDA allocator up to the
    interpreter (the Python frames already say what the interpreter did),
    each the caller of the one before, the first labelled as inside the
    line (it is not a caller of the outermost Python frame above it).
    A site the shim took without Python frames leads with its thread.
    top_down: the outermost Python caller first, the allocator last: call
    order throughout.
    With a PyTorch view (gpuguard.journal.frames.View) its levels: the line
    outside torch, its callers, then what ran inside it (allocator, ATen
    ops, torch's own Python frames); on autograd's threads the backward
    and its node lead."""
    if view is not None:
        lead, path = view.path(top_down)
        if not top_down and view.user is not None:
            # [user] + its Python callers + what ran inside the user's line
            turn = 1 + sum(1 for e in view.entries[view.user + 1:] if e.kind == PY)
            if turn < len(path):
                path = list(path)
                path[turn] = (path[turn][0], inside(path[0][1], path[turn][1]))
        return lead, path
    py = [(pyframe_key(f), pyframe_label(f)) for f in frames_of(site, "pystack")]
    native = stack_of(site)
    if py:
        cut = next((i for i, f in enumerate(native) if is_interpreter(f)), len(native))
        native = native[:cut]
    nat = [(frame_key(f), frame_label(f)) for f in native]
    if top_down:
        py, nat = py[::-1], nat[::-1]
    elif py and nat:
        nat[0] = (nat[0][0], inside(py[0][1], nat[0][1]))
    lead = []
    if not py and looked_for_python(site) and (nat or as_str(site.get("thread"))):
        lead = [line_of(site)]
    return lead, py + nat


def site_tree(sites, depth, top_down=False, views=None):
    """Merge the stacks of `peak_sites` into a tree of `depth` levels below
    the Python line or thread each site leads with (site_path); `views`:
    a site's View in PyTorch's terms, or None (gpuguard.journal.pytorch)."""
    root = Node("")
    for site in sites if isinstance(sites, list) else []:
        if not isinstance(site, dict):
            continue
        b, a = num(site.get("bytes")) or 0, num(site.get("allocs")) or 0
        lead, path = site_path(site, top_down, views(site) if views is not None else None)
        if not path:
            # the shim's entry for what no listed site holds has no stack
            if "allocs" in site and site.get("allocs") is None:
                path = [(("rest",), "(in smaller sites, or allocated without a stack)")]
            else:
                path = [(("none",), "(no stack)")]
        root.bytes += b
        root.allocs += a
        node = root
        for key, label in lead + path[:depth]:
            child = node.children.get(key)
            if child is None:
                child = node.children[key] = Node(label)
            child.bytes += b
            child.allocs += a
            node = child
        if len(path) > depth:
            node.cut = True
    return root


def render_tree(root, base, threshold, title):
    """Massif-style lines; children below `threshold` percent of `base`
    are folded into one line."""
    base = base or root.bytes or 1
    lines = ["%s (%s) %s" % (fmt_pct(root.bytes, base), fmt_bytes(root.bytes), title)]

    def walk(node, prefix):
        kids = sorted(node.children.values(), key=lambda n: -n.bytes)
        shown = [k for k in kids if 100.0 * k.bytes / base >= threshold]
        small = [k for k in kids if k not in shown]
        rows = [(k, None) for k in shown]
        if small:
            sb = sum(k.bytes for k in small)
            rows.append((None, "%s (%s) in %s, all below the %.2f%% threshold" % (
                fmt_pct(sb, base), fmt_bytes(sb), plural(len(small), "place"), threshold)))
        for i, (k, text) in enumerate(rows):
            last = i == len(rows) - 1
            if k is None:
                lines.append(prefix + "->" + text)
                continue
            lines.append("%s->%s (%s) %s: %s" % (
                prefix, fmt_pct(k.bytes, base), fmt_bytes(k.bytes),
                plural(int(k.allocs), "alloc"), k.label))
            walk(k, prefix + ("  " if last else "| "))
            if k.cut and not k.children:
                lines.append(prefix + ("  " if last else "| ") + "->...")

    walk(root, "")
    return lines


def peak_tree_lines(f, sites, tree, opts):
    """The tree of the allocation sites at the peak, with its title and
    what the listed sites leave out."""
    base = f["peak"] if f["peak"] else tree.bytes
    title = "in %s listed at the process peak of %s; %s" % (
        plural(len(sites), "site"), fmt_bytes(f["peak"]),
        "under each line, what it called" if getattr(opts, "top_down", False)
        else "under each line, its caller")
    lines = render_tree(tree, base, opts.threshold, title)
    if f["peak"] and tree.bytes < f["peak"]:
        lines.append("(%s of the peak in sites the summary does not list)" %
                     fmt_bytes(f["peak"] - tree.bytes))
    return lines
