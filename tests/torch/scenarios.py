"""The runs of real PyTorch that the golden traces record (tests/traces):
one per allocator path, clean and refused, the helper reacting to advice,
and unmodified scripts under gpuguard-run whose inputs grow or vary. `make torch-traces` records them (record_traces.py); a test of the
rig records one again and checks it against the committed file.

Each: the script and its arguments, PYTORCH_CUDA_ALLOC_CONF, the policy
(observe, or enforce at a limit), the device, and whether it runs through
gpuguard-run (gpuguard_run).
"""
from torchrig import GiB, MiB, RTX3090

OBSERVE = """[gpu]
match = *
[memory]
mode = observe
"""


def enforce(limit, total=24 * GiB, near_miss="5%", mode="enforce"):
    return """[gpu]
match = *
[memory]
headroom = %d
near_miss = %s
mode = %s
""" % (total - limit, near_miss, mode)


SCENARIOS = {
    "train-default": dict(script="train.py", args=["--steps", "5", "--grow", "32"], conf="",
                          policy=OBSERVE),
    "train-expandable": dict(script="train.py", args=["--steps", "5", "--grow", "32"],
                             conf="expandable_segments:True", policy=OBSERVE),
    "oom-default": dict(script="oom.py", args=["--chunk", "64"], conf="",
                        policy=enforce(400 * MiB)),
    "oom-expandable": dict(script="oom.py", args=["--chunk", "64"], conf="expandable_segments:True",
                           policy=enforce(400 * MiB)),
    "oom-async": dict(script="oom.py", args=["--chunk", "64"], conf="backend:cudaMallocAsync",
                      policy=enforce(400 * MiB)),
    # The full batch's step peaks are 94, 154, 230, 302, 420, 576, 832 and
    # 1152 MiB: at 500 MiB the helper must split before step 6.
    "helper-grow": dict(script="helper_train.py", args=["--steps", "8", "--shapes", "off"], conf="",
                        policy=enforce(500 * MiB, near_miss="16 MiB", mode="auto")),
    # The workloads users run, through gpuguard-run (its instrumentation tells
    # each step's input and need: `shape` and `needed` lines): a sequence
    # that grows 128 tokens a step until a step no longer fits under 2 GiB
    # (PyTorch's cache flushes and retries first), and long-tailed document
    # lengths whose one long batch (step 18) does not fit. A near-miss zone
    # of 64 MiB: the forecasts' line is the limit less the zone.
    "seq-grow": dict(script="lm.py", args=["--steps", "40", "--batch", "8", "--seq", "128",
                                           "--grow", "128", "--dim", "128", "--layers", "1",
                                           "--vocab", "4000", "--catch"],
                     conf="", policy=enforce(2 * GiB, near_miss="64 MiB"), gpuguard_run=True),
    "doc-lengths": dict(script="lm.py", args=["--lengths", "longtail", "--steps", "24",
                                              "--batch", "8", "--dim", "128", "--layers", "1",
                                              "--vocab", "4000", "--catch"],
                        conf="", policy=enforce(2 * GiB, near_miss="64 MiB"), gpuguard_run=True),
}

DEVICE = RTX3090
