#!/bin/sh
# native_from_build.sh BUILDDIR OUTDIR: make OUTDIR a native folder for
# ckpt_toolkit (what $CKPT_TOOLKIT_NATIVE names) from a build tree: links
# OUTDIR/bin/ckpt -> BUILDDIR/ckpt and OUTDIR/lib/libckpt.so.0 ->
# BUILDDIR/.libs/libckpt.so.0 (libtool's built library; the ckpt in the
# build tree is libtool's wrapper script or the binary, either runs).
set -eu
if [ $# -ne 2 ]; then
    echo "usage: $0 BUILDDIR OUTDIR" >&2
    exit 2
fi
build=$(cd "$1" && pwd)
for f in "$build/ckpt" "$build/.libs/libckpt.so.0"; do
    if [ ! -e "$f" ]; then
        echo "$0: $f is missing: build first (make)" >&2
        exit 1
    fi
done
mkdir -p "$2/bin" "$2/lib"
ln -sf "$build/ckpt" "$2/bin/ckpt"
ln -sf "$build/.libs/libckpt.so.0" "$2/lib/libckpt.so.0"
