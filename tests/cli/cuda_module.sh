#!/bin/sh
# cuda_module.sh - the CUDA backend module (libckpt_cuda.so) links only the
# CUDA runtime: cuBLAS and cuDNN are loaded at run time (doc/design.md, "The
# CUDA backend module"), so that neither is needed to load it and neither
# costs a CPU-only run; and cuDNN is found, or said to be missing, the way
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

say "the module needs the CUDA runtime, and neither cuBLAS nor cuDNN"
run objdump -p "$module"
expect_stdout_match 'NEEDED +libcudart\.so'
expect_stdout_no_match 'NEEDED +libcu(dnn|blas)'
run nm -D --undefined-only "$module"
expect_stdout_match ' cudaMalloc'
expect_stdout_no_match ' (cudnn|cublas)[A-Z]'

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
