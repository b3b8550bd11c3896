#!/usr/bin/env python3
"""Interop test: `ckpt inspect --json --stats` against what PyTorch sees.

Environment:
  CKPT    path of the ckpt binary (default: $srcdir/ckpt)
  srcdir  repository root (default: two levels above this script)

For every good fixture in $srcdir/tests/data/*.pth the file is inspected
with ckpt and loaded with torch (map_location = a callable that records the
location tag of every storage), and the two views are compared: tensor
paths, dtype, shape, stride, offset, device, nbytes (numel x element size),
parameter, requires_grad, crc32 of the values, min/max/mean/std/nan/inf
(mean/std with a tolerance scaled to the data), storage sharing, the storage
table, state dicts and their wrappers, opaque objects, records, format and
the summary.  Then every hostile file in $srcdir/tests/bad/*.pth must be
refused by `ckpt inspect` (crc_flip.pth, crc_one_zeroed.pth: `ckpt inspect --stats`) with exit
status 3, exactly one stderr line `ckpt: inspect: FILE: ...` and nothing on
stdout, and /tmp/ckpt_pwned must not appear.

Prints `ok NAME (...)` or `FAIL NAME: why` per file, then `N passed, M
failed`; exits 1 if anything failed, 77 (skip) if torch cannot be imported.

  inspect_vs_torch.py --dump FILE...   print torch's view of FILEs as JSON
  inspect_vs_torch.py [NAME...]        run only the named fixtures/bad files
"""
import json
import math
import os
import subprocess
import sys
import zipfile
from fractions import Fraction

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as c  # noqa: E402  (exit 77 without torch)
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

PWNED = '/tmp/ckpt_pwned'
FLOATS = ('float64', 'float32', 'float16', 'bfloat16')
dtype_name = c.dtype_name

# files whose `wrappers` the brief pins down exactly
WRAPPERS_EXPECTED = {
    'mlp.pth': [],
    'dp_mlp.pth': ['module.'],
    'ddp2_mlp.pth': ['module.', 'module.'],
}


# --------------------------------------------------------------------------
# torch's view

def torch_stats(t):
    """Expected min/max/mean/std/nan/inf over the finite values (None where
    undefined), or None for dtypes without stats (complex)."""
    t = t.detach()
    dn = dtype_name(t.dtype)
    if t.dtype.is_complex:
        return None
    if dn in FLOATS:
        vals = t.double().flatten().tolist()
        nan = sum(1 for v in vals if v != v)
        inf = sum(1 for v in vals if v in (math.inf, -math.inf))
        fin = [v for v in vals if math.isfinite(v)]
        n = len(fin)
        s = {'nan': nan, 'inf': inf, 'n': n,
             'maxabs': max((abs(v) for v in fin), default=0.0)}
        if n:
            s['min'], s['max'] = min(fin), max(fin)
            s['mean'], std = exact_mean_std(fin) if n <= 20000 \
                else fsum_mean_std(fin)
            if std is not None:
                s['std'] = std
        return s
    vals = [int(v) for v in t.flatten().tolist()]
    n = len(vals)
    s = {'nan': 0, 'inf': 0, 'n': n,
         'maxabs': float(max((abs(v) for v in vals), default=0))}
    if n:
        s['min'], s['max'] = min(vals), max(vals)
        s1 = sum(vals)
        s['mean'] = float(Fraction(s1, n))
        if n > 1:
            s2 = sum(v * v for v in vals)
            s['std'] = math.sqrt(float(Fraction(n * s2 - s1 * s1,
                                                n * (n - 1))))
    return s


def exact_mean_std(vals):
    """Mean and unbiased std of floats, exactly (Fractions), rounded once;
    std scaled so that values near the float maximum do not overflow."""
    n = len(vals)
    fr = [Fraction(v) for v in vals]
    mean = sum(fr) / n
    if n < 2:
        return float(mean), None
    var = sum((x - mean) ** 2 for x in fr) / (n - 1)
    scale = max(abs(v) for v in vals)
    if scale == 0:
        return float(mean), 0.0
    return float(mean), scale * math.sqrt(float(var / Fraction(scale) ** 2))


def fsum_mean_std(vals):
    n = len(vals)
    m = math.fsum(vals) / n
    if n < 2:
        return m, None
    return m, math.sqrt(math.fsum((v - m) * (v - m) for v in vals) / (n - 1))


