#!/usr/bin/env python3
"""ckpt reads a safetensors header as strictly as safetensors itself
(issue 26): every file here is made in a scratch folder, then given to the
package (`safe_open` and `load_file`) and to `ckpt inspect`.

  - hostile headers (floats where integers go, holes and bytes after the
    tensors, bad strings, bad JSON, nesting past serde's 127 levels, a
    header over 100,000,000 bytes, ...): the package refuses each and ckpt
    refuses it too (exit 3, one line);
  - odd but valid headers (spaces around the object, empty metadata, null
    metadata, empty tensors, unknown fields, escaped names, fields in any
    order, ...): both read them, with the same names, dtypes, shapes and
    bytes (what `ckpt convert` writes of it, read back by `load_file`);
  - what ckpt refuses on purpose (a NUL in a name, a name or metadata key
    twice, more than 64 dimensions): the package reads it, ckpt refuses it,
    and scan's torch_load verdict says torch 2.x (which hands a .safetensors
    path to the package) loads it;
  - every st_*.safetensors of tests/bad: the package refuses it (but for
    the cases where ckpt is stricter on purpose, listed in CKPT_STRICTER),
    and ckpt refuses it;
  - a shard index naming a shard with a NUL: Python cannot open that name,
    ckpt refuses the index;
  - --max-header-bytes: a header over the default is refused as the
    package refuses it, naming the option; a lower limit refuses a header
    the package reads, naming the option.
"""
import json
import os
import struct
import sys

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as c  # noqa: E402  (exit 77 without torch)
import torch  # noqa: E402

c.need('safetensors')
import safetensors  # noqa: E402
import safetensors.torch  # noqa: E402
from safetensors import safe_open  # noqa: E402

t = c.Tally(uses='safetensors %s, ckpt %s' % (safetensors.__version__, c.CKPT))
t.need(c.CKPT, 'CKPT')

# where ckpt refuses what the package reads, on purpose (ckpt-convert(1),
# "Reading safetensors")
CKPT_STRICTER = {
    'st_nul_name.safetensors': 'a NUL in a name (ckpt keeps names as C strings)',
}


def st(header, data=b'', length=None):
    """A file: the 8-byte length (LENGTH, else the header's), HEADER (str
    or bytes, as is), DATA."""
    h = header.encode() if isinstance(header, str) else header
    return struct.pack('<Q', len(h) if length is None else length) + h + data


def ent(name='t', dtype='U8', shape='4', offsets='0,4', extra=''):
    """One header entry, each part as written."""
    return '"%s":{"dtype":"%s","shape":[%s],"data_offsets":[%s]%s}' % (
        name, dtype, shape, offsets, extra)


ABCD = b'abcd'
DEEP = lambda k: ent(extra=',"x":' + '[' * k + ']' * k)  # noqa: E731

