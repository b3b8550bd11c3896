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
# (a sanitizer build's module needs the sanitizers' runtimes too)
check "no NEEDED beyond glibc's (libc, libm, libdl, libpthread, librt, ld-linux)" \
    sh -c '! grep -E "NEEDED" "$1" | grep -v -E "NEEDED +(lib(c|m|dl|pthread|rt)\.so\.[0-9]+|ld-linux[-a-z0-9_.]*|lib(asan|ubsan)\.so\.[0-9]+)\$"' _ "$out"
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

    say "a pip user's cuDNN: torch's NVIDIA package in a venv, found with nothing but VIRTUAL_ENV"
    # In a mount namespace of its own (root), the cuDNN found above is
    # moved to where pip puts nvidia-cudnn-cu13 and hidden where it was, so
    # that the loader's path no longer has it
    dir=$(sed -n 's|^cuDNN [0-9.]* (\(/.*\)/libcudnn\.so[.0-9]*)$|\1|p' "$out")
    site=$tmp/venv/lib/python3.11/site-packages/nvidia/cudnn/lib
    if [ -z "$dir" ]; then
        note "no cuDNN here: the pip package's case is not run"
    elif objdump -p "$module" | grep -q 'NEEDED *libasan'; then
        # ASan's dlopen interceptor loses the caller's $ORIGIN, which
        # libcudnn.so.9 loads its parts by: it aborts ("Invalid handle.
        # Cannot load symbol cudnnGetVersion") once its folder is moved
        note "a sanitizer build: the pip package's case is not run"
    elif [ "$(id -u)" != 0 ] || ! unshare --mount true 2>/dev/null; then
        note "no mount namespace here (root and unshare needed): the pip package's case is not run"
    else
        mkdir -p "$site"
        unshare --mount sh -c 'mount --make-rprivate / && mount --bind "$1" "$2" &&
            mount -t tmpfs tmpfs "$1" && VIRTUAL_ENV=$3 "$4"' _ "$dir" "$site" "$tmp/venv" \
            "$probe" >"$tmp/pip.out" 2>&1 || : # 77 without a GPU
        check "check_cuda names the venv's cuDNN ($site)" \
            grep -q "^cuDNN 9\.[0-9]*\.[0-9]* ($site/libcudnn\.so\.9)\$" "$tmp/pip.out"
        grep -q "^cuDNN" "$tmp/pip.out" || sed 's/^/   | /' "$tmp/pip.out"
    fi
else
    note "tests/unit/check_cuda not built: make check builds it"
fi

finish
