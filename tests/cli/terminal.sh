#!/bin/sh
# terminal.sh - names from a file never drive the terminal (issue 26): every
# command's text output, given names with C0 controls (ESC ] 0 ; title BEL,
# newline, CR, tab), DEL, the C1 control CSI (U+009B) and bytes that are not
# UTF-8, holds no raw control byte but the newlines and tabs of its own
# layout, no C1 control, and is valid UTF-8: ckpt(1), "Text and JSON".  The
# JSON output keeps the names exact.  Names with a NUL are refused (exit 3,
# nothing on stdout), never cut.
#
# The inputs are made here by tests/bad/make_control_names.py (Python's
# standard library) and by ckpt itself: names.pth converted from
# names.safetensors; file names and a zip archive prefix that are not UTF-8.
# shellcheck source=tests/cli/setup.sh
. "${srcdir:-.}/tests/cli/setup.sh"

command -v python3 >/dev/null 2>&1 || skip "python3 makes the inputs"
cd "$tmp"
python3 "$srcdir/tests/bad/make_control_names.py" . || exit 99
"$CKPT" convert --quiet names.safetensors names.pth || exit 99
# the same checkpoint under a file name that is not UTF-8 (ff, ESC, CSI)
badname=$(printf 'f\377\033]0;t\007\302\233')
cp names.pth "$badname.pth"
# a zip whose archive prefix (every record's folder) is not UTF-8
python3 - <<'EOF' || exit 99
import struct
d = bytearray(open('names.pth', 'rb').read())
for sig, at in ((b'PK\x03\x04', 6), (b'PK\x01\x02', 8)):  # no UTF-8 flag
    i = d.find(sig)
    while i >= 0:
        struct.pack_into('<H', d, i + at, struct.unpack_from('<H', d, i + at)[0] & ~0x800)
        i = d.find(sig, i + 4)
open('prefix.pth', 'wb').write(bytes(d).replace(b'names/', b'n\xff\x1b\xc2\x9b/'))
EOF
mkdir folder
cp names.pth "folder/$badname.pth"
cp global.pkl folder/

# clean FILE...: each file is valid UTF-8 with no control character but
# newline and tab (C0, DEL, C1); prints what it found.
cat >clean.py <<'EOF'
import re, sys
bad = 0
for path in sys.argv[1:]:
    data = open(path, 'rb').read()
    try:
        text = data.decode('utf-8')
    except UnicodeDecodeError as e:
        print('   %s: not UTF-8: %s' % (path, e))
        bad = 1
        continue
    for m in re.finditer('[\x00-\x08\x0b-\x1f\x7f-\x9f]', text):
        line = text.count('\n', 0, m.start()) + 1
        print('   %s: line %d: raw U+%04X' % (path, line, ord(m.group())))
        bad = 1
        break
sys.exit(bad)
EOF

# clean_run EXIT ARGS...: ckpt ARGS exits EXIT, and its stdout and stderr are clean.
clean_run() {
    expect_exit "$@"
    if python3 clean.py "$out" "$err"; then
        ok "no raw control byte in its output"
    else
        fail "raw control bytes or bad UTF-8 in the output of: $last_cmd"
        show_output
    fi
}

# lines N: stdout has N lines (no name added one).
lines() {
    _n=$(wc -l <"$out" | tr -d ' ')
    if [ "$_n" -eq "$1" ]; then ok "$1 lines on stdout"; else
        fail "$_n lines on stdout, expected $1: $last_cmd"
        show_output
    fi
}

say "inspect: the table, --stats, --filter; a file and an archive prefix not UTF-8"
clean_run 0 ckpt inspect names.pth
check "ESC and BEL shown as \\xNN" grep -q 'module.title\\x1b\]0;pwned\\x07 ' "$out"
check "CSI shown as \\u009b" grep -q 'module.csi\\u009b2J ' "$out"
check "a newline shown as \\x0a, on the name's own line" grep -q 'module.nl\\x0aforged -> line ' "$out"
lines 18
clean_run 0 ckpt inspect --stats names.safetensors
clean_run 0 ckpt inspect --filter csi names.pth
clean_run 0 ckpt inspect "$badname.pth"
check "the file name: each byte not UTF-8 as \\xNN" grep -q '^f\\xff\\x1b\]0;t\\x07\\u009b.pth: pth-zip' "$out"
clean_run 0 ckpt inspect prefix.pth
check "the archive prefix escaped" grep -q "^archive prefix 'n\\\\xff\\\\x1b\\\\u009b'" "$out"

