"""What the interop tests share: where ckpt and the data are, running ckpt,
counting checks, and torch's side of saving and loading.

A test starts with

    import os, sys
    sys.dont_write_bytecode = True
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import _common as c        # exits 77 (skip) when torch cannot be imported

    t = c.Tally()              # prints the torch (and ckpt) it runs under
    t.need(c.CKPT, 'CKPT')     # a FAIL, exit 1, when there is no ckpt there

then reports each check (t.report(NAME, errors), t.run(NAME, fn),
@t.case(NAME) ...) and ends with sys.exit(t.summary()), which prints
`N passed, M failed` (`, K skipped` when some were) and gives 1 if anything
failed.

Environment:
  CKPT       the ckpt binary (default: $srcdir/ckpt)
  CAST_TOOL  tests/interop/cast_tool, built by `make check`
  srcdir     the repository root (default: two levels above this file)
"""
import atexit
import collections
import importlib
import json
import os
import platform
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import textwrap
import zlib

try:
    import torch
except Exception as _e:  # pragma: no cover
    print('torch cannot be imported (%s): skipping' % _e, file=sys.stderr)
    sys.exit(77)

SKIP = 77
HERE = os.path.dirname(os.path.abspath(__file__))
SRCDIR = os.environ.get('srcdir') or os.path.normpath(
    os.path.join(HERE, '..', '..'))
CKPT = os.environ.get('CKPT') or os.path.join(SRCDIR, 'ckpt')
CAST_TOOL = os.environ.get('CAST_TOOL') or os.path.join(
    SRCDIR, 'tests', 'interop', 'cast_tool')
DATA = os.path.join(SRCDIR, 'tests', 'data')          # good fixtures
BAD = os.path.join(SRCDIR, 'tests', 'bad')            # hostile files
SPECS = os.path.join(SRCDIR, 'models')                # model specs (JSON)
TIMEOUT = 120                                         # seconds per ckpt run
# ckpt's view of this machine, as on one without CUDA, GPU or not (the
# torch_load verdict's missing_here); a test of the probe itself unsets it
os.environ.setdefault('CKPT_CUDA_DEVICES', '0')

# tests/fixtures/models.py: the torch modules the fixtures were made from
sys.path.insert(0, os.path.join(SRCDIR, 'tests', 'fixtures'))

OD = collections.OrderedDict

# the wrapper components of doc/design.md ("The rewriting commands"),
# outermost first
WRAPPERS = ('module.', '_orig_mod.', '_fsdp_wrapped_module.',
            '_forward_module.', '_checkpoint_wrapped_module.')
# one wrapper component at the start of a key or after a dot
WRAP_RE = re.compile(r'(?:^|(?<=\.))(?:%s)\.' % '|'.join(
    re.escape(w[:-1]) for w in WRAPPERS))


def need(*modules):
    """Skip (exit 77) unless every one of MODULES can be imported."""
    for m in modules:
        try:
            importlib.import_module(m)
        except Exception as e:  # pragma: no cover
            print('%s cannot be imported (%s): skipping' % (m, e),
                  file=sys.stderr)
            sys.exit(SKIP)


def need_transformers():
    """transformers, with torch.export beside it; else skip (exit 77) saying
    how to get them."""
    try:
        import transformers
        import torch.export  # noqa: F401  (torch >= 2.1)
    except Exception as e:  # pragma: no cover
        print('transformers or torch.export cannot be imported (%s): skipping (./bootstrap '
              '--deps installs transformers 5.24.0 beside torch 2.x)' % e)
        sys.exit(SKIP)
    return transformers


# --------------------------------------------------------------------------
# running ckpt

class Fail(AssertionError):
    """A check that failed; its message is the report."""


class Skip(Exception):
    """A check that cannot run here (no GPU): reported, counted as skipped."""


class Ran:
    """One finished run: rc, and stdout / stderr as bytes (.stdout,
    .stderr) or text (.out, strict UTF-8; .err, undecodable bytes
    replaced).  Unpacks as (rc, out, err)."""

    def __init__(self, argv, p):
        self.argv, self.rc = argv, p.returncode
        self.stdout, self.stderr = p.stdout, p.stderr

    @property
    def out(self):
        return self.stdout.decode()

    @property
    def err(self):
        return self.stderr.decode(errors='replace')

    @property
    def cmd(self):
        """`ckpt ARGS` as a reader would type it."""
        return ' '.join([os.path.basename(self.argv[0])] + self.argv[1:])

    def __iter__(self):
        return iter((self.rc, self.out, self.err))

    def __getitem__(self, i):
        return (self.rc, self.out, self.err)[i]