def jkey(k):
    if isinstance(k, bool) or not isinstance(k, (str, int)):
        return repr(k)
    return k


def torch_view(path):
    """Load `path` with torch and describe it like ckpt inspect would."""
    obj, tags = c.load_tagged(path, weights_only=False)
    tensors = {}     # path tuple -> dict
    groups = {}      # storage cdata -> [path tuples]
    storages = {}    # storage cdata -> (dtype, numel, device, nbytes)
    objects = []
    state_dicts = []

    def walk(o, p):
        if isinstance(o, torch.Tensor):
            st = o.storage()
            cd = c.sid(o)
            dev = tags.get(cd, '?')
            tensors[p] = {
                'dtype': dtype_name(o.dtype), 'shape': list(o.shape),
                'stride': list(o.stride()), 'offset': o.storage_offset(),
                'device': dev, 'parameter': isinstance(o, nn.Parameter),
                'requires_grad': bool(o.requires_grad),
                'nbytes': o.numel() * o.element_size(),
                'crc32': c.crc32(o),
                'stats': torch_stats(o),
            }
            groups.setdefault(cd, []).append(p)
            storages[cd] = (dtype_name(st.dtype), st.size(), dev,
                            st.nbytes())
        elif isinstance(o, dict):
            if c.is_state_dict(o):
                state_dicts.append((p, len(o), wrappers_of(list(o))))
            for k, v in o.items():
                walk(v, p + (jkey(k),))
        elif isinstance(o, (list, tuple)):
            for i, v in enumerate(o):
                walk(v, p + (i,))
        elif o is None or isinstance(o, (str, bytes, int, float, bool)):
            pass
        else:
            tp = type(o)
            objects.append((p, tp.__module__ + '.' + tp.__qualname__))

    walk(obj, ())
    is_zip = c.is_zip(path)
    records = None
    if is_zip:
        with zipfile.ZipFile(path) as z:
            records = z.namelist()
    by_device, by_dtype = {}, {}
    for dt, numel, dev, nb in storages.values():
        by_device[dev] = by_device.get(dev, 0) + nb
        by_dtype[dt] = by_dtype.get(dt, 0) + nb
    return {
        'format': 'pth-zip' if is_zip else 'pth-legacy',
        'records': records,
        'tensors': tensors,
        'sharing': sorted(sorted(g) for g in groups.values() if len(g) > 1),
        'groups': [sorted(g, key=repr) for g in groups.values()],
        'storages': sorted(storages.values()),
        'objects': sorted(objects, key=repr),
        'state_dicts': sorted(state_dicts, key=repr),
        'summary': {'tensors': len(tensors),
                    'bytes': sum(s[3] for s in storages.values()),
                    'by_device': by_device, 'by_dtype': by_dtype},
    }


def wrappers_of(keys):
    """Known wrapper components every key starts with, outermost first."""
    out = []
    rest = list(keys)
    while True:
        for w in c.WRAPPERS:
            if all(k.startswith(w) and len(k) > len(w) for k in rest):
                out.append(w)
                rest = [k[len(w):] for k in rest]
                break
        else:
            return out


def dump(paths):
    out = []
    for p in paths:
        v = torch_view(p)
        v['tensors'] = [dict(path=list(k), **val)
                        for k, val in v['tensors'].items()]
        v['file'] = p
        v['sharing'] = [[list(x) for x in g] for g in v['sharing']]
        del v['groups']
        v['objects'] = [{'path': list(p_), 'global': g}
                        for p_, g in v['objects']]
        v['state_dicts'] = [{'path': list(p_), 'tensors': n, 'wrappers': w}
                            for p_, n, w in v['state_dicts']]
        v['storages'] = [dict(zip(('dtype', 'numel', 'device', 'nbytes'), s))
                         for s in v['storages']]
        out.append(v)
    json.dump(out if len(out) != 1 else out[0], sys.stdout, indent=1,
              allow_nan=True)
    print()


# --------------------------------------------------------------------------
# comparison

class Mismatch(Exception):
    pass


def close(exp, got, tol):
    if isinstance(got, bool) or not isinstance(got, (int, float)):
        return False
    if not math.isfinite(exp):
        return True     # torch's own value is not finite; nothing to check
    return abs(float(got) - exp) <= tol


def p2s(p):
    return json.dumps(list(p))


