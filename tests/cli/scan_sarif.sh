#!/bin/sh
# scan_sarif.sh - `ckpt scan --format text|json|sarif` (man/ckpt-scan.1): the
# SARIF 2.1.0 log a code-scanning system reads, for the whole hostile suite
# (tests/bad), validated against the schema (tests/schemas/) and checked
# against the JSON document of the same files by tests/cli/check_sarif.py:
# one result per unsafe global, TorchScript archive, ambiguity and name
# outside a folder, at the opcode's byte in the file; files not read as
# notifications.  --format json is --json, text the default; usage errors;
# the exit statuses do not depend on the format.
# shellcheck source=tests/cli/setup.sh
. "${srcdir:-.}/tests/cli/setup.sh"

cd "$srcdir"

unsafe=tests/bad/os_system.pth
safe=tests/data/mlp.pth
malformed=tests/bad/empty.pth

say "--format text is the default, --format json is --json"
expect_exit 1 ckpt scan "$unsafe" "$safe"
cp "$out" "$tmp/default"
expect_exit 1 ckpt scan --format text "$unsafe" "$safe"
check "--format text prints what no --format prints" cmp -s "$out" "$tmp/default"
expect_exit 1 ckpt scan --json "$unsafe" "$safe"
cp "$out" "$tmp/json"
expect_exit 1 ckpt scan --format=json "$unsafe" "$safe"
check "--format json prints what --json prints" cmp -s "$out" "$tmp/json"
expect_exit 1 ckpt scan --json --format json "$unsafe" "$safe"
check "--json with --format json: the same" cmp -s "$out" "$tmp/json"

say "usage errors (2): a format that is not one, two that disagree, no FILE"
expect_exit 2 ckpt scan --format xml "$unsafe"
expect_stderr_line "^ckpt: scan: --format: 'xml' is not text, json or sarif"
expect_stdout_empty
expect_exit 2 ckpt scan --format
expect_stdout_empty
expect_exit 2 ckpt scan --json --format sarif "$unsafe"
expect_stderr_line '^ckpt: scan: --json and --format sarif disagree'
expect_exit 2 ckpt scan --format sarif --format text "$unsafe"
expect_stderr_line '^ckpt: scan: --format given twice, differently'
expect_exit 2 ckpt scan --format sarif
expect_stderr_line '^ckpt: scan: needs at least one FILE'
expect_stdout_empty

say "the exit status does not depend on the format"
for f in text json sarif; do
    expect_exit 0 ckpt scan --format $f "$safe"
    expect_exit 1 ckpt scan --format $f "$unsafe"
    expect_exit 3 ckpt scan --format $f "$malformed"
    expect_exit 4 ckpt scan --format $f "$tmp/missing.pth"
    expect_exit 1 ckpt scan --format $f "$malformed" "$unsafe" "$tmp/missing.pth"
done
note "--quiet leaves the log whole: a CI step uploads it"
expect_exit 1 ckpt scan --quiet --format sarif "$unsafe"
expect_stdout_match '"ruleId":[[:space:]]*"dangerous-global"'

if ! have_python; then
    note "no python3: the log's content is not checked"
    finish
fi

say "--format json answers a usage error in JSON, as --json does"
expect_exit 2 ckpt scan --format json --bogus "$unsafe"
json_expect '[d["error"]["exit"], d["error"]["command"]]' '[2, "scan"]'
expect_exit 2 ckpt scan --bogus --format=json "$unsafe"
json_expect 'd["error"]["exit"]' '2'

say "one unsafe file: a result at the GLOBAL opcode's byte, the record and its offset in the message"
expect_exit 1 ckpt scan --format sarif "$unsafe"
expect_stderr_empty
json_valid
json_expect 'd["runs"][0]["results"][0]["ruleId"]' '"dangerous-global"'
json_expect '[d["version"], len(d["runs"]), d["runs"][0]["tool"]["driver"]["name"]]' \
    '["2.1.0", 1, "ckpt"]'
json_expect 'd["runs"][0]["results"][0]["locations"][0]["physicalLocation"]["artifactLocation"]["uri"]' \
    '"tests/bad/os_system.pth"'
json_true 'open(d["runs"][0]["results"][0]["locations"][0]["physicalLocation"]["artifactLocation"]["uri"], "rb").read()[d["runs"][0]["results"][0]["locations"][0]["physicalLocation"]["region"]["byteOffset"]:][:11] == b"cos\nsystem\n"'
json_true 're.search(r"of archive/data\.pkl, byte [0-9]+ of the file", d["runs"][0]["results"][0]["message"]["text"])'
json_expect 'd["runs"][0]["invocations"][0]["executionSuccessful"]' 'true'

say "paths as URIs: percent-encoded, an absolute one as a file: URI"
cp "$unsafe" "$tmp/a b%#.pth"
expect_exit 1 ckpt scan --format sarif "$tmp/a b%#.pth"
json_expect 'd["runs"][0]["results"][0]["locations"][0]["physicalLocation"]["artifactLocation"]["uri"]' \
    "\"file://$tmp/a%20b%25%23.pth\""
note "a path that is not UTF-8: the URI percent-encodes it, the message says \\xHH (a log is UTF-8)"
bad_name=$tmp/$(printf 'caf\351').pth
cp "$malformed" "$bad_name"
expect_exit 3 ckpt scan --format sarif "$bad_name"
json_true 'd["runs"][0]["invocations"][0]["toolExecutionNotifications"][0]["locations"][0]["physicalLocation"]["artifactLocation"]["uri"].endswith("/caf%E9.pth")'
json_true 'r"/caf\xE9.pth: " in d["runs"][0]["invocations"][0]["toolExecutionNotifications"][0]["message"]["text"]'
check "the log is UTF-8" python3 -c 'import sys; open(sys.argv[1], "rb").read().decode("utf-8")' "$out"

say "a file not read: a notification, and the execution did not succeed"
expect_exit 4 ckpt scan --format sarif "$tmp/missing.pth"
expect_stderr_line '^ckpt: scan: .*/missing.pth: '
json_expect '[n["descriptor"]["id"] for n in d["runs"][0]["invocations"][0]["toolExecutionNotifications"]]' \
    '["not-read"]'
json_expect '[d["runs"][0]["invocations"][0]["executionSuccessful"], d["runs"][0]["invocations"][0]["exitCode"], d["runs"][0]["results"]]' \
    '[false, 4, []]'

say "the hostile suite (every file and folder of tests/bad, bad/scan, bad/zip) and the distributed folders"
set --
for f in tests/bad/* tests/bad/scan/* tests/bad/zip/*; do
    case $f in
    *.py | *.md | */expected.json | tests/bad/scan | tests/bad/zip) ;;
    *) set -- "$@" "$f" ;;
    esac
done
[ -d tests/fixtures/distributed/dcp ] && set -- "$@" tests/fixtures/distributed/dcp
[ -d tests/fixtures/distributed/deepspeed ] && set -- "$@" tests/fixtures/distributed/deepspeed
note "$# paths"
expect_exit 1 ckpt scan --json "$@"
cp "$out" "$tmp/suite.json"
expect_exit 1 ckpt scan --format sarif "$@"
cp "$out" "$tmp/suite.sarif"
if python3 "$srcdir/tests/cli/check_sarif.py" "$tmp/suite.sarif" "$tmp/suite.json" "$srcdir" \
    >"$tmp/check" 2>&1; then
    ok "tests/cli/check_sarif.py: the log agrees with the JSON document"
else
    fail "tests/cli/check_sarif.py"
fi
sed 's/^/   /' "$tmp/check"

finish
