#!/usr/bin/env python3
"""Interop test: the rewriting commands (strip-module, add-module, unwrap,
rename, remap) against what PyTorch loads.

Environment:
  CKPT    path of the ckpt binary (default: $srcdir/ckpt)
  srcdir  repository root (default: two levels above this script)

For every case the ckpt command writes OUT into a fresh temporary directory
and the result is checked with real torch:
  - OUT loads with torch.load(OUT, weights_only=True, map_location='cpu')
    whenever IN does (torch 1.13 refuses Python floats under weights_only,
    so training checkpoints with floats are loaded with weights_only=False);
    after `remap --to cpu` it loads with no map_location at all;
  - the object equals the expected one: torch.load(IN) with the keys of the
    selected state dicts rewritten in Python as doc/design.md says ("The
    rewriting commands"):
    container types, key order, every non-tensor value (floats bit for
    bit), and per tensor its class (Parameter or not), requires_grad,
    dtype, shape, stride, storage offset, location tag, the whole storage's
    size and bytes (bit-identical; NaN-aware torch.equal of the view too);
    storage sharing and tensor identity are the input's, no more, no less;
  - each rewritten state dict's `_metadata` equals the expected rewrite of
    IN's `_metadata`, order included;
  - the rewritten state dict loads with load_state_dict(strict=True) into
    the model it belongs to (MLP, Autoencoder, BNNet, DataParallel(MLP));
  - the zip layout: records `<OUT stem>/data.pkl` (first), `byteorder`
    (`little`), `data/<k>` for the storage keys "0".."N-1" in order of first
    reference, `version` (`3\\n`); every record stored, its data at a
    multiple of 64, its CRC right, storage records numel x element size;
    zip64 end records; data.pkl starts with PROTO 2 and uses only torch
    1.13's weights-only opcodes (BINFLOAT too where the content has
    floats) and globals (plus the known-data classes IN carries);
  - `ckpt inspect --json --stats` of OUT agrees with torch (the comparison
    of inspect_vs_torch.py);
  - stdout reports the rewritten state dicts / storages and the file;
    IN is unchanged.
Each case also runs with --dry-run: stdout must be exactly the expected
`OLD -> NEW` lines and nothing may be written.

Prints `ok NAME` or `FAIL NAME: why` per case, then `N passed, M failed`;
exits 1 if anything failed, 77 (skip) if torch cannot be imported.

  rewrite_vs_torch.py [NAME...]    run only the named cases
  rewrite_vs_torch.py --selftest   check the checks: write every case's
      expected OUT with torch itself (same layout as ckpt's writer), which
      must pass, then broken variants of it, each of which must fail
"""
import argparse
import collections
import hashlib
import io
import os
import pickle
import pickletools
import re
import shutil
import struct
import sys
import tempfile
import zipfile
import zlib

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as c  # noqa: E402  (exit 77 without torch)
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import inspect_vs_torch as ivt  # noqa: E402
import models  # noqa: E402  (tests/fixtures/models.py)

DATA = c.DATA
fmt, sid, is_state_dict = c.fmt, c.sid, c.is_state_dict
OD = collections.OrderedDict

# torch 1.13 _weights_only_unpickler: opcodes and (for interpreted content)
# globals
WO_OPCODES = {
    'APPEND', 'APPENDS', 'BINGET', 'BININT', 'BININT1', 'BININT2',
    'BINPERSID', 'BINPUT', 'BINUNICODE', 'BUILD', 'EMPTY_DICT',
    'EMPTY_LIST', 'EMPTY_SET', 'EMPTY_TUPLE', 'GLOBAL', 'LONG1',
    'LONG_BINGET', 'LONG_BINPUT', 'MARK', 'NEWFALSE', 'NEWOBJ', 'NEWTRUE',
    'NONE', 'PROTO', 'REDUCE', 'SETITEM', 'SETITEMS', 'SHORT_BINSTRING',
    'STOP', 'TUPLE', 'TUPLE1', 'TUPLE2', 'TUPLE3'}
STORAGE_SIZES = {
    'DoubleStorage': 8, 'FloatStorage': 4, 'HalfStorage': 2,
    'BFloat16Storage': 2, 'LongStorage': 8, 'IntStorage': 4,
    'ShortStorage': 2, 'CharStorage': 1, 'ByteStorage': 1, 'BoolStorage': 1,
    'ComplexDoubleStorage': 16, 'ComplexFloatStorage': 8}
WO_GLOBALS = {'collections OrderedDict', 'torch._utils _rebuild_tensor_v2',
              'torch._utils _rebuild_parameter'} | {
                  'torch ' + n for n in STORAGE_SIZES}

# --------------------------------------------------------------------------
# the key rules of doc/design.md ("The rewriting commands"), in Python:
# (key fn, _metadata fn)

def op_strip(prefix='module.'):
    mod = prefix[:-1] if prefix.endswith('.') else prefix

    def key(k):
        while k.startswith(prefix):
            k = k[len(prefix):]
        return k

    def meta(md):
        # per repetition: drop '', `module` -> '', `module.x` -> `x`
        while any(p == mod or p.startswith(prefix) for p in md):
            new = OD()
            for p, v in md.items():
                if p == '':
                    continue
                q = '' if p == mod else (p[len(prefix):]
                                         if p.startswith(prefix) else p)
                new[q] = v
            md = new
        return md
    return key, meta


def op_add(prefix='module.'):
    mod = prefix[:-1] if prefix.endswith('.') else prefix

    def meta(md):
        new = OD([('', {'version': 1})])
        for p, v in md.items():
            new[mod if p == '' else prefix + p] = v
        return new
    return (lambda k: prefix + k), meta


