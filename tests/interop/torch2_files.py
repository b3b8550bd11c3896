#!/usr/bin/env python3
"""Files that only torch 2.x writes (tests/data/torch2/, made by
tests/fixtures/make_torch2_fixtures.py under torch 2.15; MANIFEST.json says
what torch itself reads in them): tensors of the dtypes torch added after
1.13, saved through _rebuild_tensor_v3 and torch.storage.UntypedStorage.

Under every torch:
  - a file saved with compute_crc32 off (every CRC 0) is read with one
    notice, never refused, and its copies carry real CRC-32s;
  - `ckpt inspect --json --stats` gives each tensor the dtype, shape,
    stride, offset, storage sharing and CRC-32 of its bytes that torch 2.x
    gives it, and `ckpt scan` calls the files safe;
  - `--to pth-legacy` is refused (exit 3, one line): no torch reads those
    dtypes from the pre-1.6 format.
Under torch 2.x, besides:
  - what `ckpt convert` (pth) and `ckpt strip-module` write loads with plain
    `torch.load(f)` (weights-only, the default) and with `mmap=True`, every
    tensor bit for bit as in the input, views and sharing kept;
  - `ckpt convert` to safetensors writes the dtypes the format has
    (uint16/32/64, the float8 types, float4_e2m1fn_x2 as F4) and
    `safetensors.torch.load_file`
    reads them bit for bit; a dtype it lacks is refused, naming it.
"""
import json
import os
import sys

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as c  # noqa: E402  (exit 77 without torch)
import torch  # noqa: E402

DIR = os.path.join(c.DATA, 'torch2')
MANIFEST = json.load(open(os.path.join(DIR, 'MANIFEST.json')))
TORCH2 = int(torch.__version__.split('.')[0]) >= 2
# the dtypes of dtypes_v3.pth that safetensors 0.8 names (the others are
# refused by ckpt and by the package alike)
ST_DTYPES = ['uint16', 'uint32', 'uint64', 'float8_e4m3fn', 'float8_e5m2',
             'float8_e4m3fnuz', 'float8_e5m2fnuz', 'float8_e8m0fnu', 'float4_e2m1fn_x2',
             'float32']
ST_LACKS = ['bcomplex32', 'bits16', 'bits1x8', 'bits2x4', 'bits4x2', 'bits8', 'complex32']

t = c.Tally(uses='fixtures written by torch %s' % MANIFEST['torch'])
t.need(c.CKPT, 'CKPT')


def inspect(path):
    """{key: what ckpt says of it} from inspect --json --stats."""
    r = c.ckpt_expect(0, 'inspect', '--json', '--stats', path)
    d = json.loads(r.stdout.decode('utf-8'))
    out, ids = {}, {}
    for x in d['tensors']:
        out[x['path'][0]] = {'dtype': x['dtype'], 'shape': x['shape'],
                             'stride': x['stride'], 'offset': x['offset'],
                             'storage': ids.setdefault(x['storage'], len(ids)),
                             'crc32': x.get('crc32')}
    return d, out


def same_as_torch(name, path):
    """ckpt's view of PATH against what torch 2.x read in NAME."""
    want = MANIFEST['files'][name]
    d, got = inspect(path)
    errs = []
    if sorted(got) != sorted(want):
        errs.append('keys %s, torch: %s' % (sorted(got), sorted(want)))
    for k in sorted(set(got) & set(want)):
        w = {f: want[k][f] for f in ('dtype', 'shape', 'stride', 'offset', 'storage', 'crc32')}
        if got[k] != w:
            errs.append('%s: ckpt %s, torch %s' % (k, got[k], w))
    return errs


for name in sorted(MANIFEST['files']):
    t.run('inspect %s: every tensor as torch 2.x reads it' % name, same_as_torch, name,
          os.path.join(DIR, name))


@t.case('scan: torch 2.x files of new dtypes are safe (UntypedStorage is state-dict data)')
def _():
    for name in sorted(MANIFEST['files']):
        r = c.ckpt('scan', os.path.join(DIR, name))
        assert r.rc == 0 and 'unknown' not in r.out, (name, r.rc, r.out[-300:])


@t.case('a zip written without CRC-32s (compute_crc32 off) is read with one notice; '
        'its copy gets real CRC-32s')
