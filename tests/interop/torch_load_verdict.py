#!/usr/bin/env python3
"""ckpt's "will it load?" verdict (`torch_load` in `scan --json` and
`inspect --json`) against what torch.load(path, weights_only=True) really
does, under the torch this runs with: the "2.6+" verdict under torch 2.x,
"1.13" under 1.13.

The corpus: the committed fixtures (tests/data, tests/data/torch2), the
hostile files (tests/bad, tests/bad/scan), and files made here (protocol
3/4 pickles, an argparse.Namespace, a numpy scalar, a set, bytes, a float,
a hand-made v3 tensor whose storage global is `torch UntypedStorage`, a
legacy file, a record of the wrong size, a blocked module, a data record
whose CRC-32 is not its bytes' (tests/bad/make_sparse_record.py), ...).  For every
file: accepted or refused must agree, and when both refuse, the global or
opcode ckpt names must be the one torch's message names (and for a refused
global or opcode, ckpt's message must be torch's, byte for byte).

Deliberate differences, as in ckpt-inspect(1):
  - a file whose storages need devices this machine lacks (`missing_here`,
    with its `note`; the test environment sets CKPT_CUDA_DEVICES=0) is loaded
    here with map_location='cpu' when torch has no CUDA: `accepted` is about
    the file, `missing_here` about this machine's devices (tests/interop/
    map_location.py checks that plain torch.load then fails as the note says);
  - files ckpt cannot read at all (an `error` instead of verdicts) are not
    compared, but ckpt must not crash on them;
  - a verdict "accepted" with `malformed` (ckpt's reader finds the values
    wrong: a view past its storage, a negative size) is not compared: torch's
    rebuild functions check those values, which the model does not follow.
"""
import glob
import io
import json
import os
import pickle
import struct
import sys
import zipfile

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as c  # noqa: E402  (exit 77 without torch)
import torch  # noqa: E402

KEY = '1.13' if torch.__version__.startswith('1.') else '2.6+'

t = c.Tally()
t.need(c.CKPT, 'CKPT')
gen = c.scratch()


def torch_zip(path, pkl, records=(), prefix='archive'):
    """A zip laid out as torch writes one (stored records under PREFIX/)."""
    with zipfile.ZipFile(path, 'w', zipfile.ZIP_STORED) as z:
        z.writestr(prefix + '/data.pkl', pkl)
        for name, data in records:
            z.writestr(prefix + '/' + name, data)
        z.writestr(prefix + '/version', '3\n')


def g(mod, name):
    return b'c' + mod.encode() + b'\n' + name.encode() + b'\n'


def u(s):
    s = s.encode()
    return b'X' + struct.pack('<I', len(s)) + s


def tensor_v3(storage_global):
    """_rebuild_tensor_v3 of 4 uint8 elements over STORAGE_GLOBAL."""
    return (b'\x80\x02' + g('torch._utils', '_rebuild_tensor_v3') + b'((' + u('storage') +
            storage_global + u('0') + u('cpu') + b'K\x04tQK\x00K\x04\x85K\x01\x85\x89' +
            g('collections', 'OrderedDict') + b')R' + g('torch', 'uint8') + b'tR.')


def tensor_v2(nbytes_record):
    """A float32 tensor of 4 elements whose record holds NBYTES_RECORD bytes."""
    pkl = (b'\x80\x02' + g('torch._utils', '_rebuild_tensor_v2') + b'((' + u('storage') +
           g('torch', 'FloatStorage') + u('0') + u('cpu') + b'K\x04tQK\x00K\x04\x85K\x01\x85\x89' +
           g('collections', 'OrderedDict') + b')RtR.')
    return pkl, [('data/0', b'\0' * nbytes_record)]


def make(name, fn):
    path = os.path.join(gen, name)
    try:
        fn(path)
    except Exception as e:  # some are torch-2-only (pickle_protocol with v3 dtypes, ...)
        print('(not made: %s: %s)' % (name, c.describe(e)))
        return None
    return path


