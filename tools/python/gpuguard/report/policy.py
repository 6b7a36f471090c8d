"""--out DIR: each recommendation as a policy .ini file the shim's parser reads
(sizes as exact percentages or units, a [gpu] match glob, wrapped comments,
unique file names); writing text files.
"""

import os
import re
import textwrap
from collections import OrderedDict


def ini_size(n, total):
    """A size as the policy parser reads it: a percentage of total when one
    gives exactly these bytes, else the largest binary unit that divides."""
    n = int(n)
    if total:
        hundredths = int(round(10000.0 * n / total))
        if 0 < hundredths < 10000 and total * hundredths // 10000 == n:
            return "%g%%" % (hundredths / 100.0)
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n and n % scale == 0:
            return "%d %s" % (n // scale, unit)
    return "%d" % n


def ini_glob(name):
    """The device name as a [gpu] match glob that matches only it: glob
    characters escaped, the list separator and comment starters wildcarded."""
    out = []
    for ch in name:
        if ch in "*?[]\\":
            out.append("\\" + ch)
        elif ch in ",;#":
            out.append("?")
        else:
            out.append(ch)
    return "".join(out).strip()


def policy_text(r, sources):
    # inih takes lines of 199 characters at most: comments are wrapped
    comment = "written by gpuguard-report --recommend from %s. %s: batch %d x accum %d. Why: %s" % (
        ", ".join(sources), r.name, r.batch, r.accum, r.why)
    lines = ["; " + line for line in textwrap.wrap(comment, 96, break_long_words=True,
                                                    break_on_hyphens=False)]
    lines += ["[gpu]",
             "match = %s" % ini_glob(r.name),
             "",
             "[memory]"]
    if r.headroom is not None:
        lines.append("headroom = %s" % ini_size(r.headroom, r.total))
    if r.near is not None:
        lines.append("near_miss = %s" % ini_size(r.near, r.total))
    if r.mode in ("auto", "enforce", "observe", "off"):
        lines.append("mode = %s" % r.mode)
    lines += ["", "[trainer]", "batch_size = %d" % r.batch, "grad_accum = %d" % r.accum,
              "; the Python helper starts from this batch when the script's is larger",
              "apply_batch = yes"]
    if getattr(r, "max_tokens", None):
        lines += ["; the largest input per micro-batch a step held under the near-miss line",
                  "max_tokens = %d" % r.max_tokens]
    lines.append("")
    return "\n".join(lines)


def policy_file_name(name):
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "gpu"
    return slug + ".ini"


def write_policies(recs, outdir, sources):
    """{model: path} of the policy files written."""
    written = OrderedDict()
    for r in recs:
        if r.batch is None:
            continue
        os.makedirs(outdir, exist_ok=True)
        name = policy_file_name(r.name)
        base, k = name[:-len(".ini")], 1
        while os.path.join(outdir, name) in written.values():
            k += 1
            name = "%s-%d.ini" % (base, k)     # two names, one slug
        path = os.path.join(outdir, name)
        write_file(path, policy_text(r, sources))
        written[r.name] = path
    return written


def write_file(path, text):
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
