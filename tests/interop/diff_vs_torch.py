#!/usr/bin/env python3
"""Interop test: `ckpt diff` against what PyTorch says about the same pair.

Environment:
  CKPT    path of the ckpt binary (default: $srcdir/ckpt)
  srcdir  repository root (default: two levels above this script)

Every case builds two checkpoints A and B with torch in a fresh temporary
directory (the same model perturbed by known amounts, a key removed or
added, a shape changed, a float16 / bfloat16 copy, the legacy format, a
safetensors file, special values, integers past 2^53, a training
checkpoint with several state dicts, ...), runs `ckpt diff --json` and
`ckpt diff` (text) on them, and checks:
  - the exit status (0 equal within the tolerance, 1 different);
  - where A is the state dict of a model M: the Missing / Unexpected /
    size mismatch lines of the text equal, in order and byte for byte, the
    lines of the RuntimeError that `M.load_state_dict(B, strict=True)`
    raises (none when it succeeds);
  - the JSON's missing, unexpected, size_mismatch and dtype_mismatch lists;
  - per common tensor, against the same computation done by torch in
    float64 (int64 for integer pairs): elements compared, elements
    outside atol + rtol * |b| (torch.isclose's rule; NaN equals NaN, an
    infinity only itself), the first of them as an index per dimension and
    its two values, max |a - b| and max |a - b| / |b|;
  - the summary counts, and the summary line of the text.

Prints `ok NAME` or `FAIL NAME: why` per case, then `N passed, M failed`;
exits 1 if anything failed, 77 (skip) if torch cannot be imported.

  diff_vs_torch.py [NAME...]    run only the named cases
"""
import json
import math
import os
import re
import sys

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as c  # noqa: E402  (exit 77 without torch)
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import models  # noqa: E402  (tests/fixtures/models.py)

try:
    import safetensors.torch  # noqa: E402,F401
    HAVE_SAFETENSORS = True
except Exception:  # pragma: no cover - optional
    HAVE_SAFETENSORS = False

OD = c.OD
KEY_LINE = re.compile(r'^(Missing key\(s\) in state_dict: |Unexpected key\(s\)'
                      r' in state_dict: |size mismatch for )')
INT_DTYPES = {torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8,
              torch.bool}


# --------------------------------------------------------------------------
# what torch says

def torch_lines(model, sd):
    """The messages of load_state_dict(strict=True): [] when it loads."""
    msg = c.strict_load_error(model, sd)
    if msg is None:
        return []
    head, _, rest = msg.partition('\n\t')
    assert head.startswith('Error(s) in loading state_dict for '), msg
    return rest.split('\n\t')


def reference(ta, tb, atol, rtol):
    """The comparison of ckpt_tensor_compare, done by torch."""
    n = ta.numel()
    if ta.dtype in INT_DTYPES and tb.dtype in INT_DTYPES:
        a = ta.detach().reshape(-1).to(torch.int64)
        b = tb.detach().reshape(-1).to(torch.int64)
        d = (a - b).abs()
        ab = b.abs()
        df, abf = d.to(torch.float64), ab.to(torch.float64)
        same = d == 0
        rel = torch.where(same, torch.zeros_like(df),
                          torch.where(ab == 0, torch.full_like(df, math.inf),
                                      df / abf))
        if atol == 0 and rtol == 0:
            mism = ~same
        else:
            mism = ~(df <= atol + rtol * abf)
        av, bv = a, b
        abs_d = df
        any_nan = False
    else:
        a = ta.detach().reshape(-1).to(torch.float64)
        b = tb.detach().reshape(-1).to(torch.float64)
        both_nan = a.isnan() & b.isnan()
        one_nan = a.isnan() ^ b.isnan()
        same = (a == b) | both_nan
        abs_d = torch.where(same, torch.zeros_like(a), (a - b).abs())
        rel = torch.where(same, torch.zeros_like(a),
                          torch.where((b == 0) | b.isinf(),
                                      torch.full_like(a, math.inf),
                                      abs_d / b.abs()))
        finite = a.isfinite() & b.isfinite()
        close = same | (finite & (abs_d <= atol + rtol * b.abs()))
        mism = ~close
        av, bv = a, b
        any_nan = bool(one_nan.any())
    r = {'count': n, 'mismatched': int(mism.sum())}
    if n == 0:
        r['max_abs'] = r['max_rel'] = 0.0
    elif any_nan:
        r['max_abs'] = r['max_rel'] = math.nan
    else:
        r['max_abs'] = float(abs_d.max())
        r['max_rel'] = float(rel.max())
    idx = mism.nonzero()
    if len(idx):
        flat = int(idx[0])
        r['first_index'] = [int(i) for i in unravel(flat, list(ta.shape))]
        r['first_a'] = pyval(av[flat], ta.dtype)
        r['first_b'] = pyval(bv[flat], tb.dtype)
    else:
        r['first_index'] = r['first_a'] = r['first_b'] = None
    return r


