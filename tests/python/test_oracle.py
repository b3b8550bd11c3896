"""The package reads what torch reads (issue 29): every fixture of the repository
through ckpt_toolkit, against torch and against the ckpt command.

Fixtures: tests/data (every file but a DeepSpeed folder's, the Hugging Face folders and shard indexes),
tests/fixtures/distributed (DCP and DeepSpeed folders, per-rank FSDP files and the
true state dicts beside them), the real-file corpus of tests/realfiles where
fetch.py put it (skipped when absent), and the good folders the plain-Python
generators of tests/bad write at test time (DCP; DeepSpeed with EXPECTED.pth).

Without torch, `ckpt inspect --json --stats` and `ckpt extract --dry-run` are the
oracle: load()/safe_open() give the state dict extract takes (select= each one
extract --select takes), with inspect's names, dtypes and shapes and the CRC-32 of
every tensor's elements; get_slice equals indexing the whole tensor; .safetensors
files read as the safetensors package reads them, where it is installed.
With torch:
  * torch_load(f) is compared object for object with
    torch.load(f, weights_only=True) (types, dict order, OrderedDict _metadata,
    Parameters and requires_grad, tensor bytes, shape, stride, storage offset,
    which tensors share memory and at what distance); where weights-only torch
    refuses one of OUR fixtures (tests/data, tests/fixtures: trusted, made by our
    scripts), with torch.load(weights_only=False), a pickled module standing for its
    state_dict(); real files torch refuses are never given to torch.load: they are
    compared with the inert stand-in unpickler of tests/interop/_standin.py;
  * torch_load as torch.load is called: a Path, a BytesIO, a stream not at its
    start, map_location as a device or a dict, none for a CUDA file without CUDA;
  * load(f, framework="pt") against the same object's state dict; DCP folders
    against dcp_to_torch_save's output, DCP and DeepSpeed folders against the true
    state dict their run saved (*.live.pth).
A file the CLI refuses (exit 3) must raise CheckpointError with that status.
Each module prints the torch it ran under and how many files it compared with what.
"""
import argparse
import collections
import json
import os
import re
import subprocess
import sys
import warnings
import zlib

import numpy as np
import pytest

import ckpt_toolkit
from oracle_helpers import ckpt_binary, sayer
from ckpt_toolkit import CheckpointError

try:
    import torch
except Exception:  # a numpy-only venv: the torch comparisons are skipped
    torch = None
try:
    import ml_dtypes  # noqa: F401
    HAVE_ML_DTYPES = True
except Exception:
    HAVE_ML_DTYPES = False

HERE = os.path.dirname(os.path.abspath(__file__))
SRCDIR = os.environ.get('srcdir') or os.path.normpath(os.path.join(HERE, '..', '..'))
DATA = os.path.join(SRCDIR, 'tests', 'data')
DIST = os.path.join(SRCDIR, 'tests', 'fixtures', 'distributed')
BAD = os.path.join(SRCDIR, 'tests', 'bad')
os.environ.setdefault('CKPT_CUDA_DEVICES', '0')
if torch is not None:
    # the modules our whole-model fixtures were pickled from (weights_only=False on ours)
    sys.path.insert(0, os.path.join(SRCDIR, 'tests', 'fixtures'))
    sys.path.insert(0, os.path.join(SRCDIR, 'tests', 'realfiles'))
    TORCH_VERSION = torch.__version__
else:
    TORCH_VERSION = None
RAN_UNDER = 'torch %s' % TORCH_VERSION if torch is not None else 'no torch (numpy %s)' % np.__version__


CKPT = ckpt_binary()
COUNT = collections.Counter()  # what was compared with what, printed at the end


@pytest.fixture(scope='module', autouse=True)
def ran_under(pytestconfig):
    say = sayer(pytestconfig)
    say('test_oracle: ran under %s, Python %s, ckpt %s' % (
        RAN_UNDER, sys.version.split()[0], CKPT))
    yield
    say('test_oracle (%s): %s' % (RAN_UNDER, ', '.join(
        '%s %d' % kv for kv in sorted(COUNT.items())) or 'nothing compared'))


# ---------------------------------------------------------------------------------------
# the fixtures

def realfiles_dir():
    d = os.environ.get('CKPT_REALFILES')
    if not d:
        base = os.environ.get('XDG_CACHE_HOME') or os.path.join(os.path.expanduser('~'), '.cache')
        d = os.path.join(base, 'ckpt-realfiles')
    return os.path.join(d, 'files')


def fixtures():
    """(id, path, origin): origin 'ours' (made by the repository's scripts: trusted
    with weights_only=False), 'real' (the corpus: other people's files), 'dist'
    (a DCP / DeepSpeed folder: its true state dict beside it)."""
    out = []
    skip_ext = ('.json', '.md', '.txt', '.py')
    for root, dirs, files in os.walk(DATA):
        dirs.sort()
        rel = os.path.relpath(root, SRCDIR)
        if os.path.exists(os.path.join(root, 'latest')):
            # a DeepSpeed folder (llama_layouts/zero3): its rank files pickle
            # DeepSpeed's own types, which torch_load does not build; the
            # folder is read whole by ckpt (interop/verify_layouts.py)
            dirs[:] = []
            continue
        if os.path.exists(os.path.join(root, 'config.json')):
            out.append((rel, root, 'ours'))  # a Hugging Face folder as a whole
        for f in sorted(files):
            p = os.path.join(root, f)
            if f.endswith('.index.json'):
                out.append((os.path.join(rel, f), p, 'ours'))
            elif not f.endswith(skip_ext) and f != 'MANIFEST.json':
                out.append((os.path.join(rel, f), p, 'ours'))
    with open(os.path.join(DIST, 'MANIFEST.json')) as f:
        man = json.load(f)
    for case in man['cases']:
        p = os.path.join(DIST, case['path'])
        rel = os.path.relpath(p, SRCDIR)
        if case['kind'] == 'per-rank':
            for f in sorted(os.listdir(p)):
                out.append((os.path.join(rel, f), os.path.join(p, f), 'ours'))
        else:
            out.append((rel, p, 'dist'))
        for k in ('live', 'reference'):
            if case.get(k):
                out.append((os.path.relpath(os.path.join(DIST, case[k]), SRCDIR),
                            os.path.join(DIST, case[k]), 'ours'))
        if case.get('module'):
            out.append((os.path.relpath(os.path.join(DIST, case['module']), SRCDIR),
                        os.path.join(DIST, case['module']), 'ours'))
    rf = realfiles_dir()
    if os.path.isdir(rf):
        for f in sorted(os.listdir(rf)):
            out.append(('realfiles/' + f, os.path.join(rf, f), 'real'))
    seen, uniq = set(), []
    for e in out:
        if e[0] not in seen:
            seen.add(e[0])
            uniq.append(e)
    return uniq


