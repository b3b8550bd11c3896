#!/bin/sh
# scan_many.sh - `ckpt scan` of several files (man/ckpt-scan.1): exit 1 when
# any file is unsafe or ambiguous, whatever else failed (an unreadable or
# missing file never hides an unsafe one), else the worst of 3 and 4; a
# summary line at the end of the text, a "summary" object in the JSON.
# shellcheck source=tests/cli/setup.sh
. "${srcdir:-.}/tests/cli/setup.sh"

cd "$srcdir"

safe=tests/data/mlp.pth
unsafe=tests/bad/os_system.pth
malformed=tests/bad/empty.pth
missing=$tmp/missing.pth

say "an unsafe file wins over a malformed and a missing one, in any order"
expect_exit 1 ckpt scan "$malformed" "$unsafe" "$safe" "$missing"
expect_stdout_line '4 files: 1 unsafe, 1 unreadable, 1 not read, 1 safe'
expect_exit 1 ckpt scan "$missing" "$unsafe"
expect_stdout_line '2 files: 1 unsafe, 1 not read'
expect_exit 1 ckpt scan "$unsafe" "$malformed"
expect_stdout_line '2 files: 1 unsafe, 1 unreadable'
note "the errors are on stderr, one line each, as ever"
expect_exit 1 ckpt scan --quiet "$malformed" "$unsafe" "$missing"
expect_stdout_empty
check "stderr names the malformed and the missing file" \
    test "$(grep -c "^ckpt: scan: \($malformed\|$missing\): " "$err")" -eq 2

say "nothing unsafe: the worst of unreadable (3) and not read (4)"
expect_exit 3 ckpt scan "$safe" "$malformed"
expect_stdout_line '2 files: 1 unreadable, 1 safe'
expect_exit 4 ckpt scan "$malformed" "$missing" "$safe"
expect_stdout_line '3 files: 1 unreadable, 1 not read, 1 safe'
expect_exit 0 ckpt scan "$safe" tests/data/bn.pth
expect_stdout_line '2 files: 2 safe'

say "one file: its verdict line says it all, no summary"
expect_exit 0 ckpt scan "$safe"
expect_stdout_no_match '^[0-9]+ files?:'

say "--json: the summary object, and the error only when the run exits 3 or 4"
if have_python; then
    expect_exit 1 ckpt scan --json "$malformed" "$unsafe" "$safe" "$missing"
    json_valid
    json_expect 'd["summary"]' \
        '{"files": 4, "unsafe": 1, "ambiguous": 0, "unreadable": 1, "not_read": 1, "safe": 1, "skipped": 0}'
    json_expect '[f["exit"] for f in d["files"]], d["exit"]' '[[3, 1, 0, 4], 1]'
    json_true '"error" not in d' "exit 1 is a verdict, not an error: no error object"
    expect_exit 3 ckpt scan --json "$safe" "$malformed"
    expect_json_error
    json_expect 'd["summary"]["unreadable"], d["summary"]["safe"], d["error"]["file"]' \
        "[1, 1, \"$malformed\"]"
    expect_exit 1 ckpt scan --json --quiet "$unsafe" "$missing"
    json_expect 'd["files"], d["summary"]["unsafe"], d["summary"]["not_read"], d["exit"]' \
        '[[], 1, 1, 1]'
fi

finish