def _():
    import zipfile
    src = os.path.join(DIR, 'nocrc.pth')
    for args in (('inspect', src), ('inspect', '--stats', src)):
        r = c.ckpt_expect(0, *args)
        assert r.err == 'ckpt: inspect: %s: note: written without CRC-32s (torch\'s ' \
            'compute_crc32 off): its bytes are not checked\n' % src, r.err
    d, _ = inspect(src)
    assert d.get('notices') == ["written without CRC-32s (torch's compute_crc32 off): "
                                "its bytes are not checked"], d.get('notices')
    assert c.ckpt_expect(0, 'inspect', '--quiet', src).err == ''
    out = c.scratch('crc.pth')
    c.ckpt_expect(0, 'convert', '--quiet', src, out)
    with zipfile.ZipFile(out) as z:
        assert z.testzip() is None
        assert all(i.CRC for i in z.infolist() if i.file_size), 'a zero CRC in the copy'
    assert c.ckpt_expect(0, 'inspect', out).err == ''


@t.case('convert --to pth-legacy refuses the new dtypes (exit 3, one line, nothing written)')
def _():
    out = c.scratch('legacy.pth')
    line = c.refused(3, 'convert', '--to', 'pth-legacy', os.path.join(DIR, 'dtypes_v3.pth'), out)
    assert 'pth-legacy cannot hold' in line, line
    assert not os.path.exists(out)


@t.case('kinds.pth: quantized, sparse and meta tensors listed by kind, with the quantizer '
        'torch has, before and after strip-module')
def _():
    want = MANIFEST['kinds.pth']
    src = os.path.join(DIR, 'kinds.pth')
    out = c.scratch('kinds_stripped.pth')
    c.ckpt_expect(0, 'strip-module', '--quiet', src, out)
    for path, prefix in ((src, ''), (out, 'module.')):
        r = c.ckpt_expect(0, 'inspect', '--json', '--stats', path)
        got = {prefix + x['path'][0]: x for x in json.loads(r.stdout.decode())['tensors']}
        for k, w in want.items():
            have = {f: got.get(k, {}).get(f) for f in w if f != 'int_repr'}
            assert have == {f: v for f, v in w.items() if f != 'int_repr'}, (path, k, have, w)


@t.case('bigendian.pth: values read as meant (byte-swapped), the uint16 one noted as torch '
        '2.15 misreads it; rewrites keep its bytes and byteorder "big"; a cast and '
        'safetensors come out little-endian; diff finds the copies equal')
def _():
    want = MANIFEST['bigendian.pth']
    src = os.path.join(DIR, 'bigendian.pth')
    r = c.ckpt_expect(0, 'inspect', '--json', '--stats', src)
    d = json.loads(r.stdout.decode())
    got = {x['path'][0]: x for x in d['tensors']}
    for k, w in want.items():
        g = got[k]
        assert (g['dtype'], g['shape'], g['crc32']) == (w['dtype'], w['shape'], w['crc32']), \
            (k, g, w)
    assert any('uint16' in n and 'torch 2.15' in n for n in d.get('notices', [])), d.get('notices')
    out = c.scratch('be_stripped.pth')
    c.ckpt_expect(0, 'add-module', '--quiet', src, out)
    import zipfile
    zi, zo = zipfile.ZipFile(src), zipfile.ZipFile(out)
    assert zo.read('be_stripped/byteorder') == b'big'
    for k in range(len(want)):  # each tensor its own storage, in order
        assert zi.read('bigendian/data/%d' % k) == zo.read('be_stripped/data/%d' % k), k
    half = c.scratch('be_half.pth')
    c.ckpt_expect(0, 'convert', '--quiet', '--dtype', 'float16', src, half)
    assert zipfile.ZipFile(half).read('be_half/byteorder') == b'little'
    st = c.scratch('be.safetensors')
    c.ckpt_expect(0, 'convert', '--quiet', src, st)
    r = c.ckpt_expect(0, 'inspect', '--json', '--stats', st)
    sgot = {x['path'][0]: x['crc32'] for x in json.loads(r.stdout.decode())['tensors']}
    assert sgot == {k: w['crc32'] for k, w in want.items()}, sgot
    c.ckpt_expect(0, 'diff', src, st)
    c.ckpt_expect(0, 'diff', src, out, '--normalize')


