#!/bin/sh
# bench/device_kit.sh - gather what bench/device_run.sh needs on a lent GPU
# machine into one folder (default .dev/, which git ignores):
#   bin/  ckpt, bench_forward and the CUDA unit tests, as built here
#   lib/  the CUDA module, the CUDA runtime it was linked against, and every
#         library of those programs that is not glibc's (the GPU machine's
#         system may lack libzip, libcjson, ...)
#   ckpt-*-x86_64-linux.tar.gz  the portable folder (make portable), when built
#   ckpt_toolkit-*.whl  the release's wheel (make wheel-portable), when built
# The GPU machine has no registry to install from and runs another system
# (Ubuntu 24.04 with its own glibc, newer than ours), so the programs travel
# with their libraries rather than being built there.
#
#   sh bench/device_kit.sh [DIR]
# Run after `make && make check TESTS=` (which builds the unit programs) and
# `make bench/bench_forward`.
set -eu
dir=${1:-.dev}
top=$(pwd)
for f in ckpt bench/bench_forward tests/unit/.libs/check_cuda \
    tests/unit/.libs/check_runtime_cuda .libs/libckpt_cuda.so; do
    [ -f "$f" ] || { echo "device_kit.sh: $f is missing: build it first" >&2; exit 1; }
done
rm -rf "$dir"
mkdir -p "$dir/bin" "$dir/lib"
cp ckpt bench/bench_forward tests/unit/.libs/check_cuda tests/unit/.libs/check_runtime_cuda \
    "$dir/bin/"
cp .libs/libckpt_cuda.so "$dir/lib/"
# every library they resolve here, glibc's own left to the machine
for f in "$dir"/bin/* "$dir/lib/libckpt_cuda.so"; do
    LD_LIBRARY_PATH=$top/.libs ldd "$f" | awk '$2 == "=>" && $3 ~ /^\// { print $3 }'
done | sort -u | while read -r lib; do
    case $(basename "$lib") in
    libc.so.* | libm.so.* | libpthread.so.* | libdl.so.* | librt.so.* | ld-linux*) ;;
    libckpt_cuda.so) ;;
    *) cp -L "$lib" "$dir/lib/" ;;
    esac
done
ls release/ckpt-*-x86_64-linux.tar.gz >/dev/null 2>&1 && cp release/ckpt-*-x86_64-linux.tar.gz "$dir/"
ls release/ckpt_toolkit-*.whl >/dev/null 2>&1 && cp release/ckpt_toolkit-*.whl "$dir/"
git rev-parse --short HEAD >"$dir/REVISION"
git status --porcelain | grep -q . && echo "+ uncommitted changes" >>"$dir/REVISION"
du -sh "$dir"