FIXTURES = fixtures()
DIST_CASES = {}
with open(os.path.join(DIST, 'MANIFEST.json')) as _f:
    for _c in json.load(_f)['cases']:
        DIST_CASES[os.path.join(DIST, _c['path'])] = _c


def test_realfiles_present_or_said():
    """The corpus is optional (./bootstrap --deps fetches it); say when it is absent."""
    if not os.path.isdir(realfiles_dir()):
        pytest.skip('real-file corpus not fetched (tests/realfiles/fetch.py): %s' % realfiles_dir())
    with open(os.path.join(SRCDIR, 'tests', 'realfiles', 'MANIFEST.json')) as f:
        ids = {e['id'] for e in json.load(f)['files']}
    assert ids <= set(os.listdir(realfiles_dir())), 'corpus incomplete: run fetch.py'


# ---------------------------------------------------------------------------------------
# the CLI's view

_CLI = {}


def run_ckpt(*args):
    p = subprocess.run([CKPT] + [str(a) for a in args], capture_output=True, timeout=300)
    return p.returncode, p.stdout.decode(), p.stderr.decode(errors='replace')


def cli_view(path, select=None):
    """(rc, inspect document, state dict path extract takes or None, extract's rc)."""
    key = (path, select)
    if key in _CLI:
        return _CLI[key]
    rc, out, err = run_ckpt('inspect', '--json', '--stats', path)
    doc = json.loads(out)
    sd, xrc = None, None
    if rc == 0:
        args = ['extract', '--dry-run'] + (['--select', select] if select else []) + [path, '/nonexistent/x.pth']
        xrc, xout, xerr = run_ckpt(*args)
        if xrc == 0:
            # 'extracted the state dict 'a/b': N tensors' (the root: no name); with
            # --select: 'extracted 'a/b': N tensors'
            m = re.search(r"extracted (?:the state dict )?'(.*)': ", xout)
            sd = m.group(1).split('/') if m else []
    _CLI[key] = (rc, doc, sd, xrc, err)
    return _CLI[key]


def sd_tensors(doc, sd):
    """{name: inspect's tensor entry} for the state dict at path SD (keys as strings)."""
    out = collections.OrderedDict()
    n = len(sd)
    for t in doc['tensors']:
        p = t['path']
        if len(p) == n + 1 and [str(x) for x in p[:n]] == sd:
            out[str(p[n])] = t
    return out


def crc_np(a):
    """The CRC-32 of A's elements in C order, little-endian (as inspect --stats)."""
    a = np.ascontiguousarray(a)
    if a.dtype.byteorder == '>':
        a = a.astype(a.dtype.newbyteorder('<'))
    return '%08x' % (zlib.crc32(a.tobytes()) & 0xffffffff)


def raw_bytes(t):
    if t.numel() == 0:
        return b''
    return t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def crc_pt(t):
    return '%08x' % (zlib.crc32(raw_bytes(t)) & 0xffffffff)


NEEDS_ML_DTYPES = re.compile(r'^(bfloat16|float8_.*)$')
NUMPY_HAS = {'float16', 'float32', 'float64', 'int8', 'int16', 'int32', 'int64', 'uint8',
             'uint16', 'uint32', 'uint64', 'bool', 'complex64', 'complex128'}


def check_refused(fn, rc, what):
    with pytest.raises(CheckpointError) as e:
        fn()
    assert e.value.exit_status == rc, '%s: exit_status %r, the CLI exited %d' % (
        what, e.value.exit_status, rc)
    assert e.value.message


# ---------------------------------------------------------------------------------------
# load / safe_open against the CLI (no torch needed)

@pytest.mark.parametrize('fid,path,origin', FIXTURES, ids=[f[0] for f in FIXTURES])
def test_numpy_view_equals_cli(fid, path, origin):
    rc, doc, sd, xrc, err = cli_view(path)
    if rc != 0:
        check_refused(lambda: ckpt_toolkit.load(path, framework='np'), rc, 'load')
        check_refused(lambda: ckpt_toolkit.safe_open(path, framework='np').__enter__().keys(),
                      rc, 'safe_open')
        COUNT['refused like the CLI'] += 1
        return
    if xrc != 0:
        # no state dict (extract exits 3), or several models' (a GAN: extract asks for
        # --select, exit 2): so does load; then each candidate by select=
        check_refused(lambda: ckpt_toolkit.load(path, framework='np'), xrc, 'load without select')
        cands = [s for s in doc['state_dicts'] if s.get('model')] or doc['state_dicts']
        if xrc != 2:
            COUNT['no state dict, like extract'] += 1
            return
        assert cands
        for s in cands:
            sel = '/'.join(str(x) for x in s['path'])
            compare_np_with_cli(path, sd_tensors(doc, [str(x) for x in s['path']]), sel)
        return
    compare_np_with_cli(path, sd_tensors(doc, sd), None)


