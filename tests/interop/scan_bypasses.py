#!/usr/bin/env python3
"""ckpt scan judges the bytes torch.load would read, the way torch reads them (issue 15).

Each case builds, opcode by opcode (nothing here is ever pickled or unpickled with a real
class), a file that once scanned SAFE or exit 3 while torch.load would run its payload:

- the safetensors header that is also a pickle (torch 1.13, and torch 2.x under any name not
  ending in .safetensors, unpickle it from byte 0; strictly valid JSON);
- a FRAME whose length ends inside an opcode's argument (CPython's C unpickler then drops the
  rest of the frame and reads the argument from after it), in a plain pickle file and at the
  end of a zip's data.pkl (fed through io.BytesIO);
- a legacy checkpoint whose first 512 bytes are also a tar header (torch tries the torch<=0.1
  tar format first and unpickles the tar's members);
- STACK_GLOBAL operands computed by a call (_codecs.encode('bf', 'rot13') is 'os';
  builtins.str(b'os', 'ascii')).

For each, torch itself (1.13 and 2.x: the torch this script runs under) loads the file with
weights_only=False and a recording pickle_module whose find_class returns inert stand-ins: the
globals it asks for are what torch really reads.  Then `ckpt scan --json` must call the file
unsafe (exit 1) and name every dangerous global torch asked for, in the reading it says.
"""
import json
import os
import pickle
import subprocess
import sys

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as c  # noqa: E402  (exits 77 without torch)

sys.path.insert(0, os.path.join(c.SRCDIR, 'tests', 'bad'))
from bypasses import (computed_rot13, computed_str, frame_crossing,  # noqa: E402
                      legacy_tar_polyglot, safetensors_pickle, zip_with)

torch = c.torch
t = c.Tally()
t.need(c.CKPT, 'CKPT')


def scratch(name):
    return c.scratch(name)


# ---- torch's side: what its unpickler asks for ------------------------------------------

class _StandIn:
    """An instance of any global: accepts every use an unpickler can make of it."""

    def __init__(self, *a, **k):
        pass

    def __call__(self, *a, **k):
        return _StandIn()

    def __setstate__(self, state):
        pass

    def append(self, x):
        pass

    def extend(self, xs):
        pass

    def __setitem__(self, k, v):
        pass


class Recorder:
    """A pickle module for torch.load: C pickle.Unpickler with find_class recorded and inert.
    torch 1.13 ignores pickle_module when weights_only=False (it takes the `pickle` of
    torch.serialization), so torch_asks puts this there too."""

    def __init__(self):
        self.asked = []
        rec = self

        class Unpickler(pickle.Unpickler):
            def find_class(self, module, name):
                rec.asked.append('%s.%s' % (module, name))
                return type(name, (_StandIn,), {})

        self.Unpickler = Unpickler
        self.__name__ = 'recorder'

    def load(self, f, **kw):
        return self.Unpickler(f, **kw).load()

    def __getattr__(self, name):  # UnpicklingError, HIGHEST_PROTOCOL, ...
        return getattr(pickle, name)


def torch_asks(path):
    """The globals torch.load(path) asks its unpickler for, and how it ended."""
    import torch.serialization as ts
    rec = Recorder()
    real = ts.pickle
    ts.pickle = rec
    try:
        torch.load(path, map_location='cpu', pickle_module=rec, weights_only=False)
        how = 'loaded'
    except Exception as e:  # noqa: BLE001 - any end is fine: what ran before it counts
        how = '%s: %s' % (type(e).__name__, str(e).splitlines()[0][:120] if str(e) else '')
    finally:
        ts.pickle = real
    return rec.asked, how


def ckpt_scan(path):
    p = subprocess.run([c.CKPT, 'scan', '--json', path], capture_output=True, text=True,
                       timeout=c.TIMEOUT)
    doc = json.loads(p.stdout)
    return p.returncode, doc['files'][0]


def check(name, path, dangerous, reading=None, computed_by=None):
    """torch asks for DANGEROUS (a global or several); ckpt scan calls the file unsafe and
    names each in READING; COMPUTED_BY: it also reports a name computed at run time by that
    call (with inert stand-ins torch's unpickler stops there: the call returns no string)."""
    asked, how = torch_asks(path)
    errors = []
    for g in dangerous:
        if g not in asked:
            errors.append('torch did not ask for %s (asked %s; %s): the case is wrong'
                          % (g, asked, how))
    rc, doc = ckpt_scan(path)
    if rc != 1 or doc['verdict'] not in ('unsafe', 'ambiguous'):
        errors.append('ckpt scan: exit %d, verdict %s (error %s)' % (rc, doc['verdict'],
                                                                    doc.get('error')))
    found = {}
    for g in doc['globals']:
        key = g['global']
        if g.get('computed_by'):
            key = '%s.%s' % (g['computed_by'], key.rsplit('.', 1)[-1])
        found.setdefault(key, g)
        found.setdefault(g['global'].rsplit('.', 1)[-1], g)
    for g in dangerous:
        hit = found.get(g) or found.get(g.rsplit('.', 1)[-1])
        if not hit:
            errors.append('ckpt scan does not name %s (it names %s)'
                          % (g, [x['global'] for x in doc['globals']]))
        elif reading and hit.get('reading') != reading:
            errors.append('%s found in the %s reading, expected %s'
                          % (g, hit.get('reading'), reading))
    if computed_by and not any(g.get('computed_by') == computed_by for g in doc['globals']):
        errors.append('no name computed by %s reported (globals %s)'
                      % (computed_by, [(x['global'], x.get('computed_by'))
                                       for x in doc['globals']]))
    t.report('%s: torch asks for %s (%s); ckpt scan exit %d, %s' % (
        name, ', '.join(dangerous), how.split(':')[0], rc, doc['verdict']), errors)


# ---- the files -------------------------------------------------------------------------

def write(name, data):
    path = scratch(name)
    with open(path, 'wb') as f:
        f.write(data)
    return path


# ---- the cases -------------------------------------------------------------------------

st = safetensors_pickle()
check('safetensors header that is a pickle, named .pth', write('st_pickle.pth', st),
      ['os.getcwd'], 'pickle')
path = write('st_pickle.safetensors', st)
rc, doc = ckpt_scan(path)
t.report('the same file named .safetensors: still unsafe (torch 1.13 unpickles it; 2.x under '
         'another name)', [] if rc == 1 and any(r['reader'] == 'pickle' and r['unsafe']
                                                 for r in doc['readings'])
         else ['exit %d, readings %s' % (rc, doc['readings'])])

check('FRAME ending inside an argument, plain pickle file',
      write('frame_plain.pkl', frame_crossing(1 << 17)), ['os.getcwd'])
check('FRAME ending inside an argument, at the end of a zip data.pkl (BytesIO)',
      write('frame_zip.pth', zip_with(frame_crossing(64))), ['os.getcwd'], 'zip')
check('legacy checkpoint whose first 512 bytes are a tar header',
      write('legacy_tar.pth', legacy_tar_polyglot()), ['os.getcwd'], 'tar')
check('STACK_GLOBAL module computed by _codecs.encode(rot13)',
      write('rot13.pkl', computed_rot13()), ['_codecs.encode'], computed_by='_codecs.encode')
check('STACK_GLOBAL module computed by builtins.str(bytes)',
      write('str_bytes.pkl', computed_str()), ['builtins.str'], computed_by='builtins.str')

sys.exit(t.summary())
