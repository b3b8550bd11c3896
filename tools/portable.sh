#!/bin/sh
# portable.sh - the portable ckpt for x86-64 Linux, built and checked in
# Debian 11 (bullseye, glibc 2.31) roots made with debootstrap.
#
#   tools/portable.sh build DIST_TARBALL OUTDIR
#       build ckpt from `make dist`'s tarball in a bullseye root with the
#       distribution's -dev packages, gather the binary, libckpt.so.0 (with
#       include/ckpt.h: the library the Python package loads, and C
#       programs link) and every non-glibc library they need into one
#       relocatable folder (bin/ckpt with rpath $ORIGIN/../lib), and write
#       OUTDIR/ckpt-VERSION-x86_64-linux.tar.gz and OUTDIR/SHA256SUMS.  When
#       this host has nvcc, the CUDA backend module (lib/libckpt_cuda.so) is
#       compiled here, linked in the root against its glibc, and put in lib/
#       if it needs no glibc symbol newer than 2.31 (else left out, and the
#       folder's README says so).
#   tools/portable.sh check OUTDIR DIST_TARBALL TEST... [-- TEST...]
#       in a copy of a bare bullseye root (debootstrap --variant=minbase,
#       nothing else installed), check OUTDIR's SHA256SUMS and unpack the
#       tarball as a CI job would, check that the binary's libraries come
#       from the folder, then run the first TESTs (CLI tests from
#       DIST_TARBALL's tree) against the unpacked binary; then the same in a
#       copy with python3 added, for the TESTs after "--" (tests that
#       read ckpt's JSON or write their inputs with Python's standard library).
#
#   tools/portable.sh check-wheel OUTDIR DATAFILE
#       in a copy of the bare root with python3 (no pip), the release's
#       wheel (make wheel-portable) unpacked as pip installs it, with
#       numpy's: its libraries its own, ckpt --version, DATAFILE loaded.
#
# Needs root, debootstrap and deb.debian.org.  The roots are kept under
# $CKPT_ROOTS (default /var/cache/ckpt) and reused: bullseye-base (pristine,
# never changed once made), bullseye (the build root made from it) and
# bullseye-python3 (the base and python3, for the tests).
set -eu

