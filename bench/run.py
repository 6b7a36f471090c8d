#!/usr/bin/env python3
"""What the shim costs: the figures of docs/costs.md, measured in one run.

  GG_BUILD=build python3 bench/run.py        (what `make bench` does)
  bench/run.py --quick                        fewer repetitions, for a look

Runs $GG_BUILD/bench/bench (bench/bench.c) on the fake CUDA stack without the
shim and with LD_PRELOAD=$GG_BUILD/libgpuguard.so, the repetitions of every
configuration interleaved so that drift on the machine is shared, keeps the
best time of each, prints one table with each figure's target beside it and
PASS or MISS, and writes $GG_BUILD/bench.json.

A benchmark, never a test: nothing here asserts, and the exit status is 0
whatever the figures say (non-zero only when the harness itself cannot run).
Standard library only.
"""
import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.environ.get("GG_BUILD") or "build"
if not os.path.isabs(BUILD):
    BUILD = os.path.join(ROOT, BUILD)
BENCH = os.path.join(BUILD, "bench", "bench")
SHIM = os.path.join(BUILD, "libgpuguard.so")
CUDART = os.path.join(BUILD, "fake", "libcudart.so.13")
PYLOOP = os.path.join(ROOT, "bench", "pyloop.py")
HARDEN = os.path.join(BUILD, "tests", "progs", "harden")

DEVICE = "NVIDIA H200,141GiB,9.0"
PAIR_SIZE = 1 << 20      # 1 MiB: far below the 1%-of-total sample threshold
LIVE_SIZE = 4096         # 1M x 4 KiB = 4 GiB live: far from any line
STACK_DEPTH = 32         # [journal] depth
CALL_DEPTH = 40          # frames the harness puts above each call (> depth)
PY_DEPTH = 50            # Python frames above each call of the Python figure
THREADS = (1, 2, 4, 8, 16)
STEP_SITES = 1000        # live sites while gpuguard_step is timed
METRICS = "off+metrics"  # stacks=off, the metrics file rewritten every second (docs/metrics.md)
UNSHARED = "off-unshared"  # stacks=off, the GPU's ledger not shared with other processes ([memory] share = no)

# The targets (docs/costs.md).
T_ADDED_NS = 40.0
T_ADDED_ALL_NS = 3000.0
T_SCALE_16 = 8.0
T_STARTUP_MS = 1.0
T_BYTES = 64.0

POLICY = """\
; bench: headroom 0, so nothing is ever refused; stacks = {stacks}
[gpu]
match = *

[memory]
headroom = 0
near_miss = 1%
mode = enforce
enforce = runtime
virtualize_meminfo = yes

[trainer]
signal = none

[journal]
stacks = {stacks}
depth = {depth}
"""


def say(msg):
    print(f"bench: {msg}", file=sys.stderr, flush=True)


