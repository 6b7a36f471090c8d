#!/bin/sh
# tools/build-aux/deps.sh check|install|install-test CUDA_HOME
# check: one clear message naming what is missing and the command that
# installs it. install: as root, apt-get the Debian packages the build needs
# that are missing (make demo). install-test: the same, and Debian's
# python3-torch for /usr/bin/python3, which the helper's tests use (make
# test): said before, with its size, and after, with what really happened.
mode=$1
cuda=${2:-/usr/local/cuda}
missing=""
pkg-config --exists libunwind 2>/dev/null || missing="$missing libunwind-dev"
pkg-config --exists inih 2>/dev/null || missing="$missing libinih-dev"
command -v python3 >/dev/null 2>&1 || missing="$missing python3"
command -v cc >/dev/null 2>&1 || missing="$missing gcc"
command -v pkg-config >/dev/null 2>&1 || missing="pkg-config $missing"

if [ -n "$missing" ] && [ "$mode" != check ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
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
# Python helper with real PyTorch; without it they skip and say why. GG_DEPS_PYTHON
# stands in for /usr/bin/python3 in this script's own test.
python=${GG_DEPS_PYTHON:-/usr/bin/python3}
has_torch() {
    [ -x "$python" ] && "$python" -c \
        "import importlib.util, sys; sys.exit(importlib.util.find_spec('torch') is None)" 2>/dev/null
}
# What apt-get would install, from its own summary (--assume-no installs
# nothing): "181 packages (263 MB), 1,204 MB on disk"; empty when it cannot say.
torch_size() {
    out=$(LC_ALL=C apt-get install --assume-no -q --no-install-recommends python3-torch 2>/dev/null)
    n=$(printf '%s\n' "$out" | sed -n 's/^[0-9]* upgraded, \([0-9]*\) newly installed.*/\1/p')
    get=$(printf '%s\n' "$out" |
          sed -n 's/^Need to get \(.*\/\)\{0,1\}\([0-9.,]* [kMG]\{0,1\}B\) of archives.*/\2/p')
    disk=$(printf '%s\n' "$out" |
           sed -n 's/^After this operation, \([0-9.,]* [kMG]\{0,1\}B\) of additional disk.*/\1/p')
    [ -n "$n" ] || return 0
    printf '%s packages' "$n"
    [ -z "$get" ] || printf ' (%s)' "$get"
    [ -z "$disk" ] || printf ', %s on disk' "$disk"
}
if [ "$mode" = install-test ] && ! has_torch; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        export DEBIAN_FRONTEND=noninteractive
        size=$(torch_size)
        if [ -z "$size" ]; then
            apt-get update -q >/dev/null 2>&1
            size=$(torch_size)
        fi
        echo "gpuguard: installing python3-torch, Debian's PyTorch for $python, which the" \
             "Python helper's tests use (real PyTorch on the CPU): ${size:-size unknown};" \
             "without it they skip"
        log=$(mktemp) || log=/dev/null
        start=$(date +%s)
        apt-get install -y -q --no-install-recommends python3-torch >"$log" 2>&1
        rc=$?
        if [ "$rc" != 0 ]; then
            apt-get update -q >>"$log" 2>&1
            apt-get install -y -q --no-install-recommends python3-torch >>"$log" 2>&1
            rc=$?
        fi
        took=$(( $(date +%s) - start ))
        said=$(grep -v '^[[:space:]]*$' "$log" | tail -n 1)
        [ "$log" = /dev/null ] || rm -f "$log"
        # What happened is what the interpreter can import now, not apt-get's status.
        if has_torch && [ "$rc" = 0 ]; then
            echo "gpuguard: installed python3-torch in $took s"
        elif has_torch; then
            echo "gpuguard: python3-torch is installed ($took s; apt-get exited $rc: $said);" \
                 "the tests with real PyTorch will run"
        else
            echo "gpuguard: could not install python3-torch (apt-get exited $rc: ${said:-no output});" \
                 "the tests with real PyTorch will skip" >&2
        fi
    else
        echo "gpuguard: no PyTorch for $python, the tests with real PyTorch will" \
             "skip; install it with: sudo apt-get install python3-torch" >&2
    fi
fi
exit 0