# name -> file bytes; each refused by safetensors 0.8 and by ckpt
HOSTILE = {
    'shape 4.0': st('{%s}' % ent(shape='4.0'), ABCD),
    'shape 4e0': st('{%s}' % ent(shape='4e0'), ABCD),
    'shape 4.5': st('{%s}' % ent(shape='4.5'), ABCD),
    'shape -0': st('{%s}' % ent(shape='-0', offsets='0,0')),
    'shape -1': st('{%s}' % ent(shape='-1'), ABCD),
    'shape 2^64': st('{%s}' % ent(shape='18446744073709551616', offsets='0,0')),
    'shape 04': st('{%s}' % ent(shape='04'), ABCD),
    'shape +4': st('{%s}' % ent(shape='+4'), ABCD),
    'shape "4"': st('{%s}' % ent(shape='"4"'), ABCD),
    'shape [[4]]': st('{%s}' % ent(shape='[4]'), ABCD),
    'shape overflow': st('{%s}' % ent(shape='18446744073709551615,2', offsets='0,0')),
    'offset -0': st('{%s}' % ent(offsets='-0,4'), ABCD),
    'offset 4.': st('{%s}' % ent(offsets='0,4.'), ABCD),
    'three offsets': st('{%s}' % ent(offsets='0,4,4'), ABCD),
    'bytes after the data': st('{%s}' % ent(), ABCD + b'e'),
    'a hole': st('{%s,%s}' % (ent('a', shape='1', offsets='0,1'),
                              ent('b', shape='1', offsets='2,3')), b'abc'),
    'an overlap': st('{%s,%s}' % (ent('a', shape='2', offsets='0,2'),
                                  ent('b', shape='2', offsets='1,3')), b'abc'),
    'an empty tensor inside another': st('{%s,%s}' % (
        ent(), ent('z', 'F32', '0', '2,2')), ABCD),
    'end before begin': st('{%s,%s}' % (ent('a', shape='0', offsets='0,0'),
                                        ent('b', shape='0', offsets='1,0')), b'a'),
    'data too short': st('{%s}' % ent(), b'abc'),
    'size mismatch': st('{%s}' % ent(shape='3'), ABCD),
    'F4 half a byte': st('{%s}' % ent(dtype='F4', shape='3', offsets='0,1'), b'a'),
    'dtype u8': st('{%s}' % ent(dtype='u8'), ABCD),
    'dtype twice': st('{"t":{"dtype":"U8","dtype":"U8","shape":[4],"data_offsets":[0,4]}}', ABCD),
    'no shape': st('{"t":{"dtype":"U8","data_offsets":[0,0]}}'),
    'tensor null': st('{"t":null}'),
    'tensor a string': st('{"x":"y"}'),
    'two __metadata__': st('{"__metadata__":{"a":"x"},"__metadata__":{"a":"y"}}'),
    '__metadata__ [..]': st('{"__metadata__":[]}'),
    'metadata value 1': st('{"__metadata__":{"a":1}}'),
    'metadata value null': st('{"__metadata__":{"a":null}}'),
    'metadata value {}': st('{"__metadata__":{"a":{}}}'),
    '__METADATA__ (a tensor)': st('{"__METADATA__":{"a":"b"}}'),
    'lone high surrogate': st('{%s}' % ent('\\ud800'), ABCD),
    'lone low surrogate': st('{%s}' % ent('\\udc00'), ABCD),
    'high surrogate + A': st('{%s}' % ent('\\ud800\\u0041'), ABCD),
    'surrogate in metadata': st('{"__metadata__":{"a":"\\ud800"}}'),
    'escape \\x': st('{%s}' % ent('t\\x'), ABCD),
    'raw control character': st('{%s}' % ent('a\x01'), ABCD),
    'raw ESC in an unknown field': st('{%s}' % ent(extra=',"x":"a\x1b"'), ABCD),
    'bad UTF-8': st(b'{' + ent('\xff').encode('latin-1') + b'}', ABCD),
    'UTF-8 BOM': st(b'\xef\xbb\xbf{}'),
    'nesting 128 deep': st('{%s}' % DEEP(126), ABCD),
    'nesting 200 deep': st('{%s}' % DEEP(198), ABCD),
    '1e400 in an unknown field': st('{%s}' % ent(extra=',"x":1e400'), ABCD),
    'tru in an unknown field': st('{%s}' % ent(extra=',"x":tru'), ABCD),
    'a trailing comma': st('{%s,}' % ent(), ABCD),
    'two objects': st('{}{}'),
    'a NUL after the object': st('{%s}\0' % ent(), ABCD),
    'a form feed after the object': st('{%s}\x0c' % ent(), ABCD),
    'an array': st('[]'),
    'an empty header': st(''),
    'header past the end': st('{%s}' % ent(), ABCD, length=1000),
    'header over 100,000,000 bytes': st('{}', length=100000001),
    'too short for a length': b'\x01\x00',
}