def _paths(fn):
    """_metadata rewrite for rules applied to `path + "."` (trailing dot
    dropped); where two entries meet, the later (inner) one's value wins
    at the first one's place."""
    def meta(md):
        new = OD()
        for p, v in md.items():
            q = fn(p + '.')
            new[q[:-1] if q.endswith('.') else q] = v
        return new
    return meta


def op_unwrap():
    fn = lambda k: c.WRAP_RE.sub('', k)  # noqa: E731
    return fn, _paths(fn)


def op_rename(*rules):
    """rules: (python regex, python replacement, count: 0 all, 1 first)"""
    comp = [(re.compile(r), s, n) for r, s, n in rules]

    def fn(k):
        for r, s, n in comp:
            k = r.sub(s, k, count=n)
        return k
    return fn, _paths(fn)


# --------------------------------------------------------------------------
# cases

class Case:
    def __init__(self, name, src, args, out, op=None, select=None,
                 remap=None, model=None, sd_path=(), cross=None,
                 cross_meta=True, extra_globals=(), post=None, chain=None,
                 mid_wrappers=False):
        self.name = name
        self.src = src              # fixture file name
        self.args = args            # ckpt argv (command first), no IN OUT
        self.out = out              # OUT base name
        self.op = op                # (key fn, meta fn) or None (remap)
        self.select = select        # --select PATH or None
        self.remap = remap          # tag -> tag, for remap
        self.model = model          # callable -> module for strict load
        self.sd_path = sd_path      # where the state dict for `model` is
        self.cross = cross          # fixture whose content OUT must equal
        self.cross_meta = cross_meta    # ... _metadata included
        self.extra_globals = set(extra_globals)
        self.post = post            # extra checks: fn(obj, errs)
        self.chain = chain          # a Case whose OUT is this case's IN
        # keys with wrapper components inside: `ckpt inspect` lists them
        # in "wrappers", inspect_vs_torch.py expects only the chain of
        # prefixes every key starts with; that difference is not checked
        self.mid_wrappers = mid_wrappers


def mlp():
    return models.MLP()


def dp_mlp():
    return nn.DataParallel(models.MLP())


def check_sgd(obj, errs, model=models.MLP):
    m = model()
    m.load_state_dict(obj['model_state_dict'], strict=True)
    opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
    try:
        opt.load_state_dict(obj['optimizer_state_dict'])
    except Exception as e:
        errs.append('SGD.load_state_dict: %s' % e)
        return
    for i, p in enumerate(m.parameters()):
        if not torch.equal(opt.state[p]['momentum_buffer'],
                           obj['optimizer_state_dict']['state'][i][
                               'momentum_buffer']):
            errs.append('momentum_buffer %d differs after load' % i)


def check_adam(obj, errs):
    m = models.LitModel(models.MLP(hidden=16))
    m.load_state_dict(obj['state_dict'], strict=False)
    opt = torch.optim.Adam(m.parameters(), lr=1e-3)
    try:
        opt.load_state_dict(obj['optimizer_states'][0])
    except Exception as e:
        errs.append('Adam.load_state_dict: %s' % e)


def check_all_cpu(obj, errs):
    for p, t in tensors_of(obj):
        if t.device.type != 'cpu':
            errs.append('%s on %s' % (fmt(p), t.device))


def check_bn_versions(obj, errs):
    md = obj._metadata
    for k in ('features.1', 'features.4'):
        if md.get(k) != {'version': 2}:
            errs.append('_metadata[%r] = %r, BatchNorm2d needs version 2'
                        % (k, md.get(k)))


def check_legacy_train(obj, errs):
    check_all_cpu(obj, errs)
    check_sgd(obj, errs, dp_mlp)


_CKPT_WRAP = Case('ae_model_parallel.pth rename (wrap encoder)',
                  'ae_model_parallel.pth',
                  ['rename', '-e',
                   r's/^encoder\./encoder._checkpoint_wrapped_module./'],
                  'ae_ckptwrap.pth',
                  op_rename((r'^encoder\.',
                             'encoder._checkpoint_wrapped_module.', 1)),
                  mid_wrappers=True)

def check_like_dp_bn(obj, errs):
    want = nn.DataParallel(models.BNNet()).state_dict()._metadata
    if list(obj._metadata.items()) != list(want.items()):
        errs.append('_metadata differs from DataParallel(BNNet)\'s: %s'
                    % md_diff(want, obj._metadata))


_BN_ADD = Case('bn.pth add-module', 'bn.pth', ['add-module'],
               'bn_dp.pth', op_add(), model=lambda: nn.DataParallel(
                   models.BNNet()), post=check_like_dp_bn)

