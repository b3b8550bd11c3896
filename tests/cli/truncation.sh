#!/bin/sh
# truncation.sh - a checkpoint cut short anywhere, or with one byte of its zip
# structure corrupted, is refused cleanly: never a crash (exit >= 128), a
# hang, exit 1, 2 or 4, or more than one line of message.
#
# The inputs are made here, by ckpt, from a committed fixture: one Adam state
# entry of tests/data/lightning.pth (3 tensors), written as a zip in torch's
# layout (1.4 KiB), as a legacy file, as safetensors and as a shard index;
# with python3 also the zip re-packed with every record deflated.
#
# 1. Truncation: every prefix of each (0 to size - 1 bytes) is given to
#    `ckpt inspect --stats`, which must exit 3 with nothing on stdout and
#    exactly one line on stderr, "ckpt: inspect: FILE: <message>".  (A JSON
#    index cut only in its trailing white space is whole and must load.)
# 2. Corruption: in each zip, every byte of every local header, central
#    directory entry and of the end record, and the first and last byte of
#    every name, extra field, comment and record data, is flipped (xor 0xff),
#    one at a time; `ckpt inspect --stats` must then refuse the file as above
#    or, when the byte does not matter (a time stamp, attributes, a field
#    that the data descriptor overrides, padding), exit 0 with nothing on
#    stderr and the very listing of the intact file.
#
# CKPT_THOROUGH=1 adds the same on tests/data/bn.pth as torch wrote it (5.6
# KiB, 16 records) and on its legacy and safetensors conversions (about four
# times as long).
#
# Every failure is counted and the first few shown; each part ends with a
# census of the messages (digits as N, CRC-32 values as H, bytes that are
# not printable ASCII as ?).
# shellcheck source=tests/cli/setup.sh
. "${srcdir:-.}/tests/cli/setup.sh"

cd "$tmp"

# the first SHOWN failures of each kind are printed in full
shown_max=10

# A per-run time limit when coreutils' timeout is there: a hang is a failure,
# not a stuck test.
if command -v timeout >/dev/null 2>&1; then
    limit="timeout 20"
else
    limit=
fi

# judge FILE: the last run ($rc, $out, $err) refused FILE as it should (exit
# 3, stdout empty, one stderr line starting "ckpt: inspect: FILE: ").  Sets
# $why to the problems ('' when none) and $line to the stderr line.  Only
# shell builtins: this runs thousands of times.
judge() {
    why=
    line=
    _l2=
    [ "$rc" -eq 3 ] || why="$why, exit $rc"
    [ ! -s "$out" ] || why="$why, output on stdout"
    {
        IFS= read -r line || :
        if IFS= read -r _l2 || [ -n "$_l2" ]; then
            why="$why, more than one line on stderr"
        fi
    } <"$err"
    case $line in
    "ckpt: inspect: $1: "?*) ;;
    *) why="$why, stderr does not start with 'ckpt: inspect: $1: '" ;;
    esac
    why=${why#, }
}

# census LABEL: record the message of the last run (its file name removed,
# digits as N) for the summary of LABEL.
census() {
    printf '%s\n' "${line#ckpt: inspect: *: }" >>"$tmp/census.$1"
}

# show_census LABEL: the distinct messages of LABEL, most frequent first.
show_census() {
    [ -s "$tmp/census.$1" ] || return 0
    note "messages ($1), digits as N:"
    sed -e 's/stored [0-9a-f]*, data [0-9a-f]*/stored H, data H/' \
        -e 's/[0-9][0-9]*/N/g' "$tmp/census.$1" | tr -c '\n -~' '?' |
        sort | uniq -c | sort -rn |
        sed 's/^ */  /' | while IFS= read -r _m; do note "$_m"; done
}

