#!/bin/sh
# rewrite_unsafe.sh - no rewrite writes a global that runs code into its
# output (issue 26; ckpt-rewrite(7), "Globals that run code"; doc/safety.md 9).
# The inputs are made by tests/bad/make_unsafe.py: training checkpoints whose
# "cfg" (or the model's _metadata) holds an unknown call, an object of an
# unknown class, a function as an argument of known data, a call in a dict
# key, builtins.print, os.system.  For every rewriting command:
#   - refused (3) without options (the reader refuses the unknown global);
#   - refused (3) with only --allow-global G, naming G, `ckpt extract` and
#     --keep-unsafe; also with --dry-run and --in-place; no OUT, IN unchanged;
#   - refused (3) with --allow-unknown --keep-unsafe (G not named);
#   - written with --allow-global G --keep-unsafe, and a warning on stderr
#     (also with --quiet) that OUT is unsafe; `ckpt scan OUT` finds G;
#   - never for os.system, whatever the options;
# and `ckpt extract` (the way out the message names) writes a safe file.
# A pickled model (torch.save(model)) is not written back by remap or
# convert either; known data (argparse.Namespace) and an FSDP rank file's
# getattr of enum members are written as before.
# shellcheck source=tests/cli/setup.sh
. "${srcdir:-.}/tests/cli/setup.sh"

have_python || skip "no python3 to run tests/bad/make_unsafe.py"
mkdir "$tmp/in" "$tmp/w"
python3 "$srcdir/tests/bad/make_unsafe.py" "$tmp/in" ||
    { echo "ERROR: tests/bad/make_unsafe.py failed"; exit 99; }
cd "$tmp/w"
OUT=$tmp/w/out.pth

# the rewriting commands, one per line (split on newlines, then on blanks)
SPACE=$IFS
NL='
'
COMMANDS='strip-module
add-module
unwrap
rename -e s/^module\./m./
remap --to cpu
convert
convert --to pth-legacy'

# refused WANT ARGS...: `ckpt ARGS` exits WANT with nothing on stdout and one
# line on stderr; $IN unchanged; no $OUT and no temporary file left.
refused() {
    _want=$1
    shift
    cksum <"$IN" >"$tmp/in.before"
    ls -A "$tmp/w" >"$tmp/dir.before"
    ckpt "$@"
    _p=
    [ "$status" -eq "$_want" ] || _p="$_p; exit $status, expected $_want"
    [ ! -s "$out" ] || _p="$_p; output on stdout"
    _n=$(wc -l <"$err" | tr -d ' ')
    [ "$_n" -eq 1 ] || _p="$_p; $_n lines on stderr, expected 1"
    cksum <"$IN" >"$tmp/in.after"
    cmp -s "$tmp/in.before" "$tmp/in.after" || _p="$_p; IN was modified"
    [ ! -e "$OUT" ] || _p="$_p; OUT was left behind"
    ls -A "$tmp/w" >"$tmp/dir.after"
    cmp -s "$tmp/dir.before" "$tmp/dir.after" || _p="$_p; a file was left in OUT's directory"
    if [ -z "$_p" ]; then
        ok "refused ($_want; one line on stderr; IN unchanged; no OUT): $last_cmd"
    else
        fail "$last_cmd: ${_p#; }"
        show_output
    fi
}

# err_has TEXT...: the stderr of the last run contains every TEXT.
err_has() {
    for _t in "$@"; do
        if grep -Fq -- "$_t" "$err"; then ok "the message names $_t"; else
            fail "the message does not name $_t: $(cat "$err")"
        fi
    done
}

# global_of FILE: the global make_unsafe.py put in FILE.
global_of() {
    sed -n "s/^$1 //p" "$tmp/in/unsafe_globals.txt"
}