def compare_stats(p, exp, got, errs):
    if exp is None:
        return
    dn = got.get('dtype')
    isfloat = dn in FLOATS
    for k in ('nan', 'inf'):
        if k in got:
            if got[k] != exp[k]:
                errs.append('%s: %s %r, torch %r' % (p2s(p), k, got[k],
                                                     exp[k]))
        elif isfloat:
            errs.append('%s: no "%s" field' % (p2s(p), k))
    n, maxabs = exp['n'], exp['maxabs']
    for k in ('min', 'max', 'mean', 'std'):
        e = exp.get(k)
        g = got.get(k)
        if e is None:
            if g is not None and not (isinstance(g, float) and g != g):
                errs.append('%s: %s %r, torch has no finite values '
                            '(or n < 2)' % (p2s(p), k, g))
            continue
        if k not in got:
            if isfloat or dn not in ('bool',):
                errs.append('%s: no "%s" field' % (p2s(p), k))
            continue
        if isinstance(g, bool):
            g = int(g)
        e = float(e)
        if k in ('min', 'max'):
            tol = 1e-6 * abs(e)
        else:
            tol = 1e-6 * abs(e) + 4e-16 * (n + 1) * maxabs
        if not close(e, g, tol):
            errs.append('%s: %s %r, torch %r' % (p2s(p), k, g, e))


def compare(name, path, exp, doc):
    errs = []
    if doc.get('format') != exp['format']:
        errs.append('format %r, expected %r' % (doc.get('format'),
                                                exp['format']))
    if exp['records'] is not None:
        got = doc.get('records')
        if not isinstance(got, list) or sorted(got) != sorted(exp['records']):
            errs.append('records %r, zip has %r' % (got, exp['records']))

    # tensors
    got_t = {}
    for t in doc.get('tensors', []):
        k = tuple(t.get('path', []))
        if k in got_t:
            errs.append('duplicate tensor path %s' % p2s(k))
        got_t[k] = t
    missing = [k for k in exp['tensors'] if k not in got_t]
    extra = [k for k in got_t if k not in exp['tensors']]
    if missing:
        errs.append('tensors missing from ckpt: %s'
                    % ', '.join(p2s(k) for k in missing[:8]))
    if extra:
        errs.append('tensors ckpt has, torch not: %s'
                    % ', '.join(p2s(k) for k in extra[:8]))
    for k, e in exp['tensors'].items():
        g = got_t.get(k)
        if g is None:
            continue
        for f in ('dtype', 'shape', 'stride', 'offset', 'device',
                  'nbytes', 'parameter', 'requires_grad', 'crc32'):
            if g.get(f) != e[f]:
                errs.append('%s: %s %r, torch %r' % (p2s(k), f, g.get(f),
                                                     e[f]))
        compare_stats(k, e['stats'], g, errs)

    # storage sharing: same torch storage <=> same ckpt "storage"
    ck_groups = {}
    for k, t in got_t.items():
        ck_groups.setdefault(t.get('storage'), []).append(k)
    part_exp = sorted(sorted(map(repr, g)) for g in exp['groups']
                      if all(k in got_t for k in g))
    part_got = sorted(sorted(map(repr, g)) for g in ck_groups.values()
                      if all(k in exp['tensors'] for k in g))
    if part_exp != part_got:
        errs.append('storage sharing differs: torch %s, ckpt %s'
                    % ([g for g in part_exp if len(g) > 1],
                       [g for g in part_got if len(g) > 1]))

    # storage table
    st = doc.get('storages', [])
    got_s = sorted((s.get('dtype'), s.get('numel'), s.get('device'),
                    s.get('nbytes')) for s in st)
    if got_s != [tuple(s) for s in exp['storages']]:
        errs.append('storages (dtype, numel, device, nbytes) %s, torch %s'
                    % (got_s, [tuple(s) for s in exp['storages']]))
    keys = {s.get('key'): s for s in st}
    for k, t in got_t.items():
        s = keys.get(t.get('storage'))
        if s is None:
            errs.append('%s: storage %r not in "storages"'
                        % (p2s(k), t.get('storage')))
        elif s.get('device') != t.get('device'):
            errs.append('%s: device %r but its storage %r says %r'
                        % (p2s(k), t.get('device'), t.get('storage'),
                           s.get('device')))

    # state dicts
    got_sd = {tuple(s.get('path', [])): s for s in doc.get('state_dicts', [])}
    exp_sd = {p: (n, w) for p, n, w in exp['state_dicts']}
    if sorted(got_sd, key=repr) != sorted(exp_sd, key=repr):
        errs.append('state_dicts at %s, expected %s'
                    % (sorted(map(list, got_sd)), sorted(map(list, exp_sd))))
    for p, (n, w) in exp_sd.items():
        g = got_sd.get(p)
        if g is None:
            continue
        if g.get('tensors') != n:
            errs.append('state dict %s: tensors %r, expected %r'
                        % (p2s(p), g.get('tensors'), n))
        gw = g.get('wrappers')
        want = WRAPPERS_EXPECTED.get(name, w) if p == () else w
        if gw != want:
            errs.append('state dict %s: wrappers %r, expected %r'
                        % (p2s(p), gw, want))

    # opaque objects
    got_o = sorted(((tuple(o.get('path', [])), o.get('global'))
                    for o in doc.get('objects', [])), key=repr)
    if got_o != exp['objects']:
        errs.append('objects %r, expected %r' % (got_o, exp['objects']))

    # summary
    sm = doc.get('summary', {})
    es = exp['summary']
    for f in ('tensors', 'bytes', 'by_device', 'by_dtype'):
        if sm.get(f) != es[f]:
            errs.append('summary.%s %r, torch %r' % (f, sm.get(f), es[f]))
    return errs


