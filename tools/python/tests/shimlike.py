"""Journals built event by event in the shape the shim writes them: the
fields and their order of shim/events.c (start, mode, sample,
near_miss/refused/oom with pystack and, for a thread without Python frames,
thread; advice, batch, arch, summary with peak_pystack), and of
docs/journal.md for step, leak and advice's forecast."""
import json
import os

GiB = 1 << 30
MiB = 1 << 20

TORCH = "/opt/venv/lib/python3.11/site-packages/torch/lib/"


def frame(i, module, sym, off):
    return {"ip": "0x%x" % (0x7f5a00000000 + 0x1000 * i), "module": module, "sym": sym, "off": off}


ALLOC_STACK = [frame(1, TORCH + "libc10_cuda.so",
                     "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc", 420),
               frame(2, TORCH + "libtorch_cuda.so", "at::native::empty_cuda", 82),
               frame(3, TORCH + "libtorch_cuda.so", "at::native::structured_addmm_out_cuda::impl", 145),
               frame(4, "/usr/lib/libpython3.11.so.1.0", "_PyEval_EvalFrameDefault", 10291)]
ALLOC_PYSTACK = [{"file": "/home/me/model.py", "line": 88, "func": "Block.forward"},
                 {"file": "/home/me/train.py", "line": 42, "func": "train_step"}]


def device(dev, name, total, headroom, near, cc="9.0", mode="auto",
           policy="/usr/local/share/gpuguard/policy/default.ini"):
    """One entry of start.devices."""
    return {"dev": dev, "name": name, "total": total, "cc": cc, "policy": policy,
            "limit": total - headroom, "mode": mode, "headroom": headroom, "near_miss": near}


class Process(object):
    """The journal of one process, built in time order."""

    def __init__(self, devices, pid=4242, rank=None, host="node1", wall=1795000000.0,
                 comm="python3", mode="auto"):
        self.devices = {d["dev"]: d for d in devices}
        self.pid, self.rank, self.comm = pid, rank, comm
        self.peak = {}
        self.peak_used = {}
        self.counts = {}
        self.events = [{"t": 0.000021, "ev": "start", "pid": pid, "wall": wall, "comm": comm,
                        "host": host, "rank": rank, "version": "0.1.0", "mode": mode,
                        "devices": devices}]

    def _count(self, dev, key, n=1):
        c = self.counts.setdefault(dev, {})
        c[key] = c.get(key, 0) + n

    def mode(self, t, dev, mode="enforce", why="trainer registered"):
        self.events.append({"t": t, "ev": "mode", "dev": dev, "mode": mode, "why": why})

    def sample(self, t, dev, current, used):
        self.peak[dev] = max(self.peak.get(dev, 0), current)
        self.peak_used[dev] = max(self.peak_used.get(dev, 0), used)
        self.events.append({"t": t, "ev": "sample", "dev": dev, "current": current, "used": used})

    def incident(self, kind, t, dev, nbytes, used, api="cudaMalloc", count=None,
                 stack=ALLOC_STACK, pystack=ALLOC_PYSTACK, thread=None):
        d = self.devices[dev]
        e = {"t": t, "ev": kind, "dev": dev, "api": api, "bytes": nbytes, "used": used,
             "limit": d["limit"], "total": d["total"]}
        if count:
            e["count"] = count
        e["stack"] = stack
        e["pystack"] = pystack
        if not pystack and thread:
            e["thread"] = thread
        self.events.append(e)
        self._count(dev, {"near_miss": "near_misses", "refused": "refusals", "oom": "ooms"}[kind])

    def advice(self, t, seq, dev, batch, accum, reason, signaled=True, forecast=None):
        e = {"t": t, "ev": "advice", "seq": seq, "dev": dev, "batch_size": batch,
             "grad_accum": accum, "reason": reason, "signaled": signaled}
        if forecast is not None:
            e["forecast"] = forecast
        self.events.append(e)

    def note(self, t, text):
        self.events.append({"t": t, "ev": "note", "text": text})

    def step(self, t, step, dev, peak, peak_used, live):
        self.peak[dev] = max(self.peak.get(dev, 0), peak)
        self.peak_used[dev] = max(self.peak_used.get(dev, 0), peak_used)
        self.events.append({"t": t, "ev": "step", "step": step, "dev": dev, "peak": peak,
                            "peak_used": peak_used, "live": live})

    def batch(self, t, dev, batch, accum, peak, was=None):
        """was: (batch, accum) of the phase that ended, when the shim knew it."""
        e = {"t": t, "ev": "batch", "dev": dev, "batch_size": batch, "grad_accum": accum}
        if was:
            e["was_batch_size"], e["was_grad_accum"] = was
        e["peak"] = peak
        self.events.append(e)

    def summary(self, t, allocs=100, live=0):
        devs = []
        for dev in sorted(self.devices):
            d = self.devices[dev]
            c = self.counts.get(dev, {})
            used = dev in self.peak
            devs.append({"dev": dev, "name": d["name"], "total": d["total"], "limit": d["limit"],
                         "peak": self.peak.get(dev, 0), "peak_used": self.peak_used.get(dev, 0),
                         "allocs": allocs if used else 0, "frees": allocs - 1 if used else 0,
                         "near_misses": c.get("near_misses", 0), "refusals": c.get("refusals", 0),
                         "ooms": c.get("ooms", 0), "live_bytes": live if used else 0,
                         "live_allocs": 1 if used else 0, "unknown_frees": 0,
                         "peak_stack": ALLOC_STACK if used else [],
                         "peak_pystack": ALLOC_PYSTACK if used else [],
                         "peak_sites": [{"stack": ALLOC_STACK, "pystack": ALLOC_PYSTACK,
                                         "bytes": self.peak[dev], "allocs": allocs}] if used else []})
        self.events.append({"t": t, "ev": "summary", "duration": t, "sites": 1, "devices": devs})

    def write(self, directory):
        name = "gpuguard.%s.%s%d.jsonl" % (
            self.comm, "" if self.rank is None else "rank%d." % self.rank, self.pid)
        path = os.path.join(directory, name)
        with open(path, "w") as f:
            for e in self.events:
                f.write(json.dumps(e, separators=(",", ":")) + "\n")
        return path
