"""PEP 517 build backend of ckpt-toolkit (pyproject.toml), standard library only.

Why our own backend: the package is a pure-Python module over ctypes plus a C
library and program built by autotools; setuptools or scikit-build would add a
build dependency and still leave us the parts that matter here (gathering the
shared libraries, setting their rpaths, naming the manylinux tag).

The native files come from, in order:
  - env CKPT_TOOLKIT_NATIVE_DIR: a folder holding bin/ckpt and
    lib/libckpt.so.0 (the portable folder of tools/portable.sh, or symlinks
    into a build tree); any lib/*.so* beside them is taken too, and
    lib/libckpt_cuda.so, the CUDA backend module (its CUDA runtime linked in
    statically, cuBLAS and cuDNN loaded at run time), copied as it is;
  - else a build from source in a temporary folder: the source files copied
    there, ./bootstrap when configure is missing, ./configure -q
    --with-cuda=no --with-blas=no, make ckpt libckpt.la.
Then every library they need that glibc does not provide (ldd, as
tools/portable.sh does) is gathered beside libckpt.so.0 in
ckpt_toolkit/_native/lib under a name of its own (NAME-HASH.so.N, as
auditwheel repair names them), rpaths are set to $ORIGIN (libraries) and
$ORIGIN/../lib (bin/ckpt) with patchelf, and the wheel is tagged
py3-none-manylinux_2_X_x86_64 where 2.X is the highest GLIBC_2.X symbol
version any bundled file needs (readelf -V): right by construction, and
auditwheel show agrees (tests/python/wheel.sh).
"""

import base64
import csv
import glob
import hashlib
import io
import os
import re
import shutil
import stat
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile

NAME = "ckpt-toolkit"
IMPORT_NAME = "ckpt_toolkit"
DIST_NAME = "ckpt_toolkit"  # the file-name form of NAME (PEP 427, PEP 625)
PACKAGE_DIR = os.path.join("python", IMPORT_NAME)
NATIVE_ENV = "CKPT_TOOLKIT_NATIVE_DIR"
# the oldest tag pip knows for x86-64 (manylinux2014)
MIN_GLIBC = (2, 17)
# glibc's own libraries: the target system's, never bundled (as in
# tools/portable.sh, and auditwheel's manylinux policies)
GLIBC_LIBS = re.compile(
    r"^(libc|libm|libpthread|libdl|librt|libresolv|libutil|libnsl|libanl|libcrypt)\.so\.|^ld-linux"
)
# CUDA is loaded at run time when present, never bundled: a build linking it
# cannot make a portable wheel
CUDA_LIBS = re.compile(r"^lib(cuda|cudart|cublas|cublasLt|nvrtc)\.so")
# the CUDA backend module, carried when the native folder has it
CUDA_MODULE = "libckpt_cuda.so"


def _log(msg):
    print("ckpt_pep517: " + msg, file=sys.stderr, flush=True)


class BuildError(Exception):
    pass


# ---- pyproject.toml ---------------------------------------------------------


def _parse_toml_subset(text):
    """The subset of TOML pyproject.toml uses (tables, strings, arrays of
    strings), for Pythons before 3.11 that lack tomllib."""
    doc = {}
    table = doc
    lines = text.splitlines()
    i = 0

    def value(s):
        s = s.strip()
        if s.startswith('"'):
            m = re.match(r'"((?:[^"\\]|\\.)*)"\s*(#.*)?$', s)
            if not m:
                raise BuildError("pyproject.toml: cannot read " + s)
            return re.sub(r"\\(.)", r"\1", m.group(1))
        if s.startswith("["):
            return [value(x) for x in re.findall(r'"(?:[^"\\]|\\.)*"', s)]
        raise BuildError("pyproject.toml: unsupported value " + s)

    while i < len(lines):
        line = lines[i].strip()
        i += 1
        if not line or line.startswith("#"):
            continue
        m = re.match(r"^\[([A-Za-z0-9_.-]+)\]$", line)
        if m:
            table = doc
            for part in m.group(1).split("."):
                table = table.setdefault(part, {})
            continue
        m = re.match(r'^("?[A-Za-z0-9_.-]+"?)\s*=\s*(.*)$', line)
        if not m:
            raise BuildError("pyproject.toml: cannot read " + line)
        key, rest = m.group(1).strip('"'), m.group(2)
        if rest.startswith("[") and "]" not in rest:
            while i < len(lines) and "]" not in rest:  # a multi-line array
                rest += " " + lines[i]
                i += 1
        table[key] = value(rest)
    return doc