say "scan: globals, record names, file names, a folder"
clean_run 1 ckpt scan global.pkl
check "the global named with ESC, newline and CSI, escaped" grep -q 'unknown     evil\\x1b\]0;x\\x07.run\\x0aforged\\u009b ' "$out"
clean_run 0 ckpt scan prefix.pth "$badname.pth"
clean_run 1 ckpt scan folder

say "rewrites: every --dry-run line, and the report of a real run"
for c in strip-module add-module unwrap; do
    clean_run 0 ckpt "$c" --dry-run names.pth out.pth
    lines 7
    clean_run 0 ckpt "$c" names.pth "out$badname.pth"
done
clean_run 0 ckpt rename -e 's/o/\x1b[2J/' --dry-run names.pth out.pth
clean_run 0 ckpt rename -e 's/t/\xc2\x9b/' names.pth out.pth
clean_run 0 ckpt remap --map cpu=cuda:0 --dry-run "$badname.pth" out.pth
clean_run 0 ckpt remap --map cpu=cuda:0 "$badname.pth" out.pth

say "convert, extract: their messages"
clean_run 0 ckpt convert names.pth "out$badname.safetensors"
clean_run 0 ckpt extract "$badname.pth" out.pth

say "diff: value, dtype and shape lines, missing and unexpected keys"
clean_run 1 ckpt diff names.safetensors other.safetensors
lines 6
clean_run 1 ckpt diff --keys-only names.pth other.safetensors
clean_run 1 ckpt diff --normalize "$badname.pth" other.safetensors

say "verify: torch's load message quoting the checkpoint's keys"
clean_run 1 ckpt verify --model "$srcdir/models/mnist_mlp.json" names.pth
check "the unexpected keys escaped, the message on one line" grep -q 'Unexpected key(s) in state_dict: "module.title\\x1b\]0;pwned\\x07"' "$out"

say "error messages on stderr"
clean_run 3 ckpt inspect global.pkl
check "the refused global escaped in the message" grep -q "refused global 'evil\\\\x1b\]0;x\\\\x07.run\\\\x0aforged\\\\u009b'" "$err"
clean_run 4 ckpt inspect "missing$badname.pth"
clean_run 2 ckpt "$badname"
clean_run 2 ckpt inspect --bogus "$badname"
clean_run 3 ckpt strip-module global.pkl out.pth

say "JSON keeps the names exact (C1 and DEL written \\u00NN)"
expect_exit 0 ckpt inspect --json names.pth
cat >json_inspect.py <<'EOF'
import json, sys
sys.path.insert(0, sys.argv[2])
from make_control_names import CONTROL_NAMES
raw = open(sys.argv[1], 'rb').read()
got = [t['path'] for t in json.loads(raw)['tensors']]
assert got == [[n] for n in CONTROL_NAMES], got
assert b'\xc2\x9b' not in raw and b'\x7f' not in raw, 'raw C1 or DEL in the JSON'
EOF
check "inspect --json: every path exact, no raw C1 or DEL" \
    python3 json_inspect.py "$out" "$srcdir/tests/bad"
expect_exit 1 ckpt scan --json global.pkl
cat >json_scan.py <<'EOF'
import json, sys
g = [h["global"] for h in json.load(open(sys.argv[1]))["files"][0]["globals"]]
assert "evil\x1b]0;x\x07.run\nforged\x9b" in g, g
EOF
check "scan --json: the global exact" python3 json_scan.py "$out"

say "names with a NUL: refused, never cut"
for f in nul.pth nul.safetensors; do
    clean_run 3 ckpt inspect "$f"
    expect_stdout_empty
    expect_stderr_line "^ckpt: inspect: $f: .* contains NUL \(a name is kept whole or refused, never cut\)$"
    clean_run 3 ckpt convert "$f" out_nul.safetensors
    check "no output written" test ! -e out_nul.safetensors
done
clean_run 3 ckpt strip-module nul.pth out_nul.pth
check "the key named with its NUL as \\x00" grep -q "key 'w\\\\x00x' contains NUL" "$err"

say "src/: text goes through cli_printf (names escaped), never a bare printf"
if grep -n '\(^\|[^_a-z]\)printf(' "$srcdir"/src/cmd_*.c "$srcdir"/src/rewrite.c; then
    fail "a bare printf in src/ (use cli_printf)"
else
    ok "no bare printf in the commands"
fi

finish
