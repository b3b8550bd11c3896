#!/usr/bin/env python3
"""Checkpoints whose names carry terminal controls (issue 26), for
tests/cli/terminal.sh.  Python's standard library only.

    python3 tests/bad/make_control_names.py DIR

writes into DIR:
  names.safetensors   seven float32 tensors under `module.`, named with an
                      OSC title sequence (ESC ] 0 ; ... BEL), a newline that
                      would forge an output line, CR, the C1 control CSI
                      (U+009B, bytes c2 9b), DEL, a tab, and a plain name
  other.safetensors   the same less two names, plus two of its own (one with
                      ESC [2J), one value changed, one a float64 and one of
                      another shape: every kind of line `diff` prints
  global.pkl          a protocol-4 pickle calling a global whose module and
                      name carry ESC, a newline and CSI (STACK_GLOBAL takes
                      any str): scan lists it, inspect refuses it naming it
  nul.safetensors     a tensor named `w\\0x` (JSON \\u0000): refused, never cut
  nul.pth             two keys `w\\0x` and `w\\0y` in a hand-made zip in
                      torch's layout: refused, never listed as `w` twice

A name that is not UTF-8 cannot be written in a safetensors header or a
pickle str (both readers refuse it, as safetensors and torch do); the test
makes those from names.pth (file and archive names).
"""
import json
import os
import struct
import sys
import zipfile

CONTROL_NAMES = [
    'module.title\x1b]0;pwned\x07',
    'module.nl\nforged -> line',
    'module.cr\rx',
    'module.csi\u009b2J',
    'module.del\x7fx',
    'module.tab\tx',
    'module.ok',
]


def safetensors(path, tensors):
    """TENSORS: [(name, dtype, shape, bytes)] in order."""
    header, data = {}, b''
    for name, dtype, shape, raw in tensors:
        header[name] = {'dtype': dtype, 'shape': shape,
                        'data_offsets': [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header).encode()  # controls as \uXXXX, as serde writes them
    text += b' ' * (-len(text) % 8)
    with open(path, 'wb') as f:
        f.write(struct.pack('<Q', len(text)) + text + data)


def f32(*v):
    return struct.pack('<%df' % len(v), *v)


def binunicode(s):
    b = s.encode('utf-8')
    return b'X' + struct.pack('<I', len(b)) + b


def tensor_pickle(keys):
    """A protocol-2 OrderedDict of float32 tensors of one element, as torch's
    zip format pickles them (persistent ids for storages)."""
    p = b'\x80\x02ccollections\nOrderedDict\nq\x00)Rq\x01('
    for i, k in enumerate(keys):
        p += binunicode(k)
        p += b'ctorch._utils\n_rebuild_tensor_v2\n('
        p += (b'(' + binunicode('storage') + b'ctorch\nFloatStorage\n'
              + binunicode(str(i)) + binunicode('cpu') + b'K\x01tQ')
        p += b'K\x00K\x01\x85K\x01\x85\x89ccollections\nOrderedDict\n)RtR'
    return p + b'u.'


def torch_zip(path, keys):
    prefix = os.path.splitext(os.path.basename(path))[0]
    with zipfile.ZipFile(path, 'w', zipfile.ZIP_STORED) as z:
        z.writestr(prefix + '/data.pkl', tensor_pickle(keys))
        z.writestr(prefix + '/byteorder', b'little')
        for i in range(len(keys)):
            z.writestr(prefix + '/data/%d' % i, f32(float(i)))
        z.writestr(prefix + '/version', b'3\n')


def main(out):
    os.makedirs(out, exist_ok=True)
    safetensors(os.path.join(out, 'names.safetensors'),
                [(n, 'F32', [2], f32(i, i)) for i, n in enumerate(CONTROL_NAMES)])
    other = [(n, 'F32', [2], f32(i, i)) for i, n in enumerate(CONTROL_NAMES)
             if 'del' not in n and 'tab' not in n]
    other[0] = (other[0][0], 'F32', [2], f32(0, 5))           # a value differs
    other[1] = (other[1][0], 'F64', [2], struct.pack('<2d', 1, 1))  # dtype
    other[2] = (other[2][0], 'F32', [1, 2], f32(2, 2))        # shape
    other += [('module.new\x1b[2J', 'F32', [2], f32(9, 9)),
              ('module.new\u0085line', 'F32', [2], f32(9, 9))]
    safetensors(os.path.join(out, 'other.safetensors'), other)

    g = (b'\x80\x04' + binunicode('evil\x1b]0;x\x07') + binunicode('run\nforged\u009b')
         + b'\x93)R.')
    with open(os.path.join(out, 'global.pkl'), 'wb') as f:
        f.write(g)

    safetensors(os.path.join(out, 'nul.safetensors'), [('w\x00x', 'F32', [1], f32(1))])
    torch_zip(os.path.join(out, 'nul.pth'), ['w\x00x', 'w\x00y'])


if __name__ == '__main__':
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