roots=${CKPT_ROOTS:-/var/cache/ckpt}
mirror=${CKPT_DEBIAN_MIRROR:-http://deb.debian.org/debian}
suite=bullseye
base=$roots/$suite-base
buildroot=$roots/$suite
# what the build needs, from the distribution (check: configure requires it
# for the unit tests; patchelf sets the rpath)
build_packages="gcc make pkg-config libc6-dev libzip-dev zlib1g-dev libcjson-dev \
libpcre2-dev libzstd-dev check patchelf"

die() {
    echo "portable.sh: $*" >&2
    exit 1
}

[ "$(id -u)" -eq 0 ] || die "needs root (debootstrap, chroot)"

# in_root ROOT CMD...: run CMD in ROOT with /proc mounted for its duration
in_root() {
    r=$1
    shift
    mount -t proc proc "$r/proc"
    set +e
    chroot "$r" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LC_ALL=C "$@"
    rc=$?
    set -e
    umount "$r/proc"
    return $rc
}

# the pristine base, made once; a lock keeps two runs from making it at once
ensure_base() {
    mkdir -p "$roots"
    exec 9>"$roots/.lock"
    flock 9
    if [ ! -e "$base/etc/debian_version" ]; then
        command -v debootstrap >/dev/null || die "debootstrap not found (apt-get install debootstrap)"
        rm -rf "$base.tmp"
        debootstrap --variant=minbase "$suite" "$base.tmp" "$mirror" >"$roots/debootstrap.log" 2>&1 ||
            die "debootstrap failed; see $roots/debootstrap.log"
        mv "$base.tmp" "$base"
    fi
}

ensure_buildroot() {
    ensure_base
    if [ ! -e "$buildroot/.ckpt-build-root" ]; then
        rm -rf "$buildroot.tmp"
        cp -a "$base" "$buildroot.tmp"
        cp /etc/resolv.conf "$buildroot.tmp/etc/resolv.conf"
        in_root "$buildroot.tmp" sh -c "apt-get update -q && DEBIAN_FRONTEND=noninteractive \
            apt-get install -y -q --no-install-recommends $build_packages && apt-get clean" \
            >"$roots/build-root.log" 2>&1 || die "apt-get in the build root failed; see $roots/build-root.log"
        touch "$buildroot.tmp/.ckpt-build-root"
        mv "$buildroot.tmp" "$buildroot"
    fi
    exec 9>&-
}

# cuda_module SRC FOLDER: the CUDA backend module for FOLDER's lib/, when
# this host has nvcc (the bullseye root has none): kernels/*.cu compiled here
# with SRC's config.h (the root's build), linked in the root by its gcc
# against its glibc 2.31 and this host's libcudart_static.a, then checked
# with objdump to need no glibc symbol newer than 2.31 and no library beyond
# glibc's.  The CUDA runtime is linked in statically (it reaches the
# driver's libcuda.so.1 with dlopen), so the same file serves this folder
# and the wheel (tools/pybuild/ckpt_pep517.py), which stays manylinux with
# nothing of CUDA bundled; NVIDIA's EULA lists libcudart_static.a as
# distributable in an application (its "Attachment A": the toolkit's
# EULA.txt, or nvidia_cuda_runtime's License.txt in a pip install).  ckpt
# loads the module at run time; it loads cuBLAS (and cuDNN) with dlopen
# from the loader's path, NVIDIA's pip packages (torch's) or
# /usr/local/cuda/lib64, so one folder serves CPU-only and GPU runners.
# Sets cuda_note for the README.
cuda_module() {
    msrc=$1
    mdest=$2
    nvcc=$(command -v nvcc || true)
    [ -n "$nvcc" ] || [ ! -x /usr/local/cuda/bin/nvcc ] || nvcc=/usr/local/cuda/bin/nvcc
    if [ -z "$nvcc" ]; then
        cuda_note="No CUDA backend: nvcc was not found where this folder was built
(lib/libckpt_cuda.so is absent); 'ckpt --version' says so."
        echo "portable.sh: no nvcc here: the folder has no CUDA module"
        return 0
    fi
    croot=$(cd "$(dirname "$nvcc")/.." && pwd)
    clib=
    for d in "$croot/lib64" "$croot/lib" "$croot/targets/x86_64-linux/lib"; do
        if [ -e "$d/libcudart_static.a" ]; then
            clib=$d
            break
        fi
    done
    [ -n "$clib" ] || die "nvcc is $nvcc but libcudart_static.a is not beside it"
    cw=$buildroot/build/cuda
    rm -rf "$cw"
    mkdir -p "$cw/lib"
    # as Makefile.am's NVCCFLAGS (CUDA_ARCH_FLAGS: Turing, Ampere, Hopper,
    # PTX for newer GPUs)
    for f in cuda_device backend_cuda; do
        "$nvcc" -O2 -std=c++17 -I"$msrc/kernels" -I"$msrc/lib" -I"$msrc" \
            -gencode arch=compute_75,code=sm_75 -gencode arch=compute_80,code=sm_80 \
            -gencode arch=compute_90,code=[sm_90,compute_90] \
            -Xcompiler -fno-exceptions,-fno-threadsafe-statics,-fvisibility=hidden,-fPIC \
            -c "$msrc/kernels/$f.cu" -o "$cw/$f.o" || die "nvcc failed on kernels/$f.cu"
    done
    cp -L "$clib/libcudart_static.a" "$cw/lib/libcudart_static.a"
    in_root "$buildroot" gcc -shared -o /build/cuda/libckpt_cuda.so /build/cuda/cuda_device.o \
        /build/cuda/backend_cuda.o -L/build/cuda/lib -lcudart_static -ldl -lpthread -lrt \
        -Wl,--no-undefined -Wl,--exclude-libs,ALL || die "linking the CUDA module in $buildroot failed"
    extra=$(objdump -p "$cw/libckpt_cuda.so" | awk '$1 == "NEEDED" { print $2 }' |
        grep -v -E '^(libc|libm|libdl|libpthread|librt)\.so\.|^ld-linux' | tr '\n' ' ')
    [ -z "$extra" ] || die "the CUDA module needs $extra beyond glibc's libraries"
    newest=$(objdump -T "$cw/libckpt_cuda.so" | grep -o 'GLIBC_[0-9][0-9.]*' | sed 's/GLIBC_//' |
        sort -u -V | tail -n1)
    cver=$("$nvcc" --version | sed -n 's/.*release \([0-9][0-9.]*\).*/\1/p')
    if [ -n "$newest" ] && [ "$(printf '%s\n2.31\n' "$newest" | sort -V | tail -n1)" != 2.31 ]; then
        cuda_note="No CUDA backend: the module built here (nvcc $cver) needs glibc $newest,
newer than 2.31, so it was left out; 'ckpt --version' says so."
        echo "portable.sh: the CUDA module needs glibc $newest (> 2.31): left out of the folder"
        return 0
    fi
    cp "$cw/libckpt_cuda.so" "$mdest/lib/libckpt_cuda.so"
    cuda_note="lib/libckpt_cuda.so is the CUDA backend (nvcc $cver; glibc ${newest:-?} at most),
loaded when a CUDA device is asked for or --device auto finds a driver.  The
CUDA runtime is in it; it needs NVIDIA's driver and cuBLAS of CUDA ${cver%%.*}
(libcublas.so.${cver%%.*}; cuDNN 9 is used when found), looked for on the
system's loader path, in NVIDIA's pip packages (torch's: a venv's
site-packages/nvidia/...) and in /usr/local/cuda/lib64; without them
'ckpt --version' says why CUDA is not available and ckpt runs on the CPU."
    echo "portable.sh: the CUDA module (nvcc $cver, CUDA runtime linked in, $(($(wc -c <"$cw/libckpt_cuda.so") / 1024)) KiB, glibc ${newest:-?}) is in lib/"
}

build() {
    dist=$1
    outdir=$2
    [ -f "$dist" ] || die "$dist: no such tarball (make dist)"
    name=$(basename "$dist" .tar.gz)      # ckpt-VERSION
    version=${name#ckpt-}
    pname=ckpt-$version-x86_64-linux
    ensure_buildroot

    rm -rf "$buildroot/build"
    mkdir -p "$buildroot/build"
    cp "$dist" "$buildroot/build/"
    # ckpt itself links no CUDA library (the CUDA backend is a module,
    # cuda_module below: nvcc is not in the root); OpenBLAS is left out so
    # that the folder has no Fortran run time (the CPU backend's plain-C
    # loops).  `make ckpt` builds libckpt.la too, shared library included
    in_root "$buildroot" sh -c "cd /build && tar xzf $name.tar.gz && cd $name &&
        ./configure -q --with-cuda=no --with-blas=no && make -j2 ckpt" ||
        die "the build in $buildroot/build/$name failed"

    # the folder: bin/ckpt, lib/ with libckpt.so.0 and every library ldd
    # names for either that glibc does not provide, include/ckpt.h, each
    # library's copyright, ckpt's man pages
    stage=$buildroot/build/stage
    p=$stage/$pname
    mkdir -p "$p/bin" "$p/lib" "$p/include" "$p/share/doc/ckpt/libraries" "$p/share/man/man1" "$p/share/man/man3" "$p/share/man/man7"
    cp "$buildroot/build/$name/ckpt" "$p/bin/ckpt"
    src=$buildroot/build/$name
    cp -L "$src/.libs/libckpt.so.0" "$p/lib/libckpt.so.0"
    cp "$src/lib/ckpt.h" "$p/include/ckpt.h"
    cp "$src"/man/*.1 "$p/share/man/man1/"
    cp "$src"/man/*.3 "$p/share/man/man3/"
    cp "$src"/man/*.7 "$p/share/man/man7/"
    libs=$(in_root "$buildroot" ldd "/build/$name/ckpt" "/build/$name/.libs/libckpt.so.0" |
        awk '$2 == "=>" && $3 ~ /^\// { print $3 }' | sort -u)
    for l in $libs; do
        case ${l##*/} in
        libc.so.* | libm.so.* | libpthread.so.* | libdl.so.* | librt.so.* | libresolv.so.* | \
            libutil.so.* | ld-linux*) continue ;; # glibc: the target system's own
        esac
        cp -L "$buildroot$l" "$p/lib/${l##*/}"
        real=$(readlink -f "$buildroot$l")
        pkg=$(in_root "$buildroot" dpkg -S "$l" "${real#"$buildroot"}" 2>/dev/null | head -n1 | cut -d: -f1)
        if [ -n "$pkg" ] && [ -f "$buildroot/usr/share/doc/$pkg/copyright" ]; then
            cp "$buildroot/usr/share/doc/$pkg/copyright" "$p/share/doc/ckpt/libraries/$pkg.copyright"
        fi
    done
    # the libraries find each other beside themselves; the binary finds them
    # in ../lib wherever the folder is unpacked
    for l in "$p"/lib/*; do
        in_root "$buildroot" patchelf --set-rpath '$ORIGIN' "${l#"$buildroot"}"
    done
    in_root "$buildroot" patchelf --set-rpath '$ORIGIN/../lib' "${p#"$buildroot"}/bin/ckpt"
    cuda_module "$src" "$p"
    cp "$src/README.md" "$p/share/doc/ckpt/README.md"
    cat >"$p/README" <<EOF
ckpt $version for x86-64 Linux (glibc 2.31 or newer)

bin/ckpt runs from wherever this folder is unpacked: it finds its libraries
in lib/ (rpath \$ORIGIN/../lib).  Put bin/ on PATH, or call it by its path;
'ckpt --version' names the libraries and the backends found.  libckpt
(lib/libckpt.so.0, header include/ckpt.h) finds its libraries beside it;
the Python package ckpt_toolkit uses this folder when CKPT_TOOLKIT_NATIVE
names it.

Built from the release tarball in a Debian 11 (bullseye) root with Debian's
packages of libzip, zlib, cJSON, PCRE2 and libzstd (and what they need),
which lib/ holds.  No OpenBLAS: the CPU backend runs its plain-C loops.
$cuda_note

Tested: the CLI tests in a bare Debian 11 root (nothing but
debootstrap --variant=minbase) and on Debian 12.  Other systems are untested.

Licences: each bundled library's
Debian copyright file is in share/doc/ckpt/libraries/.  Man pages: share/man.
EOF
    mkdir -p "$outdir"
    tar czf "$outdir/$pname.tar.gz" --owner=0 --group=0 -C "$stage" "$pname"
    (cd "$outdir" && sha256sum "$pname.tar.gz" >SHA256SUMS)
    rm -rf "$stage"
    echo "portable.sh: $outdir/$pname.tar.gz"
    ls "$p/lib" 2>/dev/null || true
}

# in_copy ROOT TESTS...: in a fresh copy of ROOT, check OUTDIR's SHA256SUMS
# and unpack the tarball as a CI job would, check that every library the
# binary loads beyond glibc's comes from the folder, then run each test from
# the release tarball's source tree against the unpacked bin/ckpt
in_copy() {
    from=$1
    shift
    rm -rf "$work/root"
    cp -a "$from" "$work/root"
    mkdir -p "$work/root/tmp/dl" "$work/root/opt"
    cp "$outdir"/ckpt-*-x86_64-linux.tar.gz "$outdir/SHA256SUMS" "$work/root/tmp/dl/"
    tar xzf "$dist" -C "$work/root/tmp"
    # --version: exit 0, and with no NVIDIA driver here "cuda not available"
    # and why (the module loads, its CUDA runtime linked in, and finds no
    # GPU, when the folder has the module)
    in_root "$work/root" sh -c 'cd /tmp/dl && sha256sum -c --ignore-missing SHA256SUMS &&
        tar xzf ckpt-*-x86_64-linux.tar.gz -C /opt && v=$(/opt/ckpt-*/bin/ckpt --version) &&
        echo "$v" && echo "$v" | grep -q "; backends: cpu; cuda not available: ." &&
        { ! [ -e /opt/ckpt-*/lib/libckpt_cuda.so ] ||
            echo "$v" | grep -q "cuda not available: no GPU found (/opt/ckpt-[^ ]*/lib/libckpt_cuda.so, CUDA runtime "; } &&
        ! ldd /opt/ckpt-*/bin/ckpt | grep -v -e "=> /opt/ckpt-" -e "^[[:space:]]*linux-vdso" \
            -e "/ld-linux" -e "/lib\(c\|m\|dl\|pthread\|rt\)\.so"' ||
        die "the portable tarball did not unpack or start in a copy of $from, its --version did not say why CUDA is not available, or a library came from outside it"
    for t in "$@"; do
        if in_root "$work/root" sh -c "cd /tmp/$name && CKPT=\$(echo /opt/ckpt-*/bin/ckpt) srcdir=. sh $t" \
            >"$work/log" 2>&1; then
            echo "PASS: $t"
        else
            rc=$?
            if [ "$rc" -eq 77 ]; then
                echo "SKIP: $t ($(grep -m1 -i skip "$work/log"))"
                continue
            fi
            echo "FAIL: $t (exit $rc)"
            grep -E '^(FAIL|ERROR)' "$work/log" | head -n 20
            failed=$((failed + 1))
        fi
        total=$((total + 1))
    done
}

