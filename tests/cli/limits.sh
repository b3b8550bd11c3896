#!/bin/sh
# limits.sh - the reading limits of doc/safety.md (section 5, "Limits"),
# checked while reading, before the memory is spent (issue 26): small files
# that ask for gigabytes (tests/bad/make_bombs.py) are refused with exit 3
# and a message naming the limit and its option, under a memory cap of about
# 3 GB (ulimit -v, or ASan's hard_rss_limit_mb in a sanitizer build), so that
# a regression fails here instead of eating the machine.  And --max-depth
# itself: parsed, passed to the library, named when it is hit.
# shellcheck source=tests/cli/setup.sh
. "${srcdir:-.}/tests/cli/setup.sh"

have_python || skip "no python3 to write the bombs"
python3 "$srcdir/tests/bad/make_bombs.py" "$tmp/b" || {
    echo "ERROR: tests/bad/make_bombs.py failed"
    exit 99
}
b=$tmp/b

# capped ARGS...: `ckpt ARGS` (as `ckpt`) with at most ~3 GB of memory.
# ASan reserves terabytes of address space, so a sanitizer build is capped
# by its own RSS limit instead.
cap=ulimit
if ! sh -c 'ulimit -v 3000000 && exec "$0" --version' "$CKPT" >/dev/null 2>&1; then
    cap=asan
    note "ulimit -v stops this ckpt from starting (a sanitizer build): ASan's hard_rss_limit_mb=3000 instead"
fi
capped() {
    if [ $cap = ulimit ]; then
        run sh -c 'ulimit -v 3000000 && exec "$0" "$@"' "$CKPT" "$@"
        last_cmd="ulimit -v 3000000; ckpt $(cmdline "$@")"
    else
        ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}hard_rss_limit_mb=3000" run "$CKPT" "$@"
    fi
}

# refused PATTERN ARGS...: capped `ckpt ARGS` exits 3, one stderr line
# matching PATTERN, nothing on stdout (but scan's report, which says why).
refused() {
    _pat=$1
    shift
    capped "$@"
    expect_status 3
    expect_stderr_line "$_pat"
    [ "$1" = scan ] || expect_stdout_empty
}

say "a 1 MB zip whose pickle inflates to 1000 MiB of NONE POP: the values are counted as they are made"
refused "inflate_bomb.pth: .* take more than 1073741824 bytes of memory \(--max-pickle-bytes" \
    inspect "$b/inflate_bomb.pth"
refused "inflate_bomb.pth: .*\(--max-pickle-bytes" convert "$b/inflate_bomb.pth" "$tmp/out.pth"
check "convert left no OUT" test ! -e "$tmp/out.pth"
say "a smaller --max-pickle-bytes refuses the pickle before it is inflated"
refused "over the limit of 104857600 \(--max-pickle-bytes\)" \
    inspect --max-pickle-bytes 100M "$b/inflate_bomb.pth"

say "the same stream under headers that declare 1000 bytes: inflating stops there"
refused "inflate_liar.pth: record 'archive/data.pkl' inflates past its declared 1000 bytes" \
    inspect "$b/inflate_liar.pth"

say "a BINBYTES of 1000 MiB: refused before its copy is made"
refused "bytes_bomb.pth: .*take more than 1073741824 bytes of memory \(--max-pickle-bytes" \
    inspect "$b/bytes_bomb.pth"

say "95 KB of 10^8 nested TUPLE1: refused at --max-depth as the tuples are made"
for c in inspect scan; do
    refused "nesting_bomb.pth: .* nested more than 10000 levels \(--max-depth\)" $c "$b/nesting_bomb.pth"
done
refused "nested more than 10000 levels \(--max-depth\)" convert "$b/nesting_bomb.pth" "$tmp/out.safetensors"
check "convert left no OUT" test ! -e "$tmp/out.safetensors"
refused "nested more than 20000 levels \(--max-depth\)" inspect --max-depth 20000 "$b/nesting_bomb.pth"
say "scan --json: one document, the file unreadable, the limit named"
capped scan --json "$b/nesting_bomb.pth"
expect_status 3
json_expect "d['files'][0]['verdict']" '"error"'
json_true "'(--max-depth)' in d['files'][0]['error']"

say "--max-depth N: a positive whole number, for every reading command"
f=$data/mlp.pth
expect_exit 0 ckpt inspect --quiet --max-depth 10 "$f"
expect_exit 3 ckpt inspect --max-depth 2 "$f"
expect_stderr_line "values nested more than 2 levels \(--max-depth\)"
expect_exit 3 ckpt scan --quiet --max-depth 2 "$f"
expect_exit 3 ckpt convert --max-depth 2 "$f" "$tmp/o.safetensors"
expect_stderr_line "nested more than 2 levels \(--max-depth\)"
expect_exit 3 ckpt diff --max-depth 2 "$f" "$f"
for n in 0 -1 x 5K 1.5 ''; do
    expect_exit 2 ckpt inspect --max-depth "$n" "$f"
    expect_stderr_line "--max-depth needs a"
done
for c in inspect scan diff convert verify extract rename remap unwrap strip-module add-module; do
    ckpt $c --help
    if grep -q -- '--max-depth' "$out"; then ok "$c --help names --max-depth"; else fail "$c --help lacks --max-depth"; fi
done

finish
