#!/bin/sh
# scan_cost.sh - `ckpt scan` costs the pickles and the headers, not the data
# (issue 31): a checkpoint whose one record is 256 MiB (a hole in a sparse
# file, tests/bad/make_sparse_record.py) is scanned in a few hundred KiB of
# reads, in text, JSON and SARIF; its damaged data record (a CRC-32 that is
# not its bytes', which torch never checks) leaves the verdict the undamaged
# twin's; `ckpt inspect --stats`, which reads every record, reads it all and
# refuses it (the control: the count of bytes read is the kernel's, rchar of
# /proc/PID/io, taken when ckpt has exited and before it is reaped).
# shellcheck source=tests/cli/setup.sh
. "${srcdir:-.}/tests/cli/setup.sh"

have_python || skip "python3 is needed to write the files and count the reads"
[ -r /proc/self/io ] || skip "no /proc/PID/io here to count the bytes read"
python3 "$srcdir/tests/bad/make_sparse_record.py" "$tmp/damaged.pth" 256
python3 "$srcdir/tests/bad/make_sparse_record.py" "$tmp/intact.pth" 256 --intact

# reads LIMIT ARGS...: run ckpt ARGS (as `run`); ok when it read at most
# LIMIT bytes ($tmp/rchar: how many it read)
reads() {
    _limit=$1
    shift
    last_cmd="ckpt $(cmdline "$@")"
    shown=no
    echo "unknown 99" >"$tmp/io"
    python3 - "$tmp/io" "$CKPT" "$@" >"$out" 2>"$err" <<'EOF' || true
import os, subprocess, sys
p = subprocess.Popen(sys.argv[2:], stdin=subprocess.DEVNULL)
os.waitid(os.P_PID, p.pid, os.WEXITED | os.WNOWAIT)  # exited, not yet reaped
with open('/proc/%d/io' % p.pid) as f:
    rchar = next(l.split()[1] for l in f if l.startswith('rchar:'))
with open(sys.argv[1], 'w') as f:
    f.write('%s %d\n' % (rchar, p.wait()))
EOF
    read -r _read status <"$tmp/io"
    echo "$_read" >"$tmp/rchar"
    case $_read in
    '' | *[!0-9]*) fail "could not count the bytes read: $last_cmd" ;;
    *) if [ "$_read" -le "$_limit" ]; then
        ok "read $_read bytes (at most $_limit), exit $status: $last_cmd"
    else
        fail "read $_read bytes, more than $_limit: $last_cmd"
    fi ;;
    esac
}

say "scan of a 256 MiB record: the verdict, from under 8 MiB of reads"
for form in "" --json "--format sarif"; do
    # shellcheck disable=SC2086 # (FORM is the options, split)
    reads 8388608 scan $form "$tmp/damaged.pth"
    check "exit 0 (safe)" test "$status" -eq 0
done
reads 8388608 scan "$tmp/damaged.pth"
expect_stdout_line '  verdict: safe: only state-dict (interpreted) and known-data globals'
expect_stdout_line '  torch.load (2.6+, weights-only): accepted'
expect_stdout_line '  torch.load (1.13, weights-only): accepted'

say "the damaged data record changes nothing: the JSON is the intact twin's"
expect_exit 0 ckpt scan --json "$tmp/intact.pth"
sed "s|$tmp/intact.pth|F|" "$out" >"$tmp/intact.json"
expect_exit 0 ckpt scan --json "$tmp/damaged.pth"
sed "s|$tmp/damaged.pth|F|" "$out" >"$tmp/damaged.json"
check "the same document" cmp -s "$tmp/intact.json" "$tmp/damaged.json"

say "the control: inspect --stats reads every record and finds the damage"
reads 999999999999 inspect --stats "$tmp/damaged.pth"
check "exit 3" test "$status" -eq 3
check "it read the whole record (256 MiB and more)" test "$(cat "$tmp/rchar")" -ge 268435456
check "the CRC-32 mismatch is named" grep -q "record 'archive/data/0': CRC-32 mismatch" "$err"

finish
