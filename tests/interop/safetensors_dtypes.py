#!/usr/bin/env python3
"""Every dtype of the safetensors format (what safetensors 0.8's Rust Dtype
accepts: BOOL, F4, F6_E2M3, F6_E3M2, U8, I8, F8_E5M2, F8_E4M3, F8_E8M0,
F8_E4M3FNUZ, F8_E5M2FNUZ, I16, U16, F16, BF16, I32, U32, F32, C64, F64,
I64, U64), both ways, against the package itself:

  - a file `safetensors.torch.save_file` writes in every dtype this torch
    has is read by ckpt (dtype, shape as the package's torch loader gives
    it, CRC-32 of the bytes), and what `ckpt convert` writes of it to
    safetensors and to .pth loads (`load_file`, `safe_open`, `torch.load`)
    bit for bit, in the same dtype and shape;
  - F4: the package writes a float4_e2m1fn_x2 [.., k] as F4 [.., 2k] (its
    shape counts 4-bit values) and ckpt does the same, header for header;
  - F6 (no torch dtype): files whose header is written here are read by
    ckpt (shape, 6 bits an element) and passed through `ckpt convert` to
    safetensors with the same header entries and bytes, as the package's
    own `safetensors.deserialize` reads them; to .pth they are refused;
  - `--dtype` from float8_e8m0fnu / float4 / float6 is refused (exit 3).
"""
import json
import os
import struct
import sys
import zlib

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as c  # noqa: E402  (exit 77 without torch)
import torch  # noqa: E402

c.need('safetensors')
import safetensors  # noqa: E402
import safetensors.torch  # noqa: E402

t = c.Tally(uses='safetensors %s, torch %s' % (safetensors.__version__,
                                               torch.__version__))
t.need(c.CKPT, 'CKPT')

# torch dtype -> safetensors name; the ones this torch lacks are left out
NAMES = {'bool': 'BOOL', 'uint8': 'U8', 'int8': 'I8', 'int16': 'I16',
         'uint16': 'U16', 'float16': 'F16', 'bfloat16': 'BF16',
         'int32': 'I32', 'uint32': 'U32', 'float32': 'F32',
         'complex64': 'C64', 'float64': 'F64', 'int64': 'I64',
         'uint64': 'U64', 'float8_e5m2': 'F8_E5M2', 'float8_e4m3fn': 'F8_E4M3',
         'float8_e8m0fnu': 'F8_E8M0', 'float8_e4m3fnuz': 'F8_E4M3FNUZ',
         'float8_e5m2fnuz': 'F8_E5M2FNUZ', 'float4_e2m1fn_x2': 'F4'}
DTYPES = [n for n in NAMES if hasattr(torch, n)]


def header(path):
    with open(path, 'rb') as f:
        n = struct.unpack('<Q', f.read(8))[0]
        return json.loads(f.read(n))


def tensors():
    """One tensor of each dtype: every byte pattern, in a shape per dtype."""
    out = {}
    for i, n in enumerate(DTYPES):
        dt = getattr(torch, n)
        size = torch.empty(0, dtype=dt).element_size()
        raw = torch.arange(256 * size, dtype=torch.int64).remainder(256)
        raw = raw.to(torch.uint8)
        if n == 'bool':
            raw = raw.remainder(2)
        x = raw.view(dt)
        out[n] = x.reshape(4, -1) if i % 2 else x.reshape(2, 4, -1)
    out['scalar_f32'] = torch.tensor(1.5)
    out['empty_f4' if 'float4_e2m1fn_x2' in DTYPES else 'empty'] = \
        torch.empty(3, 0, dtype=getattr(torch, DTYPES[-1]))
    return out


def inspect(path):
    r = c.ckpt_expect(0, 'inspect', '--json', '--stats', path)
    return {x['path'][0]: x for x in json.loads(r.stdout.decode())['tensors']}


