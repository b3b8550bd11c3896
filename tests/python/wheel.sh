#!/bin/sh
# wheel.sh - the Python package as a user gets it: the wheel built by the
# PEP 517 backend (pyproject.toml, tools/pybuild/ckpt_pep517.py) from this
# build tree's ckpt and libckpt.so.0 (nothing rebuilt: CKPT_TOOLKIT_NATIVE_DIR
# names a folder of links to them), checked by auditwheel, installed with pip
# into fresh venvs and the Python suite run there (tests/python/run.sh, told
# by CKPT_TOOLKIT_INSTALLED=1 to use the installed package, not the tree):
#   - Debian's python3 (torch 1.13, numpy; --system-site-packages), and
#   - torch 2.x's python ($PYTHON2), the wheel installed with pip --target
#     on PYTHONPATH so that the shared venv is not changed: test_api.py
#     (api.sh runs the whole suite under both from the build tree),
#   - a numpy-only venv (no torch) for every other CPython >= 3.9 here
#     (/root/.pyenv/versions/3.*, python3.X on PATH): the whole suite under
#     the oldest and the newest, test_api.py under the others; numpy and pytest
#     from ./bootstrap --deps's wheels in /opt/ckpt/wheels;
# and once `pip install SRCDIR`, pip's own route through the backend.
# In each: `ckpt --version` from the venv's bin and `python -m ckpt_toolkit
# --version` say what the build tree's ckpt says, the CUDA module (when this
# build has one) being the wheel's own (CKPT_CUDA_MODULE, which `make check`
# sets to the build's, unset for them).  And the libraries: every
# one the installed binary and libckpt.so.0 need beyond glibc's loads from
# the wheel's own _native/lib (ldd, and a process's maps after loading it),
# none from the build's -dev packages.
# Tools: $CKPT_PYTOOLS (default /opt/ckpt/pytools, made by ./bootstrap
# --deps) with build and auditwheel; patchelf and readelf.
# shellcheck source=tests/cli/setup.sh
. "${srcdir:-.}/tests/cli/setup.sh"

pytools=${CKPT_PYTOOLS:-/opt/ckpt/pytools}
wheels=${CKPT_WHEELS:-/opt/ckpt/wheels}
builddir=$(cd "$(dirname "$CKPT")" && pwd)

if readelf -s --wide "$CKPT" 2>/dev/null | grep -q '__asan_init'; then
    skip "a sanitizer build (the wheel is made from a plain build)"
fi
"$pytools/bin/python" -c 'import build, auditwheel' 2>/dev/null ||
    skip "no $pytools with build and auditwheel (./bootstrap --deps makes it)"
command -v patchelf >/dev/null 2>&1 || skip "no patchelf (./bootstrap --deps installs it)"
command -v readelf >/dev/null 2>&1 || skip "no readelf (binutils)"
[ -f "$builddir/.libs/libckpt.so.0" ] || skip "no $builddir/.libs/libckpt.so.0 (make libckpt.la)"
if ldd "$CKPT" "$builddir/.libs/libckpt.so.0" | grep -q 'libcudart'; then
    skip "this build links libcudart (the CUDA backend not loaded at run time), which a wheel never bundles: configure --with-cuda=no"
fi
[ -f "$srcdir/tests/python/run.sh" ] || fail "tests/python/run.sh, the suite's runner, is missing"

# elapsed SINCE: seconds since SINCE (date +%s)
elapsed() { echo $(($(date +%s) - $1)); }

# ---- the wheel ----------------------------------------------------------------

say "the wheel, built by the PEP 517 backend from this build tree (python -m build --wheel)"
mkdir -p "$tmp/native/bin" "$tmp/native/lib" "$tmp/dist"
ln -s "$CKPT" "$tmp/native/bin/ckpt"
ln -s "$builddir/.libs/libckpt.so.0" "$tmp/native/lib/libckpt.so.0"
module=$builddir/.libs/libckpt_cuda.so
[ ! -f "$module" ] || ln -s "$module" "$tmp/native/lib/libckpt_cuda.so"
t0=$(date +%s)
if (cd "$srcdir" && CKPT_TOOLKIT_NATIVE_DIR=$tmp/native PYTHONDONTWRITEBYTECODE=1 \
    "$pytools/bin/python" -m build --wheel --no-isolation -o "$tmp/dist" .) >"$tmp/build.log" 2>&1; then
    ok "built in $(elapsed "$t0") s"
