"""A trainer on the fake stack, for tests/unchanged: steps through the
PyTorch-like caching allocator (ctypes, which releases the GIL as PyTorch's
ops do), the helper's Guard reacting to advice, a step whose activations
grow, a worker thread's allocation, a note, and memory kept for good.

    python3 trainer.py FAKE_DIR STEPS
"""
import ctypes
import json
import os
import sys
import threading

import gpuguard

tl = ctypes.CDLL(os.path.join(sys.argv[1], "libtorchlike.so"))
tl.tl_malloc.argtypes = [ctypes.c_size_t, ctypes.POINTER(ctypes.c_void_p)]
tl.tl_free.argtypes = [ctypes.c_void_p]
MiB = 1 << 20
kept = []


class Model:
    def forward(self, nbytes):
        p = ctypes.c_void_p()
        rc = tl.tl_malloc(nbytes, ctypes.byref(p))  # the forward's line
        return p if rc == 0 else None


def keep_for_good(nbytes):
    p = ctypes.c_void_p()
    if tl.tl_malloc(nbytes, ctypes.byref(p)) == 0:  # the leak's line
        kept.append(p)


def worker(nbytes, out):
    p = ctypes.c_void_p()
    out.append(tl.tl_malloc(nbytes, ctypes.byref(p)))  # the worker's line


guard = gpuguard.Guard(batch_size=32, grad_accum=1, signal="none")
model = Model()
weights = [model.forward(1536 * MiB) for _ in range(4)]
batch, accum, log = guard.batch_size, guard.grad_accum, []
for step in range(1, int(sys.argv[2]) + 1):
    for _ in range(accum):
        acts = [model.forward(batch * (256 + 64 * step) * 96 * 1024) for _ in range(12)]
        for a in acts:
            if a:
                tl.tl_free(a)
    keep_for_good(16 * MiB)
    out = []
    t = threading.Thread(target=worker, args=(64 * MiB, out))
    t.start()
    t.join()
    tl.tl_empty_cache()
    guard.step()
    if guard.shrink_requested:
        batch, accum = guard.accept()
        log.append([step, batch, accum])
        guard.note("accepted batch %d x accum %d at step %d" % (batch, accum, step))
print("RESULT " + json.dumps({"accepted": log, "stats": guard.stats()}))