IFS=$NL
for f in unsafe_call unsafe_object unsafe_nested unsafe_key unsafe_metadata unsafe_print; do
    IN=$tmp/in/$f.pth
    IFS=$SPACE
    G=$(global_of "$f.pth")
    IFS=$NL
    say "$f.pth (holds $G): every rewrite refuses it, unless --allow-global $G --keep-unsafe"
    for c in $COMMANDS; do
        IFS=$SPACE
        # shellcheck disable=SC2086 # the command and its options are words
        set -- $c
        refused 3 "$@" "$IN" "$OUT"
        err_has "--allow-global $G"
        refused 3 "$@" --allow-global "$G" "$IN" "$OUT"
        err_has "$G" "ckpt extract" "--allow-global $G --keep-unsafe"
        refused 3 "$@" --allow-unknown --keep-unsafe "$IN" "$OUT"
        err_has "--keep-unsafe keeps only the globals named with --allow-global" "add --allow-global $G"
        refused 3 "$@" --allow-global "$G" --dry-run "$IN" "$OUT"

        ckpt "$@" --quiet --allow-global "$G" --keep-unsafe "$IN" "$OUT"
        expect_status 0
        expect_stdout_empty
        expect_stderr_prefix "ckpt: $1: $OUT: warning: keeps the global $G (--keep-unsafe), which torch.load(weights_only=False) imports and runs: it is unsafe to load"
        check "OUT was written" test -f "$OUT"
        ckpt scan "$OUT"
        expect_status 1
        expect_stdout_match "unknown +$G "
        rm -f "$OUT"
        # without --quiet: the report on stdout, the same warning on stderr
        ckpt "$@" --allow-global "$G" --keep-unsafe "$IN" "$OUT"
        expect_status 0
        expect_stdout_match "^wrote $OUT: "
        check "the warning is on stderr" grep -Fq "warning: keeps the global $G" "$err"
        rm -f "$OUT"
        IFS=$NL
    done
    IFS=$SPACE

    say "$f.pth: --in-place is refused the same way, the file untouched"
    cp "$IN" "$tmp/w/inplace.pth"
    IN=$tmp/w/inplace.pth
    OUT=$tmp/w/inplace.pth.none
    refused 3 strip-module --in-place --allow-global "$G" "$IN"
    err_has "ckpt extract"
    rm -f "$IN"
    IN=$tmp/in/$f.pth
    OUT=$tmp/w/out.pth

    say "$f.pth: what the message offers: ckpt extract writes the weights only"
    if [ "$f" = unsafe_metadata ]; then
        # the global is in the state dict itself (its _metadata): tensors only
        refused 3 extract --allow-global "$G" "$IN" "$OUT"
        err_has "root state dict" "ckpt extract --to safetensors"
        expect_exit 0 ckpt extract --quiet --allow-global "$G" --to safetensors "$IN" "$tmp/w/sd.safetensors"
        expect_exit 0 ckpt scan "$tmp/w/sd.safetensors"
        rm -f "$tmp/w/sd.safetensors"
    else
        expect_exit 0 ckpt extract --quiet --allow-global "$G" "$IN" "$OUT"
        expect_stderr_empty
        expect_exit 0 ckpt scan "$OUT"
        rm -f "$OUT"
    fi
    say "$f.pth: a safetensors OUT holds tensors only: written without --keep-unsafe"
    expect_exit 0 ckpt convert --quiet --allow-global "$G" --select model "$IN" "$tmp/w/m.safetensors"
    expect_stderr_empty
    rm -f "$tmp/w/m.safetensors"
done

say "os.system: never written, not even with --allow-global os.system --keep-unsafe"
IN=$tmp/in/unsafe_os_system.pth
IFS=$NL
for c in $COMMANDS extract; do
    IFS=$SPACE
    # shellcheck disable=SC2086
    set -- $c
    refused 3 "$@" --allow-global os.system --keep-unsafe "$IN" "$OUT"
    err_has "os.system" "never admitted"
    refused 3 "$@" --allow-unknown --keep-unsafe "$IN" "$OUT"
    IFS=$NL
done
IFS=$SPACE

say "a pickled model: its classes are not written back (remap, convert); extract writes its state dict"
IN=$data/torch2/whole_dp.pt
for c in "remap --to cpu" "convert" "convert --to pth-legacy"; do
    # shellcheck disable=SC2086
    set -- $c
    refused 3 "$@" "$IN" "$OUT"
    err_has "module tree" "torch.nn.parallel.data_parallel.DataParallel" "ckpt extract"
    refused 3 "$@" --keep-unsafe "$IN" "$OUT"
done
for c in strip-module unwrap; do
    refused 3 $c "$IN" "$OUT"
    err_has "ckpt extract"
done
expect_exit 0 ckpt extract --quiet "$IN" "$OUT"
expect_exit 0 ckpt scan "$OUT"
rm -f "$OUT"

say "scan's fix for a called unknown global is ckpt extract, never an allow-list"
ckpt scan "$tmp/in/unsafe_print.pth"
expect_status 1
sed -n 's/.*; fix: //p' "$out" >"$tmp/fixes"
check "a fix for each torch (2.6+ and 1.13)" test "$(wc -l <"$tmp/fixes")" -eq 2
check "each fix is ckpt extract --allow-global builtins.print" \
    test "$(grep -c "^ckpt extract --allow-global builtins.print $tmp/in/unsafe_print.pth OUT.pth (writes the weights only)" "$tmp/fixes")" -eq 2
check "no fix allow-lists it (add_safe_globals) or says weights_only=False" \
    test "$(grep -c "add_safe_globals\|weights_only=False" "$tmp/fixes")" -eq 0
# a file with no state dict to extract: no fix but not loading it
ckpt scan "$bad/two_unknown_classes.pth"
check "no state dict: the fix is none, and never an allow-list" \
    test "$(sed -n 's/.*; fix: //p' "$out" | grep -c "^none: mymods.X, mymods.Y run code when the file loads")" -eq 2
# known data keeps its add_safe_globals line
ckpt scan "$data/train_ckpt.pth"
expect_stdout_match "fix: torch.serialization.add_safe_globals\\(\\[argparse.Namespace\\]\\)"

say "known data and data-only getattr are written as before, with no warning"
expect_exit 0 ckpt convert --quiet "$data/train_ckpt.pth" "$OUT"
expect_stderr_empty
rm -f "$OUT"
rank=$srcdir/tests/fixtures/distributed/ranks/fsdp1_sharded_pt/rank0.pt
if [ -f "$rank" ]; then
    expect_exit 0 ckpt convert --quiet "$rank" "$OUT"
    expect_stderr_empty
    rm -f "$OUT"
fi

finish
