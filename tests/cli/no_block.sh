#!/bin/sh
# no_block.sh - no input blocks (issue 26): a FIFO, given as a file, as a
# shard an index names, as a file of a folder, or as verify's spec or
# reference, is refused by every command with exit 3 and one line naming it
# "not a regular file (a FIFO)", without being opened for reading (nothing
# ever writes to these FIFOs: a command that read one would wait forever).
# No command reads standard input as `-` (ckpt(1)), so none takes a pipe.
# Each command runs under `timeout`, so that a regression fails (status
# 124) instead of hanging the suite.
# shellcheck source=tests/cli/setup.sh
. "${srcdir:-.}/tests/cli/setup.sh"

cd "$srcdir"

if ! command -v mkfifo >/dev/null 2>&1 || ! command -v timeout >/dev/null 2>&1; then
    skip "no mkfifo or timeout"
fi
f=$tmp/in.pth
mkfifo "$f"
good=tests/data/mlp.pth
mlp=models/mnist_mlp.json

# refused CMD ARGS...: `ckpt CMD ARGS` exits 3 within 20 s, one line on
# stderr saying the FIFO is not a regular file.
refused() {
    last_cmd="ckpt $(cmdline "$@")"
    if timeout 20 "$CKPT" "$@" >"$out" 2>"$err"; then status=0; else status=$?; fi
    if [ "$status" -eq 124 ]; then
        fail "it blocked (killed after 20 s): $last_cmd"
    elif [ "$status" -ne 3 ]; then
        fail "exit $status, expected 3: $last_cmd"
        show_output
    elif ! grep -q 'not a regular file (a FIFO)' "$err"; then
        fail "stderr does not say 'not a regular file (a FIFO)': $last_cmd"
        show_output
    else
        ok "exit 3, not a regular file (a FIFO): $last_cmd"
    fi
}

say "a FIFO as the file of every command"
refused inspect "$f"
refused inspect --json "$f"
refused inspect --stats "$f"
refused scan "$f"
refused scan --json "$f"
refused convert "$f" "$tmp/out.safetensors"
refused convert --dtype float16 "$f" "$tmp/out.pth"
refused strip-module "$f" "$tmp/out.pth"
refused add-module "$f" "$tmp/out.pth"
refused unwrap "$f" "$tmp/out.pth"
refused rename -e 's/a/b/' "$f" "$tmp/out.pth"
refused remap --to cpu "$f" "$tmp/out.pth"
refused extract "$f" "$tmp/out.pth"
refused strip-module --in-place "$f"
refused diff "$f" "$good"
refused diff "$good" "$f"
refused verify --model "$mlp" --device cpu "$f"
refused verify --model "$f" --device cpu "$good"
refused verify --model "$mlp" --device cpu --reference "$f" "$good"
check "no OUT written" test ! -e "$tmp/out.pth" -a ! -e "$tmp/out.safetensors"

say "a FIFO as a shard an index names"
mkdir "$tmp/sharded"
mkfifo "$tmp/sharded/model-00001-of-00001.safetensors"
printf '{"metadata": {}, "weight_map": {"w": "model-00001-of-00001.safetensors"}}\n' \
    >"$tmp/sharded/model.safetensors.index.json"
refused inspect "$tmp/sharded/model.safetensors.index.json"
refused convert "$tmp/sharded/model.safetensors.index.json" "$tmp/out.pth"
refused diff "$tmp/sharded/model.safetensors.index.json" "$good"

say "a FIFO in a folder: scan lists it as refused, never opens it"
mkdir "$tmp/folder"
cp "$good" "$tmp/folder/model.pth"
mkfifo "$tmp/folder/rank1.pt"
last_cmd="ckpt scan $tmp/folder"
if timeout 20 "$CKPT" scan "$tmp/folder" >"$out" 2>"$err"; then status=0; else status=$?; fi
expect_status 3
expect_stdout_match '/rank1\.pt: not read$'
expect_stdout_match '^  verdict: unreadable: not a regular file \(a FIFO\): refused, never read$'
expect_stdout_match '/model\.pth: pth-zip, 1 pickle$'
finish
