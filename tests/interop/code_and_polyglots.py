#!/usr/bin/env python3
"""Files whose loader runs code or reads other content than ckpt did (issue 26), checked
against the real loaders (torch 1.13 and 2.x: the torch this runs under; safetensors 0.8
where installed), each in a throwaway folder:

- a TorchScript archive whose module class is named argparse.Namespace (a class ckpt knows as
  data; tests/bad/torchscript_code.py): torch.load(weights_only=False) hands it to
  torch.jit.load, which runs its __setstate__ (a print of a marker: the recording payload),
  and torch 1.13 does so even with weights_only=True.  `ckpt scan` must call it unsafe (exit 1)
  with a "code" finding naming torch.jit.load and `ckpt extract`, and the torch_load verdict of
  this torch must be what torch did with weights_only=True;
- a torch.save zip whose Nth local header signature is zeroed, for every N > 1: torch's verdict
  (accepted, or refused with its message) is what this torch does, and `ckpt inspect` refuses
  (exit 3) every one torch 2.15 refuses;
- a zip that is a valid safetensors file at once (tests/bad/polyglots.py): torch.load reads the
  zip's tensors under a .pth name and (torch 2.x) safetensors' under a .safetensors name;
  `ckpt scan` calls it ambiguous (exit 1) under both names, `ckpt inspect` says it has the
  other reading, and the torch_load verdict under each name is what this torch did;
- a safetensors file holding a zip in its tensor data: ambiguous too.
"""
import io
import json
import os
import subprocess
import sys
import zipfile

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as c  # noqa: E402  (exits 77 without torch)

sys.path.insert(0, os.path.join(c.SRCDIR, 'tests', 'bad'))
import polyglots  # noqa: E402
import torchscript_code  # noqa: E402

torch = c.torch
TORCH2 = int(torch.__version__.split('.')[0]) >= 2
VERSION = '2.6+' if TORCH2 else '1.13'
t = c.Tally()
t.need(c.CKPT, 'CKPT')


def write(folder, name, data):
    path = os.path.join(folder, name)
    with open(path, 'wb') as f:
        f.write(data)
    return path


def torch_load_in_child(path, weights_only):
    """torch.load(path) in a fresh interpreter (the payload prints to its stdout): (ran the
    payload, loaded or the exception's first line)."""
    code = ('import sys, torch, warnings\nwarnings.simplefilter("ignore")\n'
            'try:\n    torch.load(sys.argv[1], weights_only=%s)\n    print("LOADED")\n'
            'except Exception as e:\n    print("ERROR", type(e).__name__, str(e).splitlines()[0])\n'
            % weights_only)
    p = subprocess.run([sys.executable, '-c', code, path], capture_output=True, text=True,
                       timeout=c.TIMEOUT)
    out = p.stdout
    return torchscript_code.MARKER in out, out.strip().splitlines()[-1] if out.strip() else p.stderr


def scan(path):
    p = subprocess.run([c.CKPT, 'scan', '--json', path], capture_output=True, text=True,
                       timeout=c.TIMEOUT)
    return p.returncode, json.loads(p.stdout)['files'][0]


def verdict(doc):
    return doc['torch_load'][VERSION]


def torchscript(tmp):
    errs = []
    path = write(tmp, 'args.pt', torchscript_code.archive())
    ran, how = torch_load_in_child(path, False)
    if not ran:
        errs.append('torch.load(weights_only=False) did not run the payload (%s): the case is '
                    'wrong' % how)
    ran_wo, how_wo = torch_load_in_child(path, True)
    if ran_wo and TORCH2:
        errs.append('torch 2.x ran the payload with weights_only=True (%s)' % how_wo)
    if not TORCH2 and not ran_wo:
        errs.append('torch 1.13 did not run it with weights_only=True (%s)' % how_wo)
    rc, doc = scan(path)
    if rc != 1 or doc['verdict'] != 'unsafe':
        errs.append('ckpt scan: exit %d, verdict %s' % (rc, doc['verdict']))
    code = ' '.join(doc.get('code', []))
    if 'torch.jit.load' not in code or 'ckpt extract' not in code:
        errs.append('no code finding naming torch.jit.load and ckpt extract: %r' % code)
    v = verdict(doc)
    if bool(v['accepted']) != how_wo.startswith('LOADED'):
        errs.append('torch_load %s says accepted=%s, torch: %s' % (VERSION, v['accepted'], how_wo))
    if not v['accepted'] and v['exception'] not in how_wo:
        errs.append('torch_load says %s, torch raised %s' % (v['exception'], how_wo))
    if v['accepted'] and v['via'] != 'torch.jit.load':
        errs.append('accepted via %s, not torch.jit.load' % v['via'])
    text = c.ckpt('scan', path)
    if 'CODE' not in text.out or 'UNSAFE' not in text.out:
        errs.append('scan text: %r' % text.out[:300])
    return errs


t.run('TorchScript archive named argparse.Namespace: torch.load runs its __setstate__; ckpt '
      'scan: unsafe (code), torch_load %s as torch' % VERSION, torchscript, tmp=True)


