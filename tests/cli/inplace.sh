#!/bin/sh
# inplace.sh - `--in-place FILE` (issue 18): a pth-zip key rewrite or remap
# writes only a new pickle record and zip directory into the file itself
# (the same inode, no tensor byte moved); a small safetensors header is
# rewritten where it is; everything else is replaced by a new file, and
# --verbose says which and why.  Guards: a lock against a second writer
# (exit 4), other names of the file refused without --force (exit 3).  The
# crash safety of the steps is tests/interop/inplace_crash.py's.
# shellcheck source=tests/cli/setup.sh
. "${srcdir:-.}/tests/cli/setup.sh"

cd "$tmp"
ino() { ls -i "$1" | cut -d' ' -f1; }

# ===========================================================================
say "--in-place FILE on a torch file: edited in place, the same as a new OUT"
cp "$data/dp_mlp.pth" ip.pth
before=$(ino ip.pth)
expect_exit 0 ckpt strip-module --verbose --in-place ip.pth
expect_stdout_line "state dict (root): 4 of 4 keys renamed"
check "stderr: in place, no tensor byte moved, the sizes, the checksum note" sh -c \
    'grep -Eq "^ckpt: strip-module: ip\.pth: in place: wrote .* no tensor byte moved; [0-9]+ -> [0-9]+ bytes, .* dead$" "$1" &&
     grep -q "^ckpt: strip-module: ip\.pth: note: edited in place: its bytes changed, so does any checksum" "$1"' sh "$err"
check "the same inode ($before)" test "$(ino ip.pth)" = "$before"
expect_exit 0 ckpt strip-module "$data/dp_mlp.pth" new.pth
expect_exit 0 ckpt diff ip.pth new.pth
head -c 400000 "$data/dp_mlp.pth" | tail -c 300000 >"$tmp/orig.part"
check "its storage records are where they were (bytes 100000..400000 as in the original)" sh -c \
    'head -c 400000 "$1" | tail -c 300000 | cmp -s - "$2"' sh ip.pth "$tmp/orig.part"
expect_exit 0 ckpt scan ip.pth
expect_stdout_match "verdict: safe"
expect_stdout_no_match "end-of-central-directory|central directory entry"

say "inspect reports the dead bytes (text and JSON)"
expect_exit 0 ckpt inspect ip.pth
expect_stdout_match "^dead bytes: [0-9.]+ (B|KiB) \\(no record holds them: left by in-place rewrites\\)\$"
expect_exit 0 ckpt inspect --json ip.pth
json_true 'd["dead_bytes"] > 0' "inspect --json: dead_bytes > 0"
expect_exit 0 ckpt inspect --json "$data/dp_mlp.pth"
json_expect 'd["dead_bytes"]' 0

say "the old form: --in-place IN IN, OUT that is IN; remap and rename too"
expect_exit 0 ckpt add-module --quiet --in-place ip.pth ip.pth
check "the same inode" test "$(ino ip.pth)" = "$before"
expect_exit 0 ckpt remap --quiet --to cpu --in-place ip.pth
expect_exit 0 ckpt rename --quiet -e 's/^module\.//' --in-place ip.pth
check "the same inode, after four rewrites" test "$(ino ip.pth)" = "$before"
expect_exit 0 ckpt remap --quiet --to cpu new.pth new2.pth
expect_exit 0 ckpt diff ip.pth new2.pth
expect_exit 0 ckpt inspect ip.pth
expect_stdout_match "^n\\.1\\.weight .* cpu "

say "usage: --in-place takes FILE, or IN and OUT (2)"
expect_exit 2 ckpt strip-module --in-place
expect_stderr_line "^ckpt: strip-module: --in-place needs FILE"
expect_exit 2 ckpt strip-module --in-place a b c
expect_stderr_line "^ckpt: strip-module: expects FILE, or IN and OUT"
expect_exit 2 ckpt strip-module ip.pth
expect_stderr_line "^ckpt: strip-module: needs IN and OUT"

# ===========================================================================
say "what is not edited in place is replaced by a new file, and --verbose says why"
cp "$data/legacy_mlp.pth" legacy.pth
before=$(ino legacy.pth)
expect_exit 0 ckpt remap --verbose --to cpu --in-place legacy.pth
expect_stderr_line "^ckpt: remap: legacy\\.pth: streamed: a new file, then renamed to legacy\\.pth; not in place: written as pth-zip, it was pth-legacy: a conversion writes a new file\$"
check "a new inode" test "$(ino legacy.pth)" != "$before"
cp "$data/mlp.pth" cast.pth
expect_exit 0 ckpt convert --verbose --dtype float16 --in-place cast.pth cast.pth
expect_stderr_line "^ckpt: convert: cast\\.pth: streamed: .*; not in place: storage '0' changes its bytes or is not a record of the file\$"

