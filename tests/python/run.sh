#!/bin/sh
# run.sh PYTHON [PYTEST ARGS...]: the Python package's tests (tests/python/test_*.py,
# or those of them named among the arguments, as tests/python/test_NAME.py)
# under PYTHON with pytest.  The package is the one PYTHON imports when
# CKPT_TOOLKIT_INSTALLED=1 (a wheel installed in a venv: tests/python/wheel.sh);
# otherwise python/ of this source tree, with CKPT_TOOLKIT_NATIVE made from the
# build tree ($builddir, else the current folder) by native_from_build.sh.
# Exit 77 (skipped) when PYTHON, pytest or numpy is missing.
set -u
if [ $# -lt 1 ]; then
    echo "usage: $0 PYTHON [PYTEST ARGS...]" >&2
    exit 99
fi
py=$1
shift
srcdir=${srcdir:-$(cd "$(dirname "$0")/../.." && pwd)}
srcdir=$(cd "$srcdir" && pwd)
builddir=$(cd "${builddir:-.}" && pwd)
if ! command -v "$py" >/dev/null 2>&1; then
    echo "SKIP: $py not found"
    exit 77
fi
for m in pytest numpy; do
    if ! "$py" -c "import $m" 2>/dev/null; then
        echo "SKIP: $py has no $m"
        exit 77
    fi
done
if [ "${CKPT_TOOLKIT_INSTALLED:-0}" = 1 ]; then
    echo "ckpt_toolkit: as installed for $py"
else
    native=$(mktemp -d "${TMPDIR:-/tmp}/ckpt-native.XXXXXX") || exit 99
    trap 'rm -rf "$native"' EXIT
    sh "$srcdir/tests/python/native_from_build.sh" "$builddir" "$native" || exit 99
    CKPT_TOOLKIT_NATIVE=$native
    PYTHONPATH=$srcdir/python${PYTHONPATH:+:$PYTHONPATH}
    export CKPT_TOOLKIT_NATIVE PYTHONPATH
    echo "ckpt_toolkit: $srcdir/python, native files from $builddir"
fi
echo "python: $("$py" -c 'import sys; print(sys.executable, sys.version.split()[0])')"
cd "$srcdir" || exit 99
# nothing written into the source tree (a read-only one under distcheck):
# no bytecode, no pytest cache
named=
for a in "$@"; do
    case $a in tests/python/test_*.py*) named=1 ;; esac
done
[ -n "$named" ] || set -- "$@" tests/python
PYTHONDONTWRITEBYTECODE=1 "$py" -m pytest -q -p no:cacheprovider "$@"
rc=$?
[ $rc -eq 5 ] && rc=77 # no tests collected
exit $rc