else
    fail "python -m build --wheel failed"
    tail -n 30 "$tmp/build.log" | sed 's/^/   | /'
    finish
fi
set -- "$tmp"/dist/ckpt_toolkit-*.whl
whl=$1
name=$(basename "$whl")
note "$name: $(($(wc -c <"$whl") / 1024)) KiB"
version=$(sed -n 's/^AC_INIT(\[ckpt\], \[\([^]]*\)\].*/\1/p' "$srcdir/configure.ac")
case $name in
"ckpt_toolkit-$version-py3-none-manylinux_2_"*"_x86_64.whl") ok "named ckpt_toolkit-$version-py3-none-manylinux_2_X_x86_64 (one wheel for every CPython 3)" ;;
*) fail "$name: expected ckpt_toolkit-$version-py3-none-manylinux_2_X_x86_64.whl" ;;
esac
tag=${name#"ckpt_toolkit-$version-py3-none-"}
tag=${tag%.whl}

# auditwheel's verdict, its lines joined (it wraps them)
"$pytools/bin/auditwheel" show "$whl" >"$tmp/audit" 2>&1 || true
audit=$(tr -s '\n ' '  ' <"$tmp/audit")
case $audit in
*"is consistent with the following platform tag: \"$tag\""*) ok "auditwheel show: consistent with $tag, the name's tag" ;;
*) fail "auditwheel show does not say $tag"; sed 's/^/   | /' "$tmp/audit" ;;
esac

# the archive: RECORD lists every file with its sha256 and size, the
# metadata says what pip needs
if "$pytools/bin/python" - "$whl" "$version" "$([ -f "$module" ] && echo "$module")" >"$tmp/pyerr" 2>&1 <<'PYEOF'; then
import base64, csv, hashlib, io, sys, zipfile
z = zipfile.ZipFile(sys.argv[1]); v = sys.argv[2]
di = "ckpt_toolkit-%s.dist-info/" % v
rows = {r[0]: r[1:] for r in csv.reader(io.StringIO(z.read(di + "RECORD").decode()))}
assert set(rows) == set(z.namelist()), set(rows) ^ set(z.namelist())
for n in z.namelist():
    if n == di + "RECORD":
        assert rows[n] == ["", ""]
        continue
    d = z.read(n)
    h = "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(d).digest()).rstrip(b"=").decode()
    assert rows[n] == [h, str(len(d))], n
meta = z.read(di + "METADATA").decode()
for line in ("Name: ckpt-toolkit", "Version: " + v, "Requires-Python: >=3.9", "Requires-Dist: numpy",
             'Requires-Dist: torch; extra == "torch"', 'Requires-Dist: ml_dtypes; extra == "ml-dtypes"'):
    assert line in meta.splitlines(), line
assert "# ckpt" in meta  # README.md as the long description
assert "ckpt = ckpt_toolkit.__main__:main" in z.read(di + "entry_points.txt").decode()
for n in ("ckpt_toolkit/__init__.py", "ckpt_toolkit/__main__.py", "ckpt_toolkit/_native/bin/ckpt",
          "ckpt_toolkit/_native/lib/libckpt.so.0"):
    assert n in rows, n
assert z.getinfo("ckpt_toolkit/_native/bin/ckpt").external_attr >> 16 & 0o111
# the CUDA module when this build has one (sys.argv[3]: its path or ""),
# as built; nothing of CUDA's own libraries
mod = "ckpt_toolkit/_native/lib/libckpt_cuda.so"
if sys.argv[3]:
    assert z.read(mod) == open(sys.argv[3], "rb").read(), mod
else:
    assert mod not in rows, mod
for n in z.namelist():
    assert "libcudart" not in n and "libcublas" not in n and "libcudnn" not in n, n
PYEOF
    ok "RECORD: every file's sha256 and size; METADATA (numpy, the extras, README); the ckpt script; the native files$([ -f "$module" ] && echo ", the CUDA module as built")"
else
    fail "the wheel's archive: $(tail -n 1 "$tmp/pyerr")"
fi

# ---- installed: the same ckpt, its libraries the wheel's own ---------------------