def compare_np_with_cli(path, want, select):
    errs = []
    with ckpt_toolkit.safe_open(path, framework='np', select=select) as f:
        keys = list(f.keys())
        if keys != list(want):
            errs.append('keys %r, inspect %r' % (keys[:8], list(want)[:8]))
        for k, t in want.items():
            if k not in keys:
                continue
            if t.get('kind', 'dense') != 'dense':
                continue  # quantized, sparse, meta: numpy has no such array; torch checks them
            if NEEDS_ML_DTYPES.match(t['dtype']) and not HAVE_ML_DTYPES:
                with pytest.raises(Exception, match='ml_dtypes'):
                    f.get_tensor(k)
                continue
            if t['dtype'] not in NUMPY_HAS and not NEEDS_ML_DTYPES.match(t['dtype']):
                with pytest.raises(CheckpointError):  # complex32, float4_e2m1fn_x2: no numpy dtype
                    f.get_tensor(k)
                continue
            a = f.get_tensor(k)
            if not isinstance(a, np.ndarray):
                errs.append('%s: %s, not a numpy array' % (k, type(a).__name__))
                continue
            if a.dtype.name != t['dtype']:
                errs.append('%s: dtype %s, inspect %s' % (k, a.dtype.name, t['dtype']))
            if list(a.shape) != t['shape']:
                errs.append('%s: shape %s, inspect %s' % (k, list(a.shape), t['shape']))
            if 'crc32' in t and crc_np(a) != t['crc32']:
                errs.append('%s: crc32 %s, inspect --stats %s' % (k, crc_np(a), t['crc32']))
    assert not errs, '\n'.join(errs[:20])
    if not HAVE_ML_DTYPES and any(NEEDS_ML_DTYPES.match(t['dtype']) for t in want.values()):
        with pytest.raises(Exception, match='ml_dtypes'):
            ckpt_toolkit.load(path, framework='np', select=select)
    elif any(t.get('kind', 'dense') != 'dense' or (t['dtype'] not in NUMPY_HAS and
                                                   not NEEDS_ML_DTYPES.match(t['dtype']))
             for t in want.values()):
        # a quantized, sparse or meta tensor, or a dtype numpy lacks (float4_e2m1fn_x2): no
        # numpy array for it, and load(framework='np') says so
        with pytest.raises(CheckpointError):
            ckpt_toolkit.load(path, framework='np', select=select)
    else:
        d = ckpt_toolkit.load(path, framework='np', select=select)
        assert list(d) == list(want)
        for k, t in want.items():
            if t.get('kind', 'dense') == 'dense' and 'crc32' in t and isinstance(d[k], np.ndarray):
                assert crc_np(d[k]) == t['crc32'], k
    COUNT['files vs ckpt inspect'] += 1


@pytest.mark.parametrize('fid,path,origin', FIXTURES, ids=[f[0] for f in FIXTURES])
def test_select_every_state_dict(fid, path, origin):
    """select= names each state dict inspect lists (an optimizer's too), as
    `ckpt extract --select` does: the same tensors, or the same refusal."""
    rc, doc, sd, xrc, err = cli_view(path)
    if rc != 0:
        pytest.skip('the CLI refuses it')
    n = 0
    for s in doc['state_dicts'][:8]:
        sel = '/'.join(str(x) for x in s['path'])
        if not sel:
            continue
        _, _, ssd, sxrc, serr = cli_view(path, sel)
        if sxrc != 0:
            check_refused(lambda: ckpt_toolkit.load(path, framework='np', select=sel), sxrc,
                          'load(select=%r)' % sel)
        else:
            compare_np_with_cli(path, sd_tensors(doc, ssd), sel)
        n += 1
    COUNT['select= vs extract --select'] += n


# ---------------------------------------------------------------------------------------
# torch

needs_torch = pytest.mark.skipif(torch is None, reason='torch is not installed here')


def torch_reference(path, origin):
    """(object, how) torch gives for PATH, or (None, why not)."""
    if os.path.isdir(path) or path.endswith(('.safetensors', '.index.json')):
        return None, 'not a torch.load file'
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        try:
            return torch.load(path, map_location='cpu', weights_only=True), 'weights_only=True'
        except Exception as e:
            first = '%s: %s' % (type(e).__name__, str(e).splitlines()[0] if str(e) else '')
        if origin != 'ours':
            return None, 'weights-only torch.load refuses it (%s); not our file' % first
        try:
            return torch.load(path, map_location='cpu', weights_only=False), 'weights_only=False'
        except Exception as e:
            return None, 'torch.load refuses it: %s / %s' % (first, str(e).splitlines()[0][:200])


def local(t):
    """A rank's own part of a DTensor or ShardedTensor (as ckpt reads a per-rank file: the
    shard as a plain tensor; no shard here: an empty tensor), else T."""
    name = type(t).__name__
    if name == 'DTensor':
        return t.to_local()
    if name == 'ShardedTensor':
        shards = t.local_shards()
        return shards[0].tensor if shards else torch.empty(0, dtype=t.dtype, device='meta')
    return t


def storage_id(t):
    if hasattr(t, 'untyped_storage'):
        return t.untyped_storage().data_ptr()
    return t.storage().data_ptr()


# Where torch is demonstrably wrong, ckpt gives the true values (doc/design.md): torch 2.x
# reads the uint16 storage of a big-endian file without swapping its bytes
# (doc/torch2-format.md), so there ours is torch's with each element's bytes swapped.
TORCH_UNSWAPPED = {('bigendian.pth', 'u16')}


def swapped(b, size):
    return b''.join(b[i:i + size][::-1] for i in range(0, len(b), size))


