"""Tests of the user-side tools (the Python helper, gpuguard-run, gpuguard-report)."""