# name -> file bytes; read by both, alike
VALID = {
    'plain': st('{%s}' % ent(), ABCD),
    'spaces before the object': st(' \n\t{%s}' % ent(), ABCD),
    'spaces after it': st('{%s}  \n\t\r ' % ent(), ABCD),
    'spaces inside': st('{ "t" : { "dtype" : "U8" ,\n"shape":[ 4 ],"data_offsets":[0 , 4] } }', ABCD),
    'no tensors': st('{}'),
    'empty metadata': st('{"__metadata__":{}}'),
    'null metadata': st('{"__metadata__":null,%s}' % ent(), ABCD),
    'metadata last': st('{%s,"__metadata__":{"a":"b"}}' % ent(), ABCD),
    'metadata named by escapes': st('{"\\u005f_metadata__":{"a":"b"},%s}' % ent(), ABCD),
    'empty tensors': st('{"z":{"dtype":"F32","shape":[0,3],"data_offsets":[0,0]},'
                        '"y":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},%s}' % ent(), ABCD),
    'an empty tensor at the end': st('{%s,%s}' % (ent(), ent('z', 'F32', '0', '4,4')), ABCD),
    'unknown fields': st('{%s}' % ent(extra=',"x":[true,false,null,-1.5e3,{"a":[]}],"y":"z"'), ABCD),
    'nesting 127 deep': st('{%s}' % DEEP(125), ABCD),
    'escaped name and dtype': st('{"\\u0074\\/":{"dtype":"\\u00558","shape":[4],"data_offsets":[0,4]}}', ABCD),
    'a surrogate pair': st('{%s}' % ent('\\ud83d\\ude00'), ABCD),
    'DEL and C1 in a name': st('{%s}' % ent('a\x7f\u009b'), ABCD),
    'an empty name': st('{%s}' % ent(''), ABCD),
    'fields in another order': st('{"t":{"data_offsets":[0,4],"shape":[4],"dtype":"U8"}}', ABCD),
    'tensors out of offset order': st('{%s,%s}' % (ent('b', shape='2', offsets='2,4'),
                                                  ent('a', shape='2', offsets='0,2')), ABCD),
    '64 dimensions': st('{%s}' % ent(shape=','.join(['1'] * 63 + ['4'])), ABCD),
    'a scalar': st('{"s":{"dtype":"F32","shape":[],"data_offsets":[0,4]}}', ABCD),
    'a length not a multiple of 8': st('{%s}' % ent(), ABCD),
}

# name -> file bytes; read by the package, refused by ckpt on purpose
# (ckpt-convert(1), "Reading safetensors"); torch 2.x's torch.load of a
# .safetensors path reads them, so scan's verdict for it says accepted
STRICTER = {
    'a NUL in a name': st('{%s}' % ent('a\\u0000b'), ABCD),
    'a NUL in a metadata value': st('{"__metadata__":{"a":"b\\u0000c"}}'),
    'a name twice, the same bytes': st('{%s,%s}' % (ent(), ent()), ABCD),
    'a metadata key twice': st('{"__metadata__":{"a":"x","a":"y"}}'),
    '65 dimensions': st('{%s}' % ent(shape=','.join(['1'] * 64 + ['4'])), ABCD),
}


def package(path):
    """What the package reads: {name: tensor}, metadata; or raises."""
    with safe_open(path, 'pt') as f:
        got = {k: f.get_tensor(k) for k in f.keys()}
        md = f.metadata()
    safetensors.torch.load_file(path)
    return got, md


def write(d, name, content):
    p = os.path.join(d, name.replace(' ', '_').replace('/', '_')[:40] + '.safetensors')
    with open(p, 'wb') as f:
        f.write(content)
    return p


@t.case('hostile headers: safetensors %s refuses each, ckpt too (3, one line)'
        % safetensors.__version__)
def hostile():
    d = c.scratch()
    errs = []
    for name, content in HOSTILE.items():
        p = write(d, name, content)
        try:
            package(p)
            errs.append('%s: the package reads it' % name)
        except Exception:
            pass
        errs += ['%s: %s' % (name, e)
                 for e in c.refusal_errors(c.ckpt('inspect', p), 3)]
    assert not errs, '; '.join(errs)


@t.case('odd but valid headers: both read them, the same names, dtypes, shapes, bytes, metadata')
def valid():
    d = c.scratch()
    errs = []
    for name, content in VALID.items():
        p = write(d, name, content)
        theirs, md = package(p)
        r = c.ckpt('inspect', '--json', p)
        if r.rc != 0:
            errs.append('%s: ckpt inspect exits %d: %s' % (name, r.rc, r.err.strip()))
            continue
        ours = {x['path'][-1]: x for x in json.loads(r.out)['tensors']}
        if sorted(ours) != sorted(theirs):
            errs.append('%s: names %r, the package %r' % (name, sorted(ours), sorted(theirs)))
            continue
        for k, v in theirs.items():
            if (ours[k]['dtype'], ours[k]['shape']) != (c.dtype_name(v.dtype), list(v.shape)):
                errs.append('%s: %r is %s %s, the package %s %s' % (
                    name, k, ours[k]['dtype'], ours[k]['shape'], v.dtype, list(v.shape)))
        if not theirs:
            continue
        out = os.path.join(d, 'out.safetensors')
        r = c.ckpt('convert', p, out)
        if r.rc != 0:
            errs.append('%s: ckpt convert exits %d: %s' % (name, r.rc, r.err.strip()))
            continue
        back, md2 = package(out)
        for k, v in theirs.items():
            if k not in back or back[k].dtype != v.dtype or back[k].shape != v.shape or \
                    not torch.equal(back[k], v):
                errs.append('%s: %r differs after ckpt convert' % (name, k))
        for k, v in (md or {}).items():
            if (md2 or {}).get(k) != v:
                errs.append('%s: metadata %r not carried' % (name, k))
        os.unlink(out)
    assert not errs, '; '.join(errs)


