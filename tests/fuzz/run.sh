#!/bin/sh
# run.sh - fuzz every target for SECONDS (default 600) under ASan + UBSan,
# two at a time, each from its committed corpus (new inputs go to a scratch
# copy), and print executions and coverage per target.
#   tests/fuzz/run.sh [SECONDS] [TARGET...]   (after tests/fuzz/build.sh)
set -eu
secs=${1:-600}
[ $# -gt 0 ] && shift
targets=${*:-container pickle safetensors rename spec zip_dir tar scan folder}
bin=${FUZZ_BIN:-tests/fuzz/bin}
work=${FUZZ_WORK:-tests/fuzz/work}
mkdir -p "$work"
run_one() {
    t=$1
    mkdir -p "$work/$t/corpus" "$work/$t/crashes"
    cp -n tests/fuzz/corpus/$t/* "$work/$t/corpus/" 2>/dev/null || true
    dict=
    [ -f tests/fuzz/$t.dict ] && dict=-dict=tests/fuzz/$t.dict
    CKPT_FUZZ_WEIGHTS=tests/data/mlp.pth TMPDIR=${TMPDIR:-/tmp} \
        "$bin/fuzz_$t" $dict -max_total_time="$secs" -rss_limit_mb=2048 -timeout=10 \
        -max_len=65536 -print_final_stats=1 -artifact_prefix="$work/$t/crashes/" \
        "$work/$t/corpus" >"$work/$t/log" 2>&1 || true
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/$t/log" | tail -n1)
    cov=$(grep -o 'cov: [0-9]*' "$work/$t/log" | tail -n1)
    ft=$(grep -o 'ft: [0-9]*' "$work/$t/log" | tail -n1)
    crashes=$(ls "$work/$t/crashes" | wc -l)
    echo "$t: ${execs:-?} executions in ${secs} s, $cov edges, $ft features, $crashes crash(es)"
}
set -- $targets
while [ $# -gt 0 ]; do
    a=$1; shift
    if [ $# -gt 0 ]; then
        b=$1; shift
        run_one "$a" >"$work/$a.summary" & pa=$!
        run_one "$b" >"$work/$b.summary" & pb=$!
        wait $pa $pb
        cat "$work/$a.summary" "$work/$b.summary"
    else
        run_one "$a"
    fi
done
