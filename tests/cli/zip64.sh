#!/bin/sh
# zip64.sh - zips whose zip64 sizes, offsets or end records (or another
# field libzip refuses: a name flagged UTF-8 that is not, a padded central
# directory) are wrong (tests/bad/make_bad_zip64.py, written here at test time): `ckpt inspect`
# refuses each with exit 3 and one message that names the field that is wrong,
# never libzip's word for its error code ("No such file", "Zip archive
# inconsistent"); scan's findings say the same.  The generator's good.pth,
# every zip64 field right, reads.
# shellcheck source=tests/cli/setup.sh
. "${srcdir:-.}/tests/cli/setup.sh"

have_python || skip "python3 is needed to write the zips"
z=$tmp/zip64
python3 "$srcdir/tests/bad/make_bad_zip64.py" "$z"
python3 "$srcdir/tests/bad/make_bad_zip64.py" --list >"$tmp/list"
libzip_words='No such file|Zip archive inconsistent|Multi-disk|Not a zip archive'

say "good.pth: a zip64 end record and locator, every field right"
expect_exit 0 ckpt inspect "$z/good.pth"
expect_stdout_match "^w +float32 +\[3\] +cpu"
check "Python's zipfile reads it too" python3 -c 'import sys, zipfile
sys.exit(zipfile.ZipFile(sys.argv[1]).read("archive/data/0") != bytes.fromhex("0000803f0000004000004040"))' "$z/good.pth"

tab=$(printf '\t')
while IFS=$tab read -r name words why; do
    [ "$words" != - ] || continue
    say "$name: $why"
    expect_exit 3 ckpt inspect "$z/$name"
    expect_stderr_line "^ckpt: inspect: $z/$name: .*$words"
    note "$(cat "$err")"
    check "not libzip's word for its error code" sh -c "! grep -Eq '$libzip_words' '$err'"
    ckpt scan "$z/$name"
    check "scan's findings and message name it in words too (exit $status)" \
        sh -c "! grep -Eq '$libzip_words' '$out' '$err'"
done <"$tmp/list"

finish
