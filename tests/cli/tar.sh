#!/bin/sh
# tar.sh - the tar checkpoints of torch <= 0.1 (tests/data/tar/tar_*.pth) as a
# user meets them: `ckpt inspect` names the format pth-tar and lists the
# tensors; `ckpt convert` writes pth-zip, pth-legacy and safetensors, which
# `ckpt diff` finds equal to the tar; extract takes a state dict from it;
# writing pth-tar is refused (read only).  Then the decision "is it a tar?"
# against Python's own tarfile.open(mode='r:'), which torch.load asks: on
# crafted and mutated headers, ckpt takes a file for a tar exactly when
# tarfile.open does not raise TarError.  Values are checked against torch in
# tests/interop/tar_files.py.
# shellcheck source=tests/cli/setup.sh
. "${srcdir:-.}/tests/cli/setup.sh"

cd "$srcdir"
w=$tmp/w
mkdir "$w"

for f in tar_state_dict tar_shared_view tar_training; do
    in=tests/data/tar/$f.pth
    say "$f.pth: inspect, convert, diff"
    expect_exit 0 ckpt inspect "$in"
    expect_stdout_match "^tests/data/tar/$f\\.pth: pth-tar, [0-9]+ tensors? in [0-9]+ storages?"
    expect_exit 0 ckpt inspect --stats --json "$in"
    json_expect 'd["format"]' '"pth-tar"'
    for to in pth legacy.pth; do
        if [ "$to" = pth ]; then expect_exit 0 ckpt convert "$in" "$w/$f.pth"; else
            expect_exit 0 ckpt convert --to pth-legacy "$in" "$w/$f.$to"; fi
        expect_exit 0 ckpt diff "$in" "$w/$f.$to"
    done
    if [ "$f" = tar_training ]; then
        # safetensors holds one state dict: the one extract takes
        expect_exit 0 ckpt convert --select state_dict "$in" "$w/$f.safetensors"
        expect_exit 0 ckpt extract --select state_dict "$in" "$w/sd.pth"
        expect_exit 0 ckpt diff "$w/sd.pth" "$w/$f.safetensors"
        expect_exit 0 ckpt diff --keys-only "$w/sd.pth" "$w/$f.safetensors"
    else
        expect_exit 0 ckpt convert "$in" "$w/$f.safetensors"
        expect_exit 0 ckpt diff "$in" "$w/$f.safetensors"
    fi
done

say "the shared storage and its view stay one storage in the zip"
expect_exit 0 ckpt inspect --json tests/data/tar/tar_shared_view.pth
json_expect 'len({t["storage"] for t in d["tensors"]})' 1
expect_exit 0 ckpt inspect --json "$w/tar_shared_view.pth"
json_expect 'len({t["storage"] for t in d["tensors"]})' 1

say "a tar is read, never written"
expect_exit 2 ckpt convert --to pth-tar tests/data/tar/tar_state_dict.pth "$w/x.pth"
check "no output file" test ! -e "$w/x.pth"

say "extract took the training checkpoint's state dict: its two tensors"
expect_exit 0 ckpt inspect --json "$w/sd.pth"
json_expect '[t["path"] for t in d["tensors"]]' '[["conv.weight"], ["conv.bias"]]'

# ---------------------------------------------------------------------------
# the tarfile of the Python torch runs under ($PYTHON, make check's) is the
# truth: tarfile's PAX parsing changed within 3.11 (3.11.2 as Debian patches it
# checks record lengths that 3.11.7 from python.org does not)
py=${PYTHON:-python3}
case $py in false | "") py=python3 ;; esac
command -v "$py" >/dev/null 2>&1 || skip "no Python for the tarfile comparison"
say "is it a tar? ckpt decides as $($py -c 'import sys; print("Python", sys.version.split()[0])')'s tarfile.open(mode='r:') does"
# Each crafted file is a first header (plus what follows it); tarfile's
# verdict is compared with ckpt's: a file ckpt takes for a tar gets a
# message about the tar (no 'storages' member, a tar header), any other a
# message that is not.
mkdir "$w/sniff"
_rc=0
"$py" - "$w/sniff" <<'PYEOF' || _rc=$?
import io, os, random, sys, tarfile
out = sys.argv[1]
if not hasattr(tarfile, "_header_length_prefix_re"):
    sys.exit(77)  # a tarfile before the PAX length checks: not the one modelled
rng = random.Random(15)

