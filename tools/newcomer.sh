#!/bin/sh
# newcomer.sh - the newcomer check (README.md, "Newcomer check"): from a bare
# machine, the time to a first `ckpt inspect FILE` by each route, measured in
# fresh copies of a bare Debian root (debootstrap --variant=minbase, nothing
# else installed).
#
#   tools/newcomer.sh RELEASE_DIR DIST_TARBALL [WHEEL]
#
# Routes, each in its own copy of the bare root, each step timed:
#   portable  RELEASE_DIR's ckpt-VERSION-x86_64-linux.tar.gz and SHA256SUMS
#             copied in (the download), then `sha256sum -c`, unpack, run
#             bin/ckpt inspect;
#   source    DIST_TARBALL (`make dist`) copied in, then apt-get of the
#             distribution's packages the build needs (tools/portable.sh's
#             build_packages, patchelf aside), ./configure, make, ./ckpt
#             inspect;
#   wheel     (when WHEEL is given) apt-get python3-venv, a venv, pip
#             install WHEEL (its dependencies, numpy, from PyPI; from the
#             folder WHEELHOUSE names instead, offline, when set), then the
#             package's `ckpt inspect` (python -m ckpt_toolkit when the
#             wheel installs no ckpt script).
# The file inspected is tests/data/dp_mlp.pth of this repository.  Copying
# the root and the files in is not timed (a download's time depends on the
# network); apt-get's is, from deb.debian.org (CKPT_DEBIAN_MIRROR), and
# pip's, from PyPI.
#
# Roots: $CKPT_ROOTS/SUITE-base (default /var/cache/ckpt, as
# tools/portable.sh), made with debootstrap when missing; SUITES (default
# "bullseye") names the Debian suites to run in, e.g. "bullseye bookworm".
# Needs root, debootstrap and deb.debian.org.  Not run by `make check` or CI
# (it needs the network and minutes): rerun it by hand, after `make
# portable` (and a wheel build), and copy its summary into README.md.
set -eu

