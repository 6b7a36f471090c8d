"""The runs of real PyTorch that the golden traces record (tests/traces):
one per allocator path, clean and refused, and the helper reacting to
advice. `make torch-traces` records them (record_traces.py); a test of the
rig records one again and checks it against the committed file.

Each: the script and its arguments, PYTORCH_CUDA_ALLOC_CONF, the policy
(observe, or enforce at a limit) and the device.
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
    "helper-grow": dict(script="helper_train.py", args=["--steps", "8"], conf="",
                        policy=enforce(500 * MiB, near_miss="16 MiB", mode="auto")),
}

DEVICE = RTX3090
