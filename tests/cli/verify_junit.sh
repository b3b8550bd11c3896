#!/bin/sh
# verify_junit.sh - `ckpt verify --junit FILE` (man/ckpt-verify.1): the JUnit
# XML report a CI system shows as tests, read back with Python's
# xml.etree: one testsuite; a testcase per strict load and per output
# compared (the reference, --against, the DataParallel replay); failure
# elements with the error and the tolerance; the checkpoint and the spec
# as properties; names escaped; the same exit statuses as without it; the
# file written whole or not at all, never over an input.
# shellcheck source=tests/cli/setup.sh
. "${srcdir:-.}/tests/cli/setup.sh"

cd "$srcdir"
mlp=models/mnist_mlp.json
ref=tests/data/fmnist_mlp.ref.pth
dp=tests/data/fmnist_mlp_dp.pth
w=$tmp/w
mkdir "$w"

# junit_eval FILE EXPR: EXPR (Python) over the report's root `r`, its one
# testsuite `s`, `cases` (name -> testcase) and `props` (name -> value) is true.
junit_eval() {
    if python3 - "$1" "$2" >"$tmp/pyerr" 2>&1 <<'EOF'; then
import sys
import xml.etree.ElementTree as ET
path, expr = sys.argv[1:3]
r = ET.parse(path).getroot()
suites = r.findall("testsuite")
assert r.tag == "testsuites" and len(suites) == 1, "not one testsuite"
s = suites[0]
cases = {c.get("name"): c for c in s.findall("testcase")}
props = {p.get("name"): p.get("value") for p in s.find("properties").findall("property")}
sys.exit(0 if eval(expr) else 1)
EOF
        ok "$1: $2"
    else
        fail "$1: $2 ($(tail -n 1 "$tmp/pyerr"))"
    fi
}

if ! have_python; then
    skip "no python3 to read the XML with"
fi

say "a failing load: one testcase, failed with torch's message and the fix"
expect_exit 1 ckpt verify --model $mlp --device cpu --junit "$w/dp.xml" "$dp"
expect_stdout_line 'result      FAIL'
junit_eval "$w/dp.xml" 'list(cases) == ["load checkpoint"]'
junit_eval "$w/dp.xml" '[s.get("tests"), s.get("failures"), s.get("errors")] == ["1", "1", "0"]'
junit_eval "$w/dp.xml" 'cases["load checkpoint"].find("failure").get("message").startswith("tests/data/fmnist_mlp_dp.pth: the strict load")'
junit_eval "$w/dp.xml" '"Unexpected key(s) in state_dict: \"module.n.1.weight\"" in cases["load checkpoint"].find("failure").text'
junit_eval "$w/dp.xml" '"ckpt strip-module" in cases["load checkpoint"].find("failure").text'
junit_eval "$w/dp.xml" 'props == {"checkpoint": "tests/data/fmnist_mlp_dp.pth", "spec": "models/mnist_mlp.json", "state_dict": "the root", "result": "FAIL"}'

say "a passing verify: the loads, the output against the reference, against CKPT2, the replay"
expect_exit 0 ckpt strip-module --map-location cpu "$dp" "$w/mlp.pth"
expect_exit 0 ckpt verify --model $mlp --device cpu --reference $ref --against "$w/mlp.pth" \
    --replicas 2 --junit "$w/pass.xml" "$w/mlp.pth"
expect_stdout_line 'result      PASS'
junit_eval "$w/pass.xml" 'sorted(cases) == ["load against", "load checkpoint", "output logits under DataParallel", "output logits vs against", "output logits vs reference"]'
junit_eval "$w/pass.xml" '[s.get("tests"), s.get("failures")] == ["5", "0"]'
junit_eval "$w/pass.xml" 'not s.findall("testcase/failure")'
junit_eval "$w/pass.xml" 'props["result"] == "PASS" and props["replicas"] == "2" and props["input"] == "reference" and props["device"].startswith("cpu")'

say "an output out of tolerance: its failure gives the errors and the tolerance"
expect_exit 1 ckpt verify --model $mlp --device cpu --reference $ref --atol 0 --rtol 0 \
    --junit "$w/tol.xml" "$w/mlp.pth"
junit_eval "$w/tol.xml" '[s.get("tests"), s.get("failures")] == ["2", "1"] and cases["load checkpoint"].find("failure") is None'
junit_eval "$w/tol.xml" '__import__("re").fullmatch(r"max abs [0-9.e-]+, max rel [0-9.e-]+ of max \|ref\| [0-9.]+: above atol 0, rtol 0; [0-9]+ of 2560 elements out of tolerance", cases["output logits vs reference"].find("failure").get("message"))'

say "without a reference: each output ran, a testcase that passes"
expect_exit 0 ckpt verify --model $mlp --device cpu --junit "$w/random.xml" "$w/mlp.pth"
junit_eval "$w/random.xml" 'sorted(cases) == ["load checkpoint", "output logits [4, 10] (ran; no reference)"] and props["input"] != "reference"'

say "names are user data: escaped, and what XML cannot hold written \\xHH"
odd="$w/a&b<c>\"'$(printf '\001\351').pth"
cp "$dp" "$odd"
expect_exit 1 ckpt verify --model $mlp --device cpu --junit "$w/odd.xml" "$odd"
junit_eval "$w/odd.xml" 'props["checkpoint"].endswith("/a&b<c>\"'"'"'\\x01\\xE9.pth")'
check "the report is UTF-8" python3 -c 'import sys; open(sys.argv[1], "rb").read().decode("utf-8")' "$w/odd.xml"

say "the same exit statuses; no report when verify cannot run (2, 3, 4), none over an input"
expect_exit 2 ckpt verify --model $mlp --junit "$w/usage.xml"
check "no report after a usage error" test ! -e "$w/usage.xml"
expect_exit 3 ckpt verify --model $mlp --device cpu --junit "$w/bad.xml" tests/bad/empty.pth
check "no report after an unreadable checkpoint" test ! -e "$w/bad.xml"
expect_exit 4 ckpt verify --model $mlp --device cpu --junit "$w/missing.xml" "$w/missing.pth"
check "no report after a missing checkpoint" test ! -e "$w/missing.xml"
cp "$w/mlp.pth" "$w/keep.pth"
expect_exit 2 ckpt verify --model $mlp --device cpu --junit "$w/mlp.pth" "$w/mlp.pth"
expect_stderr_line '^ckpt: verify: --junit .*/mlp.pth names an input: it would be replaced'
check "the checkpoint is untouched" cmp -s "$w/mlp.pth" "$w/keep.pth"
note "a report that cannot be written is an I/O error (4), with nothing left behind"
expect_exit 4 ckpt verify --model $mlp --device cpu --junit "$w/no/such/dir/r.xml" "$w/mlp.pth"
expect_stderr_line '^ckpt: verify: .*no/such/dir/r.xml: '
note "an existing report is replaced whole"
echo stale >"$w/replace.xml"
note "(with the named temporary file, as where there is no O_TMPFILE)"
CKPT_NO_O_TMPFILE=1
export CKPT_NO_O_TMPFILE
expect_exit 0 ckpt verify --model $mlp --device cpu --junit "$w/replace.xml" "$w/mlp.pth"
junit_eval "$w/replace.xml" 'props["result"] == "PASS"'
check "no temporary file is left in the folder (.NAME.ckpt-XXXXXX)" \
    test "$(find "$w" -name '.*.ckpt-*' | wc -l)" -eq 0

finish