def run(argv, timeout=TIMEOUT, input=None):
    """Runs ARGV (a program and its arguments) and returns a Ran."""
    argv = [str(a) for a in argv]
    p = subprocess.run(argv, input=input, capture_output=True,
                       timeout=timeout)
    return Ran(argv, p)


def ckpt(*args, timeout=TIMEOUT):
    """ckpt ARGS -> Ran."""
    return run([CKPT] + list(args), timeout=timeout)


def ckpt_expect(want, *args, timeout=TIMEOUT):
    """ckpt ARGS, which must exit WANT (else Fail); returns the Ran."""
    r = ckpt(*args, timeout=timeout)
    if r.rc != want:
        raise Fail('`%s` exited %d (want %d): %s'
                   % (r.cmd, r.rc, want, r.err.strip()[:400]))
    return r


def refusal_errors(r, want, prefix='ckpt: ', quiet=True):
    """What is wrong with R as a refusal: exit WANT, exactly one line on
    stderr (newline-terminated) starting with PREFIX, nothing on stdout
    when QUIET."""
    errs = []
    err = r.err
    if r.rc != want:
        errs.append('`%s` exited %d (want %d); stderr %r'
                    % (r.cmd, r.rc, want, err[:300]))
    elif len(err.splitlines()) != 1 or not err.endswith('\n'):
        errs.append('`%s`: %d stderr lines (want 1): %r'
                    % (r.cmd, len(err.splitlines()), err[:300]))
    elif not err.startswith(prefix):
        errs.append('`%s`: stderr %r does not start with %r'
                    % (r.cmd, err[:300], prefix))
    if quiet and r.stdout:
        errs.append('`%s`: output on stdout: %r' % (r.cmd, r.stdout[:200]))
    return errs


def refused(want, *args):
    """ckpt ARGS exits WANT with one stderr line `ckpt: ...` and nothing on
    stdout (else Fail); returns that line."""
    r = ckpt(*args)
    errs = refusal_errors(r, want)
    if errs:
        raise Fail('; '.join(errs))
    return r.err.strip()


def verify_json(spec, path, *extra, device='cpu', timeout=600):
    """`ckpt verify --json [--device DEVICE] --model SPEC EXTRA PATH`; SPEC
    is a path or a name in models/.  Exit 0 (PASS) or 1 (FAIL) gives (rc,
    the JSON report); anything else is a Fail."""
    dev = ['--device', device] if device else []
    r = ckpt('verify', '--json', *dev, '--model', os.path.join(SPECS, spec),
             *extra, path, timeout=timeout)
    if r.rc not in (0, 1):
        raise Fail('exit %d: %s' % (r.rc, r.err.strip()))
    return r.rc, json.loads(r.out)


# --------------------------------------------------------------------------
# counting checks

def describe(e):
    """An exception as one line of a report."""
    if isinstance(e, subprocess.TimeoutExpired):
        cmd = [str(a) for a in e.cmd] if isinstance(e.cmd, (list, tuple)) \
            else [str(e.cmd)]
        return 'timed out after %ds: %s' % (
            e.timeout, ' '.join([os.path.basename(cmd[0])] + cmd[1:]))
    if isinstance(e, AssertionError):
        return str(e) or 'assertion failed'
    return '%s: %s' % (type(e).__name__, e)


def versions():
    """torch's version, and those of numpy and safetensors where loaded."""
    v = ['torch %s' % torch.__version__]
    for m in ('numpy', 'safetensors'):
        if m in sys.modules:
            v.append('%s %s' % (m, getattr(sys.modules[m], '__version__', '?')))
    return '%s (Python %s)' % (', '.join(v), platform.python_version())


