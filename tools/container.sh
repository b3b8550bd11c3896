#!/bin/sh
# container.sh - the Containerfile's runtime stage, checked without a
# container engine: its root file system made the same way in a chroot.
#
#   tools/container.sh check OUTDIR DIST_TARBALL SRCDIR
#       The build stage: in a copy of tools/portable.sh's build root
#       ($CKPT_ROOTS/bullseye: debian:bullseye's package set and the stage's
#       apt-get install, which tests/containerfile.sh keeps equal), run the
#       Containerfile's own COPY, WORKDIR and RUN lines after its apt-get
#       one on DIST_TARBALL, and check that the /opt/ckpt they make holds the
#       files of OUTDIR's portable folder (`make portable`).
#       The runtime stage: copy the bare Debian 11 root that portable.sh
#       keeps ($CKPT_ROOTS/bullseye-base, debootstrap --variant=minbase, the
#       package set of debian:bullseye-slim), strip what the slim image's
#       dpkg excludes drop (docs but copyrights, man pages, info, locales),
#       put the build stage's /opt/ckpt where the Containerfile's COPY puts
#       it, then run ckpt as its ENTRYPOINT would, with its ENV PATH and in
#       its WORKDIR, on a fixture of SRCDIR's tests/data and one of
#       tests/bad, checking each exit status.
#
# Needs root and the roots of tools/portable.sh (make portable makes them).
# What it does not run: FROM (the roots stand in for the two base images)
# and the apt-get line (the build root has those packages).
set -eu

roots=${CKPT_ROOTS:-/var/cache/ckpt}
base=$roots/bullseye-base

die() {
    echo "container.sh: $*" >&2
    exit 1
}

[ "$(id -u)" -eq 0 ] || die "needs root (chroot)"
[ "${1-}" = check ] && [ $# -eq 4 ] || die "usage: container.sh check OUTDIR DIST_TARBALL SRCDIR"
outdir=$2
dist=$3
srcdir=$4
buildroot=$roots/bullseye
[ -e "$buildroot/.ckpt-build-root" ] || die "$buildroot: no build root (make portable makes it)"
[ -f "$dist" ] || die "$dist: no such tarball (make dist)"
version=$(basename "$dist" .tar.gz)
version=${version#ckpt-}
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
broot=$work/build
trap 'umount "$root/proc" 2>/dev/null || true; umount "$broot/proc" 2>/dev/null || true; rm -rf "$work"' EXIT

# ---- the build stage: its instructions, continuation lines joined
echo "container.sh: the build stage's COPY, WORKDIR and RUN lines in a copy of $buildroot:"
cp -a "$buildroot" "$broot"
rm -rf "$broot/build" "$broot/opt/ckpt"
sed -n '/^FROM debian:bullseye AS build/,/^FROM /p' "$cf" | grep -v '^FROM ' | grep -v '^#' |
    awk '/\\$/ { sub(/\\$/, ""); line = line $0; next } { print line $0; line = "" }' |
    grep . >"$work/stage"
bdir=/
while IFS= read -r ins; do
    case $ins in
    "ARG "*) ;;
    "WORKDIR "*) bdir=${ins#WORKDIR } && mkdir -p "$broot$bdir" ;;
    "COPY ckpt-\${VERSION}.tar.gz "*) cp "$dist" "$broot${ins##* }" ;;
    "RUN apt-get update"*) ;; # the build root has the packages
    "RUN "*)
        mount -t proc proc "$broot/proc"
        set +e
        chroot "$broot" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LC_ALL=C \
            VERSION="$version" sh -c 'cd "$1" && sh -c "$2"' sh "$bdir" "${ins#RUN }" </dev/null >"$work/out" 2>&1
        rc=$?
        set -e
        umount "$broot/proc"
        [ "$rc" -eq 0 ] || { tail -n 20 "$work/out"; die "the build stage's RUN failed (exit $rc): $ins"; } ;;
    *) die "$cf: the build stage has an instruction this check cannot run: $ins" ;;
    esac
done <"$work/stage"
# the same files as the portable folder (whose README is portable.sh's own text)
tar xzf "$tarball" -C "$work"
(cd "$work"/ckpt-*-x86_64-linux && find . ! -path ./README | sort) >"$work/portable.list"
(cd "$broot/opt/ckpt" && find . | sort) >"$work/stage.list"
if diff "$work/portable.list" "$work/stage.list" >"$work/diff"; then
    echo "ok: the build stage's /opt/ckpt holds the portable folder's $(wc -l <"$work/stage.list") files and folders"
else
    cat "$work/diff"
    die "the build stage's /opt/ckpt differs from the portable folder (< portable, > stage)"
fi

# ---- the runtime stage
cp -a "$base" "$root"
# debian:bullseye-slim's /etc/dpkg/dpkg.cfg.d/docker drops these at install
find "$root/usr/share/doc" -type f ! -name copyright -delete
rm -rf "$root/usr/share/man"/* "$root/usr/share/info"/* "$root/usr/share/locale"/*
# COPY --from=build /opt/ckpt DEST
mkdir -p "$root$(dirname "$dest")" "$root$wdir"
cp -a "$broot/opt/ckpt" "$root$dest"
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

echo "container.sh: the runtime stage's root (bare bullseye, slim's excludes, the stage's folder in $dest):"
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