def read_pyproject(root):
    with open(os.path.join(root, "pyproject.toml"), "rb") as f:
        raw = f.read()
    try:
        import tomllib
    except ImportError:
        return _parse_toml_subset(raw.decode("utf-8"))
    return tomllib.loads(raw.decode("utf-8"))


def read_version(root):
    with open(os.path.join(root, "configure.ac"), encoding="utf-8") as f:
        m = re.search(r"AC_INIT\(\[[^]]*\],\s*\[([^]]+)\]", f.read())
    if not m:
        raise BuildError("configure.ac: no AC_INIT([name], [version])")
    return m.group(1)


def _norm_extra(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def metadata_text(root):
    """METADATA (and the sdist's PKG-INFO), core metadata 2.1, from [project]."""
    project = read_pyproject(root)["project"]
    if project["name"] != NAME:
        raise BuildError("pyproject.toml: name is %r, this backend builds %s" % (project["name"], NAME))
    lines = [
        "Metadata-Version: 2.1",
        "Name: " + NAME,
        "Version: " + read_version(root),
        "Summary: " + project.get("description", ""),
    ]
    if project.get("keywords"):
        lines.append("Keywords: " + ",".join(project["keywords"]))
    for c in project.get("classifiers", []):
        lines.append("Classifier: " + c)
    if "requires-python" in project:
        lines.append("Requires-Python: " + project["requires-python"])
    for d in project.get("dependencies", []):
        lines.append("Requires-Dist: " + d)
    for extra, deps in sorted(project.get("optional-dependencies", {}).items()):
        e = _norm_extra(extra)
        lines.append("Provides-Extra: " + e)
        for d in deps:
            lines.append('Requires-Dist: %s; extra == "%s"' % (d, e))
    body = ""
    readme = project.get("readme")
    if readme:
        lines.append("Description-Content-Type: text/markdown")
        with open(os.path.join(root, readme), encoding="utf-8") as f:
            body = f.read()
    return "\n".join(lines) + "\n\n" + body


def entry_points_text(root):
    scripts = read_pyproject(root)["project"].get("scripts", {})
    return "[console_scripts]\n" + "".join("%s = %s\n" % kv for kv in sorted(scripts.items()))


# ---- the native files --------------------------------------------------------


def _run(cmd, cwd=None, env=None):
    _log("$ " + " ".join(cmd) + ("  (in %s)" % cwd if cwd else ""))
    r = subprocess.run(cmd, cwd=cwd, env=env)
    if r.returncode != 0:
        raise BuildError("%s failed (exit %d)" % (" ".join(cmd), r.returncode))


def _tool(name):
    path = shutil.which(name)
    if not path:
        raise BuildError("%s not found on PATH (Debian: apt-get install %s)" % (name, {"readelf": "binutils"}.get(name, name)))
    return path


def source_files(root):
    """The files of the source tree (a sdist's list): git's tracked and
    untracked-but-not-ignored files in a clone, else every file (an unpacked
    sdist, which has no build outputs)."""
    if os.path.isdir(os.path.join(root, ".git")) or os.path.isfile(os.path.join(root, ".git")):
        try:
            out = subprocess.run(
                ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                cwd=root, check=True, stdout=subprocess.PIPE,
            ).stdout
            return sorted(p for p in out.decode().split("\0") if p and os.path.isfile(os.path.join(root, p)))
        except (OSError, subprocess.CalledProcessError):
            pass
    files = []
    for d, dirs, names in os.walk(root):
        dirs[:] = sorted(x for x in dirs if x not in (".git", "__pycache__"))
        for n in names:
            files.append(os.path.relpath(os.path.join(d, n), root))
    return sorted(files)


def build_native(root, tmp):
    """Build ckpt and libckpt from source in tmp; returns a native folder."""
    src = os.path.join(tmp, "src")
    for rel in source_files(root):
        dst = os.path.join(src, rel)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        shutil.copy2(os.path.join(root, rel), dst)
    if not os.path.exists(os.path.join(src, "configure")):
        _run(["sh", "./bootstrap"], cwd=src)
    # CPU backend only (a build from source has no CUDA module; the
    # release's wheel, from the portable folder, carries it); no OpenBLAS
    # (no Fortran run time in the wheel)
    _run(["sh", "./configure", "-q", "--with-cuda=no", "--with-blas=no"], cwd=src)
    env = dict(os.environ)
    env.setdefault("MAKEFLAGS", "-j%d" % min(os.cpu_count() or 1, 8))
    _run(["make", "ckpt", "libckpt.la"], cwd=src, env=env)
    native = os.path.join(tmp, "native")
    os.makedirs(os.path.join(native, "bin"))
    os.makedirs(os.path.join(native, "lib"))
    os.symlink(os.path.join(src, "ckpt"), os.path.join(native, "bin", "ckpt"))
    os.symlink(os.path.join(src, ".libs", "libckpt.so.0"), os.path.join(native, "lib", "libckpt.so.0"))
    return native


def _is_elf(path):
    with open(path, "rb") as f:
        return f.read(4) == b"\x7fELF"


def _ldd(path):
    """{soname: resolved path or None} of every library path needs."""
    r = subprocess.run([_tool("ldd"), path], stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True)
    if r.returncode != 0:
        raise BuildError("ldd %s: %s" % (path, r.stderr.strip() or r.stdout.strip()))
    deps = {}
    for line in r.stdout.splitlines():
        m = re.match(r"^\s*(\S+)\s+=>\s+(not found|\S+)", line)
        if m:
            deps[m.group(1)] = None if m.group(2) == "not found" else m.group(2)
    return deps


def _needed(path):
    out = subprocess.run([_tool("readelf"), "-d", "--wide", path], stdout=subprocess.PIPE,
                         universal_newlines=True, check=True).stdout
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^]]+)\]", out)


