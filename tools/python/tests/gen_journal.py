#!/usr/bin/env python3
"""A generator of large, realistic gpuguard journals, for the report's
streaming test (a few MB, in `make test`) and its benchmark (100 MB and
1 GB, bench/report_bench.py under `make bench`).

    gen_journal.py OUT SIZE [--seed N] [--killed]     SIZE: 100M, 1G, 2000000 ...

The journal has the shape the shim writes (its schema, shim/core/events.def,
from which shim/core/events.c writes and docs/journal.md is made): a `start` listing eight GPUs of
which the process uses one, a `mode` switch when the trainer registers, an
`arch` check, then a week-long training run on an RTX 3090: every step
allocates its activations and frees them, so the process's use climbs and
falls through the 1%-of-total steps that write `sample` lines (most of the
file); `step` lines for the first 100 steps and every 100th after; the
sequence length grows with the epochs, so steps reach the near-miss zone
(`near_miss` lines from three call sites with their running counts: the
first 8, then the 16th, 32nd, ...), get advice, and the trainer halves its
batch (`batch` lines with each phase's peak) down to its minimum, where
every refusal advises `at_min` again; a slow `leak`; notes from the
helper's signal handler; and a `summary` (left out with --killed).

Standard library only; lines are formatted directly (json.dumps would
dominate the time for 1 GB).
"""
import argparse
import json
import random
import sys

GiB = 1 << 30
MiB = 1 << 20
TOTAL = 24 * GiB
HEADROOM = TOTAL // 10                  # headroom = 10% (policy/rtx-3090.ini)
LIMIT = TOTAL - HEADROOM
NEAR = TOTAL * 5 // 100                 # near_miss = 5%
CONTEXT = 512 * MiB                     # device use that is not the process's
WEIGHTS = 6 * GiB
SAMPLE_STEP = TOTAL // 100              # the shim samples on 1% moves


def _frames(names):
    return [{"ip": "0x%x" % (0x7f3a10000000 + 0x1000 * i + 0x40), "module": mod, "sym": sym,
             "off": off} for i, (mod, sym, off) in enumerate(names)]


TORCH = "/opt/venv/lib/python3.11/site-packages/torch/lib/"
NATIVE = [
    (TORCH + "libc10_cuda.so", "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc", 420),
    (TORCH + "libc10_cuda.so", "c10::cuda::CUDACachingAllocator::Native::NativeCachingAllocator::malloc", 88),
    (TORCH + "libtorch_cuda.so", "at::detail::empty_generic", 210),
    (TORCH + "libtorch_cuda.so", "at::native::empty_cuda", 82),
    (TORCH + "libtorch_cuda.so", "at::native::structured_addmm_out_cuda::impl", 145),
    (TORCH + "libtorch_cpu.so", "at::_ops::addmm::call", 301),
    (TORCH + "libtorch_cpu.so", "torch::autograd::VariableType::addmm", 77),
    (TORCH + "libtorch_python.so", "torch::autograd::THPVariable_addmm", 512),
    ("/usr/lib/libpython3.11.so.1.0", "_PyEval_EvalFrameDefault", 10291),
    ("/usr/lib/libpython3.11.so.1.0", "_PyFunction_Vectorcall", 64),
    ("/usr/lib/libpython3.11.so.1.0", "PyObject_Call", 200),
    ("/usr/bin/python3.11", "main", 16),
]
SITES = []
for k, (layer, line) in enumerate((("attention", 88), ("mlp", 121), ("loss", 203))):
    native = _frames(NATIVE)
    native[4]["sym"] = ["at::native::structured_addmm_out_cuda::impl",
                        "at::native::gelu_out_cuda", "at::native::log_softmax_cuda"][k]
    native[4]["ip"] = "0x%x" % (0x7f3a20000000 + 0x100 * k)
    py = [{"file": "/home/me/model.py", "line": line, "func": "Block.%s" % layer},
          {"file": "/home/me/model.py", "line": 260, "func": "Model.forward"},
          {"file": "/opt/venv/lib/python3.11/site-packages/torch/nn/modules/module.py",
           "line": 1511, "func": "Module._call_impl"},
          {"file": "/home/me/train.py", "line": 42, "func": "train_step"},
          {"file": "/home/me/train.py", "line": 80, "func": "<module>"}]
    SITES.append((json.dumps(native, separators=(",", ":")),
                  json.dumps(py, separators=(",", ":"))))

NOTE = ("gpuguard: SIGUSR2 received by the trainer; advice #%d (%s): batch %d x accum %d\\n"
        "Python stack (most recent call last):\\n"
        "  File \\\"/home/me/train.py\\\", line 80, in <module>\\n    main()\\n"
        "  File \\\"/home/me/train.py\\\", line 42, in train_step\\n"
        "    loss = model(batch).loss\\n")


def parse_size(text):
    text = text.strip()
    for suffix, scale in (("G", GiB), ("M", MiB), ("K", 1024)):
        if text.upper().endswith(suffix):
            return int(float(text[:-1]) * scale)
    return int(text)