def unravel(flat, shape):
    out = []
    for dim in reversed(shape):
        out.append(flat % dim if dim else 0)
        flat = flat // dim if dim else 0
    return list(reversed(out))


def pyval(x, dtype):
    if dtype == torch.bool:
        return bool(x)
    if dtype in INT_DTYPES:
        return int(x)
    return float(x)


def jnum(v):
    """A number of ckpt's JSON: non-finite ones are strings."""
    if isinstance(v, str):
        return float(v)
    return v


def same_number(got, want, rel_tol=0.0):
    if isinstance(want, bool) or isinstance(got, bool):
        return got is want
    if want is None or got is None:
        return got is want
    got = jnum(got)
    if isinstance(want, float) and math.isnan(want):
        return isinstance(got, float) and math.isnan(got)
    if rel_tol:
        return math.isclose(got, want, rel_tol=rel_tol) or got == want
    return got == want


def sd_of(obj):
    """The tensors ckpt compares: the state dict when there is exactly one
    mapping of strings to tensors, else every tensor by its path."""
    sds = []

    def walk(v, path):
        if isinstance(v, dict):
            if c.is_state_dict(v):
                sds.append((path, v))
            for k, x in v.items():
                walk(x, path + [str(k)])
        elif isinstance(v, (list, tuple)):
            for i, x in enumerate(v):
                walk(x, path + [str(i)])

    walk(obj, [])
    if len(sds) == 1:
        return OD(sds[0][1])
    flat = OD()

    def paths(v, path):
        if isinstance(v, torch.Tensor):
            flat['/'.join(path)] = v
        elif isinstance(v, dict):
            for k, x in v.items():
                paths(x, path + [str(k)])
        elif isinstance(v, (list, tuple)):
            for i, x in enumerate(v):
                paths(x, path + [str(i)])

    paths(obj, [])
    return flat


def safetensors_order(path):
    with open(path, 'rb') as f:
        n = int.from_bytes(f.read(8), 'little')
        header = json.loads(f.read(n), object_pairs_hook=OD)
    return [k for k in header if k != '__metadata__']


def unwrap(key):
    while True:
        k = c.WRAP_RE.sub('', key)
        if k == key:
            return k
        key = k


def torch_size(t):
    return 'torch.Size([%s])' % ', '.join(str(d) for d in t.shape)