def big_endian_back(tmp):
    """torch 2.x reads what ckpt writes of the big-endian file as it reads the
    file itself (its uint16 unswapped), a float16 cast as the values' .half(),
    and safetensors' load_file the true values."""
    import safetensors.torch
    src = os.path.join(DIR, 'bigendian.pth')
    orig = torch.load(src)
    errs = []
    out, half, st = (os.path.join(tmp, n) for n in ('s.pth', 'h.pth', 's.safetensors'))
    c.ckpt_expect(0, 'strip-module', '--quiet', src, out)
    c.ckpt_expect(0, 'convert', '--quiet', '--dtype', 'float16', src, half)
    c.ckpt_expect(0, 'convert', '--quiet', src, st)
    same, h, s = torch.load(out), torch.load(half), safetensors.torch.load_file(st)
    for k, a in orig.items():
        if not torch.equal(same[k], a):
            errs.append('strip-module: %s differs as torch reads it' % k)
        want = a.half() if a.is_floating_point() else a
        if k != 'u16' and not torch.equal(h[k], want):
            errs.append('--dtype float16: %s is %s, want %s' % (k, h[k], want))
        if k == 'u16':
            want = torch.tensor([1, 258, 65535], dtype=torch.int32).to(torch.uint16)
            if not torch.equal(h[k], want) or not torch.equal(s[k], want):
                errs.append('u16 (true values %s): cast %s, safetensors %s' % (want, h[k], s[k]))
        elif not torch.equal(s[k], a):
            errs.append('safetensors: %s is %s, want %s' % (k, s[k], a))
    return errs


@t.case('whole_mlp.pt, whole_dp.pt (torch.save(model)): listed and extracted as '
        'model.state_dict() names them, _metadata included; the DataParallel one strips')
def _():
    for name in ('whole_mlp.pt', 'whole_dp.pt'):
        want = MANIFEST[name]
        src = os.path.join(DIR, name)
        r = c.ckpt_expect(0, 'inspect', '--json', '--stats', src)
        d = json.loads(r.stdout.decode())
        assert [x['path'][-1] for x in d['tensors']] == want['keys'], (name, d['tensors'])
        assert [x['crc32'] for x in d['tensors']] == want['crc32'], name
        assert d['state_dicts'][0]['source'] == 'module-tree', d['state_dicts']
        out = c.scratch(name + '.pth')
        c.ckpt_expect(0, 'extract', '--quiet', src, out)
        sd = torch.load(out, weights_only=True)  # a plain state dict: 1.13 too
        assert list(sd) == want['keys'], list(sd)
        assert {k: v['version'] for k, v in sd._metadata.items()} == want['metadata']
    stripped = c.scratch('whole_stripped.pth')
    c.ckpt_expect(0, 'strip-module', '--quiet', c.scratch('whole_dp.pt.pth'), stripped)
    r = c.ckpt_expect(0, 'inspect', '--json', stripped)
    keys = [x['path'][-1] for x in json.loads(r.stdout.decode())['tensors']]
    assert keys == MANIFEST['whole_mlp.pt']['keys'], keys


def loads_back(src, out, keys=None):
    """OUT, loaded by plain torch.load (and with mmap=True), holds the
    tensors of SRC (torch.load of it) bit for bit, under KEYS (new: old)."""
    errs = []
    orig = torch.load(src)
    for how, kw in (('torch.load(f)', {}), ('mmap=True', {'mmap': True})):
        try:
            got = torch.load(out, **kw)
        except Exception as e:
            errs.append('%s: %s' % (how, c.describe(e)))
            continue
        names = keys or {k: k for k in orig}
        for new, old in names.items():
            a, b = orig[old], got.get(new)
            if b is None:
                errs.append('%s: no %s' % (how, new))
            elif (b.dtype, b.shape, b.stride(), b.storage_offset()) != \
                    (a.dtype, a.shape, a.stride(), a.storage_offset()) or \
                    c.raw_bytes(b) != c.raw_bytes(a):
                errs.append('%s: %s differs' % (how, new))
        shared = {c.sid(got[n]) for n in names if n in got}
        want_shared = {c.sid(orig[o]) for o in names.values()}
        if len(shared) != len(want_shared):
            errs.append('%s: %d storages, the input %d' % (how, len(shared), len(want_shared)))
    return errs


def convert_pth(tmp):
    errs = []
    for name in sorted(MANIFEST['files']):
        src, out = os.path.join(DIR, name), os.path.join(tmp, name)
        c.ckpt_expect(0, 'convert', '--quiet', src, out)
        errs += ['%s: %s' % (name, e) for e in loads_back(src, out)]
        errs += ['%s (ckpt reads its output): %s' % (name, e) for e in same_as_torch(name, out)]
    return errs


def strip_module(tmp):
    src, out = os.path.join(DIR, 'dp_fp8.pth'), os.path.join(tmp, 'fp8.pth')
    c.ckpt_expect(0, 'strip-module', '--quiet', src, out)
    keys = {k[len('module.'):]: k for k in MANIFEST['files']['dp_fp8.pth']}
    return loads_back(src, out, keys)