def _soname(path):
    out = subprocess.run([_tool("readelf"), "-d", "--wide", path], stdout=subprocess.PIPE,
                         universal_newlines=True, check=True).stdout
    m = re.search(r"\(SONAME\)\s+Library soname: \[([^]]+)\]", out)
    return m.group(1) if m else None


def glibc_needed(path):
    """The highest GLIBC_2.X symbol version path needs, as (2, X)."""
    out = subprocess.run([_tool("readelf"), "-V", "--wide", path], stdout=subprocess.PIPE,
                         universal_newlines=True, check=True).stdout
    best = (0, 0)
    for major, minor in re.findall(r"Name: GLIBC_(\d+)\.(\d+)", out):
        best = max(best, (int(major), int(minor)))
    return best


def _copyright_of(path):
    """Debian's copyright file of the package that installed path, if any."""
    if not shutil.which("dpkg"):
        return None, None
    for p in (path, os.path.realpath(path)):
        r = subprocess.run(["dpkg", "-S", p], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                           universal_newlines=True)
        if r.returncode == 0 and r.stdout:
            pkg = r.stdout.split(":", 1)[0].split(",")[0].strip()
            f = "/usr/share/doc/%s/copyright" % pkg
            if os.path.isfile(f):
                return pkg, f
    return None, None


