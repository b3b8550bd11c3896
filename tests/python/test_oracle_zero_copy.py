"""Zero copy (issue 29): a tensor stored uncompressed and aligned is a view of the mapped
file, and nothing is read that was not asked for.

A 128 MiB safetensors file (32 float32 tensors of 4 MiB, written here with numpy) and the
same weights as an aligned, stored pth-zip (`ckpt convert`, which writes every record
stored on a 64-byte boundary).  For each:
  * safe_open + keys(): the process's anonymous memory (RssAnon) and mapped file pages
    (RssFile) grow by under 4 MiB: no tensor data is read;
  * get_tensor (numpy): its data lies in a mapping of that very file (/proc/self/maps),
    the array owns no memory (its .base chain ends in the mapping), and writing to it,
    where numpy allows that, never changes the file;
  * get_tensor (torch, where installed): data_ptr() inside a mapping of the file;
  * get_slice reads part of a tensor without anonymous memory for the rest;
  * reading every tensor once grows RssAnon by under 10% of the bytes read.
"""
import hashlib
import json
import mmap
import os
import struct
import subprocess
import sys

import numpy as np
import pytest

import ckpt_toolkit
from oracle_helpers import ckpt_binary, sayer

try:
    import torch
except Exception:
    torch = None

N_TENSORS, ELEMS = 32, 1 << 20           # 32 x 4 MiB of float32
MiB = 1 << 20
RAN_UNDER = ('torch %s' % torch.__version__) if torch is not None else 'no torch'


def status(field):
    with open('/proc/self/status') as f:
        for line in f:
            if line.startswith(field + ':'):
                return int(line.split()[1]) * 1024
    pytest.skip('no %s in /proc/self/status' % field)


def mappings_of(path):
    """[(start, end)] of this process's mappings of PATH."""
    real = os.path.realpath(path)
    out = []
    with open('/proc/self/maps') as f:
        for line in f:
            parts = line.split(None, 5)
            if len(parts) == 6 and parts[5].strip() == real:
                a, b = parts[0].split('-')
                out.append((int(a, 16), int(b, 16)))
    return out


def inside(addr, n, maps):
    return any(a <= addr and addr + n <= b for a, b in maps)


