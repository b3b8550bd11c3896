#!/bin/sh
# make check's run of the Python package's tests (tests/python/test_*.py) from
# the build tree, once under each Python with torch configure found: Debian's
# torch 1.13 ($PYTHON) and the torch 2.x venv ($PYTHON2); each run says which.
# Fails when a run fails; skipped (77) when every run is (no pytest), and in a
# sanitizer build (configure --enable-sanitizers): libckpt then needs ASan's
# runtime loaded first, which python is not.
srcdir=${srcdir:-.}
lib=.libs/libckpt.so.0
if [ ! -e "$lib" ]; then
    echo "SKIP: no $lib in $(pwd): run from the build tree"
    exit 77
fi
if (ldd "$lib" 2>/dev/null || readelf -d "$lib" 2>/dev/null) | grep -q 'libasan'; then
    echo "SKIP: $lib is a sanitizer build (ASan's runtime cannot be loaded into python)"
    exit 77
fi
status=77
for py in "${PYTHON:-}" "${PYTHON2:-}"; do
    [ -n "$py" ] && [ "$py" != false ] || continue
    echo "==== $("$py" -c 'import torch; print("torch", torch.__version__)' 2>/dev/null ||
        echo "no torch") ($py)"
    builddir=$(pwd) sh "$srcdir/tests/python/run.sh" "$py"
    case $? in
    0) [ "$status" = 77 ] && status=0 ;;
    77) ;;
    *) status=1 ;;
    esac
done
exit $status