class Compare:
    """Object for object, as torch_load must match torch.load."""

    def __init__(self, file='', ignore_order=False):
        self.file = os.path.basename(file)
        self.ignore_order = ignore_order
        self.errs = []
        self.offsets = []  # (where, ours, torch): storage offsets that differ
        self.pairs = []  # (ours, theirs) tensors, for storage sharing

    def err(self, where, msg):
        self.errs.append('%s: %s' % ('/'.join(map(str, where)) or '(root)', msg))

    def __call__(self, ours, ref, where=(), lenient=False, depth=0):
        if depth > 200:
            return
        if isinstance(ref, torch.nn.Module):
            # a pickled module is returned as its state dict (doc/design.md)
            ref, lenient = ref.state_dict(), True
        if isinstance(ref, torch.Tensor):
            if local(ref) is not ref:
                return self.tensor(ours, local(ref), where, True)
            return self.tensor(ours, ref, where, lenient)
        if type(ours) is not type(ref) and not (lenient and isinstance(ours, dict) and isinstance(ref, dict)):
            return self.err(where, 'type %s, torch %s' % (type(ours).__name__, type(ref).__name__))
        if isinstance(ref, dict):
            if self.ignore_order and set(ours) == set(ref):
                ours = collections.OrderedDict((k, ours[k]) for k in ref)
            if list(ours.keys()) != list(ref.keys()):
                return self.err(where, 'keys %r, torch %r' % (list(ours)[:6], list(ref)[:6]))
            for k in ref:
                self(ours[k], ref[k], where + (k,), lenient, depth + 1)
            if not lenient and getattr(ref, '_metadata', None) != getattr(ours, '_metadata', None):
                self.err(where, '_metadata %r, torch %r' % (getattr(ours, '_metadata', None),
                                                            getattr(ref, '_metadata', None)))
            if isinstance(ref, collections.defaultdict) and ref.default_factory != ours.default_factory:
                self.err(where, 'default_factory differs')
        elif isinstance(ref, (list, tuple)) and not hasattr(ref, '_fields'):
            if len(ours) != len(ref):
                return self.err(where, 'length %d, torch %d' % (len(ours), len(ref)))
            for i, (a, b) in enumerate(zip(ours, ref)):
                self(a, b, where + (i,), lenient, depth + 1)
        elif isinstance(ref, argparse.Namespace):
            self(vars(ours), vars(ref), where + ('vars()',), lenient, depth + 1)
        elif isinstance(ref, np.ndarray):
            if ours.dtype != ref.dtype or ours.shape != ref.shape or ours.tobytes() != ref.tobytes():
                self.err(where, 'numpy array %s%s, torch %s%s' % (ours.dtype, ours.shape, ref.dtype, ref.shape))
        elif isinstance(ref, float):
            if repr(ours) != repr(ref):
                self.err(where, '%r, torch %r' % (ours, ref))
        elif isinstance(ref, np.generic):
            if ours.dtype != ref.dtype or ours.tobytes() != ref.tobytes():
                self.err(where, '%r, torch %r' % (ours, ref))
        else:
            try:
                same = ours == ref
                same = bool(same)
            except Exception as e:
                same = False
                self.err(where, 'cannot compare %s: %s' % (type(ref).__name__, e))
                return
            if not same:
                self.err(where, '%r, torch %r' % (ours, ref))

    def tensor(self, ours, ref, where, lenient):
        if not isinstance(ours, torch.Tensor):
            return self.err(where, '%s, torch a tensor' % type(ours).__name__)
        if not lenient:
            if type(ours) is not type(ref):
                self.err(where, 'type %s, torch %s' % (type(ours).__name__, type(ref).__name__))
            if ours.requires_grad != ref.requires_grad:
                self.err(where, 'requires_grad %s, torch %s' % (ours.requires_grad, ref.requires_grad))
        if ours.dtype != ref.dtype or tuple(ours.shape) != tuple(ref.shape):
            return self.err(where, '%s%s, torch %s%s' % (ours.dtype, tuple(ours.shape),
                                                         ref.dtype, tuple(ref.shape)))
        if ref.device.type == 'meta' and ours.numel() == 0 and ref.numel() == 0:
            return  # a rank without a shard of it: empty either way
        if ours.layout != ref.layout or ours.is_quantized != ref.is_quantized:
            return self.err(where, 'layout %s, torch %s' % (ours.layout, ref.layout))
        if ref.device.type == 'meta':
            if ours.device.type != 'meta':
                self.err(where, 'device %s, torch meta' % ours.device)
            return
        if ref.is_quantized:
            if ours.qscheme() != ref.qscheme():
                return self.err(where, 'qscheme differs')
            if ref.qscheme() in (torch.per_tensor_affine, torch.per_tensor_symmetric):
                if (ours.q_scale(), ours.q_zero_point()) != (ref.q_scale(), ref.q_zero_point()):
                    self.err(where, 'scale/zero point differ')
            else:
                if not (torch.equal(ours.q_per_channel_scales(), ref.q_per_channel_scales()) and
                        torch.equal(ours.q_per_channel_zero_points(), ref.q_per_channel_zero_points()) and
                        ours.q_per_channel_axis() == ref.q_per_channel_axis()):
                    self.err(where, 'per-channel parameters differ')
            if raw_bytes(ours.int_repr()) != raw_bytes(ref.int_repr()):
                self.err(where, 'values differ')
            return
        if ref.layout == torch.sparse_coo:
            if (raw_bytes(ours._indices()) != raw_bytes(ref._indices()) or
                    raw_bytes(ours._values()) != raw_bytes(ref._values())):
                self.err(where, 'sparse indices/values differ')
            return
        if ref.layout != torch.strided:
            for fn in ('crow_indices', 'col_indices', 'ccol_indices', 'row_indices', 'values'):
                try:
                    b = getattr(ref, fn)()
                except Exception:
                    continue
                if raw_bytes(getattr(ours, fn)()) != raw_bytes(b):
                    self.err(where, '%s differ' % fn)
            return
        want = raw_bytes(ref)
        if (self.file, '/'.join(map(str, where))) in TORCH_UNSWAPPED:
            want = swapped(want, ref.element_size())
        if raw_bytes(ours) != want:
            self.err(where, 'values differ (crc32 %s, torch %s)' % (crc_pt(ours), crc_pt(ref)))
        if not lenient:
            if ours.stride() != ref.stride():
                self.err(where, 'stride %s, torch %s' % (ours.stride(), ref.stride()))
            if ours.storage_offset() != ref.storage_offset():
                self.offsets.append((where, ours.storage_offset(), ref.storage_offset()))
            self.pairs.append((where, ours, ref))

    def sharing(self):
        """Tensors share memory in ours exactly where they do in torch's, at the same
        distances (data_ptr differences); a storage offset may differ only where torch's
        storage is itself a slice of another's (torch 0.1's storage views), the memory being
        the same."""
        ps = [(w, a, b) for w, a, b in self.pairs if b.numel() and a.numel()]

        def extent(t):
            u = t.untyped_storage() if hasattr(t, 'untyped_storage') else t.storage()._storage
            return u.data_ptr(), u.data_ptr() + u.nbytes()

        def relations(k):
            rel = {}
            for i in range(len(ps)):
                a0, a1 = extent(ps[i][k])
                for j in range(i + 1, len(ps)):
                    b0, b1 = extent(ps[j][k])
                    if a0 < b1 and b0 < a1:
                        rel[(i, j)] = ps[j][k].data_ptr() - ps[i][k].data_ptr()
            return rel
        got, want = relations(1), relations(2)
        if got != want:
            name = lambda ij: '%s~%s' % tuple('/'.join(map(str, ps[x][0])) for x in ij)
            self.errs.append('memory shared: %s, torch %s' % (
                sorted(name(ij) for ij in got)[:6], sorted(name(ij) for ij in want)[:6]))
        sliced = set()
        for i, (w, a, b) in enumerate(ps):
            s0, s1 = extent(b)
            if any(j != i and extent(ps[j][2])[0] < s0 < extent(ps[j][2])[1] for j in range(len(ps))):
                sliced.add(w)
        for w, o, r in self.offsets:
            if w not in sliced:
                self.err(w, 'storage offset %d, torch %d' % (o, r))