def stage_native(native, out):
    """Copy native's bin/ckpt, lib/libckpt.so.0 and lib/*.so* into out
    ({bin,lib,licenses}), gather the non-glibc libraries they need, set the
    rpaths; returns the highest glibc version any of them needs."""
    ckpt = os.path.join(native, "bin", "ckpt")
    lib0 = os.path.join(native, "lib", "libckpt.so.0")
    if os.path.isfile(ckpt) and not _is_elf(ckpt):
        # libtool's wrapper script in a build tree: the program is in .libs/
        real = os.path.join(os.path.dirname(os.path.realpath(ckpt)), ".libs", "ckpt")
        if os.path.isfile(real) and _is_elf(real):
            ckpt = real
    for f in (ckpt, lib0):
        if not os.path.isfile(f):
            raise BuildError("%s: no such file (the native folder needs bin/ckpt and lib/libckpt.so.0)" % f)
        if not _is_elf(f):
            raise BuildError("%s: not an ELF file (a libtool wrapper? give the real one)" % f)
    patchelf = _tool("patchelf")
    binout, libout, licout = (os.path.join(out, d) for d in ("bin", "lib", "licenses"))
    for d in (binout, libout):
        os.makedirs(d)
    shutil.copyfile(ckpt, os.path.join(binout, "ckpt"))
    for f in sorted(glob.glob(os.path.join(native, "lib", "*.so*"))):
        # each library once, under its soname (a folder may hold the
        # development link and the full version beside it)
        soname = _soname(f)
        if soname and not os.path.exists(os.path.join(libout, soname)):
            shutil.copyfile(f, os.path.join(libout, soname))
    # The CUDA backend module (no soname: libckpt dlopens it by path, from
    # beside libckpt.so.0, lib/runtime/backend_cuda.c), as the portable
    # folder has it: the CUDA runtime linked in statically, cuBLAS and cuDNN
    # loaded by it at run time, so it needs only glibc's libraries.  Copied
    # as it is: its dependencies are not gathered (nothing of CUDA is ever
    # bundled), nor its rpath changed.
    module = os.path.join(native, "lib", CUDA_MODULE)
    if os.path.isfile(module):
        if not _is_elf(module):
            raise BuildError("%s: not an ELF file" % module)
        beyond = [n for n in _needed(module) if not GLIBC_LIBS.match(n)]
        if beyond:
            raise BuildError("%s needs %s: the CUDA module the wheel carries needs only glibc's "
                             "libraries (configure links the CUDA runtime statically)"
                             % (module, ", ".join(beyond)))
        shutil.copyfile(module, os.path.join(libout, CUDA_MODULE))
        os.chmod(os.path.join(libout, CUDA_MODULE), 0o755)
        _log("the CUDA module %s: %d KiB" % (CUDA_MODULE, os.path.getsize(module) // 1024))
    # the portable folder's licence files of its libraries
    doc = os.path.join(native, "share", "doc", "ckpt", "libraries")
    if os.path.isdir(doc):
        shutil.copytree(doc, licout)
    # every library ldd resolves outside the folder, beyond glibc's
    todo = [os.path.join(binout, "ckpt")] + sorted(f for f in glob.glob(os.path.join(libout, "*"))
                                                   if os.path.basename(f) != CUDA_MODULE)
    elves = []
    while todo:
        f = todo.pop(0)
        elves.append(f)
        for soname, path in sorted(_ldd(f).items()):
            if GLIBC_LIBS.match(soname) or os.path.exists(os.path.join(libout, soname)):
                continue
            if CUDA_LIBS.match(soname):
                raise BuildError("%s links %s: the CUDA runtime is never bundled (configure "
                                 "--with-cuda=no, or the CUDA backend loaded at run time)" % (f, soname))
            if path is None:
                raise BuildError("%s needs %s, which ldd cannot find" % (f, soname))
            dst = os.path.join(libout, soname)
            shutil.copyfile(path, dst)
            _log("bundled %s (%s)" % (soname, os.path.realpath(path)))
            pkg, cr = _copyright_of(path)
            if cr:
                os.makedirs(licout, exist_ok=True)
                shutil.copyfile(cr, os.path.join(licout, pkg + ".copyright"))
            todo.append(dst)
    # Each bundled library under a name of its own (libz-1a2b3c4d.so.1, as
    # auditwheel repair names them): in a Python process the system's
    # libz.so.1 or libcrypto.so.3 may be loaded already, and a library of
    # the same soname would not be loaded again.  libckpt.so.0 keeps its
    # name (the module loads it by that name).
    renames = {}
    for f in sorted(glob.glob(os.path.join(libout, "*"))):
        old = os.path.basename(f)
        if old in ("libckpt.so.0", CUDA_MODULE):
            continue
        with open(f, "rb") as fh:
            h = hashlib.sha256(fh.read()).hexdigest()[:8]
        stem, sep, ver = old.partition(".so")
        new = "%s-%s%s%s" % (stem, h, sep, ver)
        os.rename(f, os.path.join(libout, new))
        renames[old] = new
    elves = [os.path.join(libout, renames.get(os.path.basename(f), os.path.basename(f)))
             if f.startswith(libout + os.sep) else f for f in elves]
    strip = shutil.which("strip")
    for f in elves:
        os.chmod(f, 0o755)
        # debugging information is most of a build tree's size; the
        # symbols stay
        if strip:
            _run([strip, "--strip-debug", f])
        # one change a call, as auditwheel does: patchelf 0.14 mixing
        # --replace-needed with others leaves .gnu.version_r naming the old file
        needed = _needed(f)
        for old, new in sorted(renames.items()):
            if old in needed:
                _run([patchelf, "--replace-needed", old, new, f])
        if os.path.basename(f) in renames.values():
            _run([patchelf, "--set-soname", os.path.basename(f), f])
        _run([patchelf, "--set-rpath", "$ORIGIN/../lib" if f.startswith(binout) else "$ORIGIN", f])
    # by construction: every library beyond glibc's now loads from lib/
    for f in elves:
        for soname, path in _ldd(f).items():
            if not GLIBC_LIBS.match(soname) and (soname not in renames.values() and soname != "libckpt.so.0" or path is None or os.path.dirname(os.path.realpath(path)) != os.path.realpath(libout)):
                raise BuildError("%s: %s resolves to %s, not the wheel's lib/" % (f, soname, path))
    carried = [os.path.join(libout, CUDA_MODULE)] if os.path.isfile(os.path.join(libout, CUDA_MODULE)) else []
    glibc = max([MIN_GLIBC] + [glibc_needed(f) for f in elves + carried])
    _log("highest glibc symbol version needed: %d.%d" % glibc)
    return glibc


# ---- wheel and sdist ---------------------------------------------------------


class _Wheel:
    """A wheel being written: files added, then RECORD last."""

    def __init__(self, path):
        self.zip = zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED)
        self.record = []
        # reproducible: every entry dated by SOURCE_DATE_EPOCH (or 1980)
        t = time.gmtime(int(os.environ.get("SOURCE_DATE_EPOCH", "315532800")))
        self.date = max(t[:6], (1980, 1, 1, 0, 0, 0))

    def add(self, arcname, data, mode=0o644):
        info = zipfile.ZipInfo(arcname, self.date)
        info.external_attr = (stat.S_IFREG | mode) << 16
        info.compress_type = zipfile.ZIP_DEFLATED
        self.zip.writestr(info, data)
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        self.record.append((arcname, "sha256=" + digest, str(len(data))))

    def close(self, record_name):
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        for row in self.record:
            w.writerow(row)
        w.writerow((record_name, "", ""))
        info = zipfile.ZipInfo(record_name, self.date)
        info.external_attr = (stat.S_IFREG | 0o644) << 16
        info.compress_type = zipfile.ZIP_DEFLATED
        self.zip.writestr(info, buf.getvalue())
        self.zip.close()


def _package_files(root):
    pkg = os.path.join(root, PACKAGE_DIR)
    if not os.path.isfile(os.path.join(pkg, "__init__.py")):
        raise BuildError("%s/__init__.py: no such file" % PACKAGE_DIR)
    files = []
    for d, dirs, names in os.walk(pkg):
        dirs[:] = sorted(x for x in dirs if x not in ("__pycache__", "_native"))
        for n in sorted(names):
            if not n.endswith((".pyc", ".pyo")):
                files.append(os.path.join(d, n))
    return pkg, files


def _dist_info(root, version):
    return "%s-%s.dist-info" % (DIST_NAME, version)


def _write_dist_info_files(root, dist_info, add):
    add(dist_info + "/METADATA", metadata_text(root).encode("utf-8"))
    add(dist_info + "/entry_points.txt", entry_points_text(root).encode("utf-8"))


def _build_wheel(root, wheel_directory):
    version = read_version(root)
    pkg, files = _package_files(root)
    with tempfile.TemporaryDirectory(prefix="ckpt-wheel-") as tmp:
        native = os.environ.get(NATIVE_ENV)
        if native:
            native = os.path.abspath(native)
            _log("native files from %s=%s" % (NATIVE_ENV, native))
        else:
            _log("no %s: building ckpt from source" % NATIVE_ENV)
            native = build_native(root, tmp)
        staged = os.path.join(tmp, "stage")
        glibc = stage_native(native, staged)
        tag = "py3-none-manylinux_%d_%d_x86_64" % glibc
        name = "%s-%s-%s.whl" % (DIST_NAME, version, tag)
        path = os.path.join(wheel_directory, name)
        wheel = _Wheel(path)
        for f in files:
            with open(f, "rb") as fh:
                wheel.add(IMPORT_NAME + "/" + os.path.relpath(f, pkg).replace(os.sep, "/"), fh.read())
        for d, dirs, names in os.walk(staged):
            dirs.sort()
            for n in sorted(names):
                f = os.path.join(d, n)
                rel = os.path.relpath(f, staged).replace(os.sep, "/")
                with open(f, "rb") as fh:
                    wheel.add(IMPORT_NAME + "/_native/" + rel, fh.read(),
                              0o755 if os.access(f, os.X_OK) and _is_elf(f) else 0o644)
        dist_info = _dist_info(root, version)
        _write_dist_info_files(root, dist_info, wheel.add)
        wheel.add(dist_info + "/WHEEL", (
            "Wheel-Version: 1.0\nGenerator: ckpt_pep517 (tools/pybuild)\n"
            "Root-Is-Purelib: false\nTag: %s\n" % tag).encode())
        wheel.close(dist_info + "/RECORD")
    _log("wrote %s" % path)
    return name


# ---- the PEP 517 hooks -------------------------------------------------------


def get_requires_for_build_wheel(config_settings=None):
    # patchelf from PyPI (a binary wheel) where the system has none
    return [] if shutil.which("patchelf") else ["patchelf"]


def get_requires_for_build_sdist(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    root = os.getcwd()
    dist_info = _dist_info(root, read_version(root))

    def add(arcname, data):
        p = os.path.join(metadata_directory, arcname)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "wb") as f:
            f.write(data)

    _write_dist_info_files(root, dist_info, add)
    return dist_info


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    try:
        return _build_wheel(os.getcwd(), wheel_directory)
    except BuildError as e:
        _log("error: %s" % e)
        raise SystemExit(1)


def build_sdist(sdist_directory, config_settings=None):
    root = os.getcwd()
    version = read_version(root)
    base = "%s-%s" % (DIST_NAME, version)
    name = base + ".tar.gz"
    pkg_info = metadata_text(root).encode("utf-8")
    mtime = int(os.environ.get("SOURCE_DATE_EPOCH", time.time()))

    def normalize(ti):
        ti.uid = ti.gid = 0
        ti.uname = ti.gname = ""
        ti.mtime = mtime
        return ti

    with tarfile.open(os.path.join(sdist_directory, name), "w:gz", format=tarfile.PAX_FORMAT) as tar:
        for rel in source_files(root):
            if rel == "PKG-INFO":
                continue
            tar.add(os.path.join(root, rel), base + "/" + rel, recursive=False, filter=normalize)
        ti = normalize(tarfile.TarInfo(base + "/PKG-INFO"))
        ti.size = len(pkg_info)
        ti.mode = 0o644
        tar.addfile(ti, io.BytesIO(pkg_info))
    _log("wrote %s" % os.path.join(sdist_directory, name))
    return name
