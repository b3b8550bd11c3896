#!/bin/sh
# output.sh - how OUT is written (doc/design.md, "Common rules"): never partly,
# and nothing left behind when the filesystem is too small or the command is
# killed.
#
# 1. Free space: OUT in a 64 KiB tmpfs that cannot hold it.  A conversion, a
#    key rewrite, a sharded set and an in-place rewrite must exit 4 before
#    writing, with one line "ckpt: CMD: OUT: not enough free space in 'DIR':
#    N bytes needed, M available", and leave the directory as it was (the
#    input of --in-place unchanged); a file that fits is still written.
#    Mounting needs root, or an unprivileged user and mount namespace
#    (unshare -rm); with neither this part is skipped (said so in the log).
# 2. Signals: a 256 MiB conversion (a sparse safetensors input made here, no
#    disk space taken by it) is killed by SIGTERM, SIGHUP or SIGINT while it
#    writes.  It must die of that signal (exit status 128 + N) and leave
#    neither OUT nor a temporary file.  CKPT_NO_O_TMPFILE=1 makes the
#    library use its named temporary file (".OUT.ckpt-XXXXXX", the fallback
#    for filesystems without O_TMPFILE), which only the command's signal
#    handler can remove; without it the unnamed O_TMPFILE file is used, and
#    is killed while the process holds it open.
# shellcheck source=tests/cli/setup.sh
. "${srcdir:-.}/tests/cli/setup.sh"

cd "$tmp"