say "safetensors: a header within the first sector is rewritten where it is"
expect_exit 0 ckpt convert --quiet "$data/dp_mlp.pth" sd.safetensors
before=$(ino sd.safetensors)
expect_exit 0 ckpt strip-module --verbose --in-place sd.safetensors
check "stderr: the header rewritten in place" grep -q \
    "^ckpt: strip-module: sd\\.safetensors: in place: rewrote the header (376 bytes, padded with spaces" "$err"
check "the same inode" test "$(ino sd.safetensors)" = "$before"
check "its data section still starts at byte 384, on a 64-byte boundary" python3 -c '
import struct, sys
sys.exit(8 + struct.unpack("<Q", open(sys.argv[1], "rb").read(8))[0] != 384)' sd.safetensors
expect_exit 0 ckpt diff sd.safetensors new.pth
expect_exit 0 ckpt add-module --quiet --in-place sd.safetensors
expect_exit 0 ckpt diff sd.safetensors "$data/dp_mlp.pth"
say "safetensors: data that another writer left off a 64-byte boundary takes a copy, which aligns it"
# unalign IN OUT: IN's header 8 bytes shorter, its data at byte 376, as
# safetensors' own writer may leave it (it pads to 8 only)
unalign() {
    python3 - "$1" "$2" <<'PYEOF'
import json, struct, sys
blob = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", blob[:8])[0]
text = json.dumps(json.loads(blob[8:8 + n]), separators=(",", ":")).encode()
text += b" " * (n - 8 - len(text))
open(sys.argv[2], "wb").write(struct.pack("<Q", len(text)) + text + blob[8 + n:])
PYEOF
}
unalign sd.safetensors odd.safetensors
cp odd.safetensors odd_kept.safetensors
before=$(ino odd.safetensors)
expect_exit 0 ckpt strip-module --verbose --in-place odd.safetensors
expect_stderr_line "^ckpt: strip-module: odd\\.safetensors: .*; not in place: its data section starts at byte 376, not on a 64-byte boundary: a copy aligns it\$"
check "a new file" test "$(ino odd.safetensors)" != "$before"
st_base() { python3 -c 'import struct, sys; print(8 + struct.unpack("<Q", open(sys.argv[1], "rb").read(8))[0])' "$1"; }
check "its data section starts at byte 384" test "$(st_base odd.safetensors)" = 384
expect_exit 0 ckpt diff odd.safetensors new.pth
say "safetensors: a cast changes the tensors' bytes: a copy, and the reason names the tensor"
cp sd.safetensors cast.safetensors
expect_exit 0 ckpt convert --verbose --dtype float16 --in-place cast.safetensors cast.safetensors
expect_stderr_line "^ckpt: convert: cast\\.safetensors: streamed: .*; not in place: 'module\\.[a-z0-9.]+' is not a whole tensor of the file, as it was\$"
say "safetensors: a longer header takes a copy, and says so"
expect_exit 0 ckpt convert --quiet "$data/ssd300_narrow.pth" big.safetensors
before=$(ino big.safetensors)
expect_exit 0 ckpt rename --verbose -e 's/^/x./' --in-place big.safetensors
expect_stderr_line "^ckpt: rename: big\\.safetensors: streamed: .*; not in place: the new header \\([0-9]+ bytes\\) does not fit in the old one \\([0-9]+ bytes\\): a copy is needed\$"
expect_exit 0 ckpt rename --verbose -e 's/^x\.//' --in-place big.safetensors
expect_stderr_line "^ckpt: rename: big\\.safetensors: streamed: .*; not in place: its header \\([0-9]+ bytes\\) spans more than one 512-byte sector, which a crash could leave half written: a copy is needed\$"

# ===========================================================================
say "guards: another writer holding the lock (4); other names of the file (3)"
cp "$data/dp_mlp.pth" g.pth
cksum <g.pth >g.sum
if command -v flock >/dev/null 2>&1; then
    expect_exit 4 flock g.pth "$CKPT" strip-module --in-place g.pth
    expect_stderr_line "^ckpt: strip-module: g\\.pth: another program is rewriting it \\(it holds its lock\\); nothing was written\$"
    check "g.pth unchanged" sh -c 'cksum <g.pth | cmp -s - g.sum'
else
    skip "the lock" "no flock(1)"