# prefixes FILE NAME: `ckpt inspect --stats` refuses every proper prefix of
# FILE, written as NAME (its extension decides how it is read).  The one
# exception: a JSON file (a shard index) cut in its trailing white space is
# still whole, and must load.
prefixes() {
    _src=$1
    _p=$2
    _size=$(wc -c <"$_src" | tr -d ' ')
    _whole=$_size
    case $_src in
    *.json)
        while [ "$_whole" -gt 0 ] &&
            [ -z "$(head -c "$_whole" "$_src" | tail -c 1 | tr -d ' \t\r\n')" ]; do
            _whole=$((_whole - 1))
        done
        ;;
    esac
    _n=0
    _bad=0
    _lab=$(printf '%s' "$_src" | tr / _)
    _t0=$(date +%s)
    while [ "$_n" -lt "$_size" ]; do
        head -c "$_n" "$_src" >"$_p"
        if $limit "$CKPT" inspect --stats "$_p" >"$out" 2>"$err"; then rc=0; else rc=$?; fi
        if [ "$_n" -ge "$_whole" ]; then
            why=
            [ "$rc" -eq 0 ] || why="exit $rc (only white space is missing: it must load)"
            [ ! -s "$err" ] || why="${why:+$why, }output on stderr"
        else
            judge "$_p"
            census "$_lab"
        fi
        if [ -n "$why" ]; then
            _bad=$((_bad + 1))
            if [ "$_bad" -le "$shown_max" ]; then
                fail "$_src cut to $_n of $_size bytes: $why"
                sed -n '1,3s/^/   | /p' "$err"
            fi
        fi
        _n=$((_n + 1))
    done
    _t1=$(date +%s)
    if [ "$_bad" -eq 0 ]; then
        ok "all $_whole prefixes (0 to $((_whole - 1)) bytes) of $_src refused: exit 3, one line ($((_t1 - _t0)) s)"
        [ "$_whole" -eq "$_size" ] ||
            ok "the $((_size - _whole)) longer prefixes, cut only in trailing white space, load"
    else
        fail "$_bad of the $_size prefixes of $_src were not refused cleanly (first $shown_max above)"
    fi
    show_census "$_lab"
}

# ---------------------------------------------------------------------------
say "the small checkpoints (made by ckpt from tests/data/lightning.pth)"
# One Adam state entry of lightning.pth: 3 tensors (a cpu scalar, two cuda:0
# vectors of 10 floats), 3 storages: a zip of 1.2 KiB laid out as torch lays
# it (data.pkl, data/0..2, version, byteorder; 64-byte aligned with FB extra
# fields; data descriptors).
expect_exit 0 ckpt convert --select optimizer_states/0/state/3 "$data/lightning.pth" "$tmp/small.pth"
expect_exit 0 ckpt convert --to pth-legacy "$tmp/small.pth" "$tmp/small_legacy.pth"
expect_exit 0 ckpt convert "$tmp/small.pth" "$tmp/small.safetensors"
mkdir "$tmp/sharded"
expect_exit 0 ckpt convert --shard-size 100 "$tmp/small.pth" "$tmp/sharded/small.index.json"
inputs="small.pth:cut.pth small_legacy.pth:cut.pth small.safetensors:cut.safetensors"
inputs="$inputs sharded/small.index.json:sharded/cut.index.json"
if have_python; then
    # the same records re-packed by Python's zipfile, every one deflated
    python3 - "$tmp/small.pth" "$tmp/small_deflated.pth" <<'EOF'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as src, \
        zipfile.ZipFile(sys.argv[2], "w", zipfile.ZIP_DEFLATED) as dst:
    for i in src.infolist():
        zi = zipfile.ZipInfo(i.filename, date_time=(1980, 1, 1, 0, 0, 0))
        zi.compress_type = zipfile.ZIP_DEFLATED
        dst.writestr(zi, src.read(i))
EOF
else
    note "no python3: no deflated zip"
fi
for f in $inputs small_deflated.pth:; do
    [ -f "${f%%:*}" ] || continue
    expect_exit 0 ckpt inspect --stats "${f%%:*}"
    expect_stderr_empty
done

for f in $inputs; do
    say "every prefix of ${f%%:*} is refused"
    prefixes "${f%%:*}" "${f#*:}"
done