def with_sum(h, fmt=b"%06o\0 ", signed=False):
    h = bytearray(h)
    h[148:156] = b" " * 8
    s = 256 + sum((b - 256 if signed and b > 127 else b) for i, b in enumerate(h)
                  if not 148 <= i < 156)
    h[148:156] = (fmt % s)[:8].ljust(8, b"\0")
    return bytes(h)

def base():
    b = io.BytesIO()
    with tarfile.open(fileobj=b, mode="w:", format=tarfile.PAX_FORMAT) as t:
        i = tarfile.TarInfo("storages")
        i.size = 5
        t.addfile(i, io.BytesIO(b"hello"))
    return b.getvalue()

good = base()
cases = {"good": good, "zeros": b"\0" * 1024, "short": good[:511], "empty_block": b"\0" * 512,
         "one_byte": b"x", "pickle": b"\x80\x02}q\x00." + b"\0" * 600}
h = good[:512]
for name, fmt in (("sum_space", b"%06o \0"), ("sum_plus", b"+%05o\0"), ("sum_0o", b"0o%05o\0"),
                  ("sum_us", b"%o_\0"), ("sum_lead_sp", b"  %05o"), ("sum_tab", b"\t%o\t")):
    cases[name] = with_sum(h, fmt) + good[512:]
hi = bytearray(h)
hi[0:8] = bytes([0xe9, 0xf1, 0x80, 0xff, 0x90, 0xa0, 0xb0, 0xc0])
cases["signed_sum"] = with_sum(hi, signed=True) + good[512:]
cases["unsigned_sum"] = with_sum(hi) + good[512:]
b256 = bytearray(with_sum(h))
s = int(bytes(b256[148:154]), 8)
b256[148:156] = bytes([0x80, 0, 0, 0, 0, 0, s >> 8, s & 255])
cases["sum_base256"] = with_sum(b256, b"%06o\0 ")[:148] + bytes(b256[148:156]) + \
    with_sum(b256)[156:] + good[512:]
for field, at, n in (("mode", 100, 8), ("size", 124, 12), ("mtime", 136, 12), ("devmajor", 329, 8)):
    for val in (b"0x12", b"\xc3\xa9", b"-7", b"1_2", b"8", b" ", b"\xff" * n, b"\x80" + b"\1" * (n - 1)):
        m = bytearray(h)
        m[at:at + n] = val[:n].ljust(n, b"\0")
        cases["%s_%s" % (field, val[:4].hex())] = with_sum(m) + good[512:]
for typ in b"0\0125LKSxgXZ":
    m = bytearray(h)
    m[156] = typ
    cases["type_%02x" % typ] = with_sum(m) + good[512:]
for rec in (b"12 path=ab\n", b"5 a=\n", b"4 ab\n", b"99 path=x\n", b"11 path=x\n\0", b"x path=y\n",
            b"9 =value\n", b"13 size=  7\n", b"10 size=z\n"):
    p = bytearray(h)
    p[156] = ord("x")
    p[124:136] = b"%011o\0" % len(rec)
    cases["pax_%s" % rec[:6].hex()] = with_sum(p) + rec.ljust(512, b"\0") + good
for i in range(400):
    m = bytearray(good[:1024])
    for _ in range(rng.randint(1, 4)):
        m[rng.randrange(512)] = rng.randrange(256)
    cases["mut_%03d" % i] = (with_sum(m[:512], signed=rng.random() < 0.3) if rng.random() < 0.8
                             else bytes(m[:512])) + bytes(m[512:])
with open(os.path.join(out, "expected"), "w") as e:
    for name, data in cases.items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)
        try:
            tarfile.open(fileobj=io.BytesIO(data), mode="r:")
            verdict = "tar"
        except tarfile.TarError:
            verdict = "not"
        except Exception:
            verdict = "tar"  # not a TarError: torch.load fails in its tar reader
        e.write("%s %s\n" % (name, verdict))
PYEOF
[ "$_rc" -ne 77 ] || skip "$py's tarfile predates the PAX record checks of the one modelled"
check "the crafted files are written" test "$_rc" -eq 0
n=0
bad=0
while read -r name want; do
    n=$((n + 1))
    "$CKPT" inspect "$w/sniff/$name" >/dev/null 2>"$w/sniff.err" || true
    if grep -q "tar checkpoint\|tar header\|tar member\|tar:" "$w/sniff.err"; then got=tar; else got=not; fi
    if [ "$got" != "$want" ]; then
        bad=$((bad + 1))
        fail "$name: tarfile says $want, ckpt says $got: $(cat "$w/sniff.err")"
    fi
done <"$w/sniff/expected"
check "ckpt and tarfile agree on all $n crafted files" test "$bad" -eq 0

finish