CASES = [
    Case('dp_mlp.pth strip-module', 'dp_mlp.pth', ['strip-module'],
         'dp_mlp_stripped.pth', op_strip(), model=mlp, cross='mlp.pth'),
    Case('mlp.pth add-module', 'mlp.pth', ['add-module'], 'mlp_dp.pth',
         op_add(), model=dp_mlp, cross='dp_mlp.pth'),
    Case('ddp2_mlp.pth strip-module', 'ddp2_mlp.pth', ['strip-module'],
         'ddp2_stripped.pth', op_strip(), model=mlp, cross='mlp.pth'),
    Case('ae_model_parallel.pth remap --to cpu', 'ae_model_parallel.pth',
         ['remap', '--to', 'cpu'], 'ae_cpu.pth',
         remap=lambda t: 'cpu', model=models.Autoencoder,
         post=check_all_cpu),
    Case('ae_model_parallel.pth remap --map cuda:1=cuda:0',
         'ae_model_parallel.pth', ['remap', '--map', 'cuda:1=cuda:0'],
         'ae_cuda0.pth', remap=lambda t: 'cuda:0' if t == 'cuda:1' else t,
         model=models.Autoencoder),
    Case('pipeline.pth rename', 'pipeline.pth',
         ['rename', '-e', r's/^partitions\.0\.0\./encoder./',
          '-e', r's/^partitions\.1\.0\./decoder./'], 'ae_from_pipe.pth',
         op_rename((r'^partitions\.0\.0\.', 'encoder.', 1),
                   (r'^partitions\.1\.0\.', 'decoder.', 1)),
         model=models.Autoencoder, cross='ae_model_parallel.pth',
         cross_meta=False),     # `partitions`, `partitions.N` stay
    Case('compiled.pth unwrap', 'compiled.pth', ['unwrap'],
         'compiled_unwrapped.pth', op_unwrap(), model=mlp, cross='mlp.pth'),
    Case('lightning.pth rename --select state_dict', 'lightning.pth',
         ['rename', '--select', 'state_dict', '-e', r's/^model\.//'],
         'lightning_plain.ckpt', op_rename((r'^model\.', '', 1)),
         select='state_dict', model=lambda: models.MLP(hidden=16),
         sd_path=('state_dict',), post=check_adam),
    Case('train_ckpt.pth strip-module', 'train_ckpt.pth', ['strip-module'],
         'checkpoint.pth.tar', op_strip(), model=mlp,
         sd_path=('model_state_dict',), extra_globals={'argparse Namespace'},
         post=check_sgd),
    Case('legacy_mlp.pth strip-module', 'legacy_mlp.pth', ['strip-module'],
         'legacy_stripped.pth', op_strip(), model=mlp, cross='mlp.pth'),
    Case('dtypes.pth rename s/^/x./', 'dtypes.pth',
         ['rename', '-e', 's/^/x./'], 'dtypes_x.pth',
         op_rename(('^', 'x.', 1))),
    Case('keepvars.pth add-module', 'keepvars.pth', ['add-module'],
         'keepvars_dp.pth', op_add(), model=dp_mlp),
    _BN_ADD,
    Case('bn.pth add-module | strip-module', None, ['strip-module'],
         'bn_back.pth', op_strip(), model=models.BNNet, cross='bn.pth',
         chain=_BN_ADD, post=check_bn_versions),
    # beyond the seed cases
    Case('ddp2_mlp.pth unwrap', 'ddp2_mlp.pth', ['unwrap'],
         'ddp2_unwrapped.pth', op_unwrap(), model=mlp, cross='mlp.pth'),
    _CKPT_WRAP,
    Case('... | unwrap (wrapper in the middle of keys)', None, ['unwrap'],
         'ae_unwrapped.pth', op_unwrap(), model=models.Autoencoder,
         cross='ae_model_parallel.pth', chain=_CKPT_WRAP),
    Case('train_ckpt.pth strip-module --select model_state_dict',
         'train_ckpt.pth', ['strip-module', '--select', 'model_state_dict'],
         'train_sel.pth', op_strip(), select='model_state_dict', model=mlp,
         sd_path=('model_state_dict',), extra_globals={'argparse Namespace'},
         post=check_sgd),
    Case('legacy_train.pth remap --to cpu', 'legacy_train.pth',
         ['remap', '--to', 'cpu'], 'legacy_train_cpu.pth',
         remap=lambda t: 'cpu', extra_globals={'argparse Namespace'},
         post=check_legacy_train),
    Case('proto4.pth add-module', 'proto4.pth', ['add-module'],
         'proto4_dp.pth', op_add(), model=dp_mlp, cross='dp_mlp.pth'),
    Case('deflated.pth add-module', 'deflated.pth', ['add-module'],
         'deflated_dp.pth', op_add(), model=dp_mlp, cross='dp_mlp.pth'),
    Case('prefix_renamed.pth strip-module (no key changes)',
         'prefix_renamed.pth', ['strip-module'], 'renamed_again.pth',
         op_strip(), model=mlp, cross='mlp.pth'),
]


# --------------------------------------------------------------------------
# loading with the location tags

def tensors_of(obj, path=()):
    if isinstance(obj, torch.Tensor):
        yield path, obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from tensors_of(v, path + (k,))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from tensors_of(v, path + (i,))
    elif isinstance(obj, argparse.Namespace):
        yield from tensors_of(vars(obj), path)


# --------------------------------------------------------------------------
# the expected object

def expected_rewrite(obj, case):
    """Returns (expected object, [(path, old key, new key)] for the dry run,
    {path label: (renamed, total)})."""
    changes, counts = [], {}
    keyfn, metafn = case.op

    def selected(o, path):
        if case.select is not None:
            return '/'.join(str(p) for p in path) == case.select
        return is_state_dict(o)

    def walk(o, path):
        if isinstance(o, dict):
            if selected(o, path):
                new = type(o)()
                n = 0
                for k, v in o.items():
                    nk = keyfn(k)
                    if nk in new:
                        raise ValueError('expected rewrite collides: %r'
                                         % nk)
                    new[nk] = v
                    if nk != k:
                        n += 1
                        changes.append((path, k, nk))
                counts[fmt(path)] = (n, len(o))
                if hasattr(o, '_metadata'):
                    new._metadata = metafn(o._metadata)
                return new
            new = type(o)((k, walk(v, path + (k,))) for k, v in o.items())
            if hasattr(o, '_metadata'):
                new._metadata = o._metadata
            return new
        if isinstance(o, (list, tuple)):
            return type(o)(walk(v, path + (i,)) for i, v in enumerate(o))
        return o
    return walk(obj, ()), changes, counts


# --------------------------------------------------------------------------
# comparison of loaded objects

class Ctx:
    def __init__(self, exp_tags, got_tags, remap):
        self.exp_tags, self.got_tags = exp_tags, got_tags
        self.remap = remap or (lambda t: t)
        self.exp_t, self.got_t = {}, {}


def float_bits(x):
    return struct.pack('<d', x)