class Bench:
    def __init__(self, tmp):
        self.tmp = tmp
        self.policies = {}
        for stacks in ("off", "near_miss", "all"):
            path = os.path.join(tmp, f"stacks-{stacks}.ini")
            with open(path, "w") as f:
                f.write(POLICY.format(stacks=stacks, depth=STACK_DEPTH))
            self.policies[stacks] = path
        self.journals = os.path.join(tmp, "journal")
        os.makedirs(self.journals)
        self.metrics = os.path.join(tmp, "metrics")
        os.makedirs(self.metrics)
        base = {k: v for k, v in os.environ.items()
                if not k.startswith(("GPUGUARD_", "FAKECUDA_")) and k not in ("LD_PRELOAD", "RANK")}
        base["FAKECUDA_DEVICES"] = DEVICE
        base["GPUGUARD_JOURNAL_DIR"] = self.journals
        base["GPUGUARD_QUIET"] = "1"
        self.base = base

    def env(self, stacks):
        """stacks None: no shim; else the shim with that policy; METRICS:
        stacks off, and the metrics file written every second."""
        env = dict(self.base)
        if stacks == METRICS:
            stacks = "off"
            env.update(GPUGUARD_METRICS_DIR=self.metrics, GPUGUARD_METRICS_INTERVAL="1")
        if stacks == UNSHARED:
            stacks = "off"
            env["GPUGUARD_SHARE"] = "0"
        env["GPUGUARD_POLICY"] = self.policies[stacks or "off"]
        if stacks:
            env["LD_PRELOAD"] = SHIM
        return env

    def run(self, args, stacks, timeout=600):
        proc = subprocess.run([BENCH, *map(str, args)], env=self.env(stacks), cwd=self.tmp,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              timeout=timeout)
        if proc.returncode != 0:
            raise RuntimeError(f"bench {' '.join(map(str, args))} (shim: {stacks}) exited "
                               f"{proc.returncode}: {proc.stderr.strip()}")
        if proc.stderr.strip():
            say(f"stderr of bench {args[0]} (shim: {stacks}): {proc.stderr.strip()}")
        return [json.loads(l) for l in proc.stdout.splitlines() if l.startswith("{")]

    def python(self, n, reps, stacks, python=True):
        """bench/pyloop.py: ns per pair from PY_DEPTH Python frames."""
        env = self.env(stacks)
        env["LD_LIBRARY_PATH"] = os.path.dirname(CUDART)
        if not python:
            env["GPUGUARD_PYTHON"] = "0"
        # The interpreter itself, not a launcher in PATH (pyenv's is a shell
        # script, which would run under the preload too).
        proc = subprocess.run([os.path.realpath(sys.executable), PYLOOP, CUDART, str(n),
                               str(PY_DEPTH), str(reps)], env=env, cwd=self.tmp,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              timeout=600)
        if proc.returncode != 0:
            raise RuntimeError(f"pyloop (shim: {stacks}) exited {proc.returncode}: "
                               f"{proc.stderr.strip()}")
        r = json.loads(proc.stdout.splitlines()[-1])
        return [ns / n for ns in r["ns"]], r["python"]


def pairs(b, configs, threads, n, inner, rounds):
    """Best ns per pair (wall time over all threads / pairs) for each config."""
    runs = {c: [] for c in configs}
    for _ in range(rounds):
        for c in configs:
            (r,) = b.run(["pairs", n, threads, CALL_DEPTH, inner, PAIR_SIZE], c)
            if r["err"]:
                say(f"pairs with shim {c}: CUDA error {r['err']}")
            runs[c] += [ns / r["pairs"] for ns in r["ns"]]
    return {c: {"best": min(v), "median": statistics.median(v), "all": v}
            for c, v in runs.items()}


def metrics_pairs(b, n, inner, rounds):
    """Best ns per pair, stacks off, without and with the metrics file: each
    run lasts long enough for the shim's thread to write it during the timed
    loop (its first write comes at the first tick, then every second)."""
    runs, seconds = {"off": [], METRICS: []}, []
    for _ in range(rounds):
        for c in runs:
            (r,) = b.run(["pairs", n, 1, CALL_DEPTH, inner, PAIR_SIZE], c)
            runs[c] += [ns / r["pairs"] for ns in r["ns"]]
            if c == METRICS:
                seconds.append(sum(r["ns"]) / 1e9)
    return {c: min(v) for c, v in runs.items()}, statistics.median(seconds), os.listdir(b.metrics)


def live(b, configs, n, rounds):
    out = {c: [] for c in configs}
    for _ in range(rounds):
        for c in configs:
            (r,) = b.run(["live", n, LIVE_SIZE], c)
            out[c].append(r)
    res = {}
    for c, rs in out.items():
        deltas = [r["rss_after"] - r["rss_before"] for r in rs]
        res[c] = {"rss_delta": statistics.median(deltas), "all": deltas,
                  "alloc_ns": min(r["alloc_ns"] for r in rs) / n,
                  "free_ns": min(r["free_ns"] for r in rs) / n}
    return res


def python_pairs(b, n, reps, rounds):
    """Best ns per pair from Python: no shim, stacks=all, stacks=all with
    Python frames off."""
    out = {"none": [], "all": [], "all_native_only": []}
    version = None
    for _ in range(rounds):
        for key, stacks, py in (("none", None, True), ("all", "all", True),
                                ("all_native_only", "all", False)):
            v, version = b.python(n, reps, stacks, py)
            out[key] += v
    return {k: min(v) for k, v in out.items()}, version


def steps(b, sites, count):
    """gpuguard_step's time with `sites` live sites: a flat run and one that
    leaks 32 MiB a step (its trend, site scans and leak lines)."""
    res = {}
    for leak in (0, 1):
        (r,) = b.run(["steps", sites, count, leak], "all")
        ns = sorted(r["ns"])
        res["leak" if leak else "flat"] = {
            "present": r["present"], "median": statistics.median(ns),
            "p99": ns[min(len(ns) - 1, int(len(ns) * 0.99))], "max": ns[-1],
            "mean": statistics.fmean(ns)}
    return res