@t.case('what ckpt refuses on purpose: the package reads it, ckpt refuses it (3), and scan says torch 2.x loads it')
def stricter():
    d = c.scratch()
    errs = []
    for name, content in STRICTER.items():
        p = write(d, name, content)
        try:
            package(p)
        except Exception as e:
            errs.append('%s: the package refuses it: %s' % (name, e))
        errs += ['%s: %s' % (name, e)
                 for e in c.refusal_errors(c.ckpt('inspect', p), 3)]
        r = c.ckpt('scan', '--json', p)
        v = json.loads(r.out)['files'][0]['torch_load']['2.6+']
        if not v['accepted'] or 'ckpt refuses it' not in (v.get('note') or ''):
            errs.append('%s: scan says torch 2.x %s (note %r)' % (
                name, 'accepts' if v['accepted'] else 'refuses', v.get('note')))
    assert not errs, '; '.join(errs)


@t.case('tests/bad/st_*.safetensors: ckpt refuses each; the package too, but where ckpt is stricter on purpose')
def bad_files():
    errs = []
    names = sorted(n for n in os.listdir(c.BAD) if n.startswith('st_') and n.endswith('.safetensors'))
    assert len(names) >= 25, names
    for n in names:
        p = os.path.join(c.BAD, n)
        errs += ['%s: %s' % (n, e) for e in c.refusal_errors(c.ckpt('inspect', p), 3)]
        try:
            package(p)
            read = True
        except Exception:
            read = False
        if read != (n in CKPT_STRICTER):
            errs.append('%s: the package %s it' % (n, 'reads' if read else 'refuses'))
    assert not errs, '; '.join(errs)


@t.case('a shard index naming a shard with a NUL: Python cannot open the name, ckpt refuses the index')
def nul_shard():
    d = c.scratch()
    with open(os.path.join(d, 'a.safetensors'), 'wb') as f:
        f.write(VALID['plain'])
    shard = 'a.safetensors\0.bin'
    idx = os.path.join(d, 'model.safetensors.index.json')
    with open(idx, 'w') as f:
        json.dump({'metadata': {'total_size': 4}, 'weight_map': {'t': shard}}, f)
    try:
        package(os.path.join(d, shard))
        raise AssertionError('the package opened %r' % shard)
    except (ValueError, TypeError, OSError):
        pass
    line = c.refused(3, 'inspect', idx)
    assert 'NUL' in line, line


@t.case('--max-header-bytes: over the default as the package refuses it, and a lower limit, each naming the option')
def limit():
    d = c.scratch()
    big = os.path.join(d, 'big.safetensors')
    with open(big, 'wb') as f:  # sparse: a length field of 100,000,001 and that many bytes
        f.write(struct.pack('<Q', 100000001) + b'{')
        f.truncate(8 + 100000001)
    try:
        package(big)
        raise AssertionError('the package reads a header of 100000001 bytes')
    except safetensors.SafetensorError as e:
        assert 'too large' in str(e), e
    line = c.refused(3, 'inspect', big)
    assert 'over the limit of 100000000 (--max-header-bytes)' in line, line
    os.unlink(big)
    p = write(d, 'plain', VALID['plain'])
    package(p)
    line = c.refused(3, 'inspect', '--max-header-bytes', '16', p)
    assert 'over the limit of 16 (--max-header-bytes)' in line, line
    c.ckpt_expect(0, 'inspect', '--max-header-bytes', '1K', p)


sys.exit(t.summary())
