#!/bin/sh
# containerfile.sh - the Containerfile's build stage stays in step with
# tools/portable.sh, so that the image holds the portable build and the
# recipe does not rot unseen (no container engine runs in the tests).
#
# Checked: the -dev package list (as a set), the configure flags and make
# target, the libraries left to the target's glibc, the two rpaths, the
# folder's parts (bin, lib, copyrights, man sections, README.md), the
# default VERSION against configure.ac's, and that the runtime stage copies
# the folder to the place its ENV PATH and tools/container.sh use.  Then the
# same comparison on copies with one thing changed each must fail: the
# check can fail.
set -u
srcdir=${srcdir:-.}
cf=$srcdir/Containerfile
ps=$srcdir/tools/portable.sh
[ -f "$cf" ] && [ -f "$ps" ] || {
    echo "ERROR: Containerfile or tools/portable.sh not found under $srcdir"
    exit 99
}

# one word per line, sorted: the packages portable.sh installs
portable_packages() {
    sed -n '/^build_packages="/,/"$/p' "$1" | tr -d '"\\' | sed 's/^build_packages=//' |
        tr ' ' '\n' | grep . | sort
}
# the packages of the Containerfile's apt-get install (its RUN, joined)
container_packages() {
    sed -n '/apt-get install/,/apt-get clean/p' "$1" | tr -d '\\' | tr '\n' ' ' |
        sed 's/.*--no-install-recommends//; s/&&.*//' | tr ' ' '\n' | grep . | sort
}
# the configure call and make target of a file
configure_line() {
    grep -o '\./configure [^&]*&& make [^"]*' "$1" | sed 's/"$//; s/[[:space:]]*$//' | head -n1
}
# the glibc libraries left out (the case pattern)
glibc_list() {
    grep -A1 'libc\.so\.\* |' "$1" | tr -d '\\' | tr -s ' \n' ' ' | sed 's/) *continue.*//; s/^ *//; s/ *$//'
}

# compare PORTABLE CONTAINERFILE: print one FAIL line per difference, exit 1 if any
compare() {
    bad=0
    if [ "$(portable_packages "$1")" != "$(container_packages "$2")" ]; then
        echo "FAIL: packages differ: portable.sh: $(portable_packages "$1" | tr '\n' ' ')/ Containerfile: $(container_packages "$2" | tr '\n' ' ')"
        bad=1
    fi
    a=$(configure_line "$1")
    b=$(configure_line "$2")
    if [ -z "$a" ] || [ "$a" != "$b" ]; then
        echo "FAIL: configure and make differ: portable.sh: '$a' / Containerfile: '$b'"
        bad=1
    fi
    a=$(glibc_list "$1")
    b=$(glibc_list "$2")
    if [ -z "$a" ] || [ "$a" != "$b" ]; then
        echo "FAIL: the glibc libraries left out differ: portable.sh: '$a' / Containerfile: '$b'"
        bad=1
    fi
    for want in "patchelf --set-rpath '\$ORIGIN'" "patchelf --set-rpath '\$ORIGIN/../lib'" \
        'share/doc/ckpt/libraries' 'share/man/man1' 'share/man/man3' 'share/man/man7' \
        '/share/doc/ckpt/README.md' '/usr/share/doc/$pkg/copyright'; do
        if ! grep -qF "$want" "$1" || ! grep -qF "$want" "$2"; then
            echo "FAIL: '$want' is not in both portable.sh and the Containerfile"
            bad=1
        fi
    done
    return $bad
}

failed=0
if compare "$ps" "$cf"; then
    echo "ok: the Containerfile's packages, configure flags, make target, glibc list, rpaths and folder match tools/portable.sh"
else
    failed=1
fi

version=$(sed -n 's/^AC_INIT(\[ckpt\], \[\([^]]*\)\].*/\1/p' "$srcdir/configure.ac")
if grep -qx "ARG VERSION=$version" "$cf"; then
    echo "ok: ARG VERSION=$version is configure.ac's version"
else
    echo "FAIL: the Containerfile's ARG VERSION is not configure.ac's $version"
    failed=1
fi

# the runtime stage: the folder lands in /opt/ckpt, bin/ on PATH, ckpt the
# entry point (tools/container.sh reads the same lines to lay out its root)
runtime=$(sed -n '/^FROM debian:bullseye-slim/,$p' "$cf")
dest=$(printf '%s\n' "$runtime" | sed -n 's/^COPY --from=build \/opt\/ckpt \(.*\)$/\1/p')
if [ "$dest" = /opt/ckpt ] && printf '%s\n' "$runtime" | grep -q "^ENV PATH=$dest/bin:" &&
    printf '%s\n' "$runtime" | grep -qx 'ENTRYPOINT \["ckpt"\]' &&
    [ "$(printf '%s\n' "$runtime" | grep -c '^COPY')" -eq 1 ]; then
    echo "ok: the runtime stage (bullseye-slim) copies only the folder to /opt/ckpt, on PATH, ENTRYPOINT ckpt"
else
    echo "FAIL: the runtime stage does not copy the folder alone to /opt/ckpt with its bin/ on PATH and ENTRYPOINT [\"ckpt\"]"
    failed=1
fi

# the check can fail: one change at a time in a copy must be caught
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mutate() {
    what=$1
    shift
    sed "$@" "$cf" >"$tmp/Containerfile"
    if cmp -s "$cf" "$tmp/Containerfile"; then
        echo "FAIL: the mutation '$what' changed nothing (update this test)"
        failed=1
    elif compare "$ps" "$tmp/Containerfile" >/dev/null; then
        echo "FAIL: a Containerfile with $what passed the comparison"
        failed=1
    else
        echo "ok: a Containerfile with $what is caught"
    fi
}
mutate "a package missing" 's/ libzstd-dev//'
mutate "an extra package" 's/ patchelf / patchelf libopenblas-dev /'
mutate "another configure flag" 's/--with-blas=no/--with-blas=yes/'
mutate "libz left to the system" 's/libutil\.so\.\* |/libutil.so.* | libz.so.* |/'
mutate "another rpath" "s/'\\\$ORIGIN\\/..\\/lib'/'\\\$ORIGIN\\/lib'/"

exit $failed