class Writer(object):
    def __init__(self, f):
        self.f = f
        self.bytes = 0
        self.lines = 0
        self.buf = []

    def put(self, line):
        self.buf.append(line)
        self.bytes += len(line) + 1
        self.lines += 1
        if len(self.buf) >= 4096:
            self.flush()

    def flush(self):
        if self.buf:
            self.f.write("\n".join(self.buf) + "\n")
            self.buf = []


def generate(path, size, seed=1, killed=False, rank=0, pid=4242, wall=1795000000.0,
             step_seconds=45.0):
    """Write a journal of about `size` bytes to `path`; returns a dict of
    what it holds (lines, steps, events by kind, phases)."""
    rnd = random.Random(seed)
    facts = {"near_miss": 0, "near_miss_counted": 0, "refused": 0, "advice": 0, "batch_events": 0,
             "sample": 0, "step": 0, "leak": 0, "note": 0}
    with open(path, "w") as f:
        w = Writer(f)
        devices = []
        for i in range(8):
            devices.append('{"dev":%d,"name":"NVIDIA GeForce RTX 3090","total":%d,"cc":"8.6",'
                           '"policy":"/usr/local/share/gpuguard/policy/rtx-3090.ini","limit":%d,'
                           '"mode":"auto","headroom":%d,"near_miss":%d}'
                           % (i, TOTAL, LIMIT, HEADROOM, NEAR))
        w.put('{"t":0.000001,"ev":"start","pid":%d,"wall":%.6f,"comm":"python3","host":"node1",'
              '"rank":%d,"version":"0.1.0","mode":"auto","devices":[%s]}'
              % (pid, wall, rank, ",".join(devices)))
        w.put('{"t":0.0021,"ev":"arch","dev":0,"cc":"8.6","module":"%slibtorch_cuda.so",'
              '"sass":["sm_80","sm_86","sm_90"],"ptx":["sm_90"],"ok":true,"message":""}' % TORCH)
        w.put('{"t":0.9,"ev":"mode","dev":0,"mode":"enforce","why":"trainer registered"}')
        batch, accum, minimum = 32, 1, 1
        w.put('{"t":0.9,"ev":"batch","dev":0,"batch_size":%d,"grad_accum":%d,"peak":0}'
              % (batch, accum))
        facts["batch_events"] += 1
        t = 1.0
        cur = WEIGHTS
        last_sample = 0
        phase_peak = cur
        peak = cur
        peak_used = cur + CONTEXT
        site_count = [0, 0, 0]
        seq = 0
        waiting = None          # an advice not acked yet
        step = 0
        leak = 0
        allocs = frees = 0
        per_sample = 400 * MiB  # activations of one sample at the first sequence length
        while w.bytes < size:
            step += 1
            t = 1.0 + step * step_seconds
            # The curriculum: sequences grow 50-fold over the run, so the
            # batch is halved five times and the last phase, at the minimum,
            # is refused step after step.
            grow = 50.0 ** (float(w.bytes) / size)
            act = int(batch * per_sample * grow)
            chunks = 64
            piece = max(act // chunks, 2 * MiB)
            dt = step_seconds / (4.0 * chunks * accum)
            top = cur
            step_peak = cur
            refused_here = False
            for _ in range(accum):
                held = 0
                for c in range(chunks):
                    used = cur + CONTEXT
                    if used + piece > LIMIT:
                        # refused: the trainer's Guard.run halves the micro-batch
                        facts["refused"] += 1
                        stack, py = SITES[c % 3]
                        w.put('{"t":%.6f,"ev":"refused","dev":0,"api":"cudaMalloc","bytes":%d,'
                              '"used":%d,"limit":%d,"total":%d,"stack":%s,"pystack":%s}'
                              % (t, piece, used, LIMIT, TOTAL, stack, py))
                        seq += 1
                        facts["advice"] += 1
                        nb = max(minimum, batch // 2)
                        na = -(-32 // nb)
                        w.put('{"t":%.6f,"ev":"advice","seq":%d,"dev":0,"batch_size":%d,'
                              '"grad_accum":%d,"reason":"%s","signaled":true}'
                              % (t + 1e-4, seq, nb, na, "at_min" if batch == minimum else "refused"))
                        if waiting is None:
                            waiting = (seq, nb, na)
                        refused_here = True
                        break
                    cur += piece
                    held += piece
                    allocs += 1
                    t += dt
                    if cur > step_peak:
                        step_peak = cur
                    if used + piece + NEAR > LIMIT:
                        k = c % 3
                        site_count[k] += 1
                        n = site_count[k]
                        facts["near_miss_counted"] += 1
                        if n <= 8 or (n & (n - 1)) == 0:
                            facts["near_miss"] += 1
                            stack, py = SITES[k]
                            w.put('{"t":%.6f,"ev":"near_miss","dev":0,"api":"cudaMalloc",'
                                  '"bytes":%d,"used":%d,"limit":%d,"total":%d,"count":%d,'
                                  '"stack":%s,"pystack":%s}'
                                  % (t, piece, used + piece, LIMIT, TOTAL, n, stack, py))
                        if waiting is None:
                            seq += 1
                            facts["advice"] += 1
                            nb = max(minimum, batch // 2)
                            na = -(-32 // nb)
                            reason = "at_min" if batch == minimum else "near_miss"
                            w.put('{"t":%.6f,"ev":"advice","seq":%d,"dev":0,"batch_size":%d,'
                                  '"grad_accum":%d,"reason":"%s","signaled":true}'
                                  % (t + 1e-4, seq, nb, na, reason))
                            w.put('{"t":%.6f,"ev":"note","text":"%s"}'
                                  % (t + 2e-4, NOTE % (seq, reason, nb, na)))
                            facts["note"] += 1
                            waiting = (seq, nb, na)
                    if abs(cur - last_sample) > SAMPLE_STEP:
                        w.put('{"t":%.6f,"ev":"sample","dev":0,"current":%d,"used":%d}'
                              % (t, cur, cur + CONTEXT + rnd.randrange(0, 64) * MiB))
                        facts["sample"] += 1
                        last_sample = cur
                top = max(top, cur)
                for _ in range(0, held, piece):
                    cur -= piece
                    frees += 1
                    t += dt / 2
                    if abs(cur - last_sample) > SAMPLE_STEP:
                        w.put('{"t":%.6f,"ev":"sample","dev":0,"current":%d,"used":%d}'
                              % (t, cur, cur + CONTEXT))
                        facts["sample"] += 1
                        last_sample = cur
                if refused_here:
                    break
            # a slow leak: a list of tensors that grows every 1000 steps
            if step % 1000 == 0:
                cur += 4 * MiB
                leak += 4 * MiB
                allocs += 1
                if step % 5000 == 0:
                    facts["leak"] += 1
                    stack, py = SITES[2]
                    w.put('{"t":%.6f,"ev":"leak","dev":0,"since_step":1000,"step":%d,'
                          '"rate":%d,"live":%d,"projected_step":%d,"sites":[{"stack":%s,'
                          '"pystack":%s,"bytes":%d}]}'
                          % (t, step, 4 * MiB // 1000, cur, step + (LIMIT - cur) // (4 * MiB) * 1000,
                             stack, py, leak))
            phase_peak = max(phase_peak, step_peak)
            peak = max(peak, step_peak)
            peak_used = max(peak_used, step_peak + CONTEXT + 64 * MiB)
            if step <= 100 or step % 100 == 0:
                w.put('{"t":%.6f,"ev":"step","step":%d,"dev":0,"peak":%d,"peak_used":%d,"live":%d}'
                      % (t, step, step_peak, step_peak + CONTEXT, cur))
                facts["step"] += 1
            # the trainer acks at the batch boundary
            if waiting is not None and step % 3 == 0:
                s, nb, na = waiting
                waiting = None
                if (nb, na) != (batch, accum):
                    w.put('{"t":%.6f,"ev":"batch","dev":0,"batch_size":%d,"grad_accum":%d,"peak":%d}'
                          % (t + 1e-3, nb, na, phase_peak))
                    facts["batch_events"] += 1
                    batch, accum = nb, na
                    phase_peak = cur
        if not killed:
            sites = ",".join('{"stack":%s,"pystack":%s,"bytes":%d,"allocs":%d}'
                             % (SITES[k][0], SITES[k][1], (peak - WEIGHTS) // 3, 21) for k in range(3))
            devs = ['{"dev":0,"name":"NVIDIA GeForce RTX 3090","total":%d,"limit":%d,"peak":%d,'
                    '"peak_used":%d,"allocs":%d,"frees":%d,"near_misses":%d,"refusals":%d,"ooms":0,'
                    '"live_bytes":%d,"live_allocs":%d,"unknown_frees":0,"peak_stack":%s,'
                    '"peak_pystack":%s,"peak_sites":[%s]}'
                    % (TOTAL, LIMIT, peak, peak_used, allocs, frees, facts["near_miss_counted"],
                       facts["refused"], cur, allocs - frees, SITES[0][0], SITES[0][1], sites)]
            for i in range(1, 8):
                devs.append('{"dev":%d,"name":"NVIDIA GeForce RTX 3090","total":%d,"limit":%d,'
                            '"peak":0,"peak_used":%d,"allocs":0,"frees":0,"near_misses":0,'
                            '"refusals":0,"ooms":0,"live_bytes":0,"live_allocs":0,'
                            '"unknown_frees":0,"peak_stack":[],"peak_sites":[]}'
                            % (i, TOTAL, LIMIT, CONTEXT))
            w.put('{"t":%.6f,"ev":"summary","duration":%.6f,"sites":3,"devices":[%s]}'
                  % (t, t, ",".join(devs)))
        w.flush()
    facts.update(lines=w.lines, bytes=w.bytes, steps=step, duration=t, peak=peak,
                 batch=batch, accum=accum, advice_seq=seq)
    return facts


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    p.add_argument("size", type=parse_size)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--killed", action="store_true", help="no summary at the end")
    a = p.parse_args(argv)
    facts = generate(a.out, a.size, seed=a.seed, killed=a.killed)
    print(json.dumps(facts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