@pytest.fixture(scope='module')
def big_files(tmp_path_factory, pytestconfig):
    sayer(pytestconfig)('test_oracle_zero_copy: ran under %s, Python %s' % (
        RAN_UNDER, sys.version.split()[0]))
    d = tmp_path_factory.mktemp('zero_copy')
    st = str(d / 'big.safetensors')
    header, off = {}, 0
    for i in range(N_TENSORS):
        header['layer%02d.weight' % i] = {'dtype': 'F32', 'shape': [1024, ELEMS // 1024],
                                          'data_offsets': [off, off + 4 * ELEMS]}
        off += 4 * ELEMS
    h = json.dumps(header).encode()
    h += b' ' * (-(8 + len(h)) % 64)
    with open(st, 'wb') as f:
        f.write(struct.pack('<Q', len(h)) + h)
        for i in range(N_TENSORS):
            np.full(ELEMS, i + 0.5, dtype='<f4').tofile(f)
    pth = str(d / 'big.pth')
    r = subprocess.run([ckpt_binary(), 'convert', '--quiet', st, pth], capture_output=True, timeout=600)
    assert r.returncode == 0, r.stderr.decode()
    return {'safetensors': st, 'pth-zip': pth}


FORMATS = ['safetensors', 'pth-zip']


def sha(path):
    h = hashlib.sha256()
    with open(path, 'rb') as f:
        for b in iter(lambda: f.read(1 << 20), b''):
            h.update(b)
    return h.hexdigest()


# Memory is measured in a fresh interpreter: in this one, pages an earlier test freed stay
# with the allocator and would hide new reads.
CHILD = r"""
import json, sys
import numpy as np
import ckpt_toolkit
def status(field):
    with open('/proc/self/status') as f:
        for line in f:
            if line.startswith(field + ':'):
                return int(line.split()[1]) * 1024
path, what = sys.argv[1], sys.argv[2]
fw = 'pt' if what == 'torch_one' else 'np'
if fw == 'pt':
    import torch
m = {}
anon0, file0 = status('RssAnon'), status('RssFile')
with ckpt_toolkit.safe_open(path, framework=fw) as f:
    keys = list(f.keys())
    m['keys'] = len(keys)
    m['open_anon'], m['open_file'] = status('RssAnon') - anon0, status('RssFile') - file0
    if what == 'slice':
        part = f.get_slice(keys[11])[2:4]
        m['slice'] = [list(part.shape), float(part[0, 0])]
    elif what == 'torch_one':
        t = f.get_tensor(keys[9])
        m['sum'] = float(t.sum())
    elif what == 'every':
        total = 0
        for i, k in enumerate(keys):
            a = f.get_tensor(k)
            assert float(a[-1, -1]) == i + 0.5
            total += a.nbytes + 0 * int(a.view(np.uint32).max())  # touches every page
            del a
        m['total'] = total
    m['anon'] = status('RssAnon') - anon0
print(json.dumps(m))
"""


def in_child(path, what):
    r = subprocess.run([sys.executable, '-c', CHILD, path, what], capture_output=True, timeout=600)
    assert r.returncode == 0, r.stderr.decode()[-2000:]
    return json.loads(r.stdout.decode().strip().splitlines()[-1])


@pytest.mark.parametrize('fmt', FORMATS)
def test_open_and_list_reads_nothing(big_files, fmt):
    m = in_child(big_files[fmt], 'open')
    assert m['keys'] == N_TENSORS
    assert m['open_anon'] < 4 * MiB, 'RssAnon grew %.1f MiB on open + keys()' % (m['open_anon'] / MiB)
    assert m['open_file'] < 4 * MiB, 'RssFile grew %.1f MiB on open + keys()' % (m['open_file'] / MiB)


@pytest.mark.parametrize('fmt', FORMATS)
def test_get_slice_reads_part(big_files, fmt):
    m = in_child(big_files[fmt], 'slice')
    assert m['slice'] == [[2, ELEMS // 1024], 11.5]
    assert m['anon'] < 4 * MiB, 'RssAnon grew %.1f MiB for an 8 KiB slice' % (m['anon'] / MiB)


@pytest.mark.parametrize('fmt', FORMATS)
def test_every_tensor_once_little_anonymous_memory(big_files, fmt):
    m = in_child(big_files[fmt], 'every')
    total = m['total']
    assert total == N_TENSORS * 4 * ELEMS
    assert m['anon'] < total // 10, 'RssAnon grew %.1f MiB reading %.0f MiB' % (m['anon'] / MiB, total / MiB)


@pytest.mark.skipif(torch is None, reason='torch is not installed here')
@pytest.mark.parametrize('fmt', FORMATS)
def test_torch_one_tensor_little_anonymous_memory(big_files, fmt):
    m = in_child(big_files[fmt], 'torch_one')
    assert m['sum'] == 9.5 * ELEMS
    assert m['anon'] < 4 * MiB, 'RssAnon grew %.1f MiB opening the file and reading one 4 MiB tensor' % (
        m['anon'] / MiB)


@pytest.mark.parametrize('fmt', FORMATS)
def test_numpy_tensor_is_a_view_of_the_file(big_files, fmt):
    path = big_files[fmt]
    digest = sha(path)
    with ckpt_toolkit.safe_open(path, framework='np') as f:
        a = f.get_tensor('layer07.weight')
        maps = mappings_of(path)
        assert maps, 'the file is not mapped'
        addr = a.__array_interface__['data'][0]
        assert inside(addr, a.nbytes, maps), 'the array is not in a mapping of the file'
        assert not a.flags.owndata
        b, chain = a, []
        while getattr(b, 'base', None) is not None:
            b = b.base
            chain.append(type(b).__name__)
        assert isinstance(b, mmap.mmap) or (isinstance(b, memoryview) and isinstance(b.obj, mmap.mmap)), \
            'the .base chain ends in %s (%s), not the mapping' % (type(b).__name__, chain)
        assert float(a[3, 5]) == 7.5
        if a.flags.writeable:
            a[0, 0] = -1.0  # a private (copy-on-write) mapping: the file must not change
    assert sha(path) == digest, 'writing to the array changed the file'


@pytest.mark.skipif(torch is None, reason='torch is not installed here')
@pytest.mark.parametrize('fmt', FORMATS)
def test_torch_tensor_is_a_view_of_the_file(big_files, fmt):
    path = big_files[fmt]
    digest = sha(path)
    with ckpt_toolkit.safe_open(path, framework='pt') as f:
        t = f.get_tensor('layer09.weight')
        assert t.dtype == torch.float32 and tuple(t.shape) == (1024, ELEMS // 1024)
        assert inside(t.data_ptr(), t.numel() * 4, mappings_of(path)), \
            'the tensor is not in a mapping of the file'
        assert float(t.sum()) == 9.5 * ELEMS
        t.add_(1.0)  # a private mapping: the file must not change
    assert sha(path) == digest, 'writing to the tensor changed the file'
    with ckpt_toolkit.safe_open(path, framework='pt') as f:
        assert float(f.get_tensor('layer09.weight').sum()) == 9.5 * ELEMS
    loaded = ckpt_toolkit.load(path)
    assert inside(loaded['layer03.weight'].data_ptr(), 4 * ELEMS, mappings_of(path))