class Tally:
    """Counts checks and prints one line per check: `ok NAME` or `FAIL
    NAME: why` (the first MAX_ERRORS reasons), `SKIP NAME: why`."""

    def __init__(self, uses=None, max_errors=6):
        self.passed = self.failed = self.skipped = 0
        self.max_errors = max_errors
        if uses is None:
            uses = 'ckpt %s' % CKPT
        print('%s; %s' % (versions(), uses))
        sys.stdout.flush()

    def need(self, path, env):
        """PATH, from $ENV, must be an executable: else FAIL and exit 1."""
        if not os.access(path, os.X_OK):
            self.fail(env, 'no executable at %s (set %s)' % (path, env))
            sys.exit(self.summary())

    def ok(self, name):
        self.passed += 1
        print('ok %s' % name)
        sys.stdout.flush()

    def fail(self, name, why):
        self.failed += 1
        print('FAIL %s: %s' % (name, why))
        sys.stdout.flush()

    def skip(self, name, why):
        self.skipped += 1
        print('SKIP %s: %s' % (name, why))
        sys.stdout.flush()

    def add(self, passed, failed):
        """Checks counted in bulk (their lines printed by the caller)."""
        self.passed += passed
        self.failed += failed

    def report(self, name, errs):
        """One check: ok when ERRS (a list of what went wrong) is empty.
        Returns whether it passed."""
        if not errs:
            self.ok(name)
            return True
        n = self.max_errors
        self.fail(name, '; '.join(errs[:n]) + (
            '; ... %d more' % (len(errs) - n) if len(errs) > n else ''))
        return False

    def run(self, name, fn, *args, tmp=False, prefix='ckpt-'):
        """One check: FN(*ARGS) (with a fresh temporary directory first when
        TMP) returns a list of what went wrong, or None; an exception is a
        failure (Skip: skipped).  Returns whether it passed."""
        try:
            if tmp:
                with tempfile.TemporaryDirectory(prefix=prefix) as d:
                    errs = fn(d, *args)
            else:
                errs = fn(*args)
        except Skip as e:
            self.skip(name, e)
            return False
        except Exception as e:  # report and go on
            errs = [describe(e)]
        return self.report(name, errs or [])

    def case(self, name):
        """Decorator: runs the function now as the check NAME (asserts
        inside it are its checks)."""
        def wrap(fn):
            self.run(name, fn)
            return fn
        return wrap

    def summary(self):
        """Prints the last line; returns the exit status (1 on a failure)."""
        line = '%d passed, %d failed' % (self.passed, self.failed)
        if self.skipped:
            line += ', %d skipped' % self.skipped
        print(line)
        sys.stdout.flush()
        return 1 if self.failed else 0


# --------------------------------------------------------------------------
# files

_scratch = []


def scratch(name=None):
    """A path NAME in this run's scratch directory (made on first use,
    removed at exit); the directory itself without NAME."""
    if not _scratch:
        _scratch.append(tempfile.mkdtemp(prefix='ckpt-interop-'))
        atexit.register(shutil.rmtree, _scratch[0], True)
    return os.path.join(_scratch[0], name) if name else _scratch[0]


def scratch_source(name, text):
    """TEXT (dedented) as the file NAME in scratch, written once: a module
    of models for a tool that takes MODULE.py:FACTORY; its path."""
    path = scratch(name)
    if not os.path.exists(path):
        with open(path, 'w') as f:
            f.write(textwrap.dedent(text))
    return path


def save(obj, path, fmt='zip'):
    """Writes OBJ with torch as pth-zip ('zip'), pth-legacy ('legacy'), or
    with the safetensors package ('safetensors': a dict of tensors, made
    contiguous); returns PATH."""
    if fmt == 'zip':
        torch.save(obj, path)
    elif fmt == 'legacy':
        torch.save(obj, path, _use_new_zipfile_serialization=False)
    elif fmt == 'safetensors':
        from safetensors.torch import save_file
        save_file({k: v.contiguous() for k, v in obj.items()}, path)
    else:
        raise ValueError(fmt)
    return path


def load_tagged(path, weights_only=True):
    """torch.load on the CPU with a map_location that records the location
    tag saved with each storage: (object, {storage _cdata: tag})."""
    tags = {}

    def ml(storage, location):
        tags[storage._cdata] = location
        return storage
    obj = torch.load(path, map_location=ml, weights_only=weights_only)
    return obj, tags


def load_trusted(path, **kw):
    """torch.load of a file this project made (fixtures, references): any
    object, as torch 1.13's default did (2.6+ defaults to weights_only)."""
    return torch.load(path, weights_only=False, **kw)


def loads_weights_only(path, **kw):
    """(True, None) when torch.load(PATH, weights_only=True) works, else
    (False, why)."""
    try:
        torch.load(path, weights_only=True, **kw)
        return True, None
    except Exception as e:
        return False, '%s: %s' % (type(e).__name__, str(e)[-200:])


def is_zip(path):
    with open(path, 'rb') as f:
        return f.read(4) == b'PK\x03\x04'


# the element sizes of safetensors' dtypes (the sub-byte F4/F6: 1)
ST_SIZES = {'F64': 8, 'F32': 4, 'F16': 2, 'BF16': 2, 'I64': 8, 'I32': 4,
            'I16': 2, 'I8': 1, 'U8': 1, 'BOOL': 1, 'U16': 2, 'U32': 4,
            'U64': 8, 'F8_E5M2': 1, 'F8_E4M3': 1, 'F8_E4M3FNUZ': 1,
            'F8_E5M2FNUZ': 1, 'C64': 8, 'F8_E8M0': 1, 'F4': 1,
            'F6_E2M3': 1, 'F6_E3M2': 1}


