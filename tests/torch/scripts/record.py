"""grow.py's training, whose program turns PyTorch's allocation history on
itself at step N (torch.cuda.memory._record_memory_history, as a user
debugging memory does), and says at the end whether it is still on.

    record.py --at N [grow.py's options]

Prints grow.py's RESULT lines and RESULT history {enabled, at}.
"""
import sys

import torch

import model

at = int(sys.argv[sys.argv.index("--at") + 1])
i = sys.argv.index("--at")
sys.argv = sys.argv[:i] + sys.argv[i + 2:]
step = [0]
loss_fn = model.loss_fn


def counting_loss(*a, **k):
    step[0] += 1
    if step[0] == at:
        torch.cuda.memory._record_memory_history(max_entries=100000)
    return loss_fn(*a, **k)


model.loss_fn = counting_loss
import grow  # noqa: E402

grow.main()
model.result("history", enabled=bool(torch._C._cuda_isHistoryEnabled()), at=at)
