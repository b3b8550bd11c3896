# setup.sh - sourced by every CLI test (tests/cli/*.sh); POSIX sh.
#
# Environment (set by `make check` through AM_TESTS_ENVIRONMENT):
#   CKPT    the ckpt binary under test      (default: ./ckpt)
#   srcdir  the top of the source tree      (default: .)
# By hand:
#   CKPT=$PWD/ckpt srcdir=$PWD LC_ALL=C sh tests/cli/inspect.sh
#
# Exit status of a test: 0 passed, 1 failed, 77 skipped (automake), 99 hard
# error (the test could not run at all).
#
# A test prints what it checks; each failed check prints a line starting
# "FAIL:" with what was expected and what came, and the test goes on so that
# the log lists every failure.  It must end with `finish`.

set -eu
LC_ALL=C
export LC_ALL
# ckpt's view of this machine, as on one without CUDA, GPU or not (the
# torch_load verdict's missing_here; ckpt(1), ENVIRONMENT)
CKPT_CUDA_DEVICES=${CKPT_CUDA_DEVICES-0}
export CKPT_CUDA_DEVICES
unset LANG LANGUAGE 2>/dev/null || true

CKPT=${CKPT:-./ckpt}
srcdir=${srcdir:-.}
case $CKPT in /*) ;; *) CKPT=$(pwd)/$CKPT ;; esac
srcdir=$(cd "$srcdir" && pwd)
if [ ! -x "$CKPT" ] || [ -d "$CKPT" ]; then
    echo "ERROR: $CKPT is not an executable file: build it first (make ckpt)"
    exit 99
fi
# shellcheck disable=SC2034 # (used by the tests that source this file)
data=$srcdir/tests/data   # good fixtures (tests/data/README.md)
# shellcheck disable=SC2034
bad=$srcdir/tests/bad     # hostile inputs (tests/bad/README.md)

tmp=$(mktemp -d "${TMPDIR:-/tmp}/ckpt-cli.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
trap 'exit 1' HUP INT TERM

failures=0
checks=0
status=0        # exit status of the last `run`
shown=no        # whether its output was shown (once, on the first failure)
out=$tmp/out    # its standard output
err=$tmp/err    # its standard error
: >"$out"
: >"$err"

# ---- reporting ---------------------------------------------------------------

# say TEXT: announce what the next lines check.
say() {
    printf '\n== %s\n' "$*"
}

# note TEXT: informational line.
note() {
    printf '%s\n' "$*" | sed 's/^/   /'
}

# fail MESSAGE: record a failed check and go on.
fail() {
    failures=$((failures + 1))
    printf 'FAIL: %s\n' "$*"
}

# ok MESSAGE: record a passed check.
ok() {
    checks=$((checks + 1))
    printf '   ok: %s\n' "$*"
}

# check MESSAGE CMD ARGS...: ok when CMD succeeds, else a failure.
# Example: check "the input is unchanged" cmp -s "$tmp/before" "$tmp/after"
check() {
    _msg=$1
    shift
    if "$@"; then ok "$_msg"; else fail "$_msg"; fi
}

# quote WORD: WORD in single quotes, as a shell would read it back.
quote() {
    printf "'%s'" "$(printf '%s' "$1" | sed "s/'/'\\\\''/g")"
}

# show_output: the captured output of the last run, indented, once per run
# (for failures).
show_output() {
    [ "$shown" = no ] || return 0
    shown=yes
    if [ -s "$out" ]; then
        echo "   stdout (first 20 lines):"
        sed -n '1,20s/^/   | /p' "$out"
    fi
    if [ -s "$err" ]; then
        echo "   stderr:"
        sed 's/^/   | /' "$err"
    fi
}

# finish: end the test; exit 1 if any check failed.
finish() {
    echo
    if [ "$failures" -gt 0 ]; then
        echo "$failures check(s) FAILED, $checks passed"
        exit 1
    fi
    echo "all $checks checks passed"
    exit 0
}

# skip REASON: skip the whole test (automake's 77).
skip() {
    echo "SKIP: $*"
    exit 77
}

# ---- running ckpt ------------------------------------------------------------

# cmdline ARGS...: ARGS as one printable line.
cmdline() {
    _cl=
    for _a in "$@"; do
        case $_a in
        *[!A-Za-z0-9_./:=+,@%-]* | '') _cl="$_cl $(quote "$_a")" ;;
        *) _cl="$_cl $_a" ;;
        esac
    done
    printf '%s' "${_cl# }"
}

# run CMD ARGS...: run a command, stdout to $out, stderr to $err, exit
# status in $status; never trips `set -e`.
run() {
    last_cmd=$(cmdline "$@")
    shown=no
    if "$@" >"$out" 2>"$err"; then status=0; else status=$?; fi
}

# ckpt ARGS...: run the ckpt under test (as `run`).
ckpt() {
    run "$CKPT" "$@"
    last_cmd="ckpt $(cmdline "$@")"
}

# expect_exit N CMD ARGS...: run CMD (a leading `ckpt` means the binary
# under test) and check its exit status is N.
expect_exit() {
    _want=$1
    shift
    if [ "$1" = ckpt ]; then
        shift
        ckpt "$@"
    else
        run "$@"
    fi
    if [ "$status" -eq "$_want" ]; then
        ok "exit $_want: $last_cmd"
    else
        fail "exit $status, expected $_want: $last_cmd"
        show_output
    fi
}

# expect_status N: the last run exited N.
expect_status() {
    if [ "$status" -eq "$1" ]; then
        ok "exit status $1"
    else
        fail "exit status $status, expected $1: $last_cmd"
        show_output
    fi
}

# expect_stdout_empty / expect_stderr_empty
expect_stdout_empty() {
    if [ -s "$out" ]; then
        fail "stdout is not empty: $last_cmd"
        show_output
    else
        ok "nothing on stdout"
    fi
}
expect_stderr_empty() {
    if [ -s "$err" ]; then
        fail "stderr is not empty: $last_cmd"
        show_output
    else
        ok "nothing on stderr"
    fi
}

# expect_stderr_line PATTERN: stderr is exactly one line, and it matches
# the extended regular expression PATTERN.
expect_stderr_line() {
    _n=$(wc -l <"$err" | tr -d ' ')
    if [ "$_n" -ne 1 ]; then
        fail "stderr has $_n lines, expected one: $last_cmd"
        show_output
    elif grep -Eq -- "$1" "$err"; then
        ok "one line on stderr, matching /$1/"
    else
        fail "stderr does not match /$1/: $last_cmd"
        show_output
    fi
}

# expect_stderr_prefix TEXT: stderr is exactly one line, starting with TEXT
# (compared as a plain string).
expect_stderr_prefix() {
    _n=$(wc -l <"$err" | tr -d ' ')
    _line=$(cat "$err")
    if [ "$_n" -ne 1 ]; then
        fail "stderr has $_n lines, expected one starting '$1': $last_cmd"
        show_output
    else
        case $_line in
        "$1"*) ok "one line on stderr, starting '$1'" ;;
        *)
            fail "stderr does not start with '$1': $last_cmd"
            show_output
            ;;
        esac
    fi
}

# expect_stdout_line TEXT: stdout has a line equal to TEXT.
expect_stdout_line() {
    if grep -Fxq -- "$1" "$out"; then
        ok "stdout has the line '$1'"
    else
        fail "stdout has no line '$1': $last_cmd"
        show_output
    fi
}

# expect_stdout_match PATTERN: a line of stdout matches the ERE PATTERN.
expect_stdout_match() {
    if grep -Eq -- "$1" "$out"; then
        ok "stdout matches /$1/"
    else
        fail "no line of stdout matches /$1/: $last_cmd"
        show_output
    fi
}

# expect_stdout_no_match PATTERN: no line of stdout matches the ERE PATTERN.
expect_stdout_no_match() {
    if grep -Eq -- "$1" "$out"; then
        fail "a line of stdout matches /$1/: $last_cmd"
        show_output
    else
        ok "no line of stdout matches /$1/"
    fi
}

# ---- JSON (with any python3) -------------------------------------------------

# have_python: true when a python3 is there to parse JSON.
have_python() {
    command -v python3 >/dev/null 2>&1
}

# json_valid: the last run's stdout is one JSON document.
json_valid() {
    if python3 -c 'import json,sys; json.load(open(sys.argv[1]))' "$out" 2>"$tmp/pyerr"; then
        ok "stdout is valid JSON"
    else
        fail "stdout is not valid JSON: $last_cmd ($(tail -n 1 "$tmp/pyerr"))"
        show_output
    fi
}

# The checker behind json_expect and json_true.  EXPR is a Python expression
# over `d` (the last run's stdout, parsed); it may also use the modules json,
# math, re, struct, zipfile, zlib, the variable `srcdir`, and `tensor(NAME)`,
# the tensor whose path is [NAME].
json_eval() {
    python3 - "$out" "$srcdir" "$@" <<'EOF'
import json, math, re, struct, sys, zipfile, zlib
path, srcdir, mode, expr = sys.argv[1:5]
d = json.load(open(path))
def tensor(name):
    for t in d["tensors"]:
        if t["path"] == [name]:
            return t
    raise KeyError("no tensor %r" % name)
try:
    got = eval("(" + expr.strip() + "\n)", dict(globals()))
except Exception as e:
    print("error: %s: %s" % (type(e).__name__, e))
    sys.exit(1)
canon = lambda v: json.dumps(v, sort_keys=True)
if mode == "expect":
    print(canon(got))
    sys.exit(0 if canon(got) == canon(json.loads(sys.argv[5])) else 1)
sys.exit(0 if got else 1)
EOF
}

# json_expect EXPR EXPECTED: EXPR equals the JSON text EXPECTED, types
# included (1 is neither 1.0 nor true).
# Example: json_expect 'd["summary"]["bytes"]' 407080
json_expect() {
    if _got=$(json_eval expect "$1" "$2" 2>&1); then
        ok "$1 == $2"
    else
        fail "$1 is $_got, expected $2: $last_cmd"
    fi
}

# json_true EXPR [MESSAGE]: EXPR is true.
# Example: json_true 'tensor("tied_a")["storage"] == tensor("tied_b")["storage"]'
json_true() {
    if _got=$(json_eval true "$1" 2>&1); then
        ok "${2:-$1}"
    else
        fail "${2:-$1}: false${_got:+ ($_got)}: $last_cmd"
    fi
}

# json_error_ok: true when the last run failed (exit 2, 3 or 4) and its
# stdout is exactly one JSON document carrying "error": {"exit": its exit
# status, "command", "file", "message"}, the message of the error line on
# stderr (`ckpt: <command>: <file>: <message>`); what it found in $tmp/pyerr.
json_error_ok() {
    python3 - "$out" "$err" "$status" >"$tmp/pyerr" 2>&1 <<'EOF'
import json, sys
out, err, status = sys.argv[1], sys.argv[2], int(sys.argv[3])
text = open(out).read()
d = json.loads(text)  # one document: anything after it is an error
assert status in (2, 3, 4), "exit status %d is not a failure" % status
e = d.get("error")
assert isinstance(e, dict), "no error object in %r" % text[:200]
assert e["exit"] == status, "error.exit %r, exit status %d" % (e["exit"], status)
# stderr's text escapes controls (C0 and DEL as \xNN, C1 as \u00NN); JSON keeps them
esc = lambda t: "".join("\\x%02x" % ord(c) if ord(c) < 0x20 or ord(c) == 0x7f
                        else "\\u%04x" % ord(c) if 0x80 <= ord(c) <= 0x9f else c for c in t)
line = "ckpt: %s: %s%s" % (e["command"], esc(e["file"]) + ": " if e["file"] else "",
                           esc(e["message"]))
lines = open(err).read().splitlines()
assert any(l.startswith(line) for l in lines), "no stderr line starts %r" % line
print("error.exit %d, %r" % (status, e["message"]))
EOF
}

# expect_json_error: json_error_ok, as a check.
expect_json_error() {
    if json_error_ok; then
        ok "stdout is one JSON document, $(cat "$tmp/pyerr")"
    else
        fail "not one JSON document with error.exit $status: $last_cmd ($(tail -n 1 "$tmp/pyerr"))"
        show_output
    fi
}

# ---- rewriting commands (tests/cli/rewrite.sh, rewrite_hostile.sh) -----------

# listing DIR: the names in DIR (dot files included), one a line, sorted.
listing() {
    (cd "$1" && ls -A)
}

# inspect_json FILE [OPTIONS...]: run `ckpt inspect --json OPTIONS FILE`;
# the JSON checks (json_expect, json_true) then read its output.  A failure
# to inspect is a failed check.
inspect_json() {
    _f=$1
    shift
    ckpt inspect --json "$@" "$_f"
    if [ "$status" -ne 0 ]; then
        fail "cannot inspect $_f (exit $status): $last_cmd"
        show_output
    fi
}

# expect_tensor_paths FILE JSON: the tensors of FILE, in order, have the
# paths JSON (a list of paths, each a list of keys).
# Example: expect_tensor_paths sd.pth '[["n.1.weight"], ["n.1.bias"]]'
expect_tensor_paths() {
    inspect_json "$1"
    json_expect '[t["path"] for t in d["tensors"]]' "$2"
}

# expect_devices FILE JSON: the devices of FILE's tensors, in order.
expect_devices() {
    inspect_json "$1"
    json_expect '[t["device"] for t in d["tensors"]]' "$2"
}

# same_data A B: the tensors of A and B hold the same elements (the crc32 of
# `ckpt inspect --stats`), with the same dtypes, shapes and strides, in the
# same order.
same_data() {
    inspect_json "$1" --stats
    cp "$out" "$tmp/same_data.a"
    inspect_json "$2" --stats
    cp "$out" "$tmp/same_data.b"
    if python3 - "$tmp/same_data.a" "$tmp/same_data.b" <<'PYEOF'
import json, sys
a, b = (json.load(open(f))["tensors"] for f in sys.argv[1:])
f = lambda ts: [[t[k] for k in ("dtype", "shape", "stride", "crc32")] for t in ts]
sys.exit(0 if f(a) == f(b) else 1)
PYEOF
    then
        ok "$2 holds the same data as $1 (dtype, shape, stride, crc32 of every tensor)"
    else
        fail "$2 does not hold the same data as $1"
    fi
}

# The reader behind the two checks below: loads data.pkl of a zip checkpoint
# with Python's pickle, every global but collections.OrderedDict replaced by
# an inert stand-in (nothing is imported or called), and prints
# json.dumps(EXPR) where EXPR may use `root` (the unpickled root), `z` (the
# zipfile.ZipFile), `prefix` (the archive folder) and `arg` (ARG).
# Usage: pickle_eval FILE EXPR [ARG]
pickle_eval() {
    python3 - "$1" "$2" "${3-}" <<'PYEOF'
import collections, io, json, pickle, sys, zipfile
class Opaque:
    def __init__(self, *a, **k): self.args = a
    def __setstate__(self, state): self.state = state
def stub(name):
    if name.startswith("torch._utils._rebuild"):
        return lambda *a: ("tensor", name) + a
    return type(name, (Opaque,), {})
class Reader(pickle.Unpickler):
    def find_class(self, module, name):
        if (module, name) == ("collections", "OrderedDict"):
            return collections.OrderedDict
        return stub(module + "." + name)
    def persistent_load(self, pid):
        return ("persistent_id", len(pid))
z = zipfile.ZipFile(sys.argv[1])
pkl = [n for n in z.namelist() if n.endswith("/data.pkl")][0]
prefix = pkl[:-len("/data.pkl")]
root = Reader(io.BytesIO(z.read(pkl))).load()
arg = sys.argv[3]
print(json.dumps(eval(sys.argv[2])))
PYEOF
}

# expect_metadata FILE SELECT JSON: the `_metadata` of the state dict at
# SELECT ('' for the root, else keys joined by '/') of the zip checkpoint
# FILE has the module paths JSON, in order.
# Example: expect_metadata sd.pth '' '["", "n", "n.0", "n.1", "n.2", "n.3"]'
expect_metadata() {
    _sel=$2
    _walk='list(getattr(__import__("functools").reduce(lambda m, k: m[k],
        [k for k in arg.split("/") if k], root), "_metadata", {"(none)": 0}).keys())'
    if _got=$(pickle_eval "$1" "$_walk" "$_sel" 2>&1) &&
        python3 -c 'import json,sys; sys.exit(json.loads(sys.argv[1]) != json.loads(sys.argv[2]))' "$_got" "$3"; then
        ok "_metadata of ${_sel:-the root} in $1: $3"
    else
        fail "_metadata of ${_sel:-the root} in $1 is $_got, expected $3"
    fi
}

# expect_torch_zip FILE PREFIX: FILE is a zip in torch 2.x's layout: records
# PREFIX/data.pkl, .format_version ("1"), .storage_alignment ("64"),
# byteorder ("little"), data/0..N-1 back to back, version ("3\n") and
# .data/serialization_id (40 digits), in that order, every one stored (not
# compressed), its data at a multiple of 64 bytes, its CRC-32 right.
expect_torch_zip() {
    if _why=$(python3 - "$1" "$2" 2>&1 <<'PYEOF'
import struct, sys, zipfile
path, p = sys.argv[1:]
z = zipfile.ZipFile(path)
names = z.namelist()
n = len([x for x in names if x.startswith(p + "/data/")])
want = ([p + "/data.pkl", p + "/.format_version", p + "/.storage_alignment", p + "/byteorder"]
        + ["%s/data/%d" % (p, i) for i in range(n)] + [p + "/version", p + "/.data/serialization_id"])
if names != want:
    sys.exit("records %s" % names)
if z.read(p + "/.format_version") != b"1" or z.read(p + "/.storage_alignment") != b"64":
    sys.exit(".format_version / .storage_alignment")
sid = z.read(p + "/.data/serialization_id")
if len(sid) != 40 or not sid.isdigit():
    sys.exit("serialization id %r" % sid)
raw = open(path, "rb").read()
for i in z.infolist():
    if i.compress_type != zipfile.ZIP_STORED:
        sys.exit("%s is compressed" % i.filename)
    nl, el = struct.unpack("<HH", raw[i.header_offset + 26:i.header_offset + 30])
    if (i.header_offset + 30 + nl + el) % 64:
        sys.exit("the data of %s is not 64-byte aligned" % i.filename)
infos = z.infolist()
for a, b in zip(infos[4:4 + n], infos[5:5 + n]):  # each data record ends where the next begins
    nl, el = struct.unpack("<HH", raw[a.header_offset + 26:a.header_offset + 30])
    end = a.header_offset + 30 + nl + el + a.file_size + (16 if a.file_size else 0)
    if end != b.header_offset:
        sys.exit("%s does not end where %s begins" % (a.filename, b.filename))
bad = z.testzip()
if bad:
    sys.exit("bad CRC in %s" % bad)
if z.read(p + "/byteorder") != b"little" or z.read(p + "/version") != b"3\n":
    sys.exit("byteorder %r, version %r" % (z.read(p + "/byteorder"), z.read(p + "/version")))
PYEOF
    ); then
        ok "$1 is a zip in torch's layout (folder $2/, stored, 64-byte aligned, CRCs right)"
    else
        fail "$1 is not a zip in torch's layout: $_why"
    fi
}

# expect_stdout_is TEXT: stdout is exactly TEXT (its lines, each ended by a
# newline).
expect_stdout_is() {
    printf '%s\n' "$1" >"$tmp/expected_stdout"
    if cmp -s "$tmp/expected_stdout" "$out"; then
        ok "stdout is exactly: $(sed -n '1p' "$tmp/expected_stdout")$([ "$(wc -l <"$tmp/expected_stdout")" -gt 1 ] && printf ' ...')"
    else
        fail "stdout is not as expected: $last_cmd"
        echo "   expected:"
        sed 's/^/   | /' "$tmp/expected_stdout"
        shown=no
        show_output
    fi
}

# expect_stdout_lines N: stdout has exactly N lines.
expect_stdout_lines() {
    _n=$(wc -l <"$out" | tr -d ' ')
    if [ "$_n" -eq "$1" ]; then
        ok "$1 line(s) on stdout"
    else
        fail "$_n lines on stdout, expected $1: $last_cmd"
        show_output
    fi
}
