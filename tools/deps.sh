#!/bin/sh
# tools/deps.sh check|install CUDA_HOME
# check: one clear message naming what is missing and the command that
# installs it. install: as root, apt-get the Debian packages that are missing.
mode=$1
cuda=${2:-/usr/local/cuda}
missing=""
pkg-config --exists libunwind 2>/dev/null || missing="$missing libunwind-dev"
pkg-config --exists inih 2>/dev/null || missing="$missing libinih-dev"
command -v python3 >/dev/null 2>&1 || missing="$missing python3"
command -v cc >/dev/null 2>&1 || missing="$missing gcc"
command -v pkg-config >/dev/null 2>&1 || missing="pkg-config $missing"

if [ -n "$missing" ] && [ "$mode" = install ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "gpuguard: installing$missing"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q $missing >/dev/null 2>&1 ||
        { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q $missing >/dev/null; } || exit 1
    missing=""
fi
if [ -n "$missing" ]; then
    echo "gpuguard: missing$missing; install with: sudo apt-get install$missing" >&2
    exit 1
fi
if [ ! -f "$cuda/include/cuda.h" ] || [ ! -f "$cuda/include/cuda_runtime_api.h" ]; then
    echo "gpuguard: no CUDA headers in $cuda/include; set CUDA_HOME to the CUDA toolkit" \
         "(or on Debian: enable the non-free component and apt-get install nvidia-cuda-toolkit-headers" \
         "or nvidia-cuda-dev)" >&2
    exit 1
fi
exit 0