# the base and python3 (the tests' tool: most CLI tests read ckpt's JSON and
# write their inputs with Python's standard library), made once
ensure_pyroot() {
    pyroot=$roots/$suite-python3
    if [ ! -e "$pyroot/.ckpt-python3-root" ]; then
        rm -rf "$pyroot.tmp"
        cp -a "$base" "$pyroot.tmp"
        cp /etc/resolv.conf "$pyroot.tmp/etc/resolv.conf"
        in_root "$pyroot.tmp" sh -c "apt-get update -q && DEBIAN_FRONTEND=noninteractive \
            apt-get install -y -q --no-install-recommends python3 && apt-get clean" \
            >"$roots/python3-root.log" 2>&1 || die "apt-get in the python3 root failed; see $roots/python3-root.log"
        touch "$pyroot.tmp/.ckpt-python3-root"
        mv "$pyroot.tmp" "$pyroot"
    fi
}

check() {
    outdir=$(cd "$1" && pwd)
    dist=$(cd "$(dirname "$2")" && pwd)/$(basename "$2")
    name=$(basename "$dist" .tar.gz)
    shift 2
    ensure_base
    ensure_pyroot
    exec 9>&-
    start=$(date +%s)
    work=$(mktemp -d /var/tmp/ckpt-portable-check.XXXXXX)
    trap 'umount "$work/root/proc" 2>/dev/null || true; rm -rf "$work"' EXIT
    failed=0
    total=0
    bare=
    py=
    after=no
    for t in "$@"; do
        if [ "$t" = -- ]; then
            after=yes
        elif [ $after = yes ]; then
            py="$py $t"
        else
            bare="$bare $t"
        fi
    done
    echo "portable.sh: in a bare $suite root (debootstrap --variant=minbase):"
    in_copy "$base" $bare
    echo "portable.sh: in a bare $suite root with python3 (the tests' tool):"
    in_copy "$pyroot" $py
    echo "portable.sh: $total tests in $suite roots, $failed failed, $(($(date +%s) - start)) s"
    [ "$failed" -eq 0 ]
}