# the build tree's ckpt finds its module beside .libs/libckpt.so.0; an
# installed one, in ckpt_toolkit/_native/lib ("cuda not available: no GPU
# found (FILE, CUDA runtime 13.0)" without a GPU, "cuda: ..." with one)
want_version=$(env -u CKPT_CUDA_MODULE "$CKPT" --version)
# the module's path as a placeholder
module_path() { sed 's|[^ (]*/libckpt_cuda\.so\([,)]\)|MODULE\1|'; }
want_norm=$(echo "$want_version" | module_path)
[ ! -f "$module" ] || case $want_version in
*"$(cd "$builddir/.libs" && pwd -P)/libckpt_cuda.so"*) ;;
*) fail "the build tree's ckpt --version does not name its module, .libs/libckpt_cuda.so: $want_version" ;;
esac

# same_version WHAT ROOT CMD...: CMD prints what the build tree's ckpt
# --version prints, with the CUDA module found in ROOT's
# ckpt_toolkit/_native/lib (the wheel's own)
same_version() {
    _what=$1
    _root=$(cd "$2" && pwd -P)
    shift 2
    if _got=$(env -u CKPT_CUDA_MODULE "$@" 2>&1) &&
        [ "$(echo "$_got" | module_path)" = "$want_norm" ]; then
        ok "$_what: $(echo "$_got" | head -n1)"
    else
        fail "$_what: '$_got', expected '$want_version' (but for the module's path)"
        return
    fi
    if [ -f "$module" ]; then
        case $_got in
        *"($_root/"*"/ckpt_toolkit/_native/lib/libckpt_cuda.so,"* | \
            *"($_root/ckpt_toolkit/_native/lib/libckpt_cuda.so,"*)
            ok "$_what: the CUDA module is the wheel's own" ;;
        *) fail "$_what: the CUDA module is not the one in $_root: $_got" ;;
        esac
    fi
}

# libs_from_wheel SITE PYTHON: ldd of the installed bin/ckpt and
# libckpt.so.0 names only the wheel's lib/ and glibc; and once loaded in
# PYTHON (by ctypes, as the module loads it), every library of the process
# named like one of the bundled ones is mapped from the wheel (the CUDA
# module is not loaded: no CUDA device was asked for)
libs_from_wheel() {
    _nat=$1/ckpt_toolkit/_native
    _badlibs=$(ldd "$_nat/bin/ckpt" "$_nat/lib/libckpt.so.0" | awk '$2 == "=>" { print $1, $3 }' |
        grep -v -e " $_nat/bin/../lib/" -e " $_nat/lib/" \
            -e '^lib\(c\|m\|dl\|pthread\|rt\)\.so' || true)
    if [ -z "$_badlibs" ]; then
        ok "ldd: the installed ckpt and libckpt.so.0 need only the wheel's lib/ and glibc"
    else
        fail "ldd: libraries from outside the wheel: $_badlibs"
    fi
    if env -i PATH=/usr/bin:/bin "$2" - "$_nat" >"$tmp/pyerr" 2>&1 <<'PYEOF'; then
import ctypes, os, sys
nat = os.path.realpath(sys.argv[1])
ctypes.CDLL(os.path.join(nat, "lib", "libckpt.so.0"))
bundled = {n.split("-")[0].split(".so")[0] for n in os.listdir(os.path.join(nat, "lib"))}
maps = {l.split()[-1] for l in open("/proc/self/maps") if len(l.split()) >= 6 and ".so" in l}
ours = {m for m in maps if m.startswith(nat + "/lib/")}
# every bundled library, and not the CUDA module (loaded only when a CUDA
# device is asked for)
libs = [n for n in os.listdir(os.path.join(nat, "lib")) if n != "libckpt_cuda.so"]
assert len(ours) == len(libs), (ours, libs)
assert not any(m.endswith("/libckpt_cuda.so") for m in maps), "the CUDA module loaded with libckpt"
# the system's libz (Python's zlib module) may be mapped too: a library
# of the same soname would not have been loaded again, hence the renamed ones
print(len(ours), "of the wheel's libraries mapped,", sorted(os.path.basename(m) for m in maps - ours if os.path.basename(m).split("-")[0].split(".so")[0] in bundled) or "no other copy")
PYEOF
        ok "loaded by ctypes: $(cat "$tmp/pyerr")"
    else
        fail "loaded by ctypes: $(tail -n 3 "$tmp/pyerr")"
    fi
}

