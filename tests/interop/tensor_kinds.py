#!/usr/bin/env python3
"""Tensors that are not plain strided ones, saved by the torch this runs
under: quantized (per tensor and per channel; quint8, qint8, qint32,
quint4x2, quint2x4, float zero points), sparse (COO, CSR, CSC, BSR, BSC),
meta, and (torch 2.x) a plain tensor with Python attributes (nn.Buffer).

  - `ckpt inspect --json --stats` lists each with its kind, dtype, shape
    and device as torch has them, a quantized one with its qscheme, scale
    and zero point (per channel: axis and the lists), as torch's own
    q_scale()/q_per_channel_scales() ... say;
  - strip-module, add-module, `convert --to pth-legacy` and
    `convert --dtype float16` keep every one of them: torch loads the
    output (weights-only where torch loads the input so) and finds the same
    tensors, quantized integers and quantizers bit for bit, sparse values
    cast as torch's .half() casts them, meta tensors and quantizers as they
    were;
  - `ckpt diff` compares them kind by kind (sparse: indices and values;
    quantized: integers and quantizers; meta: dtype and shape);
  - safetensors has none of these kinds: converting to it is refused,
    naming the tensor.
"""
import json
import os
import sys
import warnings

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as c  # noqa: E402  (exit 77 without torch)
import torch  # noqa: E402

warnings.filterwarnings('ignore')
TORCH2 = int(torch.__version__.split('.')[0]) >= 2

t = c.Tally()
t.need(c.CKPT, 'CKPT')