fi
ln -s g.pth sym.pth
expect_exit 3 ckpt strip-module --in-place sym.pth
expect_stderr_line "^ckpt: strip-module: sym\\.pth: a symbolic link: editing in place would change the file it points to"
ln g.pth hard.pth
expect_exit 3 ckpt strip-module --in-place g.pth
expect_stderr_line "^ckpt: strip-module: g\\.pth: it has 2 hard links: editing in place would change it under every name"
check "g.pth unchanged" sh -c 'cksum <g.pth | cmp -s - g.sum'
expect_exit 0 ckpt strip-module --quiet --force --in-place sym.pth
check "--force: edited through the link, so its hard link changed too" cmp -s hard.pth g.pth
check "sym.pth still a link" test -L sym.pth
expect_exit 0 ckpt diff g.pth new.pth

# ===========================================================================
say "a zip not laid out as torch writes it is replaced, not edited"
if have_python; then
    python3 - "$data/dp_mlp.pth" commented.pth <<'EOF'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as a, zipfile.ZipFile(sys.argv[2], 'w') as b:
    for i in a.infolist():
        b.writestr(i, a.read(i))
    b.comment = b'a comment'
EOF
    expect_exit 0 ckpt strip-module --verbose --in-place commented.pth
    expect_stderr_line "^ckpt: strip-module: commented\\.pth: streamed: .*; not in place: its zip layout: its end record is not its last 22 bytes\$"
    expect_exit 0 ckpt diff commented.pth new.pth
    say "a zip whose records another writer left off 64-byte boundaries is replaced, aligned"
    python3 - "$data/dp_mlp.pth" unaligned.pth <<'EOF'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as a, zipfile.ZipFile(sys.argv[2], 'w') as b:
    for i in a.infolist():
        b.writestr(i.filename, a.read(i))
EOF
    cp unaligned.pth unaligned_kept.pth
    expect_exit 0 ckpt strip-module --verbose --in-place unaligned.pth
    expect_stderr_line "^ckpt: strip-module: unaligned\\.pth: streamed: .*; not in place: the record of storage '[0-9]+' starts at byte [0-9]+, not on a 64-byte boundary: a new file aligns it\$"
    check "every record of the new file starts on a 64-byte boundary" python3 - unaligned.pth <<'EOF'
import struct, sys, zipfile
f = open(sys.argv[1], "rb")
for i in zipfile.ZipFile(sys.argv[1]).infolist():
    f.seek(i.header_offset + 26)
    n, x = struct.unpack("<HH", f.read(4))
    if (i.header_offset + 30 + n + x) % 64:
        sys.exit("%s starts at %d" % (i.filename, i.header_offset + 30 + n + x))
EOF
    expect_exit 0 ckpt diff unaligned.pth new.pth
else
    skip "a zip with a comment" "no python"
fi

# ===========================================================================
say "a new OUT: cloned where the filesystem shares extents, else streamed; --verbose says which"
expect_exit 0 ckpt strip-module --verbose "$data/dp_mlp.pth" v.pth
check "stderr: cloned, or streamed and why not cloned" grep -Eq \
    "^ckpt: strip-module: v\\.pth: (cloned: |streamed: a new file, then renamed to v\\.pth; not cloned: the filesystem shares no extents with the input \\(FICLONE: )" "$err"
if [ "$(id -u)" -eq 0 ] && command -v mkfs.xfs >/dev/null 2>&1 && truncate -s 320M xfs.img &&
    mkfs.xfs -q -f -m reflink=1 xfs.img 2>/dev/null && mkdir xfs && mount -o loop xfs.img xfs 2>/dev/null; then
    cp "$data/dp_mlp.pth" xfs/in.pth
    expect_exit 0 ckpt strip-module --verbose xfs/in.pth xfs/out.pth
    expect_stderr_line "^ckpt: strip-module: xfs/out\\.pth: cloned: a new file sharing the input's data \\(FICLONE\\), then edited in place: wrote "
    expect_exit 0 ckpt diff xfs/out.pth new.pth
    expect_exit 0 ckpt scan xfs/out.pth
    # a clone is laid out as a new file: one whose data is off a 64-byte
    # boundary is streamed instead, and a shard (a part of the input's data)
    # is never a clone of the whole file
    cp sd.safetensors xfs/sd.safetensors
    expect_exit 0 ckpt strip-module --verbose xfs/sd.safetensors xfs/st.safetensors
    expect_stderr_line "^ckpt: strip-module: xfs/st\\.safetensors: cloned: a new file sharing the input's data \\(FICLONE\\), then edited in place: wrote "
    check "the clone's data starts at byte 384" test "$(st_base xfs/st.safetensors)" = 384
    cp odd_kept.safetensors xfs/odd.safetensors
    expect_exit 0 ckpt strip-module --verbose xfs/odd.safetensors xfs/odd2.safetensors
    expect_stderr_line "^ckpt: strip-module: xfs/odd2\\.safetensors: streamed: .*; not cloned: its data section starts at byte 376, not on a 64-byte boundary: a copy aligns it\$"
    check "its data starts at byte 384" test "$(st_base xfs/odd2.safetensors)" = 384
    expect_exit 0 ckpt diff xfs/odd2.safetensors new.pth
    expect_exit 0 ckpt convert --verbose --shard-size 200K xfs/sd.safetensors xfs/sh.safetensors.index.json
    check "stderr: no shard cloned" sh -c '! grep -q "cloned: a new file" "$1"' sh "$err"
    expect_exit 0 ckpt diff xfs/sh.safetensors.index.json xfs/sd.safetensors
    if [ -f unaligned_kept.pth ]; then
        cp unaligned_kept.pth xfs/unaligned.pth
        expect_exit 0 ckpt strip-module --verbose xfs/unaligned.pth xfs/unaligned2.pth
        expect_stderr_line "^ckpt: strip-module: xfs/unaligned2\\.pth: streamed: .*; not cloned: the record of storage '[0-9]+' starts at byte [0-9]+, not on a 64-byte boundary: a new file aligns it\$"
        expect_exit 0 ckpt diff xfs/unaligned2.pth new.pth
    fi
    run env CKPT_NO_CLONE=1 "$CKPT" remap --verbose --to cpu xfs/in.pth xfs/out2.pth
    last_cmd="CKPT_NO_CLONE=1 ckpt remap --verbose --to cpu xfs/in.pth xfs/out2.pth"
    expect_status 0
    check "CKPT_NO_CLONE: streamed" grep -q "^ckpt: remap: xfs/out2\\.pth: streamed: " "$err"
    umount xfs