def compare_tensor(p, e, g, ctx, errs):
    ctx.exp_t[p], ctx.got_t[p] = e, g
    if type(e) is not type(g):
        errs.append('%s: %s, want %s' % (fmt(p), type(g).__name__,
                                         type(e).__name__))
    for what, fe, fg in (
            ('dtype', e.dtype, g.dtype),
            ('shape', tuple(e.shape), tuple(g.shape)),
            ('stride', e.stride(), g.stride()),
            ('storage_offset', e.storage_offset(), g.storage_offset()),
            ('requires_grad', e.requires_grad, g.requires_grad),
            ('storage size', e.storage().nbytes(), g.storage().nbytes())):
        if fe != fg:
            errs.append('%s: %s %r, want %r' % (fmt(p), what, fg, fe))
            return
    want = ctx.remap(ctx.exp_tags.get(sid(e), '?'))
    got = ctx.got_tags.get(sid(g), '?')
    if got != want:
        errs.append('%s: location %r, want %r' % (fmt(p), got, want))
    if c.storage_bytes(e) != c.storage_bytes(g):
        errs.append('%s: storage bytes differ' % fmt(p))
    ed, gd = e.detach(), g.detach()
    if not torch.equal(ed, gd):
        if ed.is_floating_point() or ed.is_complex():
            en, gn = torch.isnan(ed), torch.isnan(gd)
            if not (torch.equal(en, gn) and torch.equal(ed[~en], gd[~gn])):
                errs.append('%s: values differ' % fmt(p))
        else:
            errs.append('%s: values differ' % fmt(p))


def compare(e, g, p, ctx, errs):
    if isinstance(e, torch.Tensor):
        if not isinstance(g, torch.Tensor):
            errs.append('%s: %s, want a tensor' % (fmt(p), type(g).__name__))
        else:
            compare_tensor(p, e, g, ctx, errs)
        return
    if type(e) is not type(g):
        errs.append('%s: type %s, want %s' % (fmt(p), type(g).__name__,
                                              type(e).__name__))
        return
    if isinstance(e, dict):
        ek = [(type(k), k) for k in e]
        gk = [(type(k), k) for k in g]
        if ek != gk:
            if set(ek) == set(gk):
                errs.append('%s: key order %r, want %r'
                            % (fmt(p), list(g)[:6], list(e)[:6]))
            else:
                errs.append('%s: keys %r, want %r'
                            % (fmt(p), sorted(set(g) - set(e), key=repr)[:4],
                               sorted(set(e) - set(g), key=repr)[:4]))
            return
        em = getattr(e, '_metadata', None)
        gm = getattr(g, '_metadata', None)
        if (em is None) != (gm is None):
            errs.append('%s: _metadata %s' % (
                fmt(p), 'missing' if gm is None else 'unexpected'))
        elif em is not None:
            if type(em) is not type(gm) or list(em.items()) != list(
                    gm.items()):
                errs.append('%s: _metadata %s' % (fmt(p), md_diff(em, gm)))
        if set(vars(e) if hasattr(e, '__dict__') else ()) != set(
                vars(g) if hasattr(g, '__dict__') else ()):
            errs.append('%s: attributes %r, want %r'
                        % (fmt(p), vars(g), vars(e)))
        for k in e:
            compare(e[k], g[k], p + (k,), ctx, errs)
    elif isinstance(e, (list, tuple)):
        if len(e) != len(g):
            errs.append('%s: length %d, want %d' % (fmt(p), len(g), len(e)))
            return
        for i, (a, b) in enumerate(zip(e, g)):
            compare(a, b, p + (i,), ctx, errs)
    elif isinstance(e, float):
        if float_bits(e) != float_bits(g):
            errs.append('%s: %r, want %r' % (fmt(p), g, e))
    elif isinstance(e, argparse.Namespace):
        compare(dict(sorted(vars(e).items())), dict(sorted(vars(g).items())),
                p, ctx, errs)
    elif e != g:
        errs.append('%s: %r, want %r' % (fmt(p), g, e))


def md_diff(em, gm):
    if type(em) is not type(gm):
        return 'is a %s, want %s' % (type(gm).__name__, type(em).__name__)
    extra = [k for k in gm if k not in em]
    missing = [k for k in em if k not in gm]
    if extra or missing:
        return 'has %r, lacks %r (got %r)' % (extra, missing, list(gm)[:8])
    vals = ['[%r] = %r, want %r' % (k, gm[k], em[k]) for k in em
            if gm[k] != em[k]]
    if vals:
        return '; '.join(vals[:4])
    return 'order %r, want %r' % (list(gm), list(em))


def partition(d, keyfn):
    groups = {}
    for p, t in d.items():
        groups.setdefault(keyfn(t), []).append(p)
    return sorted(sorted(map(repr, g)) for g in groups.values())


def compare_all(exp, got, exp_tags, got_tags, remap, errs):
    ctx = Ctx(exp_tags, got_tags, remap)
    compare(exp, got, (), ctx, errs)
    if set(ctx.exp_t) == set(ctx.got_t):
        pe, pg = partition(ctx.exp_t, sid), partition(ctx.got_t, sid)
        if pe != pg:
            errs.append('storage sharing %s, want %s'
                        % ([g for g in pg if len(g) > 1],
                           [g for g in pe if len(g) > 1]))
        pe, pg = partition(ctx.exp_t, id), partition(ctx.got_t, id)
        if pe != pg:
            errs.append('tensor identity (memo) %s, want %s'
                        % ([g for g in pg if len(g) > 1],
                           [g for g in pe if len(g) > 1]))


def has_float(o):
    if isinstance(o, float):
        return True
    if isinstance(o, dict):
        return any(has_float(v) for v in o.values())
    if isinstance(o, (list, tuple)):
        return any(has_float(v) for v in o)
    if isinstance(o, argparse.Namespace):
        return has_float(vars(o))
    return False


# --------------------------------------------------------------------------
# the zip layout and the pickle

