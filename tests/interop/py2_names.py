#!/usr/bin/env python3
"""Interop test: Python 2 names in protocol-2 pickles (issue 14).

torch.save pickles at protocol 2, and Python 3's pickler then writes
builtins through _compat_pickle's reverse tables: `range` as
`__builtin__.xrange`, `int` as `__builtin__.long`, `str` as
`__builtin__.unicode`, `getattr` as `__builtin__.getattr`.  For files saved
by the torch running this test (zip and legacy):

  - ckpt inspect reads them, naming the objects by their Python 3 names;
  - ckpt scan reports those names (never `__builtin__.xrange`), classes
    range/int/str as known data (exit 0), getattr as DANGEROUS (exit 1);
  - strip-module and convert keep the objects: torch.load(OUT,
    weights_only=False) equals torch.load(IN, weights_only=False) with the
    keys rewritten, and the output names them as Python's own protocol-2
    pickler does;
  - what torch's weights-only load does with IN and OUT is printed, and
    ckpt's verdict (inspect --json "torch_load") must agree with it;
  - a file naming `__builtin__.getattr` is refused (exit 3, one line) even
    with --allow-unknown.
"""
import json
import os
import pickletools
import sys
import zipfile

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as c  # noqa: E402  (exit 77 without torch)
import torch  # noqa: E402

KEY = '1.13' if torch.__version__.startswith('1.') else '2.6+'

t = c.Tally()
t.need(c.CKPT, 'CKPT')


def cfg():
    return {'layers': range(4), 'odd': range(1, 9, 2), 'dtype': int,
            'name_type': str, 'types': [float, bool, bytes, complex],
            'c': complex(1, 2), 'sl': slice(1, 5, 2), 'fs': frozenset([3]),
            'e': Ellipsis}


def obj():
    return {'model': {'module.w': torch.ones(2), 'module.b': torch.zeros(3)},
            'cfg': cfg(), 'epoch': 3}


def expect_stripped():
    o = obj()
    o['model'] = {k[len('module.'):]: v for k, v in o['model'].items()}
    return o


def same(a, b, where='root'):
    """A list of differences between A and B (tensors by value)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
                and a.dtype == b.dtype and a.shape == b.shape
                and torch.equal(a, b)):
            return ['%s: tensors differ' % where]
        return []
    if isinstance(a, dict):
        if not isinstance(b, dict) or list(a) != list(b):
            return ['%s: keys %r vs %r' % (where, list(a), list(b) if isinstance(b, dict) else b)]
        errs = []
        for k in a:
            errs += same(a[k], b[k], '%s/%s' % (where, k))
        return errs
    if isinstance(a, (list, tuple)):
        if type(a) is not type(b) or len(a) != len(b):
            return ['%s: %r vs %r' % (where, a, b)]
        errs = []
        for i, (x, y) in enumerate(zip(a, b)):
            errs += same(x, y, '%s/%d' % (where, i))
        return errs
    if type(a) is not type(b) or a != b:
        return ['%s: %r vs %r' % (where, a, b)]
    return []


def raw_globals(path):
    """The GLOBAL names of PATH's data.pkl, as written."""
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as z:
            data = z.read([n for n in z.namelist() if n.endswith('data.pkl')][0])
        ops = pickletools.genops(data)
        return {arg.replace(' ', '.') for op, arg, _ in ops if op.name == 'GLOBAL'}
    return set()


def torch_weights_only(path):
    """(accepted, torch's reason) of torch.load(PATH, weights_only=True)."""
    try:
        torch.load(path, weights_only=True)
        return True, None
    except Exception as e:
        m = [ln for ln in str(e).splitlines() if 'Unsupported' in ln]
        return False, '%s: %s' % (type(e).__name__, (m[0] if m else str(e))[-200:])


for fmt in ('zip', 'legacy'):
    src = c.save(obj(), c.scratch('py2_%s.pth' % fmt), fmt)

    @t.case('%s: ckpt inspect reads it, Python 3 names' % fmt)
    def _():
        r = c.ckpt_expect(0, 'inspect', '--json', src)
        j = json.loads(r.out)
        objs = {'/'.join(map(str, o['path'])): o['global'] for o in j['objects']}
        for p, g in (('cfg/layers', 'builtins.range'), ('cfg/odd', 'builtins.range'),
                     ('cfg/dtype', 'builtins.int'), ('cfg/name_type', 'builtins.str'),
                     ('cfg/c', 'builtins.complex'), ('cfg/e', 'builtins.Ellipsis')):
            assert objs.get(p) == g, 'object %s: %r (want %s); %r' % (p, objs.get(p), g, objs)
        assert not any('__builtin__' in g for g in objs.values()), objs

    @t.case('%s: ckpt scan names them as Python 3 does, known data' % fmt)
    def _():
        r = c.ckpt('scan', '--json', src)
        assert r.rc == 0, 'scan exited %d: %s' % (r.rc, r.out[-600:])
        j = json.loads(r.out)
        hits = {h['global']: h['class'] for h in j['files'][0]['globals']}
        for g in ('builtins.range', 'builtins.int', 'builtins.str'):
            assert hits.get(g) == 'known data', '%s: %r in %r' % (g, hits.get(g), hits)
        assert not any(g.startswith('__builtin__.') for g in hits), hits

    @t.case('%s: ckpt verdict agrees with torch %s weights-only load' % (fmt, torch.__version__))
    def _():
        ok, why = torch_weights_only(src)
        print('  torch %s weights-only load of the %s file: %s' % (
            torch.__version__, fmt, 'accepted' if ok else 'refused: ' + why))
        j = json.loads(c.ckpt_expect(0, 'inspect', '--json', src).out)
        v = j['torch_load'][KEY]
        assert v['accepted'] == ok, 'ckpt says accepted=%r, torch %r (%s)' % (
            v['accepted'], ok, why)

    for cmd in ('strip-module', 'convert'):
        @t.case('%s: %s keeps the objects (torch.load weights_only=False)' % (fmt, cmd))
        def _():
            out = c.scratch('py2_%s_%s.pth' % (fmt, cmd))
            c.ckpt_expect(0, cmd, src, out)
            got = torch.load(out, weights_only=False)
            want = expect_stripped() if cmd == 'strip-module' else obj()
            errs = same(want, got)
            assert not errs, '; '.join(errs[:5])
            # spelled as Python's own protocol-2 pickler spells them
            names = raw_globals(out)
            for g in ('__builtin__.xrange', '__builtin__.long', '__builtin__.unicode'):
                assert g in names, '%s not written: %r' % (g, sorted(names))
            ok, why = torch_weights_only(out)
            print('  torch %s weights-only load of %s output: %s' % (
                torch.__version__, cmd, 'accepted' if ok else 'refused: ' + why))
            v = json.loads(c.ckpt_expect(0, 'inspect', '--json', out).out)['torch_load'][KEY]
            assert v['accepted'] == ok, 'ckpt says accepted=%r, torch %r (%s)' % (
                v['accepted'], ok, why)

    bad = c.save({'w': torch.ones(1), 'f': getattr}, c.scratch('getattr_%s.pth' % fmt), fmt)

    @t.case('%s: __builtin__.getattr is builtins.getattr, never admitted' % fmt)
    def _():
        line = c.refused(3, 'inspect', '--allow-unknown', bad)
        assert "'builtins.getattr'" in line and 'never admitted' in line, line
        r = c.ckpt('scan', bad)
        assert r.rc == 1, 'scan exited %d' % r.rc
        assert 'DANGEROUS   builtins.getattr' in r.out, r.out

sys.exit(t.summary())
