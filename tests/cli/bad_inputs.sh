#!/bin/sh
# bad_inputs.sh - every hostile or malformed file of tests/bad (described in
# tests/bad/README.md) is refused by `ckpt inspect`: exit status 3, exactly
# one line on stderr, "ckpt: inspect: FILE: <message>", nothing on stdout,
# the input left as it was, and nothing in it executed (the payloads would
# create /tmp/ckpt_pwned).  The log is a catalogue of the messages.
# shellcheck source=tests/cli/setup.sh
. "${srcdir:-.}/tests/cli/setup.sh"

cd "$srcdir" # so that file names print as tests/bad/NAME

pwned=/tmp/ckpt_pwned # where the os.system / eval payloads would write
if [ -e "$pwned" ]; then
    echo "ERROR: $pwned exists before the test: something ran a payload already;"
    echo "remove it and run the test again"
    exit 99
fi

# refused FILE ARGS...: `ckpt inspect ARGS FILE` refuses FILE as it should:
# exit 3, nothing on stdout, one line on stderr starting "ckpt: inspect:
# FILE: ", FILE unchanged, no $pwned.  One "ok" line, or a FAIL naming every
# problem.
refused() {
    _file=$1
    shift
    cksum <"$_file" >"$tmp/before"
    ckpt inspect "$@" "$_file"
    _p=
    [ "$status" -eq 3 ] || _p="$_p; exit $status, expected 3"
    [ ! -s "$out" ] || _p="$_p; output on stdout"
    _n=$(wc -l <"$err" | tr -d ' ')
    [ "$_n" -eq 1 ] || _p="$_p; $_n lines on stderr, expected 1"
    case $(head -n 1 "$err") in
    "ckpt: inspect: $_file: "?*) ;;
    *) _p="$_p; stderr does not start with 'ckpt: inspect: $_file: '" ;;
    esac
    cksum <"$_file" >"$tmp/after"
    cmp -s "$tmp/before" "$tmp/after" || _p="$_p; $_file was modified"
    [ ! -e "$pwned" ] || _p="$_p; $pwned exists: a payload ran"
    if [ -z "$_p" ]; then
        ok "refused (3, one line on stderr, no stdout, input unchanged): $last_cmd"
    else
        fail "$last_cmd: ${_p#; }"
        show_output
    fi
}

n=0
for path in tests/bad/*; do
    case $path in
    *.md | *.py) continue ;;
    esac
    [ -f "$path" ] || continue
    n=$((n + 1))
    name=${path#tests/bad/}
    case $name in
    crc_flip.pth)
        # Plain inspect reads no tensor data and may succeed; --stats reads
        # it and must find the flipped bit.
        say "$name (with --stats: the data is read and its CRC-32 checked)"
        refused "$path" --stats
        note "message: $(cat "$err")"
        refused "$path" --stats --json
        refused "$path" --stats --quiet
        ;;
    *)
        say "$name"
        refused "$path"
        note "message: $(cat "$err")"
        refused "$path" --json
        refused "$path" --stats
        refused "$path" --quiet
        ;;
    esac
done
check "found $n hostile inputs in tests/bad" test "$n" -ge 20

# ---------------------------------------------------------------------------
say "crc_flip.pth without --stats: only the pickle is read, the listing succeeds"
expect_exit 0 ckpt inspect tests/bad/crc_flip.pth
expect_stderr_empty

say "crc_flip.pth: --stats --filter still checks every record, listed or not"
# The flipped bit is in archive/data/0 (tensor w); the filter lists only b.
refused tests/bad/crc_flip.pth --stats --filter '^b$'
refused tests/bad/crc_flip.pth --stats --json --filter '^b$'

# ---------------------------------------------------------------------------
say "a refusal names the global"
for f in os_system:os.system posix_system:posix.system builtins_eval:builtins.eval \
    os_system_nested:os.system unknown_storage_type:torch.FooStorage; do
    refused tests/bad/${f%%:*}.pth
    check "the message names ${f#*:}" grep -Fq "${f#*:}" "$err"
done

say "globals that run commands or code are never admitted, whatever the options"
for f in os_system:os.system posix_system:posix.system builtins_eval:builtins.eval \
    os_system_nested:os.system; do
    refused tests/bad/${f%%:*}.pth --allow-unknown
    refused tests/bad/${f%%:*}.pth --allow-global "${f#*:}"
    refused tests/bad/${f%%:*}.pth --allow-global "${f#*:}" --allow-unknown
done
note "$(cat "$err")"

say "an unknown (harmless) global: refused, unless admitted by name or by --allow-unknown"
if have_python; then
    # A zip checkpoint {"cfg": mypkg.Config()}: GLOBAL 'mypkg Config', REDUCE.
    python3 - "$tmp/cfg.pth" <<'EOF'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1], "w") as z:
    z.writestr("archive/data.pkl", b"\x80\x02}X\x03\x00\x00\x00cfgcmypkg\nConfig\n)Rs.")
    z.writestr("archive/version", "3\n")
EOF
    cp "$tmp/cfg.pth" "$tmp/cfg.orig"
    expect_exit 3 ckpt inspect "$tmp/cfg.pth"
    expect_stderr_prefix "ckpt: inspect: $tmp/cfg.pth: "
    check "the message names mypkg.Config and --allow-global" \
        grep -Fq -- "--allow-global mypkg.Config" "$err"
    note "$(cat "$err")"
    expect_exit 3 ckpt inspect --allow-global mypkg.Other "$tmp/cfg.pth"
    for opt in "--allow-global mypkg.Config" --allow-unknown; do
        # shellcheck disable=SC2086 # $opt is one or two words
        expect_exit 0 ckpt inspect $opt "$tmp/cfg.pth"
        expect_stderr_empty
        expect_stdout_line "objects kept opaque:"
        expect_stdout_match '^  cfg +mypkg\.Config$'
        # shellcheck disable=SC2086
        expect_exit 0 ckpt inspect --json $opt "$tmp/cfg.pth"
        json_expect 'd["objects"]' '[{"path": ["cfg"], "global": "mypkg.Config"}]'
    done
    check "the file is unchanged" cmp -s "$tmp/cfg.pth" "$tmp/cfg.orig"
else
    note "SKIP: no python3 to build the file"
fi

finish