def check_case(tmp, case):
    """Run one case; returns a list of what went wrong."""
    errs = []
    pa, pb = os.path.join(tmp, 'a' + case.ext_a), os.path.join(tmp, 'b' + case.ext_b)
    c.save(case.a, pa, case.fmt_a)
    c.save(case.b, pb, case.fmt_b)
    opts = list(case.opts)
    atol = rtol = 0.0
    for i, o in enumerate(opts):
        if o == '--atol':
            atol = float(opts[i + 1])
        if o == '--rtol':
            rtol = float(opts[i + 1])
    keys_only = '--keys-only' in opts
    normalize = '--normalize' in opts

    # what ckpt should find, from torch's objects (in the order of the
    # file: a safetensors header lists its tensors sorted by name)
    A, B = sd_of(case.a), sd_of(case.b)
    if case.fmt_a == 'safetensors':
        A = OD((k, A[k]) for k in safetensors_order(pa))
    if case.fmt_b == 'safetensors':
        B = OD((k, B[k]) for k in safetensors_order(pb))
    ka = OD(((unwrap(k) if normalize else k), k) for k in A)
    kb = OD(((unwrap(k) if normalize else k), k) for k in B)
    missing = [k for k in ka if k not in kb]
    unexpected = [k for k in kb if k not in ka]
    common = [k for k in ka if k in kb]
    size_mm = [k for k in common if A[ka[k]].shape != B[kb[k]].shape]
    dtype_mm = [k for k in common if A[ka[k]].dtype != B[kb[k]].dtype]

    rc, out, err = c.ckpt('diff', '--json', *opts, pa, pb)
    if rc not in (0, 1):
        return ['ckpt diff --json exited %d: %s' % (rc, err.strip()[:300])]
    if err:
        errs.append('stderr not empty: %r' % err[:200])
    doc = json.loads(out)
    if rc != case.want_exit:
        errs.append('exit %d, want %d' % (rc, case.want_exit))
    if doc['equal'] != (case.want_exit == 0):
        errs.append('"equal" is %s' % doc['equal'])
    if doc['missing'] != missing:
        errs.append('missing %s, want %s' % (doc['missing'], missing))
    if doc['unexpected'] != unexpected:
        errs.append('unexpected %s, want %s' % (doc['unexpected'], unexpected))
    want_sm = [{'key': k, 'a_shape': list(A[ka[k]].shape),
                'b_shape': list(B[kb[k]].shape)} for k in size_mm]
    if doc['size_mismatch'] != want_sm:
        errs.append('size_mismatch %s, want %s' % (doc['size_mismatch'], want_sm))
    want_dm = [{'key': k, 'a_dtype': c.dtype_name(A[ka[k]].dtype),
                'b_dtype': c.dtype_name(B[kb[k]].dtype)} for k in dtype_mm]
    if doc['dtype_mismatch'] != want_dm:
        errs.append('dtype_mismatch %s, want %s' % (doc['dtype_mismatch'], want_dm))
    if [t['key'] for t in doc['tensors']] != common:
        errs.append('tensors %s, want %s' % ([t['key'] for t in doc['tensors']], common))

    n_equal = 0
    for t in doc['tensors']:
        k = t['key']
        if k not in ka or k not in kb:
            continue
        ta, tb = A[ka[k]], B[kb[k]]
        if normalize and (t.get('a_key'), t.get('b_key')) != (ka[k], kb[k]):
            errs.append('%s: a_key/b_key %s %s' % (k, t.get('a_key'), t.get('b_key')))
        if ta.shape != tb.shape or keys_only or (
                (ta.is_complex() or tb.is_complex()) and ta.dtype != tb.dtype):
            # not compared: the key differs unless only --keys-only said so
            eq = ta.shape == tb.shape and (keys_only or ta.dtype == tb.dtype)
            if t['compared_as'] is not None or t['count'] is not None:
                errs.append('%s: values compared (%s)' % (k, t))
        elif ta.is_complex():
            # the same complex dtype: element by element, as bytes
            n = ta.numel()
            ra = ta.detach().contiguous().reshape(-1).numpy().view('u1').reshape(n, -1)
            rb = tb.detach().contiguous().reshape(-1).numpy().view('u1').reshape(n, -1)
            diff = [i for i in range(n) if (ra[i] != rb[i]).any()]
            eq = not diff
            want = {'compared_as': 'bytes', 'count': n, 'mismatched': len(diff),
                    'max_abs': None, 'max_rel': None,
                    'first_index': unravel(diff[0], list(ta.shape)) if diff else None,
                    'first_a': None, 'first_b': None}
            got = {f: t[f] for f in want}
            if got != want:
                errs.append('%s: %s, want %s' % (k, got, want))
        else:
            ref = reference(ta, tb, atol, rtol)
            eq = ref['mismatched'] == 0
            if t['compared_as'] != 'values':
                errs.append('%s: compared_as %s' % (k, t['compared_as']))
            for f in ('count', 'mismatched', 'max_abs'):
                if not same_number(t[f], ref[f]):
                    errs.append('%s: %s %s, torch %s' % (k, f, t[f], ref[f]))
            if t['first_index'] != ref['first_index']:
                errs.append('%s: first_index %s, torch %s'
                            % (k, t['first_index'], ref['first_index']))
            if not same_number(t['max_rel'], ref['max_rel'], rel_tol=1e-15):
                errs.append('%s: max_rel %s, torch %s' % (k, t['max_rel'], ref['max_rel']))
            for f in ('first_a', 'first_b'):
                if not same_number(t[f], ref[f]):
                    errs.append('%s: %s %r, torch %r' % (k, f, t[f], ref[f]))
        n_equal += eq
        if t['equal'] != eq:
            errs.append('%s: equal %s, want %s' % (k, t['equal'], eq))
    want_sum = {'compared': len(common), 'equal': n_equal,
                'differ': len(common) - n_equal, 'missing': len(missing),
                'unexpected': len(unexpected), 'size_mismatch': len(size_mm),
                'dtype_mismatch': len(dtype_mm),
                'a_unreached_storages': 0, 'b_unreached_storages': 0}
    if doc['summary'] != want_sum:
        errs.append('summary %s, want %s' % (doc['summary'], want_sum))

    # the text: torch's own lines, then the summary line
    rc2, text, err2 = c.ckpt('diff', *opts, pa, pb)
    if rc2 != rc or err2:
        errs.append('text run: exit %d, stderr %r' % (rc2, err2[:200]))
    lines = text.splitlines()
    mine = [ln for ln in lines if KEY_LINE.match(ln)]
    want_lines = []
    if missing:
        want_lines.append('Missing key(s) in state_dict: %s. '
                          % ', '.join('"%s"' % k for k in missing))
    if unexpected:
        want_lines.append('Unexpected key(s) in state_dict: %s. '
                          % ', '.join('"%s"' % k for k in unexpected))
    for k in size_mm:
        want_lines.append('size mismatch for %s: copying a param with shape %s from '
                          'checkpoint, the shape in current model is %s.'
                          % (k, torch_size(B[kb[k]]), torch_size(A[ka[k]])))
    if mine != want_lines:
        errs.append('key lines %r, want %r' % (mine, want_lines))
    if case.model is not None:
        model = case.model()
        tl = torch_lines(model, case.b if not normalize else
                         OD((unwrap(k), v) for k, v in B.items()))
        if case.torch_order:
            ok = mine == tl
        else:
            # torch lists unexpected keys module by module (the root's
            # first), ckpt in B's order: the same keys, maybe not in the
            # same order
            def keyset(lines):
                return [(ln.split(':')[0], sorted(re.findall(r'"([^"]*)"', ln)))
                        for ln in lines]
            ok = keyset(mine) == keyset(tl)
        if not ok:
            errs.append('ckpt says %r, torch says %r' % (mine, tl))
    want_summary = '%d tensor%s compared%s: %d equal, %d differ' % (
        len(common), '' if len(common) == 1 else 's',
        ' (keys, shapes and dtypes only)' if keys_only else '', n_equal,
        len(common) - n_equal)
    if size_mm:
        want_summary += ' (%d size mismatch%s)' % (len(size_mm), '' if len(size_mm) == 1 else 'es')
    want_summary += '; %d missing, %d unexpected' % (len(missing), len(unexpected))
    if not lines or lines[-1] != want_summary:
        errs.append('last line %r, want %r' % (lines[-1:] or None, want_summary))
    for ln in lines:
        m = re.match(r'^dtype mismatch for (.*): (\S+) in A, (\S+) in B$', ln)
        if m and m.group(1) not in dtype_mm:
            errs.append('text: %r' % ln)
    n_dt = sum(1 for ln in lines if ln.startswith('dtype mismatch for '))
    if n_dt != len(dtype_mm):
        errs.append('%d dtype mismatch lines, want %d' % (n_dt, len(dtype_mm)))
    if case.extra:
        errs += case.extra(doc, text)
    return errs