# suite WHAT all|api PYTHON [ENV...]: the Python suite under PYTHON, the
# installed package, from a folder outside the source tree: all of it, or
# test_api.py alone (every function of the package and README's examples:
# a few seconds against a minute or two for the oracle and hostile-file
# suites, which check the native library that api.sh runs from this build
# tree under the same Pythons)
suite() {
    _what=$1
    _which=$2
    _py=$3
    shift 3
    set -- env "$@" CKPT_TOOLKIT_INSTALLED=1 sh "$srcdir/tests/python/run.sh" "$_py"
    _label="the suite"
    [ "$_which" = all ] || { set -- "$@" tests/python/test_api.py; _label=test_api.py; }
    _s=$(date +%s)
    if (cd "$tmp" && "$@") >"$tmp/suite.log" 2>&1; then
        ok "$_what: $_label passed with the installed package ($(elapsed "$_s") s; $(grep -E '[0-9]+ (passed|failed)' "$tmp/suite.log" | tail -n1))"
    else
        fail "$_what: $_label failed with the installed package"
        tail -n 40 "$tmp/suite.log" | sed 's/^/   | /'
    fi
}

# from_venv WHAT DIR PYTHON...: the module PYTHON imports is the one
# installed under DIR, not the source tree's
from_venv() {
    _what=$1
    _dir=$2
    shift 2
    _f=$(cd "$tmp" && "$@" -c 'import ckpt_toolkit; print(ckpt_toolkit.__file__)' 2>&1)
    case $_f in
    "$_dir"/*) ok "$_what: imports ckpt_toolkit from $_dir" ;;
    *) fail "$_what: imports ckpt_toolkit from '$_f', not $_dir" ;;
    esac
}

py_debian=${PYTHON:-/usr/bin/python3}
py_torch2=${PYTHON2:-/opt/ckpt/torch2/bin/python}

say "Debian's python3 (torch 1.13): pip install of the wheel into a fresh venv"
if [ -x "$py_debian" ] && "$py_debian" -c 'import numpy, venv' 2>/dev/null; then
    t0=$(date +%s)
    v=$tmp/venv-debian
    if "$py_debian" -m venv --without-pip --system-site-packages "$v" &&
        "$py_debian" -m pip --python "$v/bin/python" install -q --no-index --no-deps "$whl" >"$tmp/pip.log" 2>&1; then
        ok "installed in $(elapsed "$t0") s ($("$v/bin/python" -c 'import sys, numpy; print("Python", sys.version.split()[0], "numpy", numpy.__version__)'))"
        site=$("$v/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
        from_venv "Debian's python3" "$v" "$v/bin/python"
        same_version "the venv's bin/ckpt --version" "$v" "$v/bin/ckpt" --version
        same_version "python -m ckpt_toolkit --version" "$v" "$v/bin/python" -m ckpt_toolkit --version
        libs_from_wheel "$site" "$v/bin/python"
        suite "Debian's python3" api "$v/bin/python"
    else
        fail "could not make the venv or install the wheel: $(tail -n 3 "$tmp/pip.log" 2>/dev/null)"
    fi
else
    note "no $py_debian with numpy: skipped"
fi

say "pip install of the source tree (README's 'pip install .' in a clone): pip's PEP 517 route, build isolation, offline"
# the native files from this build tree (CKPT_TOOLKIT_NATIVE_DIR), so that
# nothing is compiled; the backend's own build from source is tried by hand
# (README.md, "Install": 32 s)
if [ -x "$py_debian" ] && "$py_debian" -c 'import numpy, venv' 2>/dev/null; then
    t0=$(date +%s)
    v=$tmp/venv-src
    if "$py_debian" -m venv --without-pip --system-site-packages "$v" &&
        CKPT_TOOLKIT_NATIVE_DIR=$tmp/native PYTHONDONTWRITEBYTECODE=1 \
            "$py_debian" -m pip --python "$v/bin/python" install -q --no-index --no-deps "$srcdir" >"$tmp/pip.log" 2>&1; then
        ok "pip install $srcdir: $(elapsed "$t0") s"
        check "the installed distribution is ckpt-toolkit $version" \
            test "$("$v/bin/python" -c 'import importlib.metadata as m; print(m.version("ckpt-toolkit"))')" = "$version"
        same_version "the venv's bin/ckpt --version" "$v" "$v/bin/ckpt" --version
    else
        fail "pip install $srcdir failed: $(tail -n 5 "$tmp/pip.log" 2>/dev/null)"
    fi
fi

say "torch 2.x's python ($py_torch2): the wheel installed with pip --target, on PYTHONPATH"
if [ -x "$py_torch2" ]; then
    t0=$(date +%s)
    d=$tmp/target-torch2
    if "$py_torch2" -m pip install -q --no-index --no-deps --target "$d" "$whl" >"$tmp/pip.log" 2>&1; then
        ok "installed in $(elapsed "$t0") s ($(PYTHONPATH=$d "$py_torch2" -c 'import sys, torch; print("Python", sys.version.split()[0], "torch", torch.__version__)'))"
        from_venv "torch 2.x" "$d" env PYTHONPATH="$d" "$py_torch2"
        same_version "bin/ckpt --version" "$d" env PYTHONPATH="$d" "$d/bin/ckpt" --version
        same_version "python -m ckpt_toolkit --version" "$d" env PYTHONPATH="$d" "$py_torch2" -m ckpt_toolkit --version
        suite "torch 2.x" api "$py_torch2" PYTHONPATH="$d"
    else
        fail "pip install --target failed: $(tail -n 3 "$tmp/pip.log")"
    fi
else
    note "no $py_torch2: skipped"
fi

# the other CPythons >= 3.9 of this machine, each once (by its real path).
# The venvs are made without pip and filled by the interpreter's own pip
# (pip --python, pip 22.3 or newer): ensurepip would triple the time
seen=" $("$py_debian" -c 'import os, sys; print(os.path.realpath(sys.executable))' 2>/dev/null) "
others= # VERSION=PATH each
pvs=
for p in /root/.pyenv/versions/3.*/bin/python3 $(IFS=:; for d in $PATH; do ls "$d"/python3.[0-9]* 2>/dev/null; done); do
    case $p in *-config | *m) continue ;; esac
    [ -x "$p" ] || continue
    # by the interpreter's own path: pyenv's shims are scripts that run one
    r=$("$p" -c 'import os, sys; assert sys.implementation.name == "cpython" and sys.version_info >= (3, 9); print(os.path.realpath(sys.executable), "%d.%d.%d" % sys.version_info[:3])' 2>/dev/null) || continue
    pv=${r##* }
    r=${r% *}
    case $seen in *" $r "*) continue ;; esac
    seen="$seen$r "
    others="$others $pv=$p"
    pvs="$pvs$pv
