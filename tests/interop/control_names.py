#!/usr/bin/env python3
"""Interop test: names with terminal controls and NULs, as torch writes them
(issue 26).  torch.save takes any str key, and so does safetensors; for
each format torch writes (zip, legacy, safetensors; and a DCP folder where
torch.distributed.checkpoint is there):

  - keys with ESC ]0;title BEL, a newline, CR, CSI (U+009B) and DEL: the
    file loads in torch with those keys; `ckpt inspect` lists them escaped,
    valid UTF-8 with no control but its own newlines, one line per tensor;
    `inspect --json` gives each key exact; `add-module --dry-run` prints one
    line per key, and the file it writes loads in torch with every key
    prefixed exactly;
  - keys 'w\\0x' and 'w\\0y': torch loads both (the oracle: a NUL is a valid
    key), ckpt refuses the file (exit 3, 'contains NUL'), and `convert`
    writes nothing: a name is never cut to 'w'.
"""
import json
import os
import re
import sys

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as c  # noqa: E402  (exit 77 without torch)
import torch  # noqa: E402

t = c.Tally()
t.need(c.CKPT, 'CKPT')

NAMES = ['title\x1b]0;pwned\x07', 'nl\nforged -> line', 'cr\rx', 'csi\u009b2J', 'del\x7fx', 'ok']
NUL = ['w\x00x', 'w\x00y']


def formats():
    fmts = ['zip', 'legacy']
    try:
        import safetensors.torch  # noqa: F401
        fmts.append('safetensors')
    except ImportError:
        pass
    return fmts


def save(keys, path, fmt):
    sd = {k: torch.full((2,), float(i)) for i, k in enumerate(keys)}
    if fmt == 'dcp':
        import torch.distributed.checkpoint as dcp
        import warnings
        with warnings.catch_warnings():
            warnings.simplefilter('ignore')  # "assuming ... a single process"
            dcp.save(sd, checkpoint_id=path)
    else:
        c.save(sd, path, fmt)
    return path


def loaded_keys(path, fmt, keys):
    if fmt == 'dcp':
        import torch.distributed.checkpoint as dcp
        import warnings
        sd = {k: torch.empty(2) for k in keys}
        with warnings.catch_warnings():
            warnings.simplefilter('ignore')
            dcp.load(sd, checkpoint_id=path)
        return list(sd)
    if fmt == 'safetensors':
        from safetensors.torch import load_file
        return list(load_file(path))
    return list(torch.load(path, weights_only=True))


def clean(data):
    """What is wrong with DATA as text for a terminal (an empty list: none)."""
    try:
        text = data.decode('utf-8')
    except UnicodeDecodeError as e:
        return ['not UTF-8: %s' % e]
    m = re.search('[\x00-\x08\x0b-\x1f\x7f-\x9f]', text)
    return ['raw U+%04X in %r' % (ord(m.group()), text[:200])] if m else []


def controls(d, fmt):
    ext = {'safetensors': '.safetensors', 'dcp': ''}.get(fmt, '.pth')
    path = save(NAMES, os.path.join(d, 'names' + ext), fmt)
    errs = []
    if sorted(loaded_keys(path, fmt, NAMES)) != sorted(NAMES):
        errs.append('torch does not load the keys back')
    r = c.ckpt('inspect', path)
    errs += ['inspect exit %d: %s' % (r.rc, r.err)] if r.rc else []
    errs += clean(r.stdout) + clean(r.stderr)
    rows = [ln for ln in r.out.splitlines() if re.search(r'  float32  \[2\] ', ln)]
    if len(rows) != len(NAMES):
        errs.append('%d table rows for %d keys' % (len(rows), len(NAMES)))
    r = c.ckpt('inspect', '--json', path)
    got = [x['path'][0] for x in json.loads(r.stdout)['tensors']] if r.rc == 0 else []
    if sorted(got) != sorted(NAMES):
        errs.append('inspect --json keys %r' % got)
    out = os.path.join(d, 'out.pth')
    r = c.ckpt('add-module', '--dry-run', path, out)
    errs += clean(r.stdout) + clean(r.stderr)
    if r.rc or len(r.out.splitlines()) != len(NAMES):
        errs.append('add-module --dry-run: exit %d, %d lines' % (r.rc, len(r.out.splitlines())))
    r = c.ckpt('add-module', path, out)
    errs += clean(r.stdout) + clean(r.stderr)
    if r.rc:
        errs.append('add-module exit %d: %s' % (r.rc, r.err))
    elif sorted(torch.load(out, weights_only=True)) != sorted('module.' + k for k in NAMES):
        errs.append('the keys written are not the keys prefixed')
    return errs


def nul(d, fmt):
    ext = {'safetensors': '.safetensors', 'dcp': ''}.get(fmt, '.pth')
    path = save(NUL, os.path.join(d, 'nul' + ext), fmt)
    errs = []
    if sorted(loaded_keys(path, fmt, NUL)) != NUL:
        errs.append('torch does not load both keys')
    r = c.ckpt('inspect', path)
    if r.rc != 3 or r.stdout or 'contains NUL' not in r.err:
        errs.append('inspect: exit %d, stdout %r, stderr %r' % (r.rc, r.out[:80], r.err))
    errs += clean(r.stderr)
    out = os.path.join(d, 'out.safetensors')
    r = c.ckpt('convert', path, out)
    if r.rc != 3 or os.path.exists(out):
        errs.append('convert: exit %d, output %s' % (r.rc, os.path.exists(out)))
    return errs


fmts = formats()
try:
    import torch.distributed.checkpoint  # noqa: F401
    fmts.append('dcp')
except ImportError:
    t.skip('dcp', 'no torch.distributed.checkpoint')
for fmt in fmts:
    t.run('%s: control characters in keys: escaped in text, exact in JSON and OUT' % fmt,
          controls, fmt, tmp=True)
    t.run('%s: keys with a NUL: torch loads them, ckpt refuses (exit 3), never cuts' % fmt,
          nul, fmt, tmp=True)
sys.exit(t.summary())
