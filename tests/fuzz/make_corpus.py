#!/usr/bin/env python3
"""Seed corpora and dictionaries for the fuzz targets (tests/fuzz/README.md).

    /usr/bin/python3 tests/fuzz/make_corpus.py      (from the top of the tree)

container:   small checkpoints (zip, legacy, safetensors) written by torch here,
             plus the small fixtures of tests/data and tests/bad
pickle:      the data.pkl records of those, and the hostile pickles of tests/bad
safetensors: headers of small safetensors files (without their framing),
             each after the 2-byte length of the data it covers
rename:      rule lines and keys
spec:        the model specs and the op-case specs (`make_corpus.py spec`: this
             one only)
tar:         the tar checkpoints of tests/data and tests/bad (torch <= 0.1's
             format), plus an empty archive (`make_corpus.py tar`: this one only)
scan:        the files ckpt scan judges in several readings: the evasions of
             tests/bad/scan, the hostile zips of tests/bad/zip, the tar checkpoints
             (`make_corpus.py scan`: this one only)
pickle also: legacy pickle chains whose FRAMEs hold STOP, MARK and memo ops, cross
             their ends or nest (tests/bad/frames.py and the streams of
             tests/interop/frame_chain.py: `make_corpus.py frames`: these only)
Needs torch (Debian's python3-torch).  Deterministic except the legacy
file's storage keys, which torch takes from C pointers."""
import collections
import glob
import io
import json
import os
import struct
import sys
import zipfile

import torch

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..'))
OUT = os.path.join(ROOT, 'tests', 'fuzz', 'corpus')
MAX = 64 * 1024


def put(target, name, data):
    d = os.path.join(OUT, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), 'wb') as f:
        f.write(data)


def saved(obj, legacy=False):
    b = io.BytesIO()
    torch.save(obj, b, _use_new_zipfile_serialization=not legacy)
    return b.getvalue()


def tar_corpus():
    """The tar checkpoints (made by tests/fixtures/make_tar_fixtures.py and
    tests/bad/make_bad_tar.py) and an archive of no members."""
    for path in sorted(glob.glob(os.path.join(ROOT, 'tests', 'data', 'tar', 'tar_*.pth')) +
                       glob.glob(os.path.join(ROOT, 'tests', 'bad', 'tar_*.pth'))):
        with open(path, 'rb') as f:
            put('tar', os.path.basename(os.path.dirname(path)) + '_' + os.path.basename(path),
                f.read())
    put('tar', 'empty_archive.tar', b'\0' * 1024)


def scan_corpus():
    """Files read several ways (the dispatch of ckpt scan): every one under 64 KiB."""
    for pat in ('scan/*.pkl', 'scan/*.pth', 'scan/*.safetensors', 'zip/*.pth'):
        for path in sorted(glob.glob(os.path.join(ROOT, 'tests', 'bad', pat))):
            if os.path.getsize(path) <= MAX:
                with open(path, 'rb') as f:
                    put('scan', os.path.basename(path), f.read())
    for path in sorted(glob.glob(os.path.join(ROOT, 'tests', 'data', 'tar', 'tar_*.pth'))):
        with open(path, 'rb') as f:
            put('scan', os.path.basename(path), f.read())
    # a zip whose first bytes also sniff as safetensors (its second reading; issue 26)
    sys.path.insert(0, os.path.join(ROOT, 'tests', 'bad'))
    import polyglots
    put('scan', 'zip_sniffs_safetensors.pth', polyglots.zip_first(full=False))


