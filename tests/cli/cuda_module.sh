#!/bin/sh
# cuda_module.sh - the CUDA backend module (libckpt_cuda.so) needs only
# glibc's libraries: the CUDA runtime is linked in statically (so that the
# wheel can carry the module and stay manylinux), cuBLAS and cuDNN are
# loaded at run time (doc/design.md, "The CUDA backend module"), so that
# neither is needed to load it and neither costs a CPU-only run; its one
# export is the module's table; and cuDNN is found, or said to be missing, the way
# ckpt-verify(1) describes (CKPT_CUDNN), without a GPU.  The convolutions
# themselves run in tests/unit/check_runtime_cuda (a GPU needed).
# shellcheck source=tests/cli/setup.sh
. "${srcdir:-.}/tests/cli/setup.sh"

build=$(dirname "$CKPT")
module=$build/.libs/libckpt_cuda.so
probe=$build/tests/unit/check_cuda
[ -f "$module" ] || skip "no CUDA module in this build (configure found no nvcc)"
command -v objdump >/dev/null 2>&1 || skip "no objdump"
command -v nm >/dev/null 2>&1 || skip "no nm"

say "the module needs glibc's libraries alone: the CUDA runtime is in it, cuBLAS and cuDNN are loaded later"
run objdump -p "$module"
expect_stdout_match 'NEEDED +libc\.so\.6'
check "no NEEDED beyond glibc's (libc, libm, libdl, libpthread, librt, ld-linux)" \
    sh -c '! grep -E "NEEDED" "$1" | grep -v -E "NEEDED +(lib(c|m|dl|pthread|rt)\.so\.[0-9]+|ld-linux[-a-z0-9_.]*)\$"' _ "$out"
expect_stdout_no_match 'NEEDED +libcu'
run nm -D --undefined-only "$module"
expect_stdout_no_match ' (cuda|cudnn|cublas)[A-Z]'
run nm -D --defined-only "$module"
expect_stdout_match ' D ckpt_cuda_module_entry$'
check "one export: ckpt_cuda_module_entry" test "$(wc -l <"$out")" -eq 1

say "cuDNN found without a GPU, or said to be missing; CKPT_CUDNN chooses it or turns it off"
# check_cuda prints the module's cuDNN line before it looks for a GPU (exit 77 without)
if [ -x "$probe" ]; then
    CKPT_CUDNN=off run "$probe"
    check "exit 0 or 77 (no GPU)" test "$status" = 0 -o "$status" = 77
    expect_stdout_line 'no cuDNN: CKPT_CUDNN=off'
    CKPT_CUDNN=$tmp/nothing/libcudnn.so.9 run "$probe"
    expect_stdout_line "no cuDNN: CKPT_CUDNN: $tmp/nothing/libcudnn.so.9: cannot open shared object file: No such file or directory"
    note "a library that is not cuDNN is refused by name"
    CKPT_CUDNN=$module run "$probe"
    expect_stdout_match "^no cuDNN: CKPT_CUDNN: .*libckpt_cuda\.so lacks cudnnGetVersion$"
    run "$probe"
    expect_stdout_match '^(cuDNN 9\.[0-9]+\.[0-9]+ \(/.*libcudnn\.so[.0-9]*\)|no cuDNN: .+)$'
else
    note "tests/unit/check_cuda not built: make check builds it"
fi

finish
