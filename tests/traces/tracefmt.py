#!/usr/bin/env python3
"""Make a golden trace from what the shim recorded (GPUGUARD_TRACE) and the
journal of the same run (tests/traces/README.md).

    tracefmt.py RAW JOURNAL --runtime 12 [--context BYTES] [--source TEXT]
                [--script TEXT] [--env K=V ...] [--torch K=V ...] [-o OUT]

The raw trace has the run's own addresses; a golden trace has names:
pointers p1, p2, ... (a new name each time an address is handed out again),
allocation handles h1, h2, ..., address ranges v+OFFSET (from the lowest
one mapped), pools d0 (a device's own pool) or m1, m2 (made by the program),
threads T1, T2, .... It keeps only what the program itself did: lookups
made by a CUDA runtime (it resolves its own driver) are dropped, and so is
the driver's cuMemGetInfo that a runtime's cudaMemGetInfo made; a free of
an address the trace never saw allocated is dropped and counted. The
header says where it came from, what to run it with (device, runtime,
context bytes, policy, environment) and what the shim's journal said
(expect), which a replay must say again.

Standard library only.
"""
import argparse
import json
import sys

FORMAT = 1


def read_journal(path):
    start = summary = None
    with open(path) as f:
        for line in f:
            if not line.strip():
                continue
            e = json.loads(line)
            if e["ev"] == "start":
                start = e
            elif e["ev"] == "summary":
                summary = e
    if start is None or summary is None:
        raise SystemExit("tracefmt: %s has no start or no summary line" % path)
    return start, summary


class Names:
    """Addresses and handles to names, per live interval."""

    def __init__(self, prefix):
        self.prefix = prefix
        self.live = {}
        self.count = 0

    def new(self, value):
        self.count += 1
        name = "%s%d" % (self.prefix, self.count)
        self.live[value] = name
        return name

    def get(self, value):
        return self.live.get(value)

    def drop(self, value):
        return self.live.pop(value, None)