@needs_torch
@pytest.mark.parametrize('fid,path,origin', FIXTURES, ids=[f[0] for f in FIXTURES])
def test_torch_load_equals_torch(fid, path, origin):
    rc, doc, sd, xrc, err = cli_view(path)
    if rc != 0:
        check_refused(lambda: ckpt_toolkit.torch_load(path, map_location='cpu'), rc, 'torch_load')
        return
    ref, how = torch_reference(path, origin)
    if ref is None:
        pytest.skip(how)
    ours = ckpt_toolkit.torch_load(path, map_location='cpu')
    cmp = Compare(path)
    cmp(ours, ref)
    cmp.sharing()
    assert not cmp.errs, 'torch.load(%s) differs:\n%s' % (how, '\n'.join(cmp.errs[:20]))
    # a file object too, as torch.load takes one
    with open(path, 'rb') as f:
        again = ckpt_toolkit.torch_load(f, map_location='cpu')
    cmp2 = Compare(path)
    cmp2(again, ref)
    assert not cmp2.errs, 'torch_load(file object) differs:\n%s' % '\n'.join(cmp2.errs[:20])
    if how == 'weights_only=True' and all(t.get('device', 'cpu') == 'cpu' for t in doc['tensors']):
        # map_location left out, as most callers do: the same object
        with warnings.catch_warnings():
            warnings.simplefilter('ignore')
            ref0 = torch.load(path, weights_only=True)
        cmp3 = Compare(path)
        cmp3(ckpt_toolkit.torch_load(path), ref0)
        assert not cmp3.errs, 'torch_load(f) without map_location differs:\n%s' % '\n'.join(cmp3.errs[:20])
    COUNT['torch_load vs torch.load(%s)' % how] += 1


# DCP folders against dcp_to_torch_save's output; DeepSpeed folders against the run's true
# state dict (*.live.pth): zero_to_fp32 drops the frozen parameters of stage 1 and keeps them
# in bf16 elsewhere, where ckpt gives the full fp32 state dict (tests/fixtures/distributed).
DIST_WITH_REFERENCE = [(c['name'], os.path.join(DIST, c['path']),
                        os.path.join(DIST, c['reference'] if c['kind'] == 'dcp' else c['live']))
                       for c in DIST_CASES.values()
                       if (c['kind'] == 'dcp' and c.get('reference') and not c.get('reference_wrong'))
                       or c['kind'] == 'deepspeed']


@needs_torch
@pytest.mark.parametrize('name,folder,reference', DIST_WITH_REFERENCE,
                         ids=[d[0] for d in DIST_WITH_REFERENCE])
def test_torch_load_folder_equals_reference(name, folder, reference):
    """torch_load(folder) of a DCP folder is what dcp_to_torch_save gives, that of a DeepSpeed
    folder the live model's state dict (both saved beside the folder by
    tests/fixtures/make_distributed.py), values bit for bit; DCP rebuilds dicts in its
    metadata's order and zero_to_fp32 in its own (by design): key order is not compared."""
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        ref = torch.load(reference, map_location='cpu', weights_only=False)
    ours = ckpt_toolkit.torch_load(folder)
    cmp = Compare(folder, ignore_order=True)
    cmp(ours, ref, lenient=True)
    assert not cmp.errs, '%s differs:\n%s' % (os.path.basename(reference), '\n'.join(cmp.errs[:20]))
    COUNT['torch_load(folder) vs dcp_to_torch_save or the live state dict'] += 1


def walk_to(obj, keys):
    for k in keys:
        if isinstance(obj, torch.nn.Module):
            obj = obj.state_dict()
        if isinstance(obj, (list, tuple)):
            obj = obj[int(k)]
        elif isinstance(obj, dict):
            obj = obj[k] if k in obj else obj[int(k)]
        else:
            obj = getattr(obj, k)
    if isinstance(obj, torch.nn.Module):
        obj = obj.state_dict()
    return obj


def compare_state_dict(got, ref, what, keys_only_in_ref=False, what_file=''):
    """GOT (load's dict) against the state dict REF; KEYS_ONLY_IN_REF: a distributed
    checkpoint's true state dict, whose int keys DCP stores as strings and whose order
    DCP does not keep (doc/design.md): every tensor of REF must be in GOT."""
    errs = []
    ref = collections.OrderedDict((str(k), local(v)) for k, v in ref.items()
                                  if isinstance(v, torch.Tensor))
    if keys_only_in_ref:
        missing = [k for k in ref if k not in got]
        if missing:
            errs.append('missing %r' % missing[:8])
    elif list(got) != list(ref):
        errs.append('keys %r, %s %r' % (list(got)[:8], what, list(ref)[:8]))
    for k, t in got.items():
        if k not in ref:
            continue
        r = ref[k]
        if r.device.type == 'meta' and r.numel() == 0 and isinstance(t, torch.Tensor) and t.numel() == 0:
            continue
        if not isinstance(t, torch.Tensor):
            errs.append('%s: %s, not a tensor' % (k, type(t).__name__))
        elif t.dtype != r.dtype or tuple(t.shape) != tuple(r.shape):
            errs.append('%s: %s%s, %s %s%s' % (k, t.dtype, tuple(t.shape), what, r.dtype, tuple(r.shape)))
        elif r.layout == torch.strided and not r.is_quantized and r.device.type != 'meta' \
                and raw_bytes(t) != (swapped(raw_bytes(r), r.element_size())
                                     if (os.path.basename(what_file), k) in TORCH_UNSWAPPED else raw_bytes(r)):
            errs.append('%s: values differ from %s' % (k, what))
        elif t.device.type != 'cpu' and r.device.type != 'meta':
            errs.append('%s: on %s, asked for cpu' % (k, t.device))
    return errs