# --------------------------------------------------------------------------
# the cases

class Case:
    def __init__(self, name, a, b, model=None, opts=(), want_exit=1,
                 fmt_a='zip', fmt_b='zip', torch_order=True, extra=None):
        self.name, self.a, self.b, self.model = name, a, b, model
        self.opts, self.want_exit = opts, want_exit
        self.fmt_a, self.fmt_b = fmt_a, fmt_b
        self.torch_order, self.extra = torch_order, extra
        ext = {'zip': '.pth', 'legacy': '.pth', 'safetensors': '.safetensors'}
        self.ext_a, self.ext_b = ext[fmt_a], ext[fmt_b]


def mlp_sd(seed=0, hidden=128):
    torch.manual_seed(seed)
    return models.MLP(hidden).state_dict()


def clone(sd):
    return OD((k, v.clone()) for k, v in sd.items())


def perturbed():
    b = clone(mlp_sd())
    b['n.1.weight'][3, 5] += 0.25
    b['n.1.weight'][100, 700] -= 1e-7
    b['n.3.bias'][7] = 0.0          # rel: |a| / 0 = inf
    b['n.3.weight'][9, 127] *= -1
    return b


def noisy():
    torch.manual_seed(11)
    b = clone(mlp_sd())
    for v in b.values():
        v.mul_(1 + 1e-4 * torch.randn_like(v))
    return b