def golden(raw_lines, start, summary, args):
    pointers, handles = Names("p"), Names("h")
    threads, pools = {}, {}
    pool_dev = {}
    created = set()
    calls, dropped = [], {"runtime lookups": 0, "unknown frees": 0, "runtime meminfo": 0}
    vas = []
    parsed = [l.split() for l in raw_lines if l.strip() and not l.startswith("#")]

    # What each pool is: made by the program (pool create), else a device's own.
    for t in parsed:
        if t[0] == "alloc":
            for tok in t[7:]:
                if tok.startswith("pool="):
                    pool_dev.setdefault(tok[5:], int(t[2]))
        if t[0] == "pool" and t[1] == "create" and t[4] == "0":
            created.add(t[2])
        if t[0] == "pool" and t[1] == "current":
            pool_dev.setdefault(t[2], int(t[3]))
        if t[0] in ("map", "unmap"):
            vas.append((int(t[1], 16), int(t[2])))
    va_base = min(v for v, _ in vas) if vas else 0
    vaspan = max(v + n for v, n in vas) - va_base if vas else 0

    def pool_name(handle):
        if handle in pools:
            return pools[handle]
        if handle in created:
            pools[handle] = "m%d" % (sum(1 for v in pools.values() if v.startswith("m")) + 1)
        else:
            pools[handle] = "d%d" % pool_dev.get(handle, 0)
        return pools[handle]

    def thread(tok):
        tid = tok[2:]
        if tid not in threads:
            threads[tid] = "T%d" % (len(threads) + 1)
        return threads[tid]

    def va(tok):
        return "v+%#x" % (int(tok, 16) - va_base)

    def failed(i, what, key, tid):
        """The result of a free, unmap or release traced before its call: the
        error of the `fail` line its thread wrote after it, else 0."""
        for t2 in parsed[i + 1:]:
            if t2[0] == "fail" and t2[1] == what and int(t2[3], 16) == key and t2[5] == tid:
                return t2[4]
            if tid in t2 and t2[0] != "fail":
                return "0"  # the thread went on: that call succeeded
        return "0"

    for i, t in enumerate(parsed):
        kind = t[0]
        if kind in ("gpuguard-trace", "device"):
            continue
        if kind == "lookup":
            if t[5].startswith("libcudart"):
                dropped["runtime lookups"] += 1
                continue
            calls.append("lookup %s %s %s %s %s" % tuple(t[1:6]))
        elif kind == "alloc":
            api, dev, n, key, res, tid = t[1], t[2], t[3], int(t[4], 16), t[5], t[6]
            name = "-"
            if res == "0":
                name = (handles if api == "cuMemCreate" else pointers).new(key)
            extra = ""
            for tok in t[7:]:
                if tok.startswith("pool="):
                    extra = " pool=" + pool_name(tok[5:])
            calls.append("alloc %s %s %s %s %s %s%s" % (api, dev, n, name, res, thread(tid), extra))
        elif kind == "free":
            api, key, tid = t[1], int(t[2], 16), t[3]
            name = pointers.drop(key)
            if name is None:
                dropped["unknown frees"] += 1
                continue
            result = failed(i, "free", key, tid)
            if result != "0":
                pointers.live[key] = name  # still allocated
            calls.append("free %s %s %s %s" % (api, name, result, thread(tid)))
        elif kind == "fail":
            continue  # in its call's line
        elif kind == "map":
            calls.append("map %s %s %s %s" % (va(t[1]), t[2], handles.get(int(t[3], 16)) or "h?", t[4]))
        elif kind == "unmap":
            calls.append("unmap %s %s %s" % (va(t[1]), t[2], failed(i, "unmap", int(t[1], 16), t[3])))
        elif kind == "release":
            key = int(t[1], 16)
            name = handles.get(key) or "h?"
            result = failed(i, "release", key, t[2])
            if result == "0":
                handles.drop(key)
            calls.append("release %s %s" % (name, result))
        elif kind == "pool":
            op, handle = t[1], t[2]
            if op == "sync":
                calls.append("pool sync - 0 %s" % t[4])
            elif op == "create":
                calls.append("pool create %s %s %s" % (pool_name(handle), t[3], t[4]))
            else:
                calls.append("pool %s %s %s %s" % (op, pool_name(handle), t[3], t[4]))
        elif kind == "meminfo":
            nxt = parsed[i + 1] if i + 1 < len(parsed) else None
            if (t[1] == "cuMemGetInfo" and nxt and nxt[0] == "meminfo" and
                    nxt[1] == "cudaMemGetInfo" and nxt[2:] == t[2:]):
                dropped["runtime meminfo"] += 1
                continue
            calls.append(" ".join(t))
        elif kind in ("step", "batch", "ack", "shape", "needed"):
            calls.append(" ".join(t))
        else:
            raise SystemExit("tracefmt: unknown raw line: %s" % " ".join(t))

    out = ["# gpuguard golden trace, format %d (tests/traces/README.md)" % FORMAT]
    if args.script:
        out.append("# script: %s" % args.script)
    dropped_text = ", ".join("%d %s" % (n, k) for k, n in dropped.items() if n)
    if dropped_text:
        out.append("# left out: %s" % dropped_text)
    out.append("source %s" % (args.source or "unknown"))
    out.append("runtime %d" % args.runtime)
    for d in start["devices"]:
        out.append("device %d %s,%d,%s" % (d["dev"], d["name"], d["total"], d["cc"]))
    out.append("context %d" % args.context)
    for d in start["devices"]:
        out.append("policy dev=%d headroom=%d near_miss=%d mode=%s" %
                   (d["dev"], d.get("headroom", 0), d.get("near_miss", 0), d.get("mode", start["mode"])))
    for kv in args.env or []:
        out.append("env %s" % kv)
    keys = ("peak", "peak_used", "allocs", "frees", "near_misses", "refusals", "ooms",
            "refusals_recovered", "ooms_recovered", "steps", "flush_steps", "live_bytes",
            "live_allocs")
    for d in summary["devices"]:
        out.append("expect dev=%d %s" % (d["dev"], " ".join("%s=%d" % (k, d[k]) for k in keys if k in d)))
    for kv in args.torch or []:
        out.append("torch %s" % kv)
    if vaspan:
        out.append("vaspan %#x" % vaspan)
    out.extend(calls)
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("raw")
    ap.add_argument("journal")
    ap.add_argument("--runtime", type=int, required=True, help="the CUDA runtime major the program used")
    ap.add_argument("--context", type=int, default=0, help="bytes the device held before the program")
    ap.add_argument("--source", help="where and with what it was recorded")
    ap.add_argument("--script", help="what was run")
    ap.add_argument("--env", action="append", help="K=V the program ran with (PYTORCH_CUDA_ALLOC_CONF)")
    ap.add_argument("--torch", action="append", help="K=V PyTorch said (max_memory_reserved)")
    ap.add_argument("-o", "--out")
    args = ap.parse_args()
    with open(args.raw) as f:
        raw = f.read().splitlines()
    start, summary = read_journal(args.journal)
    text = golden(raw, start, summary, args)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)


if __name__ == "__main__":
    main()