@needs_torch
@pytest.mark.parametrize('fid,path,origin', FIXTURES, ids=[f[0] for f in FIXTURES])
def test_load_pt_equals_torch(fid, path, origin):
    """load(framework='pt') gives the state dict extract takes, as torch sees it (for a DCP
    or DeepSpeed folder: the true state dict its run saved)."""
    rc, doc, sd, xrc, err = cli_view(path)
    if rc != 0:
        check_refused(lambda: ckpt_toolkit.load(path), rc, 'load')
        return
    if xrc == 2:
        cands = [s for s in doc['state_dicts'] if s.get('model')]
    elif xrc != 0:
        check_refused(lambda: ckpt_toolkit.load(path), xrc, 'load')
        return
    else:
        cands = [{'path': sd, 'select': None}]
    case = DIST_CASES.get(path)
    if case is not None:
        with warnings.catch_warnings():
            warnings.simplefilter('ignore')
            ref_root, how = torch.load(os.path.join(DIST, case['live']), map_location='cpu',
                                       weights_only=False), 'the run\'s live state dict'
    else:
        ref_root, how = torch_reference(path, origin)
        if ref_root is None and path.endswith('.safetensors'):
            try:
                import safetensors.torch as st
            except Exception:
                pytest.skip('no safetensors package here')
            ref_root, how = st.load_file(path), 'safetensors.torch.load_file'
    if ref_root is None:
        pytest.skip(how)
    errs = []
    for c in cands:
        keys = [str(x) for x in c['path']]
        sel = c.get('select', '/'.join(keys))
        got = ckpt_toolkit.load(path, select=sel)
        want = sd_tensors(doc, keys)
        if list(got) != list(want):
            errs.append('keys %r, inspect %r' % (list(got)[:8], list(want)[:8]))
        try:
            ref = walk_to(ref_root, keys if case is None or case['kind'] != 'deepspeed' else [])
        except Exception as e:
            errs.append('no state dict at %r in %s: %s' % (keys, how, e))
            continue
        errs += ['%s: %s' % (sel, e) for e in
                 compare_state_dict(got, ref, how, keys_only_in_ref=case is not None, what_file=path)]
    assert not errs, '\n'.join(errs[:20])
    COUNT['load(pt) vs %s' % ('live state dict' if case else 'torch')] += 1


# ---------------------------------------------------------------------------------------
# real files weights-only torch refuses: against the inert stand-in unpickler

REAL_FILES = [f for f in FIXTURES if f[2] == 'real']


def standin_state_dict(S, L, keys, source):
    """The state dict at KEYS in the stand-in reading L: {name: tensor}."""
    o = L.obj
    for k in keys:
        if isinstance(o, dict):
            o = o[k] if k in o else o[int(k)]
        elif isinstance(o, (list, tuple)):
            o = o[int(k)]
        elif isinstance(o, S.Standin):
            st = o.state if isinstance(o.state, dict) else o.__dict__.get('mapping', {})
            o = st[k]
        else:
            raise KeyError(k)
    if S.is_module(o):
        o = S.module_state_dict(o)
    return collections.OrderedDict((str(k), L.tensor(v)) for k, v in o.items()
                                   if isinstance(v, S.TensorRef))


@needs_torch
@pytest.mark.parametrize('fid,path,origin', REAL_FILES, ids=[f[0] for f in REAL_FILES])
def test_real_file_load_equals_standin(fid, path, origin):
    """A real file weights-only torch refuses (a whole pickled model, a Lightning checkpoint)
    is never given to torch.load: load() is compared with tests/interop/_standin.py, which runs
    Python's own unpickler with every global replaced by an inert stand-in (nothing imported)
    and takes the tensors from the storage bytes."""
    rc, doc, sd, xrc, err = cli_view(path)
    if rc != 0 or xrc != 0:
        pytest.skip('no state dict extract takes')
    ref, how = torch_reference(path, origin)
    if ref is not None:
        pytest.skip('torch.load reads it: compared with torch')
    sys.path.insert(0, os.path.join(SRCDIR, 'tests', 'interop'))
    try:
        import _standin as S
    finally:
        sys.path.pop(0)
    if doc['format'] not in ('pth-zip', 'pth-legacy', 'torchscript'):
        pytest.skip('%s: the stand-in reads pickles' % doc['format'])
    source = next((x.get('source') for x in doc['state_dicts'] if [str(p) for p in x['path']] == sd), None)
    if source == 'torchscript':
        L, refs = S.torchscript_state_dict(path)
        want = collections.OrderedDict((k, L.tensor(v)) for k, v in refs.items())
    else:
        want = standin_state_dict(S, S.load(path), sd, source)
    errs = compare_state_dict(ckpt_toolkit.load(path), want, 'the stand-in unpickler')
    assert not errs, '\n'.join(errs[:20])
    COUNT['real files torch refuses vs the stand-in unpickler'] += 1


# ---------------------------------------------------------------------------------------
# as torch.load is called: file objects, paths, map_location of every form