class _Stub:
    def __init__(self, *a, **k):
        pass

    def __setstate__(self, state):
        pass


class _PidUnpickler(pickle._Unpickler):
    """Reads a data.pkl without torch: every global but OrderedDict is a
    stub; records the persistent ids in order."""
    def __init__(self, f):
        super().__init__(f)
        self.pids = []

    def find_class(self, module, name):
        if (module, name) == ('collections', 'OrderedDict'):
            return OD
        return type(name, (_Stub,), {'_global': module + ' ' + name})

    def persistent_load(self, pid):
        self.pids.append(pid)
        return _Stub()


def check_zip(path, allowed_ops, allowed_globals, errs):
    stem = os.path.basename(path).rsplit('.', 1)[0]
    with open(path, 'rb') as f:
        raw = f.read()
    try:
        z = zipfile.ZipFile(io.BytesIO(raw))
    except zipfile.BadZipFile as e:
        errs.append('not a zip: %s' % e)
        return
    infos = z.infolist()
    names = [i.filename for i in infos]
    if len(set(names)) != len(names):
        errs.append('duplicate record names')
    bad = z.testzip()
    if bad is not None:
        errs.append('CRC mismatch in %s' % bad)
    for i in infos:
        off = i.header_offset
        h = raw[off:off + 30]
        if len(h) < 30 or h[:4] != b'PK\x03\x04':
            errs.append('%s: no local header at %d' % (i.filename, off))
            continue
        method, = struct.unpack('<H', h[8:10])
        nlen, elen = struct.unpack('<HH', h[26:30])
        if i.compress_type != 0 or method != 0:
            errs.append('%s: not stored (method %d)' % (i.filename, method))
        if raw[off + 30:off + 30 + nlen] != i.filename.encode():
            errs.append('%s: local header name differs' % i.filename)
        data = off + 30 + nlen + elen
        if data % 64:
            errs.append('%s: data at %d, not a multiple of 64'
                        % (i.filename, data))
    if raw[-22:-18] != b'PK\x05\x06' or raw[-42:-38] != b'PK\x06\x07':
        errs.append('no zip64 end of central directory locator before the '
                    'end record')
    if not names or names[0] != stem + '/data.pkl':
        errs.append('first record %r, want %r' % (names[:1],
                                                   stem + '/data.pkl'))
    if stem + '/data.pkl' not in names:
        return
    if stem + '/byteorder' in names and z.read(stem + '/byteorder') \
            != b'little':
        errs.append('byteorder %r' % z.read(stem + '/byteorder'))
    if stem + '/version' in names and z.read(stem + '/version') != b'3\n':
        errs.append('version %r' % z.read(stem + '/version'))
    pkl = z.read(stem + '/data.pkl')
    try:
        ops = list(pickletools.genops(pkl))
    except Exception as e:
        errs.append('data.pkl: %s' % e)
        return
    if not ops or ops[0][0].name != 'PROTO' or ops[0][1] != 2:
        errs.append('data.pkl does not start with PROTO 2')
    badops = sorted({o.name for o, a, p in ops} - allowed_ops)
    if badops:
        errs.append('data.pkl opcodes outside the weights-only set: %s'
                    % ', '.join(badops))
    badg = sorted({a for o, a, p in ops if o.name == 'GLOBAL'}
                  - allowed_globals)
    if badg:
        errs.append('data.pkl globals not allowed: %s' % ', '.join(badg))
    up = _PidUnpickler(io.BytesIO(pkl))
    try:
        up.load()
    except Exception as e:
        errs.append('data.pkl: %s: %s' % (type(e).__name__, e))
        return
    order, numel = [], {}
    for pid in up.pids:
        if not (isinstance(pid, tuple) and len(pid) == 5
                and pid[0] == 'storage'):
            errs.append('persistent id %r' % (pid,))
            return
        st, key, n = pid[1], pid[2], pid[4]
        if key not in numel:
            order.append(key)
            numel[key] = n * STORAGE_SIZES.get(st.__name__, 0)
    if order != [str(i) for i in range(len(order))]:
        errs.append('storage keys %r, want "0".."N-1" in order of first '
                    'reference' % order[:10])
    # torch 2.x's records, in its order
    want = ([stem + r for r in ('/data.pkl', '/.format_version', '/.storage_alignment',
                                '/byteorder')]
            + [stem + '/data/' + k for k in order]
            + [stem + '/version', stem + '/.data/serialization_id'])
    if names != want:
        errs.append('records: extra %s, missing %s, or out of order'
                    % (sorted(set(names) - set(want)), sorted(set(want) - set(names))))
    for k, nb in numel.items():
        r = stem + '/data/' + k
        if r in names and z.getinfo(r).file_size != nb:
            errs.append('%s: %d bytes, storage needs %d'
                        % (r, z.getinfo(r).file_size, nb))


# --------------------------------------------------------------------------
# running ckpt

def sha(path):
    with open(path, 'rb') as f:
        return hashlib.sha256(f.read()).hexdigest()