# ---------------------------------------------------------------------------
# flips FILE: flip (xor 0xff), one at a time, every byte of every local
# header, central directory entry and the end record of the zip FILE, and the
# first and the last byte of every name, extra field, comment and record
# data; each time `ckpt inspect --stats` must refuse the file cleanly or list
# exactly what it lists for the intact file.
_v=0 # the value u16 and u32 read
u16() { eval "_v=\$((B_$1 + 256 * B_$(($1 + 1))))"; }
u32() {
    eval "_v=\$((B_$1 + 256 * (B_$(($1 + 1)) + 256 * (B_$(($1 + 2)) + 256 * B_$(($1 + 3))))))"
}
span() { # span FROM LEN: every byte
    _k=$1
    while [ "$_k" -lt $(($1 + $2)) ]; do
        offsets="$offsets $_k"
        _k=$((_k + 1))
    done
}
ends() { # ends FROM LEN: the first and the last byte (none if LEN is 0)
    [ "$2" -gt 0 ] || return 0
    offsets="$offsets $1"
    [ "$2" -eq 1 ] || offsets="$offsets $(($1 + $2 - 1))"
}
# put_byte K V: byte K of flip.pth becomes V
put_byte() {
    # shellcheck disable=SC2059 # the format is the octal escape of the byte
    printf "\\$((($2 / 64) * 100 + ($2 / 8 % 8) * 10 + $2 % 8))" >"$tmp/byte"
    dd if="$tmp/byte" of="$tmp/flip.pth" bs=1 seek="$1" conv=notrunc 2>/dev/null
}
flips() {
    _src=$1
    _lab=flip_$(printf '%s' "$_src" | tr / _)
    cp "$_src" "$tmp/flip.pth"
    # its bytes as shell variables B_0, B_1, ...
    _size=$(wc -c <"$tmp/flip.pth" | tr -d ' ')
    _i=0
    for _b in $(od -An -v -tu1 "$tmp/flip.pth"); do
        eval "B_$_i=$_b"
        _i=$((_i + 1))
    done
    # the end record: its signature PK\5\6, searched from the end
    _e=$((_size - 22))
    while [ "$_e" -ge 0 ]; do
        u32 "$_e"
        [ "$_v" -ne 101010256 ] || break
        _e=$((_e - 1))
    done
    if [ "$_e" -lt 0 ]; then
        fail "$_src has no zip end record"
        return 0
    fi
    u16 $((_e + 10))
    _count=$_v
    u32 $((_e + 16))
    _c=$_v
    note "$_src: $_size bytes, $_count records, central directory at byte $_c, end record at byte $_e"
    offsets=
    _r=0
    while [ "$_r" -lt "$_count" ]; do
        u16 $((_c + 28)); _n=$_v
        u16 $((_c + 30)); _x=$_v
        u16 $((_c + 32)); _m=$_v
        u32 $((_c + 20)); _cs=$_v
        u32 $((_c + 42)); _l=$_v
        span "$_c" 46
        ends $((_c + 46)) "$_n"
        ends $((_c + 46 + _n)) "$_x"
        ends $((_c + 46 + _n + _x)) "$_m"
        u16 $((_l + 26)); _ln=$_v
        u16 $((_l + 28)); _lx=$_v
        span "$_l" 30
        ends $((_l + 30)) "$_ln"
        ends $((_l + 30 + _ln)) "$_lx"
        ends $((_l + 30 + _ln + _lx)) "$_cs"
        _c=$((_c + 46 + _n + _x + _m))
        _r=$((_r + 1))
    done
    span "$_e" 22
    _nf=$(echo "$offsets" | wc -w | tr -d ' ')

    expect_exit 0 ckpt inspect --stats flip.pth
    cp "$out" "$tmp/intact.out"
    _bad=0
    _same=0
    _refused=0
    _t0=$(date +%s)
    for _k in $offsets; do
        eval "_v=\$B_$_k"
        put_byte "$_k" $((255 - _v))
        if $limit "$CKPT" inspect --stats flip.pth >"$out" 2>"$err"; then rc=0; else rc=$?; fi
        why=
        if [ "$rc" -eq 0 ]; then
            if [ -s "$err" ]; then
                why="exit 0 with output on stderr"
            elif ! cmp -s "$out" "$tmp/intact.out"; then
                why="exit 0 but the listing differs from the intact file's"
            else
                _same=$((_same + 1))
            fi
        else
            judge flip.pth
            census "$_lab"
            [ -n "$why" ] || _refused=$((_refused + 1))
        fi
        if [ -n "$why" ]; then
            _bad=$((_bad + 1))
            if [ "$_bad" -le "$shown_max" ]; then
                fail "$_src with byte $_k flipped ($_v -> $((255 - _v))): $why"
                sed -n '1,3s/^/   | /p' "$err"
                [ "$rc" -ne 0 ] || diff "$tmp/intact.out" "$out" | sed -n '1,6s/^/   | /p'
            fi
        fi
        put_byte "$_k" "$_v"
    done
    _t1=$(date +%s)
    check "flip.pth is $_src again after the flips" cmp -s "$tmp/flip.pth" "$_src"
    if [ "$_bad" -eq 0 ]; then
        ok "$_nf flips in $_src: $_refused refused (exit 3, one line), $_same harmless (exit 0, the same listing) ($((_t1 - _t0)) s)"
    else
        fail "$_bad of the $_nf flips in $_src were not handled cleanly (first $shown_max above); $_refused refused, $_same harmless"
    fi
    show_census "$_lab"
}

say "one byte of the zip structure flipped"
flips small.pth
[ ! -f small_deflated.pth ] || flips small_deflated.pth
if [ "${CKPT_THOROUGH:-}" = 1 ]; then
    say "CKPT_THOROUGH=1: tests/data/bn.pth as torch wrote it, and its conversions"
    cp "$data/bn.pth" bn.pth
    expect_exit 0 ckpt convert --to pth-legacy bn.pth bn_legacy.pth
    expect_exit 0 ckpt convert bn.pth bn.safetensors
    for f in bn.pth:cut.pth bn_legacy.pth:cut.pth bn.safetensors:cut.safetensors; do
        say "every prefix of ${f%%:*} is refused"
        prefixes "${f%%:*}" "${f#*:}"
    done
    say "one byte of the zip structure of bn.pth flipped"
    flips bn.pth
fi

finish
