#!/bin/sh
# tools/build-aux/deps.sh check|install CUDA_HOME
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
# Optional: Debian's python3-torch (torch for /usr/bin/python3), for the tests of the
# Python helper with real PyTorch; without it they skip and say why.
has_torch() {
    [ -x /usr/bin/python3 ] && /usr/bin/python3 -c \
        "import importlib.util, sys; sys.exit(importlib.util.find_spec('torch') is None)" 2>/dev/null
}
if [ "$mode" = install ] && ! has_torch; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "gpuguard: installing python3-torch (the tests with real PyTorch)"
        export DEBIAN_FRONTEND=noninteractive
        apt-get install -y -q --no-install-recommends python3-torch >/dev/null 2>&1 ||
            { apt-get update -q >/dev/null 2>&1 &&
              apt-get install -y -q --no-install-recommends python3-torch >/dev/null 2>&1; } ||
            echo "gpuguard: could not install python3-torch; the tests with real PyTorch" \
                 "will skip" >&2
    else
        echo "gpuguard: no PyTorch for /usr/bin/python3, the tests with real PyTorch will" \
             "skip; install it with: sudo apt-get install python3-torch" >&2
    fi
fi
exit 0
