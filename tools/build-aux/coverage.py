#!/usr/bin/env python3
"""The shim's line coverage: tools/build-aux/coverage.py OBJDIR[:OBJDIR...] SOURCE...

Reads the counters that the tests left beside the objects of a --coverage
build (make coverage: build/cov/shim, the library's objects, and
build/cov/shim-testing, the unit tests' builds of the modules with test-only
entry points; a line run in either is run) through gcov's JSON output,
and prints a line per source file of shim/ (the .c files and the headers
whose inline code they include, a header's line counted once however many
objects include it: run by any of them is run) and the total:

    shim/core/guard.c          412/440   93.6%
    ...
    total               9876/12345  80.0%   (lines of shim/ that hold code)

Exits 1 when no counters are found (the tests did not run). Standard library
only; needs gcov from the gcc that built the objects.
"""
import json
import os
import subprocess
import sys


def main():
    if len(sys.argv) < 3:
        print(__doc__.strip().splitlines()[0], file=sys.stderr)
        return 2
    objdirs, sources = sys.argv[1].split(":"), sys.argv[2:]
    root = os.getcwd()
    lines = {}  # file -> {line: executed}
    found = 0
    for objdir, src in ((o, s) for s in sources for o in objdirs):
        # shim/LAYER/NAME.c's object is OBJDIR/LAYER/NAME.o
        odir = os.path.join(objdir, os.path.dirname(os.path.relpath(src, "shim")))
        obj = os.path.join(odir, os.path.splitext(os.path.basename(src))[0])
        if not os.path.exists(obj + ".gcda"):
            # never run by any test: its lines count as not executed
            if os.path.exists(obj + ".gcno"):
                proc = subprocess.run(["gcov", "--json-format", "--stdout", "-o", odir, src],
                                      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
                merge(lines, proc.stdout, root)
            continue
        found += 1
        proc = subprocess.run(["gcov", "--json-format", "--stdout", "-o", odir, src],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if proc.returncode != 0:
            print("coverage: gcov %s: %s" % (src, proc.stderr.strip()), file=sys.stderr)
            continue
        merge(lines, proc.stdout, root)
    if not found:
        print("coverage: no counters in %s (did the tests run?)" % sys.argv[1], file=sys.stderr)
        return 1
    total = run = 0
    width = max(len(f) for f in lines) if lines else 10
    print("%-*s %13s" % (width, "shim's C, lines run by the tests", ""))
    for f in sorted(lines):
        n = len(lines[f])
        r = sum(1 for v in lines[f].values() if v)
        total += n
        run += r
        if n:
            print("%-*s %6d/%-6d %5.1f%%" % (width, f, r, n, 100.0 * r / n))
    print("%-*s %6d/%-6d %5.1f%%" % (width, "total", run, total, 100.0 * run / total if total else 0))
    return 0


def merge(lines, text, root):
    for doc in text.splitlines():
        doc = doc.strip()
        if not doc.startswith("{"):
            continue
        data = json.loads(doc)
        for f in data.get("files", []):
            name = os.path.normpath(f["file"])
            if os.path.isabs(name):
                name = os.path.relpath(name, root)
            if not name.startswith("shim" + os.sep):
                continue
            mine = lines.setdefault(name, {})
            for ln in f.get("lines", []):
                k = ln["line_number"]
                mine[k] = mine.get(k, False) or ln["count"] > 0


if __name__ == "__main__":
    sys.exit(main())