def check_stdout(case, out, stdout, counts, n_tensors, n_storages, tags,
                 errs):
    lines = stdout.splitlines()
    got = {}
    wrote = None
    remap_line = None
    for ln in lines:
        m = re.match(r'state dict (.+): (\d+) of (\d+) keys? renamed$', ln)
        if m:
            got[m.group(1)] = (int(m.group(2)), int(m.group(3)))
            continue
        # one line per (old tag -> new tag) pair; their counts add up
        m = re.match(r'storages: (\d+) of (\d+) remapped \((\S+) -> (\S+)\)$', ln)
        if m:
            prev = remap_line[0] if remap_line else 0
            remap_line = (prev + int(m.group(1)), int(m.group(2)))
            continue
        m = re.match(r'wrote (.+): pth-zip, (\d+) tensors?, (\d+) '
                     r'storages?, \S.*$', ln)
        if m:
            wrote = m
            continue
        errs.append('stdout: unexpected line %r' % ln)
    if case.op:
        want = {p: n for p, n in counts.items() if n[0]}
        have = {p: n for p, n in got.items() if n[0]}
        if want != have:
            errs.append('stdout reports %r, want %r' % (have, want))
        for p, n in got.items():
            if not n[0] and counts.get(p) != n:
                errs.append('stdout: state dict %s: %r' % (p, n))
    else:
        n = sum(1 for t in tags.values() if case.remap(t) != t)
        if remap_line != (n, len(tags)):
            errs.append('stdout storages line %r, want %r'
                        % (remap_line, (n, len(tags))))
    if wrote is None:
        errs.append('stdout: no `wrote OUT: pth-zip, ...` line')
    else:
        if os.path.basename(wrote.group(1)) != os.path.basename(out):
            errs.append('stdout: wrote %r' % wrote.group(1))
        if int(wrote.group(2)) not in n_tensors:
            errs.append('stdout: %s tensors, want %s'
                        % (wrote.group(2), ' or '.join(map(str, n_tensors))))
        if int(wrote.group(3)) != n_storages:
            errs.append('stdout: %s storages, want %d'
                        % (wrote.group(3), n_storages))


def dry_run(case, src, changes, tags, tmp):
    errs = []
    d = os.path.join(tmp, 'dry')
    os.mkdir(d)
    out = os.path.join(d, case.out)
    r = c.ckpt(*case.args, '--dry-run', src, out)
    if r.rc != 0:
        return ['exit %d: %s' % (r.rc, r.err.strip()[:300])]
    if os.listdir(d):
        errs.append('--dry-run wrote %s' % os.listdir(d))
    lines = r.out.splitlines()
    if case.op:
        want = []
        for p, a, b in changes:
            pre = ''.join('%s/' % x for x in p)
            want.append('%s%s -> %s%s' % (pre, a, pre, b))
        if lines != want:
            errs.append('stdout %r, want %r' % (lines[:6], want[:6]))
    else:
        cnt = collections.Counter(t for t in tags.values()
                                  if case.remap(t) != t)
        want = sorted('%s -> %s (%d storages)' % (t, case.remap(t), n)
                      for t, n in cnt.items())
        if sorted(lines) != want:
            errs.append('stdout %r, want %r' % (lines, want))
    return errs


# --------------------------------------------------------------------------
# one case

def expected_for(case, src):
    wo, _ = c.loads_weights_only(src, map_location='cpu')
    obj, tags = c.load_tagged(src, weights_only=wo)
    changes, counts = [], {}
    exp = obj
    if case.op:
        exp, changes, counts = expected_rewrite(obj, case)
    return wo, exp, tags, changes, counts


def check_output(case, src, out, wo, exp, tags):
    """Everything about OUT that torch can tell."""
    errs = []
    owo, why = c.loads_weights_only(out, map_location='cpu')
    if wo and not owo:
        errs.append('IN loads with weights_only=True, OUT does not: %s'
                    % why)
    if case.remap and all(case.remap(t) == 'cpu' for t in tags.values()):
        try:
            torch.load(out, weights_only=wo)
        except Exception as e:
            errs.append('no load without map_location: %s: %s'
                        % (type(e).__name__, str(e)[-200:]))
    try:
        got, gtags = c.load_tagged(out, weights_only=wo)
    except Exception as e:
        errs.append('torch.load: %s: %s' % (type(e).__name__, e))
        return errs
    compare_all(exp, got, tags, gtags, case.remap, errs)
    if case.cross:
        cobj, ctags = c.load_tagged(os.path.join(DATA, case.cross), False)
        if not case.cross_meta:
            cobj._metadata = got._metadata
        cerrs = []
        compare_all(cobj, got, ctags, gtags, None, cerrs)
        errs += ['vs %s: %s' % (case.cross, e) for e in cerrs]
    if case.model:
        sd = got
        for k in case.sd_path:
            sd = sd[k]
        try:
            case.model().load_state_dict(sd, strict=True)
        except Exception as e:
            errs.append('load_state_dict(strict=True): %s'
                        % str(e).replace('\n', ' ')[:300])
    if case.post:
        try:
            case.post(got, errs)
        except Exception as e:
            errs.append('%s: %s: %s' % (case.post.__name__,
                                        type(e).__name__, e))
    ops = set(WO_OPCODES)
    if has_float(exp):
        ops.add('BINFLOAT')
    check_zip(out, ops, WO_GLOBALS | case.extra_globals, errs)
    return errs


def counts_of(exp):
    paths = list(tensors_of(exp))
    return ({len(paths), len({id(t) for p, t in paths})},
            len({sid(t) for p, t in paths}))


def inspect_errors(case, out):
    if not os.access(c.CKPT, os.X_OK):
        return []
    errs, _ = ivt.check_good(out)
    if case.mid_wrappers:
        errs = [e for e in errs if not re.match(r'state dict \[.*\]: '
                                                r'wrappers ', e)]
    return ['inspect --json: %s' % e for e in errs]


def run_case(case, tmp, srcs):
    """Returns (errors of the rewrite, errors of the dry run)."""
    src = srcs[case.chain.name] if case.chain else os.path.join(DATA,
                                                                case.src)
    wo, exp, tags, changes, counts = expected_for(case, src)
    before = sha(src)
    errs = []
    d = os.path.join(tmp, 'out')
    os.mkdir(d)
    out = os.path.join(d, case.out)
    r = c.ckpt(*case.args, src, out)
    if r.rc != 0:
        return ['exit %d: %s' % (r.rc, r.err.strip()[:300])], dry_run(
            case, src, changes, tags, tmp)
    srcs[case.name] = out
    if case.op and not changes and not r.err.strip():
        errs.append('no key changed but no note on stderr')
    if os.listdir(d) != [case.out]:
        errs.append('directory holds %s' % os.listdir(d))
    nt, ns = counts_of(exp)
    check_stdout(case, out, r.out, counts, nt, ns, tags, errs)
    errs += check_output(case, src, out, wo, exp, tags)
    errs += inspect_errors(case, out)
    derrs = dry_run(case, src, changes, tags, tmp)
    if sha(src) != before:
        errs.append('IN was modified')
    return errs, derrs