top=$(cd "$(dirname "$0")/.." && pwd)
roots=${CKPT_ROOTS:-/var/cache/ckpt}
mirror=${CKPT_DEBIAN_MIRROR:-http://deb.debian.org/debian}
suites=${SUITES:-bullseye}

die() {
    echo "newcomer.sh: $*" >&2
    exit 1
}

[ $# -ge 2 ] && [ $# -le 3 ] || die "usage: newcomer.sh RELEASE_DIR DIST_TARBALL [WHEEL]"
[ "$(id -u)" -eq 0 ] || die "needs root (debootstrap, chroot)"
release=$(cd "$1" && pwd)
dist=$(cd "$(dirname "$2")" && pwd)/$(basename "$2")
wheel=
if [ $# -eq 3 ]; then
    wheel=$(cd "$(dirname "$3")" && pwd)/$(basename "$3")
    [ -f "$wheel" ] || die "$3: no such wheel"
fi
[ -f "$dist" ] || die "$2: no such tarball (make dist)"
set -- "$release"/ckpt-*-x86_64-linux.tar.gz
[ -f "$1" ] && [ -f "$release/SHA256SUMS" ] ||
    die "$release: no ckpt-*-x86_64-linux.tar.gz and SHA256SUMS (make portable)"
portable=$1
file=$top/tests/data/dp_mlp.pth
name=$(basename "$dist" .tar.gz)
# what the release tarball needs from the distribution: the same list as
# the portable build's (patchelf is that build's own tool)
packages=$(sed -n '/^build_packages="/,/"$/p' "$top/tools/portable.sh" | tr -d '"\\' |
    sed 's/^build_packages=//' | tr ' ' '\n' | grep . | grep -v '^patchelf$' | tr '\n' ' ')

in_root() {
    r=$1
    shift
    mount -t proc proc "$r/proc"
    set +e
    chroot "$r" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LC_ALL=C \
        DEBIAN_FRONTEND=noninteractive "$@"
    rc=$?
    set -e
    umount "$r/proc"
    return $rc
}

ensure_base() {
    b=$roots/$1-base
    mkdir -p "$roots"
    exec 9>"$roots/.lock"
    flock 9
    if [ ! -e "$b/etc/debian_version" ]; then
        command -v debootstrap >/dev/null || die "debootstrap not found (apt-get install debootstrap)"
        rm -rf "$b.tmp"
        debootstrap --variant=minbase "$1" "$b.tmp" "$mirror" >"$roots/debootstrap-$1.log" 2>&1 ||
            die "debootstrap failed; see $roots/debootstrap-$1.log"
        mv "$b.tmp" "$b"
    fi
    exec 9>&-
}

now() {
    date +%s.%N
}

# step LABEL CMD: run CMD (a shell line) in the route's root, timed; its
# output goes to the log
step() {
    label=$1
    t0=$(now)
    if ! in_root "$work/root" sh -c "$2" >>"$log" 2>&1; then
        echo "newcomer.sh: $suite $route: '$label' failed; the last lines of $log:" >&2
        tail -n 20 "$log" >&2
        exit 1
    fi
    s=$(awk -v a="$t0" -v b="$(now)" 'BEGIN { d = b - a; printf(d < 1 ? "%.2f" : "%.1f", d) }')
    total=$(awk -v a="$total" -v b="$s" 'BEGIN { d = a + b; printf(d < 1 ? "%.2f" : "%.1f", d) }')
    steps="$steps${steps:+, }$label $s s"
}

# fresh ROUTE: a new copy of the bare root, the inspected file in /root
fresh() {
    route=$1
    rm -rf "$work/root"
    cp -a "$roots/$suite-base" "$work/root"
    cp /etc/resolv.conf "$work/root/etc/resolv.conf"
    mkdir -p "$work/root/root/dl"
    cp "$file" "$work/root/root/"
    steps=
    total=0
    echo "== $suite $route" >>"$log"
}

report() {
    line="$suite, $route: $total s to a first inspect ($steps)"
    echo "newcomer.sh: $line"
    summary="$summary$line
"
}

work=$(mktemp -d /var/tmp/ckpt-newcomer.XXXXXX)
trap 'umount "$work/root/proc" 2>/dev/null || true; rm -rf "$work"' EXIT
log=$work/log
summary=
for suite in $suites; do
    ensure_base "$suite"
    echo "newcomer.sh: in a bare $suite root ($(cat "$roots/$suite-base/etc/debian_version")):"

    fresh portable
    cp "$portable" "$release/SHA256SUMS" "$work/root/root/dl/"
    step "sha256sum -c and unpack" 'cd /root/dl && sha256sum -c SHA256SUMS && tar xzf ckpt-*-x86_64-linux.tar.gz'
    step "inspect" '/root/dl/ckpt-*/bin/ckpt inspect /root/dp_mlp.pth'
    report

    fresh source
    cp "$dist" "$work/root/root/dl/"
    step "apt-get" "apt-get update -q && apt-get install -y -q --no-install-recommends $packages"
    step "configure" "cd /root/dl && tar xzf $name.tar.gz && cd $name && ./configure -q"
    step "make" "cd /root/dl/$name && nice make -j2"
    step "inspect" "/root/dl/$name/ckpt inspect /root/dp_mlp.pth"
    report

    if [ -n "$wheel" ]; then
        fresh wheel
        cp "$wheel" "$work/root/root/dl/"
        whl=/root/dl/$(basename "$wheel")
        pipfrom=
        if [ -n "${WHEELHOUSE-}" ]; then
            mkdir -p "$work/root/root/dl/wheels"
            cp "$WHEELHOUSE"/*.whl "$work/root/root/dl/wheels/"
            pipfrom="--no-index --find-links /root/dl/wheels"
        fi
        step "apt-get" "apt-get update -q && apt-get install -y -q --no-install-recommends python3-venv"
        step "venv" "python3 -m venv /root/venv"
        step "pip install" "/root/venv/bin/pip install -q $pipfrom $whl"
        step "inspect" 'if [ -x /root/venv/bin/ckpt ]; then /root/venv/bin/ckpt inspect /root/dp_mlp.pth;
            else /root/venv/bin/python -m ckpt_toolkit inspect /root/dp_mlp.pth; fi'
        report
    fi
done
cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n1)
echo "newcomer.sh: $(date -u +%Y-%m-%d), $(nproc) cores ($cpu), $(awk '/MemTotal/ { printf "%d GiB", $2 / 1048576 }' /proc/meminfo), apt from $mirror:"
printf '%s' "$summary"