def st_alignment(path):
    """The layout ckpt-convert(1) promises for a safetensors file it writes,
    read with struct and json only: (errors, aligned, tensors), where
    ALIGNED counts the tensors of at least one byte whose data starts on a
    64-byte boundary of the file, of TENSORS such.  Errors: the data
    section not starting on a 64-byte boundary, a hole or overlap (in
    offset order), a tensor off a multiple of its element size, a tensor
    whose size is a multiple of 64 bytes off a 64-byte boundary."""
    with open(path, 'rb') as f:
        n = struct.unpack('<Q', f.read(8))[0]
        hdr = json.loads(f.read(n))
        size = f.seek(0, 2)
    base, errs, at, aligned, total = 8 + n, [], 0, 0, 0
    if base % 64:
        errs.append('data section at byte %d (%d mod 64)' % (base, base % 64))
    hdr.pop('__metadata__', None)
    for name, e in sorted(hdr.items(), key=lambda kv: kv[1]['data_offsets']):
        b, end = e['data_offsets']
        if b != at:
            errs.append('%s at %d, after a tensor ending at %d' % (name, b, at))
        if b % ST_SIZES.get(e['dtype'], 1):
            errs.append('%s (%s) at byte %d of the data' % (name, e['dtype'], b))
        if (end - b) % 64 == 0 and (base + b) % 64:
            errs.append('%s, %d bytes, at %d mod 64' % (name, end - b, (base + b) % 64))
        if end > b:
            total += 1
            aligned += (base + b) % 64 == 0
        at = end
    if base + at != size:
        errs.append('the tensors end at byte %d of %d' % (base + at, size))
    return errs, aligned, total


def zip_unaligned(path):
    """The records of the zip PATH whose data does not start on a 64-byte
    boundary: [(name, offset)]."""
    import zipfile
    out = []
    with open(path, 'rb') as f, zipfile.ZipFile(path) as z:
        for i in z.infolist():
            f.seek(i.header_offset + 26)
            nl, xl = struct.unpack('<HH', f.read(4))
            at = i.header_offset + 30 + nl + xl
            if at % 64:
                out.append((i.filename, at))
    return out


# --------------------------------------------------------------------------
# tensors as torch sees them

def dtype_name(dt):
    """'float32' for torch.float32."""
    return str(dt).replace('torch.', '')


def untyped(t):
    """The untyped storage T is a view of (torch 2.x: untyped_storage();
    1.13: the TypedStorage's _storage)."""
    if hasattr(t, 'untyped_storage'):
        return t.untyped_storage()
    return t.storage()._storage


def sid(t):
    """Which storage T is a view of (equal for tensors sharing one)."""
    return untyped(t)._cdata


def raw_bytes(t):
    """The bytes of T's values in C order, any dtype (bfloat16, complex and
    the float8 types included)."""
    return t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def crc32(t):
    """The crc32 of T's values, as `ckpt inspect --stats` prints it."""
    return '%08x' % (zlib.crc32(raw_bytes(t)) & 0xffffffff)


def storage_bytes(t):
    """The bytes of the whole storage T is a view of."""
    u = torch.empty(0, dtype=torch.uint8).set_(untyped(t))
    return u.numpy().tobytes()


def fmt(path):
    """A path of keys as a/b/0 (the root: '(root)')."""
    return '/'.join(str(p) for p in path) or '(root)'


def is_state_dict(o):
    """A non-empty mapping of strings to tensors."""
    return (isinstance(o, dict) and len(o) > 0
            and all(isinstance(k, str) for k in o)
            and all(isinstance(v, torch.Tensor) for v in o.values()))


# --------------------------------------------------------------------------
# models

def strict_load_error(model, sd):
    """The message of MODEL.load_state_dict(SD, strict=True)'s RuntimeError,
    or None when it loads."""
    try:
        model.load_state_dict(sd, strict=True)
        return None
    except RuntimeError as e:
        return str(e)


def forward(model, x):
    """MODEL's outputs for X in eval mode, always a tuple."""
    model.eval()
    with torch.no_grad():
        y = model(x)
    return y if isinstance(y, tuple) else (y,)


def save_reference(model, x, names, path):
    """A reference file for `ckpt verify --reference`: the input X and
    torch's output NAME as output.NAME; returns PATH."""
    ref = {'input': x}
    for n, y in zip(names, forward(model, x)):
        ref['output.' + n] = y.contiguous()
    return save(ref, path)
