#!/usr/bin/env python3
"""What gpuguard-report costs on a long journal (docs/costs.md).

  GG_BUILD=build python3 bench/report_bench.py            (what `make bench` runs: 100 MB)
  python3 bench/report_bench.py --size 1G                 the 1 GB figure (a few minutes)

Generates a realistic journal of SIZE bytes (tools/python/tests/gen_journal.py:
a multi-day run, mostly samples, with near misses, refusals, advice, steps
and batch phases), then times, each in a fresh interpreter, the bare loop
`for line in f: json.loads(line)` over the same file and the full report
(text, written to /dev/null), interleaved, best of --repeat; prints the time
ratio against the bare loop and each one's peak RSS (getrusage), with the
targets: report time within 3x the bare loop, peak memory well under
200 MiB for 100 MB, 60 s and 1 GiB for a 1 GB journal. Writes
$GG_BUILD/bench-report.json.

A benchmark, never a test: nothing here asserts, and the exit status is 0
whatever the figures say. Standard library only.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPORT = os.path.join(ROOT, "tools", "bin", "gpuguard-report")
PYHELPER = os.path.join(ROOT, "tools", "python")
GEN = os.path.join(ROOT, "tools", "python", "tests")
BUILD = os.environ.get("GG_BUILD") or "build"
if not os.path.isabs(BUILD):
    BUILD = os.path.join(ROOT, BUILD)

T_RATIO = 3.0
GiB, MiB = 1 << 30, 1 << 20

# Each measurement runs in its own interpreter and prints
# "<seconds> <peak RSS in KiB>" (ru_maxrss is KiB on Linux).
BARE = r"""
import json, resource, sys, time
t = time.perf_counter()
with open(sys.argv[1], "rb") as f:
    for line in f:
        json.loads(line)
t = time.perf_counter() - t
print(t, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""

REPORT_RUN = r"""
import os, resource, sys, time
sys.path.insert(0, sys.argv[2])
from gpuguard.report import main
t = time.perf_counter()
with open(os.devnull, "w") as out:
    sys.stdout = out
    rc = main([sys.argv[1]])
    sys.stdout = sys.__stdout__
t = time.perf_counter() - t
print(t, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
sys.exit(rc)
"""


def say(msg):
    print("report bench: " + msg, file=sys.stderr, flush=True)


def measure(code, *args):
    out = subprocess.run([sys.executable, "-c", code] + list(args), stdout=subprocess.PIPE,
                         universal_newlines=True, check=True).stdout.split()
    return float(out[0]), int(out[1]) * 1024


def bench(size, repeat, tmp):
    sys.path.insert(0, GEN)
    import gen_journal
    path = os.path.join(tmp, "gpuguard.python3.rank0.4242.jsonl")
    say("generating a %s journal" % fmt_size(size))
    facts = gen_journal.generate(path, size)
    real = os.path.getsize(path)
    bare, rep = [], []
    for i in range(repeat):
        say("run %d/%d: bare json.loads loop" % (i + 1, repeat))
        bare.append(measure(BARE, path))
        say("run %d/%d: gpuguard-report" % (i + 1, repeat))
        rep.append(measure(REPORT_RUN, path, PYHELPER))
    with open(os.devnull, "w") as devnull:
        lines = subprocess.run([sys.executable, REPORT, path], stdout=subprocess.PIPE,
                               stderr=devnull, universal_newlines=True).stdout.count("\n")
    os.unlink(path)
    b, r = min(bare), min(rep)
    return {"bytes": real, "lines": facts["lines"], "report_lines": lines,
            "bare_s": b[0], "bare_rss": max(x[1] for x in bare),
            "report_s": r[0], "report_rss": max(x[1] for x in rep),
            "ratio": r[0] / b[0] if b[0] else None}


def fmt_size(n):
    return "%.0f MiB" % (n / MiB) if n < GiB else "%.1f GiB" % (n / float(GiB))


def verdict(ok):
    return "PASS" if ok else "MISS"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", action="append", default=None,
                   help="journal size: 100M (default), 1G; may be given twice")
    p.add_argument("--repeat", type=int, default=2, help="runs of each, best kept (default 2)")
    p.add_argument("--dir", default=None, help="where the journal is generated (default: a temp dir)")
    a = p.parse_args()
    sys.path.insert(0, GEN)
    import gen_journal
    sizes = [gen_journal.parse_size(s) for s in (a.size or ["100M"])]
    results = []
    with tempfile.TemporaryDirectory(prefix="gg-report-bench-", dir=a.dir) as tmp:
        for size in sizes:
            results.append(bench(size, a.repeat, tmp))
    print("gpuguard-report on generated journals (best of %d; peak RSS from getrusage)" % a.repeat)
    print("%-10s %10s %9s %9s %9s %9s %7s %6s  %s" % (
        "journal", "lines", "bare", "bare RSS", "report", "rep. RSS", "ratio", "text", "targets"))
    for r in results:
        big = r["bytes"] >= 512 * MiB
        mem_target = GiB if big else 200 * MiB
        checks = ["ratio <= %g %s" % (T_RATIO, verdict(r["ratio"] <= T_RATIO)),
                  "RSS <= %s %s" % (fmt_size(mem_target), verdict(r["report_rss"] <= mem_target))]
        if big:
            checks.append("time <= 60 s %s" % verdict(r["report_s"] <= 60.0))
        print("%-10s %10d %8.2fs %9s %8.2fs %9s %6.2fx %6d  %s" % (
            fmt_size(r["bytes"]), r["lines"], r["bare_s"], fmt_size(r["bare_rss"]), r["report_s"],
            fmt_size(r["report_rss"]), r["ratio"], r["report_lines"], "; ".join(checks)))
    try:
        os.makedirs(BUILD, exist_ok=True)
        with open(os.path.join(BUILD, "bench-report.json"), "w") as f:
            json.dump(results, f, indent=1)
    except OSError as e:
        say("cannot write bench-report.json: %s" % e)
    return 0


if __name__ == "__main__":
    sys.exit(main())