"
done
[ -n "$others" ] || note "no other CPython >= 3.9 on this machine"
# the whole suite under the oldest and the newest of them, where the
# language and numpy change; test_api.py under those between
oldest=$(printf '%s' "$pvs" | sort -V | head -n 1)
newest=$(printf '%s' "$pvs" | sort -V | tail -n 1)
for e in $others; do
    pv=${e%%=*}
    p=${e#*=}
    say "Python $pv ($p): a numpy-only venv (no torch), pip install of the wheel (numpy) and pytest"
    t0=$(date +%s)
    v=$tmp/venv-$pv
    if ! "$p" -m venv --without-pip "$v" >"$tmp/pip.log" 2>&1; then
        note "no venv for $p: skipped ($(tail -n 1 "$tmp/pip.log"))"
        continue
    fi
    # numpy from ./bootstrap --deps's wheels, else an index if one answers
    if ! "$p" -m pip --python "$v/bin/python" install -q --no-index --find-links "$wheels" "$whl" pytest >"$tmp/pip.log" 2>&1 &&
        ! "$p" -m pip --python "$v/bin/python" install -q --find-links "$wheels" "$whl" pytest >>"$tmp/pip.log" 2>&1; then
        note "pip found no numpy or pytest for Python $pv (./bootstrap --deps puts them in $wheels): skipped"
        continue
    fi
    ok "installed with numpy $("$v/bin/python" -c 'import numpy; print(numpy.__version__)') in $(elapsed "$t0") s"
    check "no torch in this venv" test "$("$v/bin/python" -c 'import importlib.util as u; print(u.find_spec("torch") is None)')" = True
    from_venv "Python $pv" "$v" "$v/bin/python"
    same_version "the venv's bin/ckpt --version" "$v" "$v/bin/ckpt" --version
    same_version "python -m ckpt_toolkit --version" "$v" "$v/bin/python" -m ckpt_toolkit --version
    case $pv in "$oldest" | "$newest") which=all ;; *) which=api ;; esac
    suite "Python $pv" "$which" "$v/bin/python"
done

finish
