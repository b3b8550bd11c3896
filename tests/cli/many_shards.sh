#!/bin/sh
# many_shards.sh - a sharded set of 1,100 .safetensors files: ckpt keeps every
# shard open while it reads the set, so under the usual soft limit of 1,024
# open files it raises its own soft limit to the hard one (ckpt(1), "Limits"),
# and where the hard limit is too low it says so and how to raise it.  The
# shards are written here with printf: no Python, so that the portable
# folder's bare roots run it too.
# shellcheck source=tests/cli/setup.sh
. "${srcdir:-.}/tests/cli/setup.sh"

n=1100
set_dir=$tmp/set
mkdir "$set_dir"
# one shard: {"layer.I.weight": float32 [1] = 1.0}, the header padded with
# spaces to a multiple of 8 bytes, its length as 8 little-endian bytes
{
    printf '{"metadata":{},"weight_map":{'
    i=0
    while [ $i -lt $n ]; do
        name=$(printf 'model-%05d-of-%05d.safetensors' $((i + 1)) $n)
        h=$(printf '{"layer.%d.weight":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}' $i)
        while [ $((${#h} % 8)) -ne 0 ]; do h="$h "; done
        # shellcheck disable=SC2059 # the length's byte, as an octal escape
        { printf "\\$(printf %03o ${#h})\\000\\000\\000\\000\\000\\000\\000"
          printf '%s' "$h"
          printf '\000\000\200\077'; } >"$set_dir/$name"
        [ $i -gt 0 ] && printf ','
        printf '"layer.%d.weight":"%s"' $i "$name"
        i=$((i + 1))
    done
    printf '}}\n'
} >"$set_dir/model.safetensors.index.json"
index=$set_dir/model.safetensors.index.json

hard=$(ulimit -H -n)
say "under a soft limit of 1,024 open files, 1,100 shards read as one state dict"
if [ "$hard" = unlimited ] || [ "$hard" -ge $((n + 64)) ]; then
    ulimit -S -n 1024
    expect_exit 0 ckpt inspect --json "$index"
    check "all $n tensors listed" test "$(grep -c "\"path\":.\[\"layer\." "$out")" -eq $n
    expect_exit 0 ckpt convert "$index" "$tmp/one.safetensors"
    expect_exit 0 ckpt inspect --quiet "$tmp/one.safetensors"
else
    note "hard limit $hard: too low to check this here"
fi

say "a hard limit too low for the set: exit 4, naming the shard and the way out"
expect_exit 4 sh -c 'ulimit -n 1024 && exec "$@"' sh "$CKPT" inspect "$index"
# which shard is the first too many depends on the descriptors the caller
# left open, so the message is matched around the shard's number
expect_stderr_prefix "ckpt: inspect: $index: shard 'model-0"
check "one line, naming a shard past the limit and ulimit -n" \
    grep -qx "ckpt: inspect: $index: shard 'model-0[0-9]*-of-01100\.safetensors' named by the index: Too many open files (every shard stays open while the set is read: raise the limit on open files, ulimit -n)" "$err"
check "stderr is that one line" test "$(wc -l <"$err")" -eq 1

finish
