#!/bin/sh
# help.sh - the command line people expect (doc/design.md, "Command line";
# ckpt(1)): `ckpt help CMD` prints what `ckpt CMD --help` and `ckpt CMD -h`
# print; the short options -q (--quiet), -j (--json, for the commands that
# print JSON) and -h do what their long forms do, alone or bundled (-qj); a
# usage error under -j is one JSON document, as under --json.
# shellcheck source=tests/cli/setup.sh
. "${srcdir:-.}/tests/cli/setup.sh"

cd "$srcdir"
good=tests/data/mlp.pth
dp=tests/data/dp_mlp.pth
unsafe=tests/bad/scan/builtins.exec.pkl
spec=models/mnist_mlp.json

ckpt --help
commands=$(sed -n '/^commands:$/,/^$/s/^  \([a-z][a-z-]*\) .*/\1/p' "$out")

# keep NAME: save the last run's exit status, stdout and stderr as NAME;
# same_run NAME [WHAT]: the last run's are those (of WHAT, by default NAME).
keep() {
    cp "$out" "$tmp/$1.out"
    cp "$err" "$tmp/$1.err"
    echo "$status" >"$tmp/$1.status"
}
same_run() {
    if [ "$status" = "$(cat "$tmp/$1.status")" ] && cmp -s "$out" "$tmp/$1.out" &&
        cmp -s "$err" "$tmp/$1.err"; then
        ok "same exit status ($status), stdout and stderr as ${2:-$1}"
    else
        fail "not the same run as ${2:-$1}: $last_cmd"
        show_output
    fi
}

# ---------------------------------------------------------------------------
for c in $commands; do
    say "ckpt help $c = ckpt $c --help = ckpt $c -h"
    expect_exit 0 ckpt "$c" --help
    expect_stderr_empty
    expect_stdout_match "^usage: ckpt $c "
    keep "--help"
    expect_exit 0 ckpt help "$c"
    same_run "--help"
    expect_exit 0 ckpt "$c" -h
    same_run "--help"
done

say "ckpt help = ckpt --help = ckpt -h: the commands and the common options"
expect_exit 0 ckpt --help
expect_stdout_match '^common options'
expect_stdout_match '^  -q, --quiet '
expect_stdout_match '^  -h, --help '
keep top
expect_exit 0 ckpt help
same_run top
expect_exit 0 ckpt -h
same_run top

say "README.md's examples, exactly"
expect_exit 0 ckpt help inspect
expect_stdout_match '^usage: ckpt inspect '
expect_exit 1 ckpt scan -q tests/bad/scan/builtins.exec.pkl
expect_stdout_empty
expect_exit 3 ckpt inspect -qj tests/bad/empty.pth
if have_python; then
    json_expect d '{"error": {"exit": 3, "command": "inspect", "file": "tests/bad/empty.pth", "message": "empty file"}}'
fi

say "ckpt help: an unknown command, or more than one, is a usage error"
expect_exit 2 ckpt help nosuch
expect_stdout_empty
expect_stderr_line "^ckpt: 'nosuch' is not a ckpt command \(see 'ckpt --help'\)$"
expect_exit 2 ckpt help inspect diff
expect_stdout_empty
expect_stderr_line "^ckpt: help: takes one COMMAND"

say "-h prints the help where the command would need arguments it lacks"
expect_exit 0 ckpt verify -h
expect_stdout_match '^usage: ckpt verify '
expect_exit 0 ckpt rename -h
expect_stdout_match '^usage: ckpt rename '

# ---------------------------------------------------------------------------
say "-q is --quiet: inspect, diff, scan, verify and a rewrite"
expect_exit 0 ckpt inspect -q "$good"
expect_stdout_empty
expect_stderr_empty
expect_exit 1 ckpt diff --quiet "$good" "$dp"
keep diff-quiet
expect_exit 1 ckpt diff -q "$good" "$dp"
same_run diff-quiet
expect_stdout_empty
expect_exit 1 ckpt scan -q "$unsafe"
expect_stdout_empty
expect_stderr_empty
expect_exit 1 ckpt verify -q --model "$spec" --device cpu "$dp"
expect_stdout_empty
expect_exit 0 ckpt strip-module -q "$dp" "$tmp/stripped.pth"
expect_stdout_empty
expect_stderr_empty
check "strip-module -q wrote its OUT" test -s "$tmp/stripped.pth"
note "rename's own -e bundles with -q"
expect_exit 0 ckpt rename -qe 's/^module\.//' "$dp" "$tmp/renamed.pth"
expect_stdout_empty
expect_stderr_empty
expect_exit 0 ckpt diff -q "$tmp/stripped.pth" "$tmp/renamed.pth"

say "-j is --json: the same document, byte for byte"
for args in "inspect $good" "diff $good $dp" "scan $unsafe" "scan $good $unsafe" \
    "verify --model $spec --device cpu $dp"; do
    # shellcheck disable=SC2086 # the words of ARGS, split
    set -- $args
    c=$1
    shift
    ckpt "$c" --json "$@"
    keep json
    ckpt "$c" -j "$@"
    same_run json "ckpt $c --json"
    if have_python; then json_valid; fi
done

say "-j and -q bundled (-qj, -jq) are --json --quiet"
ckpt scan --json --quiet "$good" "$unsafe"
keep scan-json-quiet
for b in -qj -jq; do
    expect_exit 1 ckpt scan "$b" "$good" "$unsafe"
    same_run scan-json-quiet "scan --json --quiet"
done

say "usage errors under -j are one JSON document, as under --json"
if have_python; then
    for args in "inspect -j" "inspect -qj" "inspect -jx $good" "inspect -x -j $good" \
        "diff -j $good" "scan -j" "verify -j $dp"; do
        # shellcheck disable=SC2086
        set -- $args
        expect_exit 2 ckpt "$@"
        expect_json_error
    done
    expect_exit 2 ckpt inspect -j "$good" "$good"
    expect_json_error
    json_expect 'd["error"]["message"]' '"expects exactly one FILE"'
else
    note "python3 is not here: the JSON documents are not checked"
fi

say "-j only where --json is: a rewrite calls it unknown, in text"
expect_exit 2 ckpt strip-module -j "$dp" "$tmp/o.pth"
expect_stdout_empty
expect_stderr_line "^ckpt: strip-module: unknown option '-j'"
check "no OUT" test ! -e "$tmp/o.pth"

say "after --, -j is a file's name, not the option"
expect_exit 4 ckpt inspect -- -j
expect_stdout_empty
expect_stderr_prefix "ckpt: inspect: -j: "

finish