def genuine_torchscript(tmp):
    """A real torch.jit.save archive: unsafe to scan, and extract still gives its weights."""
    m = torch.jit.script(torch.nn.Linear(3, 2))
    path = os.path.join(tmp, 'lin.pt')
    torch.jit.save(m, path)
    errs = []
    rc, doc = scan(path)
    if rc != 1 or not doc.get('code'):
        errs.append('scan: exit %d, code %s' % (rc, doc.get('code')))
    out = os.path.join(tmp, 'lin.safetensors')
    r = c.ckpt('extract', path, out)
    if r.rc != 0:
        return errs + ['%s: exit %d: %s' % (r.cmd, r.rc, r.err.strip())]
    try:
        from safetensors.torch import load_file
    except ImportError:
        return errs
    got = load_file(out)
    for k, v in m.state_dict().items():
        if k not in got or not torch.equal(got[k], v):
            errs.append('extract: %s differs or is missing' % k)
    return errs


t.run('a genuine torch.jit.save archive: scan unsafe (code); ckpt extract still writes its '
      'weights', genuine_torchscript, tmp=True)


def local_headers(tmp):
    errs = []
    base = os.path.join(tmp, 'base.pth')
    torch.save({'a': torch.arange(4.0), 'b': torch.ones(3)}, base)
    data = open(base, 'rb').read()
    infos = zipfile.ZipFile(io.BytesIO(data)).infolist()
    for k in range(1, len(infos)):
        d = bytearray(data)
        at = infos[k].header_offset
        d[at:at + 4] = bytes(4)
        name = infos[k].filename.split('/', 1)[1]
        path = write(tmp, 'zeroed_%d.pth' % k, d)
        try:
            torch.load(path, weights_only=True)
            how = 'LOADED'
        except Exception as e:  # noqa: BLE001 - what torch says is the point
            how = '%s %s' % (type(e).__name__, str(e))
        p = subprocess.run([c.CKPT, 'scan', '--json', path], capture_output=True, text=True,
                           timeout=c.TIMEOUT)
        v = verdict(json.loads(p.stdout)['files'][0])
        if bool(v['accepted']) != (how == 'LOADED'):
            errs.append('%s zeroed: torch_load accepted=%s, torch %s' % (name, v['accepted'],
                                                                         how[:120]))
        elif not v['accepted'] and (v['exception'] not in how or
                                    'invalid header or archive is corrupted' not in v['message']):
            errs.append('%s zeroed: torch_load %s: %s; torch %s' % (
                name, v['exception'], v['message'][:100], how[:120]))
        r = c.ckpt('inspect', path)
        if TORCH2 and how != 'LOADED' and r.rc != 3:
            errs.append('%s zeroed: torch refuses it, ckpt inspect exit %d' % (name, r.rc))
    return errs


t.run('zip with its Nth local header zeroed (N = 2..): torch_load %s says what torch does; '
      'inspect refuses what torch 2.15 refuses' % VERSION, local_headers, tmp=True)


def polyglot_zip_first(tmp):
    errs = []
    blob = polyglots.zip_first()
    try:
        import safetensors.torch as st
    except ImportError:
        st = None
    for name in ('poly.pth', 'poly.safetensors'):
        path = write(tmp, name, blob)
        got = set(torch.load(path, weights_only=True))
        want = {polyglots.ST_NAME} if TORCH2 and name.endswith('.safetensors') else {'w'}
        if got != want:
            errs.append('torch.load(%s) gave %s, expected %s: the case is wrong' % (name, got, want))
        if st is not None and set(st.load_file(path)) != {polyglots.ST_NAME}:
            errs.append('safetensors does not read %s' % name)
        rc, doc = scan(path)
        amb = ' '.join(doc['ambiguities'])
        if rc != 1 or doc['verdict'] != 'ambiguous' or 'safetensors file at once' not in amb:
            errs.append('scan %s: exit %d, verdict %s, %s' % (name, rc, doc['verdict'], amb[:200]))
        if not verdict(doc)['accepted']:
            errs.append('torch_load %s of %s: refused (%s), torch loaded it' % (
                VERSION, name, verdict(doc).get('message', '')[:100]))
        if TORCH2 and verdict(doc)['via'] != ('safetensors' if name.endswith('.safetensors')
                                              else 'weights-only unpickler'):
            errs.append('torch_load of %s via %s' % (name, verdict(doc)['via']))
        r = c.ckpt('inspect', path)
        if r.rc != 0 or 'also a valid safetensors file' not in r.err:
            errs.append('inspect %s: exit %d, %r' % (name, r.rc, r.err[:200]))
    return errs


t.run('zip that is also a valid safetensors file: torch reads one or the other by name; ckpt '
      'scan: ambiguous, inspect names both readings', polyglot_zip_first, tmp=True)


def polyglot_safetensors_first(tmp):
    errs = []
    for make in (polyglots.safetensors_first, polyglots.safetensors_first_absolute):
        path = write(tmp, make.__name__ + '.safetensors', make())
        if set(zipfile.ZipFile(path).namelist()) != {'archive/data.pkl', 'archive/data/0',
                                                     'archive/version'}:
            errs.append('%s: Python\'s zipfile does not read the zip: the case is wrong'
                        % make.__name__)
        rc, doc = scan(path)
        if rc != 1 or doc['verdict'] != 'ambiguous':
            errs.append('scan %s: exit %d, verdict %s' % (make.__name__, rc, doc['verdict']))
    return errs


t.run('safetensors file whose tensor holds a zip (Python\'s zipfile reads it): ambiguous',
      polyglot_safetensors_first, tmp=True)

sys.exit(t.summary())