def kinds_back(tmp):
    src, out = os.path.join(DIR, 'kinds.pth'), os.path.join(tmp, 'kinds.pth')
    c.ckpt_expect(0, 'strip-module', '--quiet', src, out)
    got, errs = torch.load(out), []
    for k, w in MANIFEST['kinds.pth'].items():
        b = got.get(k[len('module.'):])
        if b is None:
            errs.append('no %s' % k)
        elif b.is_quantized:
            if b.int_repr().reshape(-1).tolist() != w['int_repr'] or b.dtype != getattr(
                    torch, w['dtype']) or list(b.shape) != w['shape']:
                errs.append('%s: %s' % (k, b))
        elif w['kind'] == 'meta' and not b.is_meta:
            errs.append('%s is not meta' % k)
        elif w['kind'].startswith('sparse') and str(b.layout) != 'torch.' + w['kind']:
            errs.append('%s is %s' % (k, b.layout))
    return errs


def to_safetensors(tmp):
    import safetensors.torch
    errs = []
    src = os.path.join(DIR, 'dtypes_v3.pth')
    line = c.refused(3, 'convert', src, os.path.join(tmp, 'all.safetensors'))
    if not any(("for %s " % d) in line for d in ST_LACKS):
        errs.append('the refusal does not name a dtype safetensors lacks: %s' % line)
    orig = torch.load(src)
    part = os.path.join(tmp, 'part.pth')
    torch.save({k: orig[k] for k in ST_DTYPES}, part)
    out = os.path.join(tmp, 'part.safetensors')
    c.ckpt_expect(0, 'convert', '--quiet', part, out)
    got = safetensors.torch.load_file(out)
    for k in ST_DTYPES:
        a, b = orig[k], got.get(k)
        if b is None or b.dtype != a.dtype or b.shape != a.shape or \
                c.raw_bytes(b) != c.raw_bytes(a):
            errs.append('%s: load_file gives %s' % (k, None if b is None else (b.dtype, b.shape)))
    # and ckpt reads what the package writes of the same tensors
    theirs = os.path.join(tmp, 'theirs.safetensors')
    safetensors.torch.save_file({k: orig[k] for k in ST_DTYPES}, theirs)
    d, mine = inspect(theirs)
    for k in ST_DTYPES:
        if mine.get(k, {}).get('dtype') != k or mine[k]['crc32'] != MANIFEST['files'][
                'dtypes_v3.pth'][k]['crc32']:
            errs.append('%s from save_file: ckpt reads %s' % (k, mine.get(k)))
    return errs


def shared_views_to_safetensors(tmp):
    """shared_v3.pth: one untyped storage seen as uint16, float8_e5m2 and a
    strided float8_e4m3fn view; each tensor is written in its own dtype
    (the storage's first dtype once named them all, and the strided view
    read past the storage's end)."""
    import safetensors.torch
    src = os.path.join(DIR, 'shared_v3.pth')
    orig = torch.load(src)
    out = os.path.join(tmp, 'shared.safetensors')
    c.ckpt_expect(0, 'convert', '--quiet', src, out)
    got = safetensors.torch.load_file(out)
    errs = []
    for k, a in orig.items():
        b = got.get(k)
        if b is None or b.dtype != a.dtype or b.shape != a.shape or \
                c.raw_bytes(b) != c.raw_bytes(a.contiguous()):
            errs.append('%s (%s %s): load_file gives %s' % (k, a.dtype, tuple(a.shape),
                        None if b is None else (b.dtype, tuple(b.shape))))
    return errs


if TORCH2:
    t.run('convert to pth: plain torch.load and mmap=True read every tensor bit for bit',
          convert_pth, tmp=True)
    t.run('strip-module of an FP8 DataParallel checkpoint loads with plain torch.load',
          strip_module, tmp=True)
    t.run('kinds.pth after strip-module: torch.load gives the same quantized integers and '
          'quantizers, sparse and meta tensors', kinds_back, tmp=True)
    c.need('safetensors')
    t.run('bigendian.pth under torch 2.x: rewrites read as torch reads the input, the float16 '
          'cast and safetensors give the true values', big_endian_back, tmp=True)
    t.run('safetensors: the dtypes the format has, both ways; the others refused by name',
          to_safetensors, tmp=True)
    t.run('safetensors: tensors of several dtypes over one untyped storage, each in its own',
          shared_views_to_safetensors, tmp=True)
else:
    print('note torch %s cannot load these dtypes: the torch.load checks run under 2.x'
          % torch.__version__)

sys.exit(t.summary())
