#!/bin/sh
# replay.sh - `make check`'s fuzz test: every fuzz target (built without
# libFuzzer as tests/fuzz/replay_NAME) runs over its committed corpus and
# every crash reproducer in tests/fuzz/crashes/NAME.  Sanitizer builds
# (--enable-sanitizers) make this a real check of the reproducers.
set -eu
srcdir=${srcdir:-.}
bindir=$(cd "${FUZZ_REPLAY_DIR:-tests/fuzz}" && pwd)
status=0
for t in container pickle safetensors rename spec zip_dir tar scan folder dcp; do
    dirs=
    for d in "$srcdir/tests/fuzz/corpus/$t" "$srcdir/tests/fuzz/crashes/$t"; do
        [ -d "$d" ] && dirs="$dirs $d"
    done
    if [ ! -x "$bindir/replay_$t" ]; then
        echo "FAIL: $bindir/replay_$t is not built"
        status=1
        continue
    fi
    # shellcheck disable=SC2086
    if out=$(CKPT_FUZZ_WEIGHTS="$srcdir/tests/data/mlp.pth" "$bindir/replay_$t" $dirs 2>&1); then
        echo "ok   $t: $out"
    else
        echo "FAIL $t: $out" | tail -n 20
        status=1
    fi
done
exit $status