def check_good(path):
    name = os.path.basename(path)
    exp = torch_view(path)
    try:
        r = c.ckpt('inspect', '--json', '--stats', '--allow-global',
                   'argparse.Namespace', path)
    except subprocess.TimeoutExpired as e:
        return [c.describe(e)], exp
    if r.rc != 0:
        return ['ckpt inspect exited %d: %s' % (r.rc, r.err.strip())], exp
    try:
        doc = json.loads(r.stdout)
    except ValueError as e:
        return ['ckpt output is not JSON: %s' % e], exp
    return compare(name, path, exp, doc), exp


def check_bad(path):
    """`ckpt inspect PATH` exits 3 with one line `ckpt: inspect: PATH: ...`
    on stderr, nothing on stdout, and /tmp/ckpt_pwned does not appear."""
    name = os.path.basename(path)
    runs = [['inspect', path]]
    optional = set()
    # defects in the record data: found when the data is read
    if name in ('crc_flip.pth', 'crc_one_zeroed.pth', 'zip_deflate_overrun.pth'):
        runs = [['inspect', '--stats', path], ['inspect', path]]
        optional.add(1)     # plain inspect reads no data and may succeed
    errs = []
    for i, args in enumerate(runs):
        try:
            r = c.ckpt(*args)
        except subprocess.TimeoutExpired as e:
            errs.append(c.describe(e))
            continue
        if i in optional and r.rc == 0:
            continue
        errs += c.refusal_errors(r, 3, 'ckpt: inspect: %s: ' % path)
        if os.path.exists(PWNED):
            errs.append('%s was created!' % PWNED)
    return errs


def main():
    argv = sys.argv[1:]
    if argv and argv[0] == '--dump':
        dump(argv[1:])
        return 0
    only = set(argv)
    t = c.Tally()
    t.need(c.CKPT, 'CKPT')
    good = sorted(f for f in os.listdir(c.DATA) if f.endswith('.pth'))
    if not good:
        t.fail('fixtures', 'none in %s' % c.DATA)
    for f in good:
        if only and f not in only:
            continue
        try:
            errs, exp = check_good(os.path.join(c.DATA, f))
        except Exception as e:   # torch failed: a broken fixture
            errs, exp = ['torch side: %s' % c.describe(e)], None
        if errs:
            t.report(f, errs)
        else:
            t.ok('%s (%d tensors)' % (f, len(exp['tensors'])))
    if os.path.exists(PWNED):
        os.unlink(PWNED)
    bad = sorted(f for f in os.listdir(c.BAD) if f.endswith('.pth'))
    if not bad:
        t.fail('hostile files', 'none in %s' % c.BAD)
    for f in bad:
        if only and f not in only:
            continue
        errs = check_bad(os.path.join(c.BAD, f))
        if errs:
            t.report('bad/%s' % f, errs)
        else:
            t.ok('bad/%s (refused)' % f)
    return t.summary()


if __name__ == '__main__':
    sys.exit(main())