# check_wheel OUTDIR DATAFILE: the release's wheel in a copy of the bare root
# with python3 (Debian 11's 3.9, no pip there: the wheel unpacked where pip
# would put it, with numpy's cp39 wheel from $CKPT_WHEELS beside it): every
# library its ckpt and libckpt.so.0 load beyond glibc's is the wheel's own,
# ckpt runs, and the module loads DATAFILE's tensors through libckpt
check_wheel() {
    outdir=$(cd "$1" && pwd)
    set -- "$outdir"/ckpt_toolkit-*.whl "$2"
    whl=$1
    data=$2
    [ -f "$whl" ] || die "no ckpt_toolkit-*.whl in $outdir (make wheel-portable)"
    set -- "${CKPT_WHEELS:-/opt/ckpt/wheels}"/numpy-*-cp39-cp39-*.whl
    numpy=$1
    [ -f "$numpy" ] || die "no numpy wheel for Python 3.9 in ${CKPT_WHEELS:-/opt/ckpt/wheels} (./bootstrap --deps)"
    ensure_base
    ensure_pyroot
    exec 9>&-
    work=$(mktemp -d /var/tmp/ckpt-portable-check.XXXXXX)
    trap 'umount "$work/root/proc" 2>/dev/null || true; rm -rf "$work"' EXIT
    cp -a "$pyroot" "$work/root"
    site=$work/root/usr/local/lib/python3.9/dist-packages
    mkdir -p "$site" "$work/root/tmp/data"
    # zipfile keeps no modes: the programs made executable as pip does
    python3 -m zipfile -e "$whl" "$site"
    python3 -m zipfile -e "$numpy" "$site"
    chmod +x "$site"/ckpt_toolkit/_native/bin/ckpt "$site"/ckpt_toolkit/_native/lib/* "$site"/numpy.libs/* 2>/dev/null || true
    cp "$data" "$work/root/tmp/data/"
    n=/usr/local/lib/python3.9/dist-packages/ckpt_toolkit/_native
    # the CUDA module, when the wheel has it, loads (its CUDA runtime linked
    # in) and finds no GPU here
    in_root "$work/root" sh -c "python3 --version && v=\$($n/bin/ckpt --version) && echo \"\$v\" &&
        { ! [ -e $n/lib/libckpt_cuda.so ] ||
            echo \"\$v\" | grep -q 'cuda not available: no GPU found ($n/lib/libckpt_cuda.so, CUDA runtime '; } &&
        ! ldd $n/bin/ckpt $n/lib/libckpt.so.0 | awk '\$2 == \"=>\"' |
            grep -v -e '=> $n/' -e '/lib\(c\|m\|dl\|pthread\|rt\)\.so' &&
        python3 -c 'import sys, ckpt_toolkit as ck
d = ck.load(sys.argv[1], framework=\"np\")
assert d, d
print(\"ckpt_toolkit\", ck.__version__, \"loaded\", len(d), \"tensors of\", sys.argv[1], \"with numpy\", __import__(\"numpy\").__version__)' /tmp/data/$(basename "$data")" ||
        die "the wheel did not run in a copy of $pyroot, its CUDA module did not load, or a library came from outside it"
    echo "portable.sh: $(basename "$whl") runs in a bare $suite root with python3 (unpacked, numpy $(basename "$numpy" | cut -d- -f2)): its libraries the wheel's own"
}

case ${1-} in
build) [ $# -eq 3 ] || die "usage: portable.sh build DIST_TARBALL OUTDIR"; build "$2" "$3" ;;
check) [ $# -ge 4 ] || die "usage: portable.sh check OUTDIR DIST_TARBALL TEST... [-- TEST...]"; shift; check "$@" ;;
check-wheel) [ $# -eq 3 ] || die "usage: portable.sh check-wheel OUTDIR DATAFILE"; check_wheel "$2" "$3" ;;
*) die "usage: portable.sh build DIST_TARBALL OUTDIR | check OUTDIR DIST_TARBALL TEST... [-- TEST...] | check-wheel OUTDIR DATAFILE" ;;
esac