def with_missing():
    b = clone(mlp_sd())
    del b['n.3.bias']
    return b


def with_unexpected(keys):
    b = clone(mlp_sd())
    for k in keys:
        b[k] = torch.zeros(3)
    return b


def mixed():
    b = clone(mlp_sd())
    del b['n.3.bias']
    b['n.1.weight'] = torch.zeros(5, 5)
    b['n.3.extra'] = torch.ones(2)
    return b


def dataparallel():
    torch.manual_seed(0)
    return nn.DataParallel(models.MLP()).state_dict()


def special():
    nan, inf = math.nan, math.inf
    a = OD([('x', torch.tensor([1.0, nan, inf, -0.0, 5.0, -inf, 3.0, nan])),
            ('y', torch.tensor([[0.0, 1.0], [inf, -inf]])),
            ('same_nan', torch.tensor([nan, 2.0, -inf]))])
    b = OD([('x', torch.tensor([1.0, nan, inf, 0.0, 5.0, inf, 3.5, 1.0])),
            ('y', torch.tensor([[1e-300, 1.0], [inf, 7.0]], dtype=torch.float64)),
            ('same_nan', torch.tensor([nan, 2.0, -inf]))])
    return a, b


def integers():
    a = OD([('big', torch.tensor([2 ** 60, -(2 ** 62), 5, 7], dtype=torch.int64)),
            ('i32', torch.tensor([[1, -2147483648], [3, 4]], dtype=torch.int32)),
            ('u8', torch.tensor([0, 255, 17], dtype=torch.uint8)),
            ('flags', torch.tensor([True, False, True])),
            ('steps', torch.tensor(41, dtype=torch.int64)),
            ('i_vs_f', torch.tensor([1, 2, 3], dtype=torch.int64))])
    b = OD([('big', torch.tensor([2 ** 60 + 1, -(2 ** 62), 5, 7], dtype=torch.int64)),
            ('i32', torch.tensor([[1, 2147483647], [3, 4]], dtype=torch.int32)),
            ('u8', torch.tensor([0, 254, 17], dtype=torch.uint8)),
            ('flags', torch.tensor([True, True, True])),
            ('steps', torch.tensor(42, dtype=torch.int64)),
            ('i_vs_f', torch.tensor([1.0, 2.5, 3.0], dtype=torch.float32))])
    return a, b