def soak(b, seconds):
    """Journal bytes a run of `seconds` of memory oscillating across the
    timeline's sample step writes (stacks = all, the shipped setting): the
    growth per hour, extrapolated."""
    size = int(141 * (1 << 30) * 0.015)  # 1.5% of the device: every pair crosses a step
    before = {f: os.path.getsize(os.path.join(b.journals, f)) for f in os.listdir(b.journals)}
    (r,) = b.run(["soak", seconds, size], "all", timeout=seconds + 120)
    grown = sum(os.path.getsize(os.path.join(b.journals, f)) - before.get(f, 0)
                for f in os.listdir(b.journals))
    return {"seconds": seconds, "pairs": r["pairs"], "bytes": grown,
            "bytes_per_hour": grown * 3600.0 / seconds}


def startup(b, argv, runs):
    (r,) = b.run(["startup", runs, SHIM, *argv], None)
    w, p = [x / 1e6 for x in r["without"]], [x / 1e6 for x in r["with"]]
    return {"without": {"median": statistics.median(w), "mean": statistics.fmean(w)},
            "with": {"median": statistics.median(p), "mean": statistics.fmean(p)},
            # Each run with the preload next to one without (ABBA order):
            # the median of those differences cancels drift on the machine.
            "paired_median_added": statistics.median(b - a for a, b in zip(w, p)),
            "runs": runs, "argv": argv, "raw_ms": {"without": w, "with": p}}


def thread_stack(b, runs):
    """Bytes of a 16 KiB thread's stack touched by a near miss, two refusals
    and two OOMs (tests/progs/harden smallstack), without the shim and with
    it (stacks = all, enforce): what the shim adds to a CUDA call's stack.
    The test (test_hardening) bounds it by the same path without the shim;
    the figure itself is the machine's (compiler, libc)."""
    policy = os.path.join(b.tmp, "stack.ini")
    with open(policy, "w") as f:
        f.write("[gpu]\nmatch = *\n[memory]\nheadroom = 10%\nnear_miss = 5%\n"
                "mode = enforce\n[trainer]\nsignal = none\n[journal]\nstacks = all\n")
    used = {}
    for _ in range(runs):
        for shim in (False, True):
            env = dict(b.env(None), FAKECUDA_DEVICES="NVIDIA GeForce RTX 3090,24GiB,8.6")
            if shim:
                env.update(GPUGUARD_POLICY=policy, LD_PRELOAD=SHIM, GPUGUARD_JOURNAL_DIR=b.journals)
            out = subprocess.run([HARDEN, "alloc:20G", "smallstack:16", "freeall"], env=env,
                                 cwd=b.tmp, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 universal_newlines=True, timeout=120).stdout
            m = [l for l in out.splitlines() if l.startswith("stack used ")]
            if m:
                used.setdefault(shim, []).append(int(m[0].split()[2]))
    if len(used) < 2:
        return None
    return {"without": max(used[False]), "with": max(used[True]), "runs": runs}