def main():
    torch.manual_seed(0)
    small = collections.OrderedDict([('module.w', torch.arange(6.0).view(2, 3)),
                                     ('module.b', torch.tensor([1.5, -2.0])),
                                     ('i', torch.tensor([3], dtype=torch.int64))])
    files = {
        'tiny_zip.pth': saved(small),
        'tiny_legacy.pth': saved(small, legacy=True),
        'view.pth': saved({'base': torch.arange(8.0), 'v': torch.arange(8.0)[2:5]}),
        'half.pth': saved({'h': torch.ones(3, dtype=torch.float16),
                           'bf': torch.ones(2, dtype=torch.bfloat16)}),
        'nested.pth': saved({'epoch': 1, 'sd': small, 'l': [1, 2.5, 'x', None, True]}),
    }
    for name in ('dtypes.pth', 'bn.pth'):
        with open(os.path.join(ROOT, 'tests', 'data', name), 'rb') as f:
            files[name] = f.read()
    # what torch 2.x writes: untyped storages of the new dtypes (v3)
    for path in sorted(glob.glob(os.path.join(ROOT, 'tests', 'data', 'torch2', '*.pth'))):
        with open(path, 'rb') as f:
            files['torch2_' + os.path.basename(path)] = f.read()
    for path in sorted(glob.glob(os.path.join(ROOT, 'tests', 'bad', '*'))):
        if os.path.isfile(path) and os.path.getsize(path) <= MAX and \
                not path.endswith(('.md', '.py')):
            with open(path, 'rb') as f:
                files['bad_' + os.path.basename(path)] = f.read()
    for name, data in sorted(files.items()):
        put('container', name, data)
        if data[:2] == b'PK':
            try:  # the hostile zips may not even open
                with zipfile.ZipFile(io.BytesIO(data)) as z:
                    for rec in z.namelist():
                        if rec.endswith('.pkl'):
                            put('pickle', name + '.' + os.path.basename(rec), z.read(rec))
            except Exception:
                pass
        elif data[:1] == b'\x80':
            put('pickle', name + '.stream', data[:MAX])

    # nesting checked as the VM builds (issue 26): TUPLE1s past the fuzzer's
    # depth limit (200), and dicts filled by SETITEMs from the innermost out
    put('pickle', 'nested_tuple1.pkl', b'\x80\x02)' + b'\x85' * 300 + b'.')
    put('pickle', 'nested_dicts.pkl',
        b'\x80\x02}' + b'X\x01\x00\x00\x00k}' * 250 + b's' * 250 + b'.')

    # safetensors headers, each after the 2-byte length of the data it covers
    # (fuzz_safetensors.c), tiling the data as safetensors wants
    def header(tensors, meta=None, text=None):
        h, off = {}, 0
        for n, (dt, shape, nbytes) in tensors.items():
            h[n] = {'dtype': dt, 'shape': shape, 'data_offsets': [off, off + nbytes]}
            off += nbytes
        if meta is not None:
            h['__metadata__'] = meta
        return struct.pack('<H', off) + (
            text or json.dumps(h, separators=(',', ':'))).encode()
    put('safetensors', 'one.json', header({'w': ('F32', [2, 3], 24)}))
    put('safetensors', 'many.json', header({'a': ('F16', [4], 8), 'b': ('BF16', [2, 2], 8),
                                            'c': ('I64', [], 8), 'd': ('BOOL', [3], 3)},
                                           {'format': 'pt'}))
    put('safetensors', 'empty.json', header({}, text='{}'))
    put('safetensors', 'f8.json', header({'x': ('F8_E4M3', [16], 16)}))
    # the sub-byte dtypes: F4 counts 4-bit values, F6 6-bit ones (packed)
    put('safetensors', 'sub_byte.json', header({'e': ('F8_E8M0', [2, 3], 6), 'f': ('F4', [2, 4], 4),
                                                'g': ('F6_E2M3', [4, 1], 3),
                                                'h': ('F6_E3M2', [0, 5], 0)}))
    # what safetensors 0.8 reads though it looks odd (issue 26): spaces around
    # and inside, null metadata, empty tensors, unknown fields nested, escapes
    put('safetensors', 'odd.json', header({'w': ('U8', [4], 4)}, text=(
        ' \n{ "__metadata__" : null , "\\u0077" : {"x":[1,-2.5e3,{"y":[true,false,null]}],'
        '"data_offsets":[0,4],"shape":[ 4 ],"dtype":"U8"},'
        '"z":{"dtype":"F32","shape":[0,3],"data_offsets":[4,4]},'
        '"\\ud83d\\ude00\\/":{"dtype":"U8","shape":[0],"data_offsets":[4,4]}} \t')))

    rules = [b's/^module\\.//\nmodule.\nmodule.n.1.weight\nn.2.bias\n_orig_mod.x',
             b's|(\\w+)\\.(\\d+)|${2}_$1|g\nx\nencoder.0.weight\ndecoder.10.bias',
             b's/a*/b/gi\n\nAAA\n',
             b's#^partitions\\.0\\.0\\.#encoder.#\npartitions.\npartitions.0.0.conv1.weight']
    for i, r in enumerate(rules):
        put('rename', 'rules%d' % i, r)

    spec_corpus()