else
    skip "a clone on xfs" "needs root, mkfs.xfs and a loop mount"
fi

say "replacing an existing OUT leaves only OUT (its old blocks freed after the commit)"
mkdir rep
expect_exit 0 ckpt strip-module --quiet "$data/ssd300_narrow.pth" rep/out.pth
expect_exit 0 ckpt add-module --quiet rep/out.pth rep/out2.pth
expect_exit 0 ckpt strip-module --quiet rep/out2.pth rep/out.pth
check "rep/ lists out.pth out2.pth: $(listing rep | tr '\n' ' ')" test "$(listing rep | tr '\n' ' ')" = "out.pth out2.pth "
expect_exit 0 ckpt diff rep/out.pth "$data/ssd300_narrow.pth"
# a big OUT (sparse, 100 MiB) is freed by a child after ckpt exits
truncate -s 100M rep/big.pth
expect_exit 0 ckpt strip-module --quiet "$data/dp_mlp.pth" rep/big.pth
expect_exit 0 ckpt diff rep/big.pth new.pth
i=0
while [ "$(listing rep | tr '\n' ' ')" != "big.pth out.pth out2.pth " ] && [ $i -lt 50 ]; do
    sleep 0.1
    i=$((i + 1))
done
check "the replaced big OUT is gone within 5 s: rep/ lists $(listing rep | tr '\n' ' ')" \
    test "$(listing rep | tr '\n' ' ')" = "big.pth out.pth out2.pth "

say "a bound on dead bytes (CKPT_INPLACE_DEAD_MAX, for tests): over it, the file is compacted"
cp "$data/dp_mlp.pth" b.pth
expect_exit 0 ckpt strip-module --quiet --in-place b.pth
run env CKPT_INPLACE_DEAD_MAX=10 "$CKPT" add-module --verbose --in-place b.pth
last_cmd="CKPT_INPLACE_DEAD_MAX=10 ckpt add-module --verbose --in-place b.pth"
expect_status 0
expect_stderr_line "^ckpt: add-module: b\\.pth: streamed: .*; not in place: compacting: [0-9]+ dead bytes would be over the bound of 10 \\(max\\(64 MiB, 5% of the file\\)\\)\$"
expect_exit 0 ckpt inspect --json b.pth
json_expect 'd["dead_bytes"]' 0
expect_exit 0 ckpt diff b.pth "$data/dp_mlp.pth"

say "every hostile input of tests/bad: refused, or rewritten into a file that reads back"
mkdir hostile
n=0
for f in "$bad"/*; do
    [ -f "$f" ] || continue
    n=$((n + 1))
    cp "$f" hostile/x
    run "$CKPT" strip-module --quiet --in-place hostile/x
    case $status in
    0)
        "$CKPT" inspect hostile/x >/dev/null 2>&1 ||
            fail "$(basename "$f"): rewritten in place, but ckpt inspect cannot read the result"
        ;;
    2 | 3 | 4) ;;
    *) fail "$(basename "$f"): strip-module --in-place exited $status" ;;
    esac
    rm -f hostile/x
done
ok "$n hostile inputs: no crash, and every file written reads back"

finish