def complex_pair():
    a = OD([('z', torch.tensor([[1 + 2j, 3 - 4j], [0j, -1j]], dtype=torch.complex64)),
            ('w', torch.tensor([1 + 1j, 2j], dtype=torch.complex128)),
            ('same', torch.tensor([5 + 5j], dtype=torch.complex128))])
    b = OD([('z', torch.tensor([[1 + 2j, 3 - 4.5j], [-0.0 + 0j, -1j]], dtype=torch.complex64)),
            ('w', torch.tensor([1 + 1j, 2j], dtype=torch.complex64)),
            ('same', torch.tensor([5 + 5j], dtype=torch.complex128))])
    return a, b


def bn_pair():
    torch.manual_seed(3)
    m = models.BNNet()
    m.train()
    m(torch.randn(4, 3, 8, 8))
    a = m.state_dict()
    b = clone(a)
    b['features.1.num_batches_tracked'] += 1
    b['features.1.running_mean'][2] += 0.5
    return a, b


def strided():
    torch.manual_seed(4)
    base = torch.randn(5, 3)
    a = OD([('t', base.t()), ('p', torch.randn(2, 3, 4).permute(2, 0, 1))])
    b = OD([('t', base.t().contiguous().clone()), ('p', a['p'].contiguous().clone())])
    b['t'][2, 4] += 1.0
    b['p'][3, 1, 2] -= 2.0
    return a, b


def training(seed_a, perturb):
    torch.manual_seed(seed_a)
    model = models.MLP(16)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(2, 1, 28, 28)).sum().backward()
    opt.step()
    ck = {'epoch': 1, 'model_state_dict': model.state_dict(),
          'optimizer_state_dict': opt.state_dict()}
    if perturb:
        ck['optimizer_state_dict']['state'][1]['momentum_buffer'][4] += 1.0
        ck['model_state_dict']['n.3.bias'][0] -= 0.5
    return ck


def float_copy(dtype):
    return OD((k, v.to(dtype)) for k, v in mlp_sd().items())


def check_keys_only_reads_nothing(doc, text):
    errs = []
    for t in doc['tensors']:
        if any(t[f] is not None for f in ('count', 'mismatched', 'max_abs', 'first_index')):
            errs.append('--keys-only: %s has values' % t['key'])
    return errs


def check_paths(want):
    def f(doc, text):
        keys = [t['key'] for t in doc['tensors']]
        if keys != want:
            return ['by path: keys %s, want %s' % (keys, want)]
        if doc['a_state_dict'] is not None or doc['b_state_dict'] is not None:
            return ['a_state_dict/b_state_dict should be null (several state dicts)']
        return []
    return f


