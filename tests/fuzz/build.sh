#!/bin/sh
# build.sh - build the libFuzzer targets with clang, ASan and UBSan.
#   tests/fuzz/build.sh [OUTDIR]       (from the top of a configured tree)
# Each target is lib/*/*.c + tests/fuzz/fuzz_NAME.c, compiled with
# -fsanitize=fuzzer,address,undefined into OUTDIR (default tests/fuzz/bin).
# The CUDA backend (kernels/, a module loaded at run time) is left out:
# fuzzing needs no GPU.  -I.: lib/runtime/backend_cuda.c reads the module's
# table from kernels/ckpt_cuda.h.
set -eu
out=${1:-tests/fuzz/bin}
CC=${FUZZ_CC:-clang}
[ -f config.h ] || { echo "build.sh: run ./configure first (no config.h here)" >&2; exit 2; }
mkdir -p "$out/include"
sed 's/^#define CKPT_HAVE_CUDA 1/#define CKPT_HAVE_CUDA 0/' config.h >"$out/include/config.h"
deps="libzip zlib libcjson libpcre2-8 libzstd"
flags="-g -O1 -fno-omit-frame-pointer -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined"
objs=""
mkdir -p "$out/obj"
for src in lib/*/*.c; do
    o="$out/obj/$(echo "${src#lib/}" | tr / _ | sed 's/\.c$//').o" # pickle/read.c: pickle_read.o
    $CC $flags -fsanitize=fuzzer-no-link -std=gnu11 -DCKPT_BUILDING -I"$out/include" -Ilib -I. \
        $(pkg-config --cflags $deps) -c "$src" -o "$o" 2>/dev/null ||
        $CC $flags -std=gnu11 -DCKPT_BUILDING -I"$out/include" -Ilib -I. \
            $(pkg-config --cflags $deps) -c "$src" -o "$o"
    objs="$objs $o"
done
for t in ${FUZZ_TARGETS:-container pickle safetensors rename spec zip_dir tar scan folder dcp}; do
    $CC $flags -std=gnu11 -I"$out/include" -Ilib -Itests/fuzz $(pkg-config --cflags $deps) \
        tests/fuzz/fuzz_$t.c $objs $(pkg-config --libs $deps) -lm -lpthread -ldl \
        -o "$out/fuzz_$t"
    echo "built $out/fuzz_$t"
done
