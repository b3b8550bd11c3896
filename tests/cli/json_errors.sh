#!/bin/sh
# json_errors.sh - with --json, stdout holds exactly one JSON document, also
# when the command fails: then it carries "error": {"exit", "command", "file",
# "message"}, error.exit equal to the exit status, the message the one on
# stderr (ckpt(1), "JSON OUTPUT").  Every command that takes --json, on a
# missing file (4), a malformed file (3) and usage errors (2), also when the
# bad option comes before --json.
# shellcheck source=tests/cli/setup.sh
. "${srcdir:-.}/tests/cli/setup.sh"

cd "$srcdir"
have_python || skip "python3 is needed to parse the JSON"

good=tests/data/mlp.pth
missing=$tmp/missing.pth
malformed=tests/bad/not_a_checkpoint.pth
spec=models/mnist_mlp.json

# fails N ARGS...: `ckpt ARGS` exits N, its stdout one error document.
fails() {
    _n=$1
    shift
    expect_exit "$_n" ckpt "$@"
    expect_json_error
}

say "inspect --json"
fails 4 inspect --json "$missing"
fails 3 inspect --json "$malformed"
fails 2 inspect --json
fails 2 inspect --json "$good" "$good"
fails 2 inspect --json --filter '(' "$good"
fails 2 inspect --bogus --json "$good"
fails 2 inspect --max-depth 0 --json "$good"
fails 2 inspect --js "$good" "$good"
note "--quiet silences the text, never the error"
fails 3 inspect --json --quiet "$malformed"
note "README.md's example, exactly"
fails 3 inspect --json tests/bad/empty.pth
json_expect d '{"error": {"exit": 3, "command": "inspect", "file": "tests/bad/empty.pth", "message": "empty file"}}'
expect_exit 0 ckpt inspect --json "$good"
json_true '"error" not in d' "no error object when inspect succeeds"

say "diff --json"
fails 4 diff --json "$good" "$missing"
fails 3 diff --json "$malformed" "$good"
fails 2 diff --json "$good"
fails 2 diff --json --atol x "$good" "$good"
fails 2 diff --bogus --json "$good" "$good"
expect_exit 1 ckpt diff --json "$good" tests/data/bn.pth
json_true '"error" not in d and d["equal"] is False' "a difference (exit 1) is a result, not an error"

say "verify --json"
fails 4 verify --json --model $spec --device cpu "$missing"
fails 3 verify --json --model $spec --device cpu "$malformed"
fails 4 verify --json --model "$tmp/no-spec.json" --device cpu tests/data/fmnist_mlp.pth
fails 2 verify --json tests/data/fmnist_mlp.pth
fails 2 verify --json --model $spec --device tpu tests/data/fmnist_mlp.pth
fails 2 verify --bogus --json --model $spec tests/data/fmnist_mlp.pth
expect_exit 1 ckpt verify --json --model $spec --device cpu tests/data/fmnist_mlp_dp.pth
json_true '"error" not in d' "a failed check (exit 1) is a result, not an error"

say "scan --json: the files' document, with the error of the run's exit status"
fails 4 scan --json "$missing"
json_expect 'd["files"][0]["exit"], d["exit"], d["error"]["file"]' "[4, 4, \"$missing\"]"
fails 3 scan --json "$malformed"
json_expect 'd["files"][0]["verdict"], d["error"]["file"]' "[\"error\", \"$malformed\"]"
fails 3 scan --json --quiet "$malformed"
json_expect 'd["files"]' '[]'
fails 2 scan --json
fails 2 scan --json --allow-unknown "$good"
fails 2 scan --bogus --json "$good"
note "a malformed file, then a missing one: the run's 4 names the missing one"
fails 4 scan --json "$malformed" "$missing"
json_expect 'd["error"]["file"]' "\"$missing\""
expect_exit 0 ckpt scan --json "$good"
json_true '"error" not in d' "no error object when every file is safe"

say "commands without --json answer usage errors in text only"
expect_exit 2 ckpt convert --json "$good" "$tmp/out.pth"
expect_stdout_empty
expect_exit 2 ckpt strip-module --json "$good" "$tmp/out.pth"
expect_stdout_empty

finish