def cases():
    MLP = models.MLP
    sd = mlp_sd()
    sp_a, sp_b = special()
    in_a, in_b = integers()
    bn_a, bn_b = bn_pair()
    cx_a, cx_b = complex_pair()
    st_a, st_b = strided()
    tr_keys = (['model_state_dict/' + k for k in mlp_sd(0, 16)]
               + ['optimizer_state_dict/state/%d/momentum_buffer' % i for i in range(4)])
    cs = [
        Case('same', sd, clone(sd), MLP, want_exit=0),
        Case('perturbed', sd, perturbed(), MLP),
        Case('perturbed_atol', sd, perturbed(), MLP, ('--atol', '0.3'), want_exit=0),
        Case('perturbed_atol_small', sd, perturbed(), MLP, ('--atol', '1e-6')),
        Case('noise_rtol_fails', sd, noisy(), MLP, ('--rtol', '1e-4')),
        Case('noise_rtol_passes', sd, noisy(), MLP, ('--rtol', '1e-3'), want_exit=0),
        Case('noise_atol_rtol', sd, noisy(), MLP, ('--atol', '1e-7', '--rtol', '2e-4')),
        Case('missing', sd, with_missing(), MLP),
        Case('unexpected', sd, with_unexpected(['n.1.extra', 'n.3.extra']), MLP),
        Case('unexpected_spread', sd, with_unexpected(['n.3.extra', 'top_extra']), MLP,
             torch_order=False),
        Case('missing_unexpected_size', sd, mixed(), MLP),
        Case('size_mismatch', sd, mlp_sd(0, 64), MLP),
        Case('dataparallel', sd, dataparallel(), MLP),
        Case('dataparallel_normalize', sd, dataparallel(), MLP, ('--normalize',),
             want_exit=0),
        Case('dataparallel_legacy_normalize', dataparallel(), sd, None, ('--normalize',),
             want_exit=0, fmt_a='legacy'),
        Case('other_seed', sd, mlp_sd(1), MLP),
        Case('float16', sd, float_copy(torch.float16), MLP),
        Case('float16_tolerance', sd, float_copy(torch.float16), MLP,
             ('--atol', '1e-6', '--rtol', '1e-3'), want_exit=0),
        Case('bfloat16', sd, float_copy(torch.bfloat16), MLP),
        Case('bfloat16_tolerance', sd, float_copy(torch.bfloat16), MLP,
             ('--rtol', '4e-3'), want_exit=0),
        Case('float64_b', sd, float_copy(torch.float64), MLP, want_exit=0),
        Case('legacy_vs_zip', sd, clone(sd), MLP, want_exit=0, fmt_b='legacy'),
        Case('legacy_perturbed', sd, perturbed(), MLP, fmt_a='legacy'),
        Case('special_values', sp_a, sp_b),
        Case('special_values_atol', sp_a, sp_b, None, ('--atol', '10')),
        Case('integers', in_a, in_b),
        Case('integers_atol', in_a, in_b, None, ('--atol', '1')),
        Case('batchnorm_buffers', bn_a, bn_b, models.BNNet),
        Case('complex_as_bytes', cx_a, cx_b),
        Case('strided_views', st_a, st_b),
        Case('keys_only_equal', sd, perturbed(), MLP, ('--keys-only',), want_exit=0,
             extra=check_keys_only_reads_nothing),
        Case('keys_only_size', sd, mixed(), MLP, ('--keys-only',),
             extra=check_keys_only_reads_nothing),
        Case('training_by_path', training(5, False), training(5, True), None,
             extra=check_paths(tr_keys)),
        Case('training_same', training(5, False), training(5, False), None, want_exit=0),
    ]
    if HAVE_SAFETENSORS:
        cs += [
            Case('safetensors_same', sd, clone(sd), MLP, want_exit=0, fmt_b='safetensors'),
            Case('safetensors_perturbed', sd, perturbed(), MLP, fmt_b='safetensors'),
            Case('safetensors_vs_legacy', sd, float_copy(torch.float16), MLP,
                 fmt_a='safetensors', fmt_b='legacy'),
            Case('safetensors_missing', sd, with_missing(), MLP, fmt_a='safetensors',
                 fmt_b='safetensors'),
        ]
    return cs


def main():
    only = set(sys.argv[1:])
    t = c.Tally()
    t.need(c.CKPT, 'CKPT')
    for case in cases():
        if only and case.name not in only:
            continue
        t.run(case.name, check_case, case, tmp=True, prefix='ckpt-diff-')
    if not HAVE_SAFETENSORS:
        print('note: safetensors is not installed: the safetensors cases were not run')
    return t.summary()


if __name__ == '__main__':
    sys.exit(main())