def verdict(ok):
    return "PASS" if ok else "MISS"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer repetitions")
    opts = ap.parse_args()
    for f in (BENCH, SHIM):
        if not os.path.exists(f):
            print(f"bench: {f} is missing; run `make bench`", file=sys.stderr)
            return 1

    q = opts.quick
    p_n, p_inner, p_rounds = (100000, 3, 2) if q else (200000, 5, 5)
    t_n, t_inner, t_rounds = (200000, 2, 1) if q else (400000, 3, 5)
    s_runs = 50 if q else 200
    l_n, l_rounds = (200000, 1) if q else (1000000, 3)
    py_n, py_reps, py_rounds = (20000, 2, 1) if q else (50000, 3, 3)
    st_steps = 500 if q else 3000
    m_n, m_inner, m_rounds = (2000000, 5, 2) if q else (3000000, 5, 5)  # runs of 1-2 s
    soak_s = 10 if q else 60

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), "")
    except OSError:
        pass

    t_start = time.monotonic()
    tmp = tempfile.mkdtemp(prefix="gg-bench-")
    try:
        b = Bench(tmp)
        say(f"1 thread, {p_rounds} rounds x {p_inner} x {p_n} pairs: no shim, stacks off (the "
            f"GPU's ledger shared, and not), near_miss, all")
        single = pairs(b, (None, "off", UNSHARED, "near_miss", "all"), 1, p_n, p_inner, p_rounds)
        say(f"metrics: {m_rounds} rounds x {m_inner} x {m_n} pairs, stacks off, without and with "
            f"the metrics file every second")
        met, met_seconds, met_left = metrics_pairs(b, m_n, m_inner, m_rounds)
        say(f"threads {', '.join(map(str, THREADS))}: {t_rounds} rounds x {t_inner} x {t_n} pairs")
        scaling = {}
        for _ in range(t_rounds):
            for t in THREADS:
                r = pairs(b, (None, "off"), t, t_n, t_inner, 1)
                for c, v in r.items():
                    scaling.setdefault((t, c), []).extend(v["all"])
        say(f"start-up: {s_runs} runs each, interleaved")
        # A fresh journal directory: a process that never uses CUDA must
        # leave nothing in it.
        shutil.rmtree(b.journals)
        os.makedirs(b.journals)
        # The interpreter itself, not a launcher in PATH (pyenv's shim is a
        # shell script that would start three processes under the preload).
        python = os.path.realpath(sys.executable)
        st = {"/bin/true": startup(b, ["/bin/true"], s_runs),
              "python3 -c pass": startup(b, [python, "-c", "pass"], s_runs)}
        left = len(os.listdir(b.journals))
        say(f"ledger memory: {l_rounds} rounds x {l_n} live allocations")
        mem = live(b, (None, "off", "all"), l_n, l_rounds)
        say(f"Python: {py_rounds} rounds x {py_reps} x {py_n} pairs from {PY_DEPTH} frames")
        py, py_version = python_pairs(b, py_n, py_reps, py_rounds)
        say(f"gpuguard_step: {st_steps} steps with {STEP_SITES} live sites, flat and leaking")
        stp = steps(b, STEP_SITES, st_steps)
        say(f"soak: {soak_s} s of memory oscillating across the sample step")
        sk = soak(b, soak_s)
        say("a 16 KiB thread's stack: a near miss, refusals and OOMs with stacks on")
        stk = thread_stack(b, 3) if os.path.exists(HARDEN) else None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    elapsed = time.monotonic() - t_start

    # ---- the figures ---------------------------------------------------------
    figures = []

    def figure(name, without, with_, unit, target, target_text, added=None, note=""):
        added = (with_ - without) if added is None else added
        ratio = with_ / without if without else None
        ok = added <= target
        figures.append({"figure": name, "without": without, "with": with_, "added": added,
                        "ratio": ratio, "unit": unit, "target": target_text,
                        "result": verdict(ok), "note": note})

    base = single[None]["best"]
    for c, label, target, text in (("off", "stacks=off", T_ADDED_NS, "added <= 40 ns"),
                                   ("near_miss", "stacks=near_miss", T_ADDED_NS, "added <= 40 ns"),
                                   ("all", f"stacks=all depth {STACK_DEPTH}", T_ADDED_ALL_NS,
                                    "added <= 3 us")):
        figure(f"pair, 1 thread, {label}", base, single[c]["best"], "ns", target, text,
               note="" if c != "near_miss" else "the shipped policies' setting; target as for off")

    figure("pair, 1 thread, stacks=off: shared ledger vs none", single[UNSHARED]["best"],
           single["off"]["best"], "ns", 0.05 * single[UNSHARED]["best"], "ratio <= 1.05",
           note="far from the line: within its claim an allocation asks no other process "
                "(docs/how-it-works.md, \"A GPU shared by processes\"); 'without': "
                "[memory] share = no")
    figure("pair, 1 thread, stacks=off, metrics every 1 s", met["off"], met[METRICS], "ns",
           0.05 * met["off"], "ratio <= 1.05",
           note=f"each run {met_seconds:.1f} s of pairs: the shim's thread wrote the file "
                f"about {int(met_seconds + 0.5)}x during it (at 0.5 s, then every 1 s), off the "
                f"allocation path; files left by clean exits: {len(met_left)}")

    best = {k: min(v) for k, v in scaling.items()}
    thr = {}
    for t in THREADS:
        row = {}
        for c in (None, "off"):
            tput = 1e9 / best[(t, c)]  # pairs per second, all threads together
            row["shim" if c else "none"] = {"ns_per_pair": best[(t, c)], "pairs_per_s": tput,
                                            "vs_1_thread": tput / (1e9 / best[(1, c)]),
                                            "median_ns_per_pair": statistics.median(scaling[(t, c)]),
                                            "median_vs_1_thread": statistics.median(scaling[(1, c)])
                                            / statistics.median(scaling[(t, c)])}
        thr[t] = row
    s16_none, s16_shim = thr[16]["none"]["vs_1_thread"], thr[16]["shim"]["vs_1_thread"]
    figures.append({"figure": "throughput 16 threads / 1 thread, stacks=off",
                    "without": s16_none, "with": s16_shim, "added": None,
                    "ratio": s16_shim / s16_none, "unit": "x", "target": ">= 8x (with shim)",
                    "result": verdict(s16_shim >= T_SCALE_16),
                    "note": f"{cores} CPU core{'s' if cores != 1 else ''}: at most "
                            f"{min(16, cores)}x is possible on this machine"})

    for name, s in st.items():
        # Added: the median of the paired differences, which drift and the
        # spread of a slow start-up (python) disturb far less than the
        # difference of the two medians, also shown.
        figure(f"start-up {name}, median of {s['runs']}", s["without"]["median"],
               s["with"]["median"], "ms", T_STARTUP_MS, "added <= 1 ms",
               added=s["paired_median_added"],
               note=f"added: median of paired differences; difference of medians "
                    f"{s['with']['median'] - s['without']['median']:+.3f} ms")
        figure(f"start-up {name}, mean of {s['runs']}", s["without"]["mean"], s["with"]["mean"],
               "ms", T_STARTUP_MS, "added <= 1 ms")

    figure(f"pair, Python depth {PY_DEPTH}, stacks=all depth {STACK_DEPTH}",
           py["none"], py["all"], "ns", T_ADDED_ALL_NS, "added <= 3 us",
           note=f"CPython {py_version} through ctypes; with python = no: "
                f"+{py['all_native_only'] - py['none']:.0f} ns")

    for c, label in (("off", "stacks=off"), ("all", "stacks=all (1 site)")):
        w = mem[None]["rss_delta"] / l_n
        p = mem[c]["rss_delta"] / l_n
        figure(f"bytes per live allocation, {label}", w, p, "B", T_BYTES, "added <= 64 B",
               note=f"RSS with {l_n} live vs none; 'without': the fake driver's own tables")

    for kind, label in (("flat", "flat"), ("leak", "leaking")):
        r = stp[kind]
        figures.append({"figure": f"gpuguard_step, {STEP_SITES} sites, {label}",
                        "without": None, "with": r["median"], "added": r["median"],
                        "ratio": None, "unit": "ns", "target": "(none; median)",
                        "result": "-" if r["present"] else "MISS",
                        "note": f"p99 {r['p99'] / 1000:.1f} us, max {r['max'] / 1000:.1f} us "
                                f"(the first boundary's site snapshot, a leak line); "
                                + ("leaking: 32 MiB kept a step; " if kind == "leak" else "") +
                                f"nothing on the allocation path" if r["present"]
                                else "gpuguard_step not found"})

    figures.append({"figure": f"journal growth, oscillation soak ({soak_s} s)", "without": None,
                    "with": sk["bytes_per_hour"] / (1 << 20), "added": None, "ratio": None,
                    "unit": "MiB/h", "target": "< 12 MiB/h",
                    "result": verdict(sk["bytes_per_hour"] < 12 * (1 << 20)),
                    "note": f"{sk['bytes']} bytes for {sk['pairs']} pairs; the bound: under 2 MiB "
                            f"per 10 min"})

    if stk:
        figure("stack of a 16 KiB thread, stacks=all", stk["without"], stk["with"], "B",
               stk["without"], "added <= without",
               note="bytes touched by a near miss, 2 refusals, 2 OOMs; the most of "
                    f"{stk['runs']} runs")

    # ---- the table -------------------------------------------------------------
    def fmt(v, unit):
        if v is None:
            return "-"
        if unit == "ns":
            return f"{v / 1000:.2f} us" if abs(v) >= 10000 else f"{v:.1f} ns"
        if unit == "ms":
            return f"{v:.3f} ms"
        if unit == "B":
            return f"{v:.1f} B"
        if unit == "MiB/h":
            return f"{v:.2f} MiB/h"
        return f"{v:.2f}x"

    def fmt_added(v, unit):
        if v is None:
            return "-"
        s = fmt(abs(v), unit)
        return ("+" if v >= 0 else "-") + s

    print()
    print(f"gpuguard bench: fake CUDA runtime ({DEVICE}), {cores} CPU cores ({cpu or platform.machine()}), "
          f"best of {p_rounds * p_inner} repetitions unless said")
    head = f"{'figure':<44} {'without':>11} {'with':>11} {'added':>11} {'ratio':>7}  {'target':<18} result"
    print(head)
    print("-" * len(head))
    for f in figures:
        ratio = f"{f['ratio']:.2f}x" if f["ratio"] is not None else "-"
        print(f"{f['figure']:<44} {fmt(f['without'], f['unit']):>11} {fmt(f['with'], f['unit']):>11} "
              f"{fmt_added(f['added'], f['unit']):>11} {ratio:>7}  {f['target']:<18} {f['result']}"
              + (f"  ({f['note']})" if f["note"] else ""))
    print()
    print(f"threads (stacks=off, {t_n} pairs shared by the threads, best of {t_rounds * t_inner}, "
          f"'(median)': the same from the medians; {cores} CPU cores, so at most {min(16, cores)}x)")
    head = (f"{'threads':>7} {'no shim ns/pair':>16} {'pairs/s':>10} {'vs 1T':>7} {'(median)':>8}   "
            f"{'shim ns/pair':>13} {'pairs/s':>10} {'vs 1T':>7} {'(median)':>8}   {'shim/no shim':>12}")
    print(head)
    print("-" * len(head))
    for t in THREADS:
        n, s = thr[t]["none"], thr[t]["shim"]
        print(f"{t:>7} {n['ns_per_pair']:>16.1f} {n['pairs_per_s'] / 1e6:>9.2f}M {n['vs_1_thread']:>6.2f}x "
              f"{n['median_vs_1_thread']:>7.2f}x   "
              f"{s['ns_per_pair']:>13.1f} {s['pairs_per_s'] / 1e6:>9.2f}M {s['vs_1_thread']:>6.2f}x "
              f"{s['median_vs_1_thread']:>7.2f}x   "
              f"{s['ns_per_pair'] / n['ns_per_pair']:>11.2f}x")
    print()
    print(f"start-up runs left {left} journal file(s) (a process that never uses CUDA should leave 0); "
          f"live allocations: alloc {mem['off']['alloc_ns']:.0f} ns, free {mem['off']['free_ns']:.0f} ns "
          f"each with the shim (no shim: {mem[None]['alloc_ns']:.0f} / {mem[None]['free_ns']:.0f} ns)")
    print(f"{sum(f['result'] == 'PASS' for f in figures)} PASS, "
          f"{sum(f['result'] == 'MISS' for f in figures)} MISS; {elapsed:.0f} s")

    out = {
        "machine": {"cores": cores, "cpu": cpu, "platform": platform.platform(),
                    "python": platform.python_version()},
        "config": {"device": DEVICE, "pair_size": PAIR_SIZE, "live_size": LIVE_SIZE,
                   "stack_depth": STACK_DEPTH, "call_depth": CALL_DEPTH,
                   "pairs": {"n": p_n, "inner": p_inner, "rounds": p_rounds},
                   "threads": {"n": t_n, "inner": t_inner, "rounds": t_rounds},
                   "startup_runs": s_runs, "live_allocs": l_n, "quick": q,
                   "metrics_pairs": {"n": m_n, "inner": m_inner, "rounds": m_rounds}},
        "figures": figures,
        "single_thread_ns_per_pair": {str(k or "none"): v for k, v in single.items()},
        "threads": {str(t): v for t, v in thr.items()},
        "startup_ms": st,
        "startup_journals_left": left,
        "ledger": {str(k or "none"): v for k, v in mem.items()},
        "python_ns_per_pair": py, "python_version": py_version,
        "steps_ns": stp,
        "metrics_ns_per_pair": {"off": met["off"], "off_with_metrics": met[METRICS],
                                "run_seconds": met_seconds},
        "soak": sk,
        "seconds": elapsed,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    path = os.path.join(BUILD, "bench.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
    sys.stdout.flush()
    print(f"wrote {os.path.relpath(path, ROOT) if path.startswith(ROOT) else path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