@needs_torch
@pytest.mark.parametrize('fid,path,origin', FIXTURES, ids=[f[0] for f in FIXTURES])
def test_torch_load_call_forms(fid, path, origin):
    """torch_load(f) for f a pathlib.Path, an open file, an io.BytesIO (no file behind it)
    and one not at its start (torch reads from the current position); map_location as a
    torch.device, as a dict {saved tag: 'cpu'} and as a callable (called with the same
    storages and tags as torch.load calls it): each the same object as torch.load with
    the same arguments (weights-only)."""
    import io
    import pathlib
    rc, doc, sd, xrc, err = cli_view(path)
    if rc != 0 or os.path.isdir(path) or path.endswith(('.safetensors', '.index.json')):
        pytest.skip('not a file torch.load reads')
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        try:
            ref = torch.load(path, map_location='cpu', weights_only=True)
        except Exception as e:
            pytest.skip('weights-only torch.load refuses it: %s' % type(e).__name__)
    with open(path, 'rb') as f:
        data = f.read()
    tags = sorted({t.get('device', 'cpu') for t in doc['tensors']})
    forms = [
        ('pathlib.Path', lambda: ckpt_toolkit.torch_load(pathlib.Path(path), map_location='cpu')),
        ('io.BytesIO', lambda: ckpt_toolkit.torch_load(io.BytesIO(data), map_location='cpu')),
        ('map_location=torch.device', lambda: ckpt_toolkit.torch_load(path, map_location=torch.device('cpu'))),
        ('map_location=dict', lambda: ckpt_toolkit.torch_load(path, map_location={t: 'cpu' for t in tags})),
    ]

    def after_junk():
        b = io.BytesIO(b'JUNK' + data)
        b.read(4)
        return ckpt_toolkit.torch_load(b, map_location='cpu')
    forms.append(('a stream at byte 4', after_junk))
    # a callable: called once per storage, with a CPU untyped storage and the saved tag
    seen = {'ours': [], 'torch': []}

    def keep(who):
        return lambda storage, tag: seen[who].append((type(storage).__name__, tag)) or storage
    forms.append(('map_location=callable', lambda: ckpt_toolkit.torch_load(path, map_location=keep('ours'))))
    if not any(t.startswith('cuda') for t in tags) or torch.cuda.is_available():
        forms.append(('map_location=callable returning None',
                      lambda: ckpt_toolkit.torch_load(path, map_location=lambda s, t: None)))
    errs = []
    for name, fn in forms:
        try:
            ours = fn()
        except Exception as e:
            errs.append('%s: %s: %s' % (name, type(e).__name__, e))
            continue
        cmp = Compare(path)
        cmp(ours, ref)
        errs += ['%s: %s' % (name, e) for e in cmp.errs[:5]]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter('ignore')
            torch.load(path, map_location=keep('torch'), weights_only=True)
    except (ValueError, RuntimeError):
        # torch refuses a callable for a TorchScript archive (1.13's torch.jit.load)
        # and for DTensors (_rebuild_wrapper_subclass); ckpt reads them as tensors
        seen['torch'] = None
    if seen['torch'] is not None and sorted(seen['ours']) != sorted(seen['torch']):
        errs.append('map_location=callable: called with %s, torch.load with %s'
                    % (sorted(seen['ours'])[:6], sorted(seen['torch'])[:6]))
    if not torch.cuda.is_available() and any(t.startswith('cuda') for t in tags):
        # no CUDA here: without map_location torch refuses (2.x: RuntimeError; 1.13 wraps it
        # in UnpicklingError), and the drop-in raises torch 2.x's RuntimeError
        try:
            with warnings.catch_warnings():
                warnings.simplefilter('ignore')
                torch.load(path, weights_only=True)
            errs.append('torch.load with map_location=None on %s loaded here, without CUDA' % tags)
        except Exception:
            pass
        try:
            ckpt_toolkit.torch_load(path)
            errs.append('map_location=None on %s loaded here, without CUDA' % tags)
        except RuntimeError:
            pass
        except Exception as e:
            errs.append('map_location=None on %s: %s, not a RuntimeError' % (tags, type(e).__name__))
    assert not errs, '\n'.join(errs[:20])
    COUNT['torch_load call forms vs torch.load'] += 1


# ---------------------------------------------------------------------------------------
# get_slice against the whole tensor, and against the safetensors package

SLICES = [(0,), (-1,), (slice(1, 3),), (slice(None, None, 2),), (slice(5, 2),), (Ellipsis, 0),
          (0, Ellipsis), (slice(None), slice(1, 2)), (slice(-2, None), 0)]


@pytest.mark.parametrize('fid,path,origin', FIXTURES, ids=[f[0] for f in FIXTURES])
def test_get_slice_equals_indexing(fid, path, origin):
    rc, doc, sd, xrc, err = cli_view(path)
    if rc != 0 or xrc != 0:
        pytest.skip('no state dict extract takes')
    want = sd_tensors(doc, sd)
    errs, n = [], 0
    with ckpt_toolkit.safe_open(path, framework='np') as f:
        for k, t in want.items():
            if t.get('kind', 'dense') != 'dense' or t['dtype'] not in NUMPY_HAS:
                continue
            s = f.get_slice(k)
            if list(s.get_shape()) != t['shape']:
                errs.append('%s: get_shape %s, inspect %s' % (k, s.get_shape(), t['shape']))
            whole = f.get_tensor(k)
            for idx in SLICES:
                try:
                    w = whole[idx]
                except IndexError:
                    continue
                try:
                    got = s[idx]
                except Exception as e:
                    errs.append('%s[%r]: %s: %s' % (k, idx, type(e).__name__, e))
                    continue
                if got.shape != w.shape or got.dtype != w.dtype or np.ascontiguousarray(got).tobytes() != \
                        np.ascontiguousarray(w).tobytes():
                    errs.append('%s[%r]: %s%s, indexing the tensor %s%s' % (k, idx, got.dtype, got.shape,
                                                                        w.dtype, w.shape))
                n += 1
    assert not errs, '\n'.join(errs[:20])
    COUNT['get_slice checks'] += n


SAFETENSORS_FILES = [f for f in FIXTURES if f[1].endswith('.safetensors')]


