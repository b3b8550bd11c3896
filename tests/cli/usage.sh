#!/bin/sh
# usage.sh - the command line itself: --help, --version, unknown commands and
# options, wrong argument counts and bad option values.  A usage error exits
# 2 with one line on stderr, "ckpt: <command>: <message>", and nothing on
# stdout; help goes to stdout and exits 0 (doc/design.md, ckpt(1)).
# shellcheck source=tests/cli/setup.sh
. "${srcdir:-.}/tests/cli/setup.sh"

cd "$srcdir"
f=tests/data/dp_mlp.pth # any good fixture; its pickle is 614 bytes

# ---------------------------------------------------------------------------
say "ckpt without arguments: usage on stderr, exit 2"
expect_exit 2 ckpt
expect_stdout_empty
check "stderr starts with 'usage: ckpt'" grep -q '^usage: ckpt ' "$err"

say "ckpt --help: usage on stdout, exit 0, lists the inspect command"
for h in --help -h help; do
    expect_exit 0 ckpt $h
    expect_stderr_empty
    expect_stdout_match '^usage: ckpt <command>'
    expect_stdout_match '^  inspect +'
done

say "ckpt --version: one line naming the libraries"
for v in --version -V; do
    expect_exit 0 ckpt $v
    expect_stderr_empty
    check "exactly one line on stdout" test "$(wc -l <"$out" | tr -d ' ')" -eq 1
    expect_stdout_match '^ckpt [0-9]+\.[0-9]+\.[0-9]+ '
    for lib in libzip zlib PCRE2 cJSON; do
        expect_stdout_match "[(,] *$lib [0-9]"
    done
    # the backends found: cpu always; cuda with the module, its CUDA runtime
    # and a GPU, else why not
    expect_stdout_match '; backends: cpu(, cuda \(.*libckpt_cuda\.so, CUDA runtime [0-9.]+, [0-9]+ GPUs?\)|; cuda not available: .+)$'
done
note "$(cat "$out")"

say "ckpt links no CUDA library: the CUDA backend is a module, loaded at run time"
if command -v ldd >/dev/null 2>&1 && ldd "$CKPT" >"$tmp/ldd" 2>&1; then
    check "ldd names no libcudart, libcublas or libcuda" \
        sh -c '! grep -E "libcu(dart|blas|da)[.]" "$1"' - "$tmp/ldd"
else
    note "ldd cannot read $CKPT: not checked"
fi

say "ckpt --version without the CUDA module: cuda not available, and why"
CKPT_CUDA_MODULE=$tmp/no-such-module.so
export CKPT_CUDA_MODULE
expect_exit 0 ckpt --version
expect_stderr_empty
expect_stdout_match '; backends: cpu; cuda not available: CKPT_CUDA_MODULE=.*/no-such-module\.so: No such file or directory$'
say "--device cuda without it: exit 4 naming what is missing; auto runs on the CPU"
expect_exit 4 ckpt verify --device cuda --model models/mnist_mlp.json tests/data/fmnist_mlp.pth
expect_stdout_empty
expect_stderr_line 'ckpt: verify: --device cuda: cuda:0: the CUDA backend cannot be loaded: CKPT_CUDA_MODULE=.*/no-such-module\.so: No such file or directory'
expect_exit 0 ckpt verify --device auto --model models/mnist_mlp.json tests/data/fmnist_mlp.pth
expect_stdout_match '^device +cpu '
say "a file that is not the module: refused at load, and why"
printf 'not a library\n' >"$tmp/not-a-module.so"
CKPT_CUDA_MODULE=$tmp/not-a-module.so
expect_exit 0 ckpt --version
expect_stdout_match '; backends: cpu; cuda not available: .*not-a-module\.so.*$'
unset CKPT_CUDA_MODULE

say "an unknown command: exit 2"
expect_exit 2 ckpt x
expect_stdout_empty
expect_stderr_prefix "ckpt: 'x' is not a ckpt command"
expect_exit 2 ckpt --bogus
expect_stdout_empty
expect_stderr_prefix "ckpt: '--bogus' is not a ckpt command"

# ---------------------------------------------------------------------------
say "ckpt inspect --help: usage on stdout, exit 0"
expect_exit 0 ckpt inspect --help
expect_stderr_empty
expect_stdout_match '^usage: ckpt inspect \[--json\] \[--stats\] \[--filter REGEX\] FILE$'
for o in '-j, --json' --stats --filter --allow-global --allow-unknown --max-pickle-bytes \
    '-q, --quiet' '-h, --help'; do
    expect_stdout_match "^  $o( |$)"
done

note "every command's options against its man page: tests/cli/synopsis.sh"

# ---------------------------------------------------------------------------
# usage_error ARGS...: `ckpt inspect ARGS` is a usage error: exit 2, nothing
# on stdout, one line on stderr that starts "ckpt: inspect: ".
usage_error() {
    expect_exit 2 ckpt inspect "$@"
    expect_stdout_empty
    expect_stderr_prefix "ckpt: inspect: "
    note "$(cat "$err")"
}

say "ckpt inspect: no FILE, two FILEs"
usage_error
usage_error "$f" tests/data/mlp.pth
note "with --json, the usage error is also stdout's one JSON document (tests/cli/json_errors.sh)"
expect_exit 2 ckpt inspect --json
expect_stderr_prefix "ckpt: inspect: no FILE given"
if have_python; then expect_json_error; fi

say "ckpt inspect: unknown options, a missing option argument"
usage_error --bogus "$f"
usage_error -x "$f"
usage_error --filter

say "ckpt inspect --filter: an invalid PCRE2 expression"
usage_error --filter '(' "$f"
usage_error --filter '[a-' "$f"
usage_error --filter 'a{2,1}' "$f"

say "--allow-global needs MODULE.NAME"
usage_error --allow-global foo "$f"
usage_error --allow-global '' "$f"

say "--max-pickle-bytes: a positive SIZE (K M G T, KB MB GB TB, KiB MiB GiB TiB)"
for n in 0 -1 1k 12X abc '' 1kb 1Kb 1KIB 1Ki '1 K' 1.5G 18446744073709551616 18014398509481984K \
    17592186044416M 17179869184G 18446744073709552KB 16777216TiB; do
    usage_error --max-pickle-bytes "$n" "$f"
done
note "dp_mlp.pth's pickle is 614 bytes: 614 is enough, 613 is not (a refusal, exit 3)"
for n in 614 1K 1M 1G 16777215G; do
    expect_exit 0 ckpt inspect --quiet --max-pickle-bytes "$n" "$f"
    expect_stderr_empty
done
expect_exit 3 ckpt inspect --max-pickle-bytes 613 "$f"
expect_stdout_empty
expect_stderr_prefix "ckpt: inspect: $f: "
note "$(cat "$err")"

say "the common options are accepted on a good file"
expect_exit 0 ckpt inspect --allow-global mypkg.Config --allow-global a.b --allow-unknown --quiet "$f"
expect_stdout_empty
expect_stderr_empty
expect_exit 0 ckpt inspect --quiet --json --stats --filter . "$f"
expect_stdout_empty
expect_stderr_empty

finish