def tensors():
    """name -> tensor, every kind this torch can save."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(4, 6, generator=g)
    d = {
        'qt': torch.quantize_per_tensor(x, 0.05, 3, torch.quint8),
        'qs': torch.quantize_per_tensor(x, 0.01, 0, torch.qint8),
        'q32': torch.quantize_per_tensor(x, 1e-4, -7, torch.qint32),
        'qc': torch.quantize_per_channel(
            x, torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64),
            torch.tensor([0, 1, -2, 3]), 0, torch.qint8),
        'qc1': torch.quantize_per_channel(
            x, torch.linspace(0.01, 0.06, 6, dtype=torch.float64),
            torch.arange(6), 1, torch.quint8),
        'qf': torch.quantize_per_channel(
            x, torch.tensor([0.1, 0.2, 0.3, 0.4]), torch.tensor([0.5, 1.0, 0.0, -1.5]),
            0, torch.quint8),
        'q4': torch.quantize_per_tensor(torch.rand(3, 5, generator=g), 0.1, 0, torch.quint4x2),
        'coo': (x * (x > 0.5)).to_sparse(),
        'coo3': torch.sparse_coo_tensor(torch.tensor([[0, 2], [1, 0]]),
                                        torch.randn(2, 3, generator=g), (3, 2, 3)),
        'csr': (x * (x > 0)).to_sparse_csr(),
        'meta': torch.empty(2, 3, device='meta', dtype=torch.float16),
    }
    try:
        d['q2'] = torch.quantize_per_tensor(torch.rand(2, 7, generator=g), 0.3, 1,
                                            torch.quint2x4)
    except RuntimeError:
        pass  # not every build quantizes to quint2x4
    for name, fn in [('csc', 'to_sparse_csc'), ('bsr', 'to_sparse_bsr'),
                     ('bsc', 'to_sparse_bsc')]:
        if TORCH2:  # 1.13 saves only COO and CSR
            d[name] = getattr(x, fn)((2, 2)) if name != 'csc' else x.to_sparse_csc()
    if hasattr(torch.nn, 'Buffer'):
        d['buf'] = torch.nn.Buffer(torch.arange(3.0))
    return d


def kind(x):
    if x.is_quantized:
        return 'quantized'
    if x.is_meta:
        return 'meta'
    if x.layout != torch.strided:
        return str(x.layout).replace('torch.', '')
    return 'dense'


def qparams(x):
    """What ckpt's JSON should say of X's quantizer."""
    qs = x.qscheme()
    if qs in (torch.per_tensor_affine, torch.per_tensor_symmetric):
        return {'qscheme': 'per_tensor_affine', 'scale': x.q_scale(),
                'zero_point': x.q_zero_point()}
    # float zero points are saved with the qscheme per_channel_affine
    return {'qscheme': 'per_channel_affine', 'axis': x.q_per_channel_axis(),
            'scale': [float(v) for v in x.q_per_channel_scales()],
            'zero_point': [v.item() for v in x.q_per_channel_zero_points()]}


def listed(path):
    r = c.ckpt_expect(0, 'inspect', '--json', '--stats', path)
    return {x['path'][0]: x for x in json.loads(r.stdout.decode())['tensors']}


def same_listing(want, got):
    errs = []
    for k, x in want.items():
        g = got.get(k)
        if g is None:
            errs.append('%s: not listed' % k)
            continue
        exp = {'kind': kind(x), 'dtype': c.dtype_name(x.dtype), 'shape': list(x.shape),
               'device': str(x.device)}
        if x.is_quantized:
            exp.update(qparams(x))
        have = {f: g.get(f) for f in exp}
        if have != exp:
            errs.append('%s: ckpt says %s, torch %s' % (k, have, exp))
    return errs


def same_tensors(a, b, cast=None):
    """B as torch loaded ckpt's output against A as saved (CAST: the dtype
    floating values were cast to)."""
    errs = []
    for k, x in a.items():
        y = b.get(k)
        if y is None:
            errs.append('%s: missing' % k)
            continue
        if x.is_quantized:
            ok = (y.is_quantized and x.qscheme() == y.qscheme() and x.dtype == y.dtype and
                  torch.equal(x.int_repr(), y.int_repr()) and
                  qparams(x) == qparams(y))
        elif x.is_meta:
            ok = y.is_meta and x.shape == y.shape and x.dtype == y.dtype
        elif x.layout != torch.strided:
            want = x.to_dense()
            if cast is not None and want.is_floating_point():
                want = want.to(cast)
            ok = x.layout == y.layout and y.dtype == want.dtype and \
                torch.equal(y.to_dense(), want)
        else:
            want = x.to(cast) if cast is not None and x.is_floating_point() else x
            ok = torch.equal(y, want) and y.dtype == want.dtype and \
                type(y) is type(x) and y.__dict__ == x.__dict__
        if not ok:
            errs.append('%s: torch reads %r, saved %r' % (k, y, x))
    return errs


def load(path):
    """As a user loads it: plain weights-only where torch can (2.x; 1.13
    refuses _rebuild_qtensor under weights_only, so the whole file is read
    trusted there, as its original would have to be)."""
    return torch.load(path, weights_only=True) if TORCH2 else c.load_trusted(path)


def main():
    d = tensors()
    tmp = c.scratch()
    src = os.path.join(tmp, 'kinds.pth')
    torch.save({'module.' + k: v for k, v in d.items()}, src)
    plain = os.path.join(tmp, 'plain.pth')
    torch.save(d, plain)

    t.report('inspect lists every kind as torch has it (%d tensors)' % len(d),
             same_listing(d, listed(plain)))

    out = os.path.join(tmp, 'stripped.pth')
    c.ckpt_expect(0, 'strip-module', '--quiet', src, out)
    t.report('strip-module: torch %s loads every kind back' % torch.__version__,
             same_tensors(d, load(out)))

    added = os.path.join(tmp, 'added.pth')
    c.ckpt_expect(0, 'add-module', '--quiet', plain, added)
    back = load(added)
    t.report('add-module: every kind kept under module.',
             same_tensors(d, {k[len('module.'):]: v for k, v in back.items()}))

    legacy = os.path.join(tmp, 'legacy.pth')
    c.ckpt_expect(0, 'convert', '--quiet', '--to', 'pth-legacy', plain, legacy)
    t.report('convert --to pth-legacy: every kind kept', same_tensors(d, load(legacy)))

    half = os.path.join(tmp, 'half.pth')
    c.ckpt_expect(0, 'convert', '--quiet', '--dtype', 'float16', plain, half)
    t.report('convert --dtype float16: sparse values cast, quantizers kept',
             same_tensors(d, load(half), cast=torch.float16))

    same = c.ckpt_expect(0, 'diff', plain, legacy).out
    differ = c.ckpt_expect(1, 'diff', plain, half).out
    errs = [] if '%d equal, 0 differ' % len(d) in same else ['diff of a copy: %s' % same]
    floats = [k for k, x in d.items() if not x.is_quantized and not x.is_meta and
              x.is_floating_point()]
    errs += ['diff after a float16 cast does not see %s cast' % k for k in floats
             if 'dtype mismatch for %s:' % k not in differ]
    t.report('diff: a copy compares equal kind by kind; the float16 cast is seen in the %d '
             'floating tensors' % len(floats), errs)

    r = c.ckpt('convert', plain, os.path.join(tmp, 'x.safetensors'))
    errs = c.refusal_errors(r, 3)
    if not errs and b"'q" not in r.stderr:
        errs.append('the refusal does not name the tensor: %s' % r.stderr)
    if os.path.exists(os.path.join(tmp, 'x.safetensors')):
        errs.append('a partial safetensors file was left')
    t.report('convert to safetensors: refused, naming the tensor', errs)


main()
sys.exit(t.summary())