@pytest.mark.parametrize('fid,path,origin', SAFETENSORS_FILES, ids=[f[0] for f in SAFETENSORS_FILES])
def test_safetensors_package_agrees(fid, path, origin):
    """Where the safetensors package is installed: keys, metadata(), get_tensor and get_slice
    as its safe_open(framework='np') gives them."""
    try:
        from safetensors import safe_open as st_open
    except Exception:
        pytest.skip('no safetensors package here')
    errs = []
    with st_open(path, framework='np') as ref, ckpt_toolkit.safe_open(path, framework='np') as f:
        if sorted(f.keys()) != sorted(ref.keys()):
            errs.append('keys %r, safetensors %r' % (sorted(f.keys())[:6], sorted(ref.keys())[:6]))
        if f.metadata() != ref.metadata():
            errs.append('metadata %r, safetensors %r' % (f.metadata(), ref.metadata()))
        for k in ref.keys():
            try:
                r = ref.get_tensor(k)
            except Exception:
                continue  # a dtype numpy lacks: safetensors cannot either
            a = f.get_tensor(k)
            if a.dtype != r.dtype or a.shape != r.shape or a.tobytes() != r.tobytes():
                errs.append('%s: %s%s, safetensors %s%s' % (k, a.dtype, a.shape, r.dtype, r.shape))
            if ref.get_slice(k).get_dtype() != f.get_slice(k).get_dtype():
                errs.append('%s: get_dtype %s, safetensors %s' % (k, f.get_slice(k).get_dtype(),
                                                                  ref.get_slice(k).get_dtype()))
            if r.ndim and r.shape[0] > 1:
                if f.get_slice(k)[1:].tobytes() != ref.get_slice(k)[1:].tobytes():
                    errs.append('%s[1:] differs from safetensors' % k)
    assert not errs, '\n'.join(errs[:20])
    COUNT['safetensors files vs the safetensors package'] += 1


# ---------------------------------------------------------------------------------------
# files plain weights-only torch.load refuses but that hold only data

def _write_data_only_files(folder):
    """Our own trusted files (saved by the running torch) that weights-only torch.load
    refuses in some version: argparse.Namespace, numpy scalars and arrays, a whole model."""
    import torch.nn as nn
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    files = {}
    sd = m.state_dict()
    files['namespace.pth'] = {'state_dict': sd, 'args': argparse.Namespace(lr=0.1, name='x', layers=[1, 2]),
                              'epoch': 3}
    files['numpy_values.pth'] = {'model': sd, 'best': np.float64(0.25), 'step': np.int64(7),
                                 'arr': np.arange(6, dtype=np.float32).reshape(2, 3),
                                 'flag': np.bool_(True)}
    files['whole_model.pth'] = m
    files['whole_model_nested.pth'] = {'model': m, 'epoch': 1}
    shared = torch.arange(10.0)
    files['views.pth'] = collections.OrderedDict(
        [('a', shared), ('b', shared[2:5]), ('c', shared.view(2, 5).t()),
         ('p', nn.Parameter(torch.ones(2))), ('q', nn.Parameter(torch.zeros(2), requires_grad=False))])
    out = {}
    for name, obj in files.items():
        p = os.path.join(folder, name)
        torch.save(obj, p)
        out[name] = p
    return out


@needs_torch
def test_torch_load_data_only_files(tmp_path):
    errs, n = [], 0
    for name, p in _write_data_only_files(str(tmp_path)).items():
        with warnings.catch_warnings():
            warnings.simplefilter('ignore')
            ref = torch.load(p, map_location='cpu', weights_only=False)  # our own file
        try:
            ours = ckpt_toolkit.torch_load(p)
        except CheckpointError as e:
            errs.append('%s: CheckpointError %s' % (name, e.message))
            continue
        cmp = Compare()
        cmp(ours, ref)
        cmp.sharing()
        errs += ['%s: %s' % (name, e) for e in cmp.errs]
        if name == 'numpy_values.pth':
            # numpy values as numpy objects, exactly
            if not (type(ours['best']) is np.float64 and type(ours['step']) is np.int64):
                errs.append('%s: numpy scalars came back as %s, %s' % (
                    name, type(ours['best']).__name__, type(ours['step']).__name__))
        n += 1
    assert not errs, '\n'.join(errs)
    COUNT['data-only files vs torch.load(weights_only=False)'] += n


# ---------------------------------------------------------------------------------------
# folders written at test time by the plain-Python generators of tests/bad: their good DCP
# folder, and their good DeepSpeed folders with EXPECTED.pth (zero_to_fp32's state dict, as
# tests/cli/deepspeed.sh uses it)

def test_generated_good_folders(tmp_path):
    n = 0
    for script in ('make_bad_dcp.py', 'make_bad_deepspeed.py'):
        out = str(tmp_path / script[:-3])
        p = subprocess.run([sys.executable, os.path.join(BAD, script), out],
                           capture_output=True, timeout=300)
        assert p.returncode == 0, '%s: %s' % (script, p.stderr.decode()[-300:])
        good = [os.path.join(out, d) for d in sorted(os.listdir(out)) if d.startswith('good')]
        assert good, '%s wrote no good folder: %s' % (script, os.listdir(out))
        for g in good:
            if script == 'make_bad_deepspeed.py' and not os.path.exists(os.path.join(g, 'latest')):
                g = os.path.join(g, 'global_step3')  # good_zero3: IN is the tag folder
            rc, doc, sd, xrc, err = cli_view(g)
            assert rc == 0 and xrc == 0, err
            compare_np_with_cli(g, sd_tensors(doc, sd), None)
            n += 1
        want = os.path.join(out, 'EXPECTED.pth')
        if torch is not None and os.path.exists(want):
            ref = torch.load(want, map_location='cpu', weights_only=True)
            for g in (os.path.join(out, 'good_zero2'), os.path.join(out, 'good_zero3', 'global_step3')):
                errs = compare_state_dict(ckpt_toolkit.load(g), ref, 'EXPECTED.pth')
                assert not errs, '%s: %s' % (g, errs)
                cmp = Compare(g, ignore_order=True)
                cmp(ckpt_toolkit.torch_load(g), ref, lenient=True)
                assert not cmp.errs, '%s: %s' % (g, cmp.errs)
                COUNT['generated DeepSpeed folders vs EXPECTED.pth'] += 1
    COUNT['generated good folders vs ckpt inspect'] += n
