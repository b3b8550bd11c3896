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
import io
import json
import os
import pickle
import struct
import subprocess
import sys
import tarfile
import zipfile

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as c  # noqa: E402  (exits 77 without torch)

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

# protocol 0: GLOBAL, EMPTY_TUPLE, REDUCE.  Harmless if it ever ran (os.getcwd()), and
# unknown to ckpt: what matters is that torch asks for it.
PAYLOAD = b"cos\ngetcwd\n)R."


def safetensors_pickle():
    """A valid safetensors file (strict JSON, one U8 tensor) whose bytes from 0 are a pickle:
    the 8-byte length starts with 'V' (UNICODE: a line), the JSON's one newline ends that
    line, its closing '}' is EMPTY_DICT, and the tensor's bytes are the payload."""
    for pad in range(400):
        h = ('{"t":{"dtype":"U8","shape":[%d],"data_offsets":[0,%d]},"__metadata__":'
             '{"p":"%s"}\n}' % (len(PAYLOAD), len(PAYLOAD), ' ' * pad)).encode()
        if len(h) & 0xff == ord('V'):
            break
    return struct.pack('<Q', len(h)) + h + PAYLOAD


def frame_crossing(size):
    """A protocol-4 pickle whose FRAME (SIZE bytes; 128 KiB or more makes a real file's reader
    read it whole with read(), as a BytesIO always does) ends one byte into an 8-byte
    SHORT_BINUNICODE argument.  Read contiguously: a string, then STOP.  CPython's C
    unpickler drops that byte, takes the argument from after the frame, and runs the payload
    that follows it."""
    k = 8
    tail = b'\x8c' + bytes([k]) + b'.'           # the argument's first byte is the frame's last
    fill = size - 9 - 1 - len(tail)
    frame = b'\x8d' + struct.pack('<Q', fill) + b'A' * fill + b'0' + tail
    assert len(frame) == size
    return (b'\x80\x04\x95' + struct.pack('<Q', size) + frame +
            b'B' * (k - 1) + b'.' +                # contiguous: the argument's rest, STOP
            PAYLOAD)                               # C: after its 8-byte argument


def zip_with(data_pkl, extra=()):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, 'w', zipfile.ZIP_STORED) as z:
        z.writestr('archive/data.pkl', data_pkl)
        for n, d in extra:
            z.writestr(n, d)
        z.writestr('archive/version', b'3\n')
    return buf.getvalue()


MAGIC = b'\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19\x2e'
PROTO = b'\x80\x02M\xe9\x03.'


def tar_header(name, size, typeflag=b'0'):
    h = bytearray(512)
    h[0:len(name)] = name
    h[100:108] = b'0000644\0'
    h[108:116] = b'0000000\0'
    h[116:124] = b'0000000\0'
    h[124:136] = b'%011o\0' % size
    h[136:148] = b'00000000000\0'
    h[156:157] = typeflag
    h[257:265] = b'ustar\x0000'
    h[148:156] = b' ' * 8
    h[148:156] = b'%06o\0 ' % sum(h)
    return bytes(h)


def tar_member(name, data):
    return tar_header(name, len(data)) + data + b'\0' * (-len(data) % 512)


def legacy_tar_polyglot():
    """A legacy checkpoint (magic, protocol, sys_info, an empty state dict, no storages) whose
    first 512 bytes are also a tar header: sys_info is a BINUNICODE string whose bytes are
    the header's fields.  The tar's first member holds the rest of the legacy stream; then
    the members torch's tar loader reads: storages (0), tensors (0) and pickle, which holds
    the payload."""
    start = MAGIC + PROTO + b'\x80\x02X'          # sys_info: a str ...
    # ... of L bytes, so that the str ends at byte 512 (the header's end)
    L = 512 - len(start) - 4
    hdr = bytearray(start + struct.pack('<I', L) + b'\0' * L)
    rest = b'.' + b'\x80\x02}q\x00.' + b'\x80\x02]q\x00.'    # end of sys_info, data, keys
    pad = -len(rest) % 512
    # the header fields sit inside the str: ASCII, so the str stays valid UTF-8
    name_end = hdr.index(0)
    assert name_end < 100
    fields = tar_header(b'x', len(rest))
    hdr[100:512] = fields[100:512]
    hdr[148:156] = b' ' * 8
    hdr[148:156] = b'%06o\0 ' % sum(hdr)
    assert all(b < 0x80 for b in hdr[start.__len__() + 4:]), 'the header must stay ASCII'
    members = (tar_member(b'storages', b'\x80\x02K\x00.' + b'\x80\x02]q\x00.') +
               tar_member(b'tensors', b'\x80\x02K\x00.') +
               tar_member(b'pickle', PAYLOAD) + b'\0' * 1024)
    return bytes(hdr) + rest + b'\0' * pad + members


def computed_rot13():
    """STACK_GLOBAL whose module is _codecs.encode('bf', 'rot13'): 'os'."""
    return (b'\x80\x04' + b'\x8c\x07_codecs\x8c\x06encode\x93' +
            b'\x8c\x02bf\x8c\x05rot13\x86R' + b'\x8c\x06getcwd\x93' + b')R.')


def computed_str():
    """STACK_GLOBAL whose module is builtins.str(b'os', 'ascii')."""
    return (b'\x80\x04' + b'\x8c\x08builtins\x8c\x03str\x93' +
            b'C\x02os\x8c\x05ascii\x86R' + b'\x8c\x06getcwd\x93' + b')R.')


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