def made():
    import argparse
    sd = {'w': torch.arange(4.0), 'b': torch.zeros(2, dtype=torch.int64)}
    out = []
    out.append(make('proto4.pth', lambda p: torch.save(sd, p, pickle_protocol=4)))
    out.append(make('proto3_bytes.pth', lambda p: torch.save({'b': b'xy'}, p, pickle_protocol=3)))
    out.append(make('bytes.pth', lambda p: torch.save({'b': b'xy', 'w': sd['w']}, p)))
    out.append(make('set.pth', lambda p: torch.save({'s': {1, 2}}, p)))
    out.append(make('float.pth', lambda p: torch.save({'lr': 0.1, 'w': sd['w']}, p)))
    out.append(make('namespace.pth', lambda p: torch.save(
        {'args': argparse.Namespace(lr=1), 'w': sd['w']}, p)))
    try:
        import numpy as np
        out.append(make('numpy_scalar.pth', lambda p: torch.save({'acc': np.float64(0.5)}, p)))
    except ImportError:
        pass
    out.append(make('legacy.pth', lambda p: torch.save(
        sd, p, _use_new_zipfile_serialization=False)))
    out.append(make('untyped_torch.pth', lambda p: torch_zip(
        p, tensor_v3(g('torch', 'UntypedStorage')), [('data/0', b'\1\2\3\4')])))
    out.append(make('untyped_storage.pth', lambda p: torch_zip(
        p, tensor_v3(g('torch.storage', 'UntypedStorage')), [('data/0', b'\1\2\3\4')])))
    out.append(make('record_short.pth', lambda p: torch_zip(p, *tensor_v2(12))))
    out.append(make('record_exact.pth', lambda p: torch_zip(p, *tensor_v2(16))))
    out.append(make('record_missing.pth', lambda p: torch_zip(p, tensor_v2(16)[0])))
    out.append(make('os_getcwd.pth', lambda p: torch_zip(
        p, b'\x80\x02' + g('os', 'getcwd') + b')R.')))
    out.append(make('builtins_print.pth', lambda p: torch_zip(
        p, b'\x80\x02' + g('__builtin__', 'print') + b')R.')))
    out.append(make('setitem_list.pth', lambda p: torch_zip(
        p, b'\x80\x02]' + u('k') + b'K\x01s.')))
    out.append(make('append_dict.pth', lambda p: torch_zip(p, b'\x80\x02}K\x01a.')))
    out.append(make('build_dict.pth', lambda p: torch_zip(p, b'\x80\x02}}b.')))
    out.append(make('reduce_str.pth', lambda p: torch_zip(p, b'\x80\x02' + u('x') + b')R.')))
    out.append(make('int_pid.pth', lambda p: torch_zip(p, b'\x80\x02K\x01Q.')))
    out.append(make('short_pid.pth', lambda p: torch_zip(
        p, b'\x80\x02(' + u('storage') + g('torch', 'FloatStorage') + b'tQ.')))
    out.append(make('memo_missing.pth', lambda p: torch_zip(p, b'\x80\x02h\x05.')))
    out.append(make('no_version.pth', lambda p: (
        zipfile.ZipFile(p, 'w').writestr('a/data.pkl', b'\x80\x02N.'))))
    out.append(make('version_11.pth', lambda p: _version(p, '11')))
    out.append(make('torchscript.pth', lambda p: torch.jit.save(
        torch.jit.script(torch.nn.Linear(2, 2)), p)))
    out.append(make('truncated.pth', lambda p: torch_zip(p, b'\x80\x02}X\x10\x00\x00\x00ab')))
    out.append(make('data_crc_damaged.pth', damaged_record))
    out.append(make('plain.pickle', lambda p: open(p, 'wb').write(pickle.dumps({'a': 1}, 2))))
    return [p for p in out if p]


def damaged_record(p):
    """tests/bad/make_sparse_record.py's file, 1 MiB: torch checks no CRC-32."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        'make_sparse_record', os.path.join(c.BAD, 'make_sparse_record.py'))
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    m.write(p, 1)


def _version(p, v):
    with zipfile.ZipFile(p, 'w') as z:
        z.writestr('a/data.pkl', b'\x80\x02N.')
        z.writestr('a/version', v)


def corpus():
    files = []
    for pat in ('tests/data/*.pth', 'tests/data/torch2/*.pth', 'tests/bad/*.pth',
                'tests/bad/*.safetensors', 'tests/bad/scan/*'):
        files += sorted(glob.glob(os.path.join(c.SRCDIR, pat)))
    files = [f for f in files if not f.endswith(('.json', '.py', '.md'))]
    return files + made()


def torch_side(path, verdict):
    kw = {}
    if verdict.get('missing_here') and not torch.cuda.is_available():
        kw['map_location'] = 'cpu'  # the verdict is about the file, not this machine
    try:
        torch.load(path, weights_only=True, **kw)
        return None
    except BaseException as e:  # noqa: B902  (torch raises anything)
        if isinstance(e, KeyboardInterrupt):
            raise
        return e


stats = {'agree_accept': 0, 'agree_refuse': 0, 'skipped': 0}


def check(path):
    r = c.ckpt('scan', '--json', path)
    errs = []
    if r.rc not in (0, 1, 3, 4):
        return ['ckpt scan exit %d: %s' % (r.rc, r.err[-300:])]
    doc = json.loads(r.out)
    tl = doc['files'][0]['torch_load'] if doc['files'] else {'error': r.err}
    if 'error' in tl or tl[KEY].get('malformed'):
        stats['skipped'] += 1  # not decided by the model (see the docstring)
        return None
    v = tl[KEY]
    e = torch_side(path, v)
    name = os.path.relpath(path, c.SRCDIR) if path.startswith(c.SRCDIR) else os.path.basename(path)
    if (e is None) != bool(v['accepted']):
        return ['%s: ckpt says %s, torch %s' % (
            name, 'accepted' if v['accepted'] else 'refused (%s)' % v.get('reason'),
            'accepted' if e is None else 'raised %s: %s' % (type(e).__name__, str(e)[:300]))]
    if e is None:
        stats['agree_accept'] += 1
        return None
    stats['agree_refuse'] += 1
    msg = str(e)
    if v.get('global'):
        shown = v['global'][9:] if v['global'].startswith('builtins.') else v['global']
        if 'GLOBAL ' + shown not in msg and 'class ' + v['global'] not in msg and \
                'must be imported' not in msg:
            errs.append('%s: ckpt stops at GLOBAL %s, torch: %s' % (name, v['global'], msg[:300]))
        elif v['message'] != msg:
            errs.append('%s: message differs: ckpt %r, torch %r' % (name, v['message'], msg))
    elif 'Unsupported operand' in (v.get('reason') or ''):
        if v['message'] != msg:
            errs.append('%s: ckpt %r, torch %r' % (name, v['message'], msg))
    elif type(e).__name__ != v['exception']:
        errs.append('%s: ckpt says %s(%s), torch raised %s: %s' % (
            name, v['exception'], v.get('reason'), type(e).__name__, msg[:200]))
    return errs


files = corpus()
for f in files:
    t.run('verdict %s' % os.path.basename(f), check, f)
print('torch %s vs ckpt "%s": %d files, both accept %d, both refuse %d, not modelled %d' % (
    torch.__version__, KEY, len(files), stats['agree_accept'], stats['agree_refuse'],
    stats['skipped']))
sys.exit(t.summary())