def same(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and \
        c.raw_bytes(a) == c.raw_bytes(b)


@t.case('save_file in every dtype of this torch: ckpt reads dtype, shape and bytes')
def read_theirs():
    d = c.scratch()
    ts = tensors()
    theirs = os.path.join(d, 'theirs.safetensors')
    safetensors.torch.save_file(ts, theirs)
    got = inspect(theirs)
    errs = []
    for k, v in ts.items():
        g = got.get(k, {})
        want = (c.dtype_name(v.dtype), list(v.shape), c.crc32(v))
        if (g.get('dtype'), g.get('shape'), g.get('crc32')) != want:
            errs.append('%s: ckpt %s, torch %s' % (
                k, (g.get('dtype'), g.get('shape'), g.get('crc32')), want))
    assert not errs, '; '.join(errs)


@t.case('ckpt convert of that file to safetensors: the same header entries, load_file and safe_open bit for bit')
def write_safetensors():
    d = c.scratch()
    theirs = os.path.join(d, 'theirs.safetensors')
    ts = safetensors.torch.load_file(theirs)
    mine = os.path.join(d, 'mine.safetensors')
    c.ckpt_expect(0, 'convert', '--quiet', theirs, mine)
    h1, h2 = header(theirs), header(mine)
    errs = []
    for k in ts:
        if (h1[k]['dtype'], h1[k]['shape']) != (h2[k]['dtype'], h2[k]['shape']):
            errs.append('%s: theirs %s, ckpt %s' % (k, h1[k], h2[k]))
    got = safetensors.torch.load_file(mine)
    with safetensors.safe_open(mine, framework='pt') as f:
        for k, v in ts.items():
            if not same(v, got[k]) or not same(v, f.get_tensor(k)):
                errs.append('%s: does not load back as it was' % k)
    if 'float4_e2m1fn_x2' in DTYPES:
        # what the package does with torch's shape: the last dimension doubled
        if h1['float4_e2m1fn_x2']['shape'][-1] != 2 * ts['float4_e2m1fn_x2'].shape[-1]:
            errs.append('save_file no longer doubles the F4 last dimension: %s'
                        % h1['float4_e2m1fn_x2'])
    assert not errs, '; '.join(errs)


@t.case('ckpt convert of that file to .pth: torch.load reads every tensor bit for bit')
def write_pth():
    d = c.scratch()
    theirs = os.path.join(d, 'theirs.safetensors')
    ts = safetensors.torch.load_file(theirs)
    out = os.path.join(d, 'mine.pth')
    c.ckpt_expect(0, 'convert', '--quiet', theirs, out)
    got = torch.load(out, weights_only=True)
    bad = [k for k, v in ts.items() if k not in got or not same(v, got[k])]
    assert not bad, 'differ: %s' % bad


if hasattr(torch, 'float4_e2m1fn_x2'):
    @t.case('a 0-dim float4_e2m1fn_x2 is refused by ckpt as by save_file (it has no F4 shape)')
    def f4_scalar():
        d = c.scratch()
        x = torch.tensor(7, dtype=torch.uint8).view(torch.float4_e2m1fn_x2)
        try:
            safetensors.torch.save_file({'x': x}, os.path.join(d, 's.safetensors'))
            raise c.Fail('save_file now accepts a 0-dim float4_e2m1fn_x2')
        except safetensors.SafetensorError:
            pass
        src, out = os.path.join(d, 's.pth'), os.path.join(d, 's2.safetensors')
        torch.save({'x': x}, src)
        line = c.refused(3, 'convert', src, out)
        assert "'x'" in line and '0-dim' in line, line
        assert not os.path.exists(out)


def st_file(path, entries):
    """A safetensors file of (name, dtype, shape, bytes) written by hand."""
    hdr, data = {}, b''
    for name, dt, shape, raw in entries:
        hdr[name] = {'dtype': dt, 'shape': shape,
                     'data_offsets': [len(data), len(data) + len(raw)]}
        data += raw
    h = json.dumps(hdr).encode()
    h += b' ' * (-len(h) % 8)
    with open(path, 'wb') as f:
        f.write(struct.pack('<Q', len(h)) + h + data)


F6 = [('a', 'F6_E2M3', [4, 2], bytes(range(0, 60, 10))),
      ('b', 'F6_E3M2', [4, 1], b'\xff\x80\x01'),
      ('c', 'F6_E2M3', [2, 0, 3], b''),
      ('d', 'F6_E3M2', [12], bytes(range(200, 209)))]


@t.case('F6_E2M3 / F6_E3M2: read (6 bits a value) and passed through convert to safetensors bit for bit')
def f6_through():
    d = c.scratch()
    src, out = os.path.join(d, 'f6.safetensors'), os.path.join(d, 'f6b.safetensors')
    st_file(src, F6)
    # the package's own reading of the file (no framework has these dtypes)
    theirs = dict(safetensors.deserialize(open(src, 'rb').read()))
    got = inspect(src)
    errs = []
    for name, dt, shape, raw in F6:
        want = ('float6_e2m3fn' if dt == 'F6_E2M3' else 'float6_e3m2fn', shape,
                len(raw), '%08x' % zlib.crc32(raw))
        g = got[name]
        if (g['dtype'], g['shape'], g['nbytes'], g.get('crc32')) != want:
            errs.append('%s: ckpt %s, want %s' % (name, g, want))
        if bytes(theirs[name]['data']) != raw:
            errs.append('%s: safetensors.deserialize reads other bytes' % name)
    c.ckpt_expect(0, 'convert', '--quiet', src, out)
    back = dict(safetensors.deserialize(open(out, 'rb').read()))
    for name, dt, shape, raw in F6:
        b = back.get(name)
        if not b or (b['dtype'], list(b['shape']), bytes(b['data'])) != (dt, shape, raw):
            errs.append('%s: ckpt wrote %s' % (name, b))
    r = c.ckpt('diff', src, out)
    if r.rc != 0:
        errs.append('diff of the copy: exit %d: %s' % (r.rc, r.err))
    assert not errs, '; '.join(errs)


@t.case('F6 to .pth and --dtype from float6 / float8_e8m0fnu / float4 are refused (3, one line, nothing written)')
def refusals():
    d = c.scratch()
    src = os.path.join(d, 'f6.safetensors')
    st_file(src, F6)
    errs = []
    for args, word in ((['convert', src, os.path.join(d, 'x.pth')], 'float6_e2m3fn'),
                       (['convert', '--dtype', 'float16', src,
                         os.path.join(d, 'x.safetensors')], 'float6')):
        line = c.refused(3, *args)
        if word not in line:
            errs.append('%s: %s' % (args[0], line))
        if os.path.exists(args[-1]):
            errs.append('%s wrote %s' % (args[0], args[-1]))
    for name, dt in (('e', 'F8_E8M0'), ('f', 'F4')):
        p = os.path.join(d, name + '.safetensors')
        st_file(p, [(name, dt, [2, 2], b'\x01\x02\x03\x04'[:4 if dt == 'F8_E8M0' else 2])])
        line = c.refused(3, 'convert', '--dtype', 'bfloat16', p, os.path.join(d, 'y.pth'))
        if 'cannot cast' not in line:
            errs.append('%s: %s' % (dt, line))
    assert not errs, '; '.join(errs)


sys.exit(t.summary())
