"""gpuguard-preflight: will the script fit on each GPU model? Answered
before launch, on a machine without a GPU, by running the user's own script
with real PyTorch on a simulated GPU (docs/preflight.md).

  cli       the command: runs, verdicts, text and JSON
  runner    one run: the environment, the simulated GPU, its results
  sandbox   the throwaway layer every run's writes go to, and no network
  probe     inside the script: PyTorch's allocator at each step
  answer    per model: peaks, what a real GPU adds, verdict, largest batch
  models    the GPU models and what a real GPU holds outside PyTorch
"""