def collision_case(tmp):
    """A rename that makes two keys equal is refused, nothing written."""
    d = os.path.join(tmp, 'coll')
    os.mkdir(d)
    out = os.path.join(d, 'x.pth')
    r = c.ckpt('rename', '-e', r's/\.(weight|bias)$//',
               os.path.join(DATA, 'mlp.pth'), out)
    errs = []
    err = r.err
    if r.rc != 3:
        errs.append('exit %d, want 3' % r.rc)
    if 'n.1.weight' not in err or 'n.1.bias' not in err:
        errs.append('stderr does not name both keys: %r' % err[:300])
    if os.listdir(d):
        errs.append('left %s behind' % os.listdir(d))
    return errs


# --------------------------------------------------------------------------
# --selftest: expected outputs written by torch, and broken ones

_TAGS = {}


def _tagger(storage):
    return _TAGS.get(storage.data_ptr()) if storage.data_ptr() else None


def write_zip(records):
    """Records [(name, bytes)] -> zip bytes in torch's layout (stored, FB
    padding to 64, data descriptors, zip64 end records)."""
    out = bytearray()
    cd = []
    for name, data in records:
        nb = name.encode()
        off = len(out)
        pad = (64 - (off + 30 + len(nb) + 4) % 64) % 64
        extra = b'FB' + struct.pack('<H', pad) + b'Z' * pad
        crc = zlib.crc32(data) & 0xffffffff
        flags = 0x0808 if data else 0x0800
        out += struct.pack('<IHHHHHIIIHH', 0x04034b50, 0, flags, 0, 0, 0, 0,
                           0, 0, len(nb), len(extra)) + nb + extra + data
        if data:
            out += struct.pack('<IIII', 0x08074b50, crc, len(data), len(data))
        cd.append((nb, off, crc, len(data), flags))
    cd_off = len(out)
    for nb, off, crc, size, flags in cd:
        out += struct.pack('<IHHHHHHIIIHHHHHII', 0x02014b50, 0, 0, flags, 0,
                           0, 0, crc, size, size, len(nb), 0, 0, 0, 0, 0,
                           off) + nb
    cd_size = len(out) - cd_off
    z64 = len(out)
    n = len(cd)
    out += struct.pack('<IQHHIIQQQQ', 0x06064b50, 44, 0x031e, 0x2d, 0, 0, n,
                       n, cd_size, cd_off)
    out += struct.pack('<IIQI', 0x07064b50, 0, z64, 1)
    out += struct.pack('<IHHHHIIH', 0x06054b50, 0, 0, n, n, cd_size, cd_off,
                       0)
    return bytes(out)


def torch_records(obj, tags_of, stem, protocol=2):
    """torch.save(obj) with each storage tagged tags_of(tensor); returns the
    records in ckpt's layout."""
    _TAGS.clear()
    keep = []
    for p, t in tensors_of(obj):
        _TAGS[t.storage().data_ptr()] = tags_of(t)
        keep.append(t)
    buf = io.BytesIO()
    torch.save(obj, buf, pickle_protocol=protocol)
    _TAGS.clear()
    z = zipfile.ZipFile(io.BytesIO(buf.getvalue()))
    pre = z.namelist()[0].split('/')[0]
    rec = {n[len(pre) + 1:]: z.read(n) for n in z.namelist()}
    keys = sorted((n[5:] for n in rec if n.startswith('data/')), key=int)
    return ([(stem + '/data.pkl', rec['data.pkl']),
             (stem + '/byteorder', b'little')]
            + [(stem + '/data/' + k, rec['data/' + k]) for k in keys]
            + [(stem + '/version', rec['version'])])


def _first_sd(o):
    if is_state_dict(o):
        return o
    if isinstance(o, dict):
        for v in o.values():
            r = _first_sd(v)
            if r is not None:
                return r
    return None


def _swap2(d):
    """Moves the first key of d to the end."""
    k = next(iter(d))
    d[k] = d.pop(k)


def _set(o, path, v):
    for k in path[:-1]:
        o = o[k]
    o[path[-1]] = v


