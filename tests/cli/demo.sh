#!/bin/sh
# demo.sh - `make demo` (tools/demo.sh) prints what README.md's transcript
# of a CPU run shows, once the paths (its output folder, the Pythons), the
# verify lines that depend on the CPU and its BLAS (device, max abs/rel
# errors) and trailing blanks are normalised on both sides; it keeps its
# output folder, whose fixed files are there; it shows each command before
# running it, and never calls ckpt's own check PyTorch's.  Run as on a
# machine without CUDA (CUDA_VISIBLE_DEVICES empty, CKPT_CUDA_DEVICES=0), as
# the transcript was.
# shellcheck source=tests/cli/setup.sh
. "${srcdir:-.}/tests/cli/setup.sh"

PYTHON=${PYTHON:-false}
PYTHON2=${PYTHON2:-}
if [ -z "$PYTHON2" ] || [ "$PYTHON2" = false ]; then PYTHON2=$PYTHON; fi
if [ -z "$PYTHON" ] || [ "$PYTHON" = false ]; then
    skip "no Python with torch: README's transcript is of a run with torch"
fi

CUDA_VISIBLE_DEVICES=
export CUDA_VISIBLE_DEVICES
demo=$(mktemp -d /tmp/ckpt-demo.XXXXXX)
trap 'rm -rf "$tmp" "$demo"' EXIT

say "make demo's script, run as make demo runs it"
run env CKPT="$CKPT" PYTHON="$PYTHON" PYTHON2="$PYTHON2" DEMO_DIR="$demo" \
    sh "$srcdir/tools/demo.sh"
if [ "$status" -eq 0 ]; then ok "exit 0: tools/demo.sh"; else fail "exit $status: tools/demo.sh"; show_output; fi
expect_stderr_empty

# normalise <FILE: the same rules for the demo's output and README's transcript
normalise() {
    sed -e "s|$demo|/tmp/ckpt-demo.XXXXXX|g" \
        -e "s|$PYTHON2 |/opt/ckpt/torch2/bin/python |g" \
        -e "s|$PYTHON |/usr/bin/python3 |g" \
        -e 's|^device      .*|device      ...|' \
        -e 's#^\(output      [^:]*\): max abs .*: \(PASS\|FAIL\)$#\1: ...: \2#' \
        -e 's|[ 	]*$||'
}

say "its output is README.md's transcript (normalised)"
sed -n '/^<!-- make demo: begin/,/^<!-- make demo: end/p' "$srcdir/README.md" |
    sed -e '1,/^```/d' -e '/^```/,$d' >"$tmp/readme"
check "README.md has the transcript" test -s "$tmp/readme"
normalise <"$tmp/readme" >"$tmp/want"
normalise <"$out" >"$tmp/got"
if cmp -s "$tmp/want" "$tmp/got"; then
    ok "make demo prints README's transcript ($(wc -l <"$tmp/got" | tr -d ' ') lines)"
else
    fail "make demo's output differs from README's transcript (- README, + demo):"
    diff -u "$tmp/want" "$tmp/got" | sed -n '3,60p' | sed 's/^/   | /'
fi

say "what the demo promises"
check "it names its output folder" grep -q "^ckpt demo: the outputs go to $demo (kept)\$" "$out"
for f in fmnist_mlp.pth fmnist_ae.pth mp_ae_cpu.pth mp_ae_dp_stripped.pth; do
    check "it kept $f" test -s "$demo/$f"
done
check "each ckpt command is shown before it runs" \
    test "$(grep -c '^\$ ckpt ' "$out")" -ge 10
check "it shows remap or --map-location" grep -q '^\$ ckpt remap \|--map-location' "$out"
check "it never calls ckpt's check PyTorch's" sh -c "! grep -qi \"PyTorch's strict load\" '$out'"
check "it ends with plain torch.load of a fixed file succeeding" \
    sh -c "tail -n 4 '$out' | grep -q '^12 tensors on cpu\$'"
check "before the fix, plain torch.load fails here" \
    grep -q '^RuntimeError: Attempting to deserialize object on a CUDA device' "$out"

finish