def spec_corpus():
    """The model specs and the op-case specs (the transformer ops' among
    them)."""
    for path in sorted(glob.glob(os.path.join(ROOT, 'models', '*.json')) +
                       glob.glob(os.path.join(ROOT, 'tests', 'data', 'ops', '*.json'))):
        with open(path, 'rb') as f:
            data = f.read()
        if len(data) <= MAX:
            put('spec', os.path.basename(path), data)
    # a spec of the transformer ops that binds to tests/data/mlp.pth (the
    # target's weights), so that the fuzzer starts from one that runs
    N = lambda op, ins, out, attrs=None, params=None: dict(  # noqa: E731
        [('op', op), ('inputs', ins), ('output', out)] +
        ([('attrs', attrs)] if attrs else []) + ([('params', params)] if params else []))
    n1 = {'weight': 'n.1.weight', 'bias': 'n.1.bias'}
    spec = collections.OrderedDict([
        ('name', 'transformer_ops'),
        ('inputs', [{'name': 'ids', 'shape': [-1, 5], 'dtype': 'int64'}]),
        ('nodes', [
            N('embedding', ['ids'], 'e', params={'weight': 'n.1.weight'}),
            N('linear', ['e'], 'h', params=n1),
            N('gelu', ['h'], 'g', {'approximate': 'tanh'}),
            N('layer_norm', ['g'], 'n', {'normalized_shape': [128]}),
            N('unsqueeze', ['n'], 'q', {'dim': 1}),
            N('scaled_dot_product_attention', ['q', 'q', 'q'], 'a', {'is_causal': True}),
            N('squeeze', ['a'], 'a2', {'dim': 1}),
            N('linear', ['a2'], 'o', params={'weight': 'n.3.weight', 'bias': 'n.3.bias'}),
            N('parameter', [], 'b', params={'weight': 'n.3.bias'}),
            N('constant', [], 'c', {'shape': [2], 'values': [1.5, '-inf']}),
            N('slice', ['o'], 's', {'dim': 1, 'start': 1, 'end': 9223372036854775807,
                                    'step': 2}),
            N('mul', ['s', 'b'], 'm0'),
            N('rms_norm', ['o'], 'r', {'normalized_shape': [10], 'eps': 1e-6}),
            N('add', ['r', 'b'], 'r2'),
            N('transpose', ['r2'], 't', {'dim0': 1, 'dim1': 2}),
            N('matmul', ['r2', 't'], 'mm'),
            N('mean', ['mm'], 'mn', {'dim': [0, 2], 'keepdim': True}),
            N('select', ['mn'], 'sel', {'dim': 1, 'index': -1}),
            N('expand', ['sel'], 'x1', {'size': [3, 1, 1]}),
            N('silu', ['x1'], 'y', None),
            N('div', ['m0'], 'y2', {'other': 2.0}),
            N('sub', ['c', 'c'], 'y3'),
        ]),
        ('outputs', ['y', 'y2', 'y3']),
    ])
    put('spec', 'transformer_ops.json', json.dumps(spec, indent=1).encode())
    # a tie: copy.weight is not in mlp.pth and takes n.3.weight's tensor
    tied = collections.OrderedDict([
        ('name', 'tied'),
        ('inputs', [{'name': 'x', 'shape': [-1, 784]}]),
        ('nodes', [
            N('linear', ['x'], 'h', params=n1),
            N('relu', ['h'], 'r'),
            N('linear', ['r'], 'y', params={'weight': 'n.3.weight', 'bias': 'n.3.bias'}),
            N('parameter', [], 'w', params={'weight': 'copy.weight'}),
        ]),
        ('outputs', ['y', 'w']),
        ('tied', {'copy.weight': 'n.3.weight'}),
    ])
    put('spec', 'tied.json', json.dumps(tied, indent=1).encode())


def frames_corpus():
    """Pickle streams for the framing model (fuzz_pickle reads them back to back)."""
    import random
    sys.path.insert(0, os.path.join(ROOT, 'tests', 'bad'))
    sys.path.insert(0, os.path.join(ROOT, 'tests', 'interop'))
    import bypasses
    import frame_chain
    import frames
    put('pickle', 'frames_stop_in_small_frame.stream',
        frames.stop_in_small_frame(bypasses.PAYLOAD, at=600, size=300))
    put('pickle', 'frames_stop_in_frame_300.stream', frames.stop_in_frame(bypasses.PAYLOAD, 300))
    put('pickle', 'frames_magic_by_call.stream', frames.magic_by_call(bypasses.PAYLOAD))
    put('pickle', 'frames_protocol_float.stream', frames.protocol_float(bypasses.PAYLOAD))
    r = random.Random(26)
    n = 0
    while n < 12:
        data = frame_chain.stream(r)
        if len(data) <= 4096:
            put('pickle', 'frames_chain_%02d.stream' % n, data)
            n += 1


if __name__ == '__main__':
    if sys.argv[1:] == ['frames']:
        frames_corpus()
    elif sys.argv[1:] == ['tar']:
        tar_corpus()
    elif sys.argv[1:] == ['scan']:
        scan_corpus()
    elif sys.argv[1:] == ['spec']:
        spec_corpus()
    else:
        main()
        tar_corpus()
        scan_corpus()
        frames_corpus()