# make_safetensors FILE KEY NUMEL [dense]: a safetensors file of one float32
# tensor KEY of NUMEL zeros, sparse (the data is a hole made by truncate), or
# with "dense" of NUMEL elements whose bytes are all 1, written out.
make_safetensors() {
    _json="{\"$2\":{\"dtype\":\"F32\",\"shape\":[$3],\"data_offsets\":[0,$(($3 * 4))]}}"
    while [ $((${#_json} % 8)) -ne 0 ]; do _json="$_json "; done
    _len=${#_json}
    # the header's length, 8 bytes little-endian (octal escapes for printf)
    _le=
    for _i in 0 1 2 3 4 5 6 7; do
        _le="$_le\\$(printf '%03o' $(((_len >> (_i * 8)) & 255)))"
    done
    # shellcheck disable=SC2059 # (the format is the escapes made above)
    printf "$_le" >"$1"
    printf '%s' "$_json" >>"$1"
    if [ "${4-}" = dense ]; then
        head -c $(($3 * 4)) /dev/zero | tr '\000' '\001' >>"$1"
    else
        truncate -s $((8 + _len + $3 * 4)) "$1"
    fi
}

# ---- 1. free space --------------------------------------------------------------

tiny=$tmp/tiny
mkdir "$tiny"
# the inputs of part 1: sd.safetensors (module.w, 40000 bytes, for --in-place
# in the tiny filesystem, where it leaves 24 KiB free)
make_safetensors sd.safetensors module.w 10000 dense

# The script each case runs, as root or in a user and mount namespace:
# mount a 64 KiB tmpfs on $tiny, copy $1 there unless it is '-', run ckpt with
# the other arguments (stderr to $err), and record its exit status, what the
# directory holds and whether the copy is unchanged; then unmount.
cat >tiny.sh <<EOF
set -u
mount -t tmpfs -o size=64k,mode=0755 tmpfs '$tiny' || exit 99
if [ "\$1" != - ]; then cp "\$1" '$tiny'/; fi
copy=\$1
shift
'$CKPT' "\$@" >'$out' 2>'$err'
echo \$? >'$tmp/tiny.status'
(cd '$tiny' && ls -A) >'$tmp/tiny.left'
if [ "\$copy" != - ]; then
    cmp -s "\$copy" '$tiny'/"\$(basename "\$copy")" && echo same >'$tmp/tiny.cmp' || echo changed >'$tmp/tiny.cmp'
fi
umount '$tiny'
EOF

if [ "$(id -u)" -eq 0 ] && sh tiny.sh - --version >/dev/null 2>&1; then
    as="sh"
    mount_how="as root"
elif command -v unshare >/dev/null 2>&1 && unshare -rm sh tiny.sh - --version >/dev/null 2>&1; then
    as="unshare -rm sh"
    mount_how="in a user and mount namespace (unshare -rm)"
else
    as=
fi

# tiny_case COPY LEFT ARGS...: run ckpt ARGS with OUT in the tiny
# filesystem (COPY copied there first, '-' for none); the directory must then
# hold exactly LEFT (names, one a line; '' for nothing).
tiny_case() {
    _copy=$1
    _left=$2
    shift 2
    last_cmd="ckpt $(cmdline "$@")"
    shown=no
    rm -f "$tmp/tiny.status" "$tmp/tiny.left" "$tmp/tiny.cmp"
    $as tiny.sh "$_copy" "$@" || :
    status=$(cat "$tmp/tiny.status" 2>/dev/null || echo 99)
    if [ "$(cat "$tmp/tiny.left" 2>/dev/null)" = "$_left" ]; then
        ok "the directory holds ${_left:-nothing}${_left:+ only}"
    else
        fail "the directory holds '$(tr '\n' ' ' <"$tmp/tiny.left" 2>/dev/null)', expected '$_left': $last_cmd"
    fi
}

# refused OUT: the last tiny case refused OUT for want of space, before writing.
refused() {
    expect_status 4
    expect_stdout_empty
    expect_stderr_line "^ckpt: [a-z-]+: $1: not enough free space in '$tiny': [0-9]+ bytes needed, [0-9]+ available\$"
}

if [ -z "$as" ]; then
    say "free space: SKIPPED (cannot mount a small tmpfs: not root, and no unprivileged user namespaces)"
else
    say "free space: OUT in a 64 KiB tmpfs, mounted $mount_how"

    tiny_case - '' convert "$data/mlp.pth" "$tiny/mlp.safetensors"
    refused "$tiny/mlp.safetensors"
    tiny_case - '' convert --to pth-legacy "$data/mlp.pth" "$tiny/mlp.pth"
    refused "$tiny/mlp.pth"
    tiny_case - '' strip-module "$data/dp_mlp.pth" "$tiny/mlp.pth"
    refused "$tiny/mlp.pth"
    tiny_case - '' convert --shard-size 100K "$data/mlp.pth" "$tiny/mlp.index.json"
    refused "$tiny/mlp.index.json"

    # in place: the old file takes space until the new one replaces it
    tiny_case sd.safetensors sd.safetensors strip-module --in-place "$tiny/sd.safetensors" "$tiny/sd.safetensors"
    refused "$tiny/sd.safetensors"
    check "the input of --in-place is unchanged" [ "$(cat "$tmp/tiny.cmp")" = same ]

    # what fits is written
    tiny_case - bn.pth convert --quiet "$data/bn.pth" "$tiny/bn.pth"
    expect_status 0
    expect_stderr_empty
    tiny_case - sd.safetensors convert --quiet sd.safetensors "$tiny/sd.safetensors"
    expect_status 0
    expect_stderr_empty
fi

# ---- 2. signals -------------------------------------------------------------------

make_safetensors big.safetensors w $((64 * 1024 * 1024))
mkdir sig

# killed_case NAMED SIGNAL: convert big.safetensors to sig/o.pth and send
# SIGNAL while it writes (NAMED: with CKPT_NO_O_TMPFILE=1, and the temporary
# file seen in sig/ first; else the unnamed file seen among the process's
# open files); check the exit status and that sig/ is left empty.
killed_case() {
    _try=1
    # the signal can land after the write ended (a fast page cache, a busy
    # machine between seeing the file and the kill): that outcome, exit 0
    # with OUT whole, is a try that tested nothing; three such tries fail
    while killed_try "$@" && [ "$status" -eq 0 ] && [ -s sig/o.pth ] && [ $_try -lt 3 ]; do
        note "SIG$2: the conversion ended before the signal came (try $_try); again"
        _try=$((_try + 1))
    done
    killed_check "$@"
}

# killed_try NAMED SIGNAL: one run; STATUS, _seen and _pid set
killed_try() {
    _named=$1
    _sig=$2
    rm -rf sig/* sig/.[!.]* 2>/dev/null || :
    if [ "$_named" = yes ]; then
        what="named temporary file"
        # (env --default-signal: a background job's SIGINT is ignored, and an
        # ignored signal stays ignored)
        CKPT_NO_O_TMPFILE=1 $default_signal "$CKPT" convert --quiet big.safetensors sig/o.pth 2>"$err" &
    else
        what="O_TMPFILE"
        $default_signal "$CKPT" convert --quiet big.safetensors sig/o.pth 2>"$err" &
    fi
    _pid=$!
    _seen=no
    _n=0
    while [ $_seen = no ] && [ $_n -lt 300000 ] && kill -0 $_pid 2>/dev/null; do
        _n=$((_n + 1))
        # shellcheck disable=SC2010 # (the links' targets are what is looked at)
        if [ "$_named" = yes ]; then
            for _f in sig/.o.pth.ckpt-*; do
                [ -e "$_f" ] && _seen=yes
            done
        elif ls -l /proc/$_pid/fd 2>/dev/null | grep -Fq "/sig/#"; then
            _seen=yes
        fi
    done
    if [ $_seen = yes ]; then
        kill -s "$_sig" $_pid 2>/dev/null || :
    else
        kill -s KILL $_pid 2>/dev/null || :
    fi
    if wait $_pid 2>/dev/null; then status=0; else status=$?; fi
}

killed_check() {
    if [ $_seen = no ]; then
        fail "SIG$_sig, $what: never saw the temporary file of the write (exit $status)"
        return
    fi
    case $_sig in HUP) _want=129 ;; INT) _want=130 ;; *) _want=143 ;; esac
    if [ "$status" -eq "$_want" ]; then
        ok "SIG$_sig during the write ($what): died of the signal (exit $status)"
    else
        fail "SIG$_sig during the write ($what): exit $status, expected $_want (the write ended first?)"
        sed 's/^/   | /' "$err"
    fi
    _left=$(cd sig && ls -A)
    if [ -z "$_left" ]; then
        ok "SIG$_sig, $what: no OUT and no temporary file left"
    else
        fail "SIG$_sig, $what: left behind: $(echo "$_left" | tr '\n' ' ')"
    fi
}

# every signal at its default: a background job's SIGINT is ignored, and
# SIGHUP too when the suite runs under nohup (an ignored signal stays so)
if env --default-signal=INT,HUP,TERM true 2>/dev/null; then
    default_signal="env --default-signal=INT,HUP,TERM"
else
    default_signal=
fi

say "signals: a 256 MiB conversion killed while it writes"
killed_case yes TERM
killed_case yes HUP
if [ -n "$default_signal" ]; then
    killed_case yes INT
else
    note "SIGINT: skipped (no env --default-signal to undo the shell's ignoring it)"
fi
killed_case no TERM

# the same conversion, not killed, works (the input is sound)
ckpt convert --quiet big.safetensors sig/o.pth
expect_status 0
check "the uninterrupted conversion wrote OUT" [ -s sig/o.pth ]
rm -f sig/o.pth

finish