def mutations(case, exp):
    """(name, object mutator or None, records mutator or None)."""
    def flip(recs):
        i = next(i for i, (n, d) in enumerate(recs) if '/data/' in n and d)
        n, d = recs[i]
        recs[i] = (n, bytes([d[0] ^ 1]) + d[1:])

    def unalign(recs):
        return 'unaligned'

    def deflate(recs):
        return 'deflate'

    def drop_byteorder(recs):
        recs[:] = [r for r in recs if not r[0].endswith('/byteorder')]

    def rename_prefix(recs):
        recs[:] = [('archive/' + n.split('/', 1)[1], d) for n, d in recs]

    def key_order(o):
        _swap2(_first_sd(o))

    def metadata(o):
        sd = _first_sd(o)
        if getattr(sd, '_metadata', None):
            sd._metadata.popitem()

    def unrenamed(o):
        sd = _first_sd(o)
        k = next(iter(sd))
        v = sd.pop(k)
        sd['zz' + k] = v

    def value(o):
        p, t = next(iter(tensors_of(o)))
        with torch.no_grad():
            t.view(-1)[0] += 1

    def tag(o):
        return 'tag'

    def contiguous(o):
        for p, t in tensors_of(o):
            if t.dim() > 1 and t.shape[0] > 1 and t.shape[1] > 1:
                _set(o, p, t.detach().transpose(0, 1).contiguous()
                     .transpose(0, 1) if t.is_contiguous()
                     else t.detach().contiguous())
                return

    def tied(o, how):
        seen = {}
        for p, t in list(tensors_of(o)):
            if sid(t) in seen and t.storage_offset() == 0 and \
                    t.numel() == t.storage().size():
                _set(o, p, t.clone() if how == 'clone' else t[:])
                return
            seen[sid(t)] = p

    def plain_tensors(o):
        for p, t in list(tensors_of(o)):
            if isinstance(t, nn.Parameter):
                _set(o, p, t.detach())

    def other_value(o):
        if isinstance(o, dict) and 'epoch' in o:
            o['epoch'] += 1

    def add_float(o):
        return 'float'

    m = [('storage byte flipped', None, flip),
         ('records not aligned', None, unalign),
         ('records deflated', None, deflate),
         ('no byteorder record', None, drop_byteorder),
         ('archive prefix not the stem', None, rename_prefix),
         ('protocol 4', 'proto4', None),
         ('tensor value changed', value, None),
         ('stride changed', contiguous, None),
         ('location tag wrong', tag, None)]
    if case.op:
        m += [('state dict key order changed', key_order, None),
              ('a key not rewritten as expected', unrenamed, None)]
        if getattr(_first_sd(exp), '_metadata', None):
            m.append(('a _metadata entry lost', metadata, None))
    if case.src == 'dtypes.pth':
        m.append(('tied tensor saved as a copy',
                  lambda o: tied(o, 'clone'), None))
        m.append(('tied tensor saved twice (no memo)',
                  lambda o: tied(o, 'view'), None))
    if case.src == 'keepvars.pth':
        m.append(('Parameters saved as plain tensors', plain_tensors, None))
    if case.src in ('train_ckpt.pth', 'lightning.pth'):
        m.append(('epoch changed', other_value, None))
    if case.src == 'mlp.pth':
        m.append(('a float in a weights-only file', add_float, None))
    return m


def selftest():
    torch.serialization.register_package(0, _tagger, lambda s, loc: None)
    with tempfile.TemporaryDirectory() as keepdir:
        return _selftest(keepdir)


def _selftest(keepdir):
    t = c.Tally()
    srcs = {}
    for case in CASES:
        src = srcs[case.chain.name] if case.chain else os.path.join(
            DATA, case.src)
        wo, exp, tags, changes, counts = expected_for(case, src)
        rm = case.remap or (lambda t: t)
        stem = case.out.rsplit('.', 1)[0]

        def tags_of(t, tags=tags, rm=rm):
            return rm(tags.get(sid(t), '?'))

        def build(omut=None, rmut=None):
            import copy
            obj = exp
            how = None
            tf = tags_of
            if omut == 'proto4':
                recs = torch_records(exp, tf, stem, protocol=4)
            else:
                if callable(omut):
                    obj = copy.deepcopy(exp)
                    # deepcopy loses the tags (new storages): map them
                    old = dict(tensors_of(exp))
                    new = dict(tensors_of(obj))
                    tm = {sid(new[p]): tags_of(old[p]) for p in new}
                    how = omut(obj)
                    tf = lambda t: tm.get(sid(t), 'cpu')  # noqa: E731
                    if how == 'tag':
                        tf = lambda t: 'cuda:7'  # noqa: E731
                    elif how == 'float':
                        obj['zz'] = 0.5
                        how = None
                recs = torch_records(obj, tf, stem)
            if rmut:
                how = rmut(recs)
            if how == 'unaligned' or how == 'deflate':
                b = io.BytesIO()
                ct = zipfile.ZIP_DEFLATED if how == 'deflate' \
                    else zipfile.ZIP_STORED
                with zipfile.ZipFile(b, 'w', ct) as zo:
                    for n, d in recs:
                        zo.writestr(n, d)
                return b.getvalue()
            return write_zip(recs)

        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, case.out)
            with open(out, 'wb') as f:
                f.write(build())
            errs = check_output(case, src, out, wo, exp, tags)
            errs += inspect_errors(case, out)
            t.report('selftest %s' % case.name, errs)
            keep = os.path.join(keepdir, case.out)
            shutil.copy(out, keep)
            srcs[case.name] = keep
            for mname, om, rmu in mutations(case, exp):
                with open(out, 'wb') as f:
                    f.write(build(om, rmu))
                try:
                    errs = check_output(case, src, out, wo, exp, tags)
                except Exception as e:
                    errs = [c.describe(e)]
                if errs:
                    t.ok('selftest %s: %s caught (%s)'
                         % (case.name, mname, errs[0][:100]))
                else:
                    t.fail('selftest %s' % case.name, '%s NOT caught' % mname)
    return t.summary()


# --------------------------------------------------------------------------

def main():
    argv = sys.argv[1:]
    if argv == ['--selftest']:
        return selftest()
    only = set(argv)
    t = c.Tally()
    t.need(c.CKPT, 'CKPT')
    srcs = {}
    with tempfile.TemporaryDirectory() as top:
        for i, case in enumerate(CASES):
            if only and case.name not in only and case.src not in only:
                continue
            if case.chain and case.chain.name not in srcs:
                t.report(case.name, ['needs the output of %r'
                                     % case.chain.name])
                continue
            tmp = os.path.join(top, str(i))
            os.mkdir(tmp)
            try:
                errs, derrs = run_case(case, tmp, srcs)
            except Exception as e:
                errs = [c.describe(e)]
                derrs = ['not run']
            t.report(case.name, errs)
            t.report('%s --dry-run' % case.name, derrs)
        if not only or 'collision' in only:
            t.run('rename collision refused', collision_case, tmp=True)
    return t.summary()


if __name__ == '__main__':
    sys.exit(main())
