#!/bin/sh
# container.sh - the Containerfile's runtime stage, checked without a
# container engine: its root file system made the same way in a chroot.
#
#   tools/container.sh check OUTDIR SRCDIR
#       copy the bare Debian 11 root that tools/portable.sh keeps
#       ($CKPT_ROOTS/bullseye-base, debootstrap --variant=minbase, the
#       package set of debian:bullseye-slim), strip what the slim image's
#       dpkg excludes drop (docs but copyrights, man pages, info, locales),
#       put OUTDIR's portable folder (`make portable`) where the
#       Containerfile's COPY puts it, then run ckpt as its ENTRYPOINT would,
#       with its ENV PATH and in its WORKDIR, on a fixture of SRCDIR's
#       tests/data and one of tests/bad, checking each exit status.
#
# Needs root and the roots of tools/portable.sh (make portable makes them).
# The folder in the image is built by the Containerfile's own build stage;
# tests/containerfile.sh keeps that stage in step with portable.sh, whose
# folder this check uses.
set -eu

roots=${CKPT_ROOTS:-/var/cache/ckpt}
base=$roots/bullseye-base

die() {
    echo "container.sh: $*" >&2
    exit 1
}

[ "$(id -u)" -eq 0 ] || die "needs root (chroot)"
[ "${1-}" = check ] && [ $# -eq 3 ] || die "usage: container.sh check OUTDIR SRCDIR"
outdir=$2
srcdir=$3
cf=$srcdir/Containerfile
[ -e "$base/etc/debian_version" ] || die "$base: no Debian 11 root (make portable makes it)"
set -- "$outdir"/ckpt-*-x86_64-linux.tar.gz
[ -f "$1" ] || die "$outdir: no portable tarball (make portable)"
tarball=$1

# what the runtime stage says, read from the Containerfile itself
runtime=$(sed -n '/^FROM debian:bullseye-slim/,$p' "$cf")
[ -n "$runtime" ] || die "$cf: no runtime stage FROM debian:bullseye-slim"
dest=$(printf '%s\n' "$runtime" | sed -n 's/^COPY --from=build \/opt\/ckpt \(\/.*\)$/\1/p')
path=$(printf '%s\n' "$runtime" | sed -n 's/^ENV PATH=//p')
wdir=$(printf '%s\n' "$runtime" | sed -n 's/^WORKDIR //p')
entry=$(printf '%s\n' "$runtime" | sed -n 's/^ENTRYPOINT \["\([^"]*\)"\]$/\1/p')
[ -n "$dest" ] && [ -n "$path" ] && [ -n "$wdir" ] && [ -n "$entry" ] ||
    die "$cf: the runtime stage lacks COPY --from=build /opt/ckpt, ENV PATH, WORKDIR or ENTRYPOINT"

start=$(date +%s)
work=$(mktemp -d /var/tmp/ckpt-container-check.XXXXXX)
root=$work/root
trap 'umount "$root/proc" 2>/dev/null || true; rm -rf "$work"' EXIT
cp -a "$base" "$root"
# debian:bullseye-slim's /etc/dpkg/dpkg.cfg.d/docker drops these at install
find "$root/usr/share/doc" -type f ! -name copyright -delete
rm -rf "$root/usr/share/man"/* "$root/usr/share/info"/* "$root/usr/share/locale"/*
# COPY --from=build /opt/ckpt DEST: the folder alone, under the name the
# Containerfile gives it
tar xzf "$tarball" -C "$work"
mkdir -p "$root$(dirname "$dest")" "$root$wdir"
mv "$work"/ckpt-*-x86_64-linux "$root$dest"
cp "$srcdir/tests/data/dp_mlp.pth" "$srcdir/tests/bad/builtins_eval.pth" "$root$wdir/"

failed=0
total=0
# expect STATUS ARGS...: the image run with ARGS (ENTRYPOINT ARGS) exits STATUS
expect() {
    want=$1
    shift
    total=$((total + 1))
    mount -t proc proc "$root/proc"
    set +e
    chroot "$root" /usr/bin/env -i PATH="$path" HOME=/root LC_ALL=C \
        sh -c 'cd "$1" && shift && exec "$@"' sh "$wdir" "$entry" "$@" >"$work/out" 2>&1
    rc=$?
    set -e
    umount "$root/proc"
    if [ "$rc" -eq "$want" ]; then
        echo "ok: $entry $* exits $rc"
    else
        echo "FAIL: $entry $* exits $rc, not $want:"
        head -n 5 "$work/out"
        failed=$((failed + 1))
    fi
}

echo "container.sh: the runtime stage's root (bare bullseye, slim's excludes, the folder in $dest):"
expect 0 --version
expect 0 inspect dp_mlp.pth
expect 0 scan dp_mlp.pth
expect 1 scan builtins_eval.pth
expect 3 inspect builtins_eval.pth
# every library beyond glibc's comes from the folder
total=$((total + 1))
mount -t proc proc "$root/proc"
if chroot "$root" /usr/bin/ldd "$dest/bin/$entry" | grep -v -e "=> $dest/" -e "^[[:space:]]*linux-vdso" \
    -e "/ld-linux" -e "/lib\(c\|m\|dl\|pthread\|rt\)\.so"; then
    echo "FAIL: a library above comes from outside $dest"
    failed=$((failed + 1))
else
    echo "ok: every library beyond glibc's is loaded from $dest/lib"
fi
umount "$root/proc"
echo "container.sh: $total checks, $failed failed, $(($(date +%s) - start)) s"
[ "$failed" -eq 0 ]
