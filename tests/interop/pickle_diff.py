"""Differential test: ckpt's pickle VM against CPython's C unpickler.

Thousands of pickles - generated opcode by opcode (every opcode of protocols
0-5, frames of every kind: exact, ending inside an argument, nested, past
the end; readline across a frame's end; STACK_GLOBAL operands computed by a
call) and byte-level mutations of those and of the pickles of tests/data -
are fed to
  (a) Python's C pickle.Unpickler (encoding='utf-8', as torch.load), whose
      find_class records each request and returns an inert permissive
      stand-in (never imports), once over io.BytesIO (how torch.load feeds
      a zip's data.pkl) and once over the file opened 'rb' (peek);
  (b) ckpt: tests/interop/pickle_tool, the VM in scan mode, with the
      BYTESIO and the FILE feed.
It fails on any difference in the globals requested (in order, every
request), in reaching STOP or not, or in the file position at STOP.

Known, documented departures (none hides a global):
- a STACK_GLOBAL whose operand is not a str but a call's result (or a
  global) is reported by ckpt as a computed name and scanned on; the C
  unpickler with stand-ins fails there ("STACK_GLOBAL requires str"), so
  only the globals before it are compared;
- MemoryError/RecursionError on Python's side (a memo index of 2**32) is a
  resource limit: the case is counted, not compared;
- Python 2 names: the C unpickler's find_class maps them when the protocol
  in force is < 3, which a find_class override cannot see; a request
  matches ckpt's name either as written or as mapped;
- a real file (BufferedReader, 8 KiB buffer) is peeked, and read on
  contiguously (the FILE feed), except a FRAME of 128 KiB or more (or past
  what peek() holds), read with read() as a BytesIO reads it (the BYTESIO
  feed).  The file run is compared with the FILE feed for pickles up to
  8 KiB, without a frame crossing, or whose frame lies in the first 8 KiB
  ('peeked' cases, padded past 8 KiB after STOP); with the BYTESIO feed for
  'big' cases (one FRAME over 128 KiB, ending exactly, inside an argument
  or past the end).  Smaller frames deeper in a larger file are not
  compared (which of them peek() holds depends on buffer boundaries).
- READONLY_BUFFER on a stand-in: Python fails (no buffer); ckpt scans on,
  since a real object may export one: only the globals before are compared.

Usage: pickle_diff.py [--long N] [--seconds S] [--seed K] [--save DIR]
Short (make check): a few thousand cases.  Every case that ever found a
difference is kept in tests/interop/pickle_diff_cases/ and rerun first.
"""
import _compat_pickle
import argparse
import io
import json
import os
import pickle
import random
import resource
import struct
import subprocess
import sys
import tempfile
import time
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.environ.get('srcdir') or os.path.dirname(os.path.dirname(HERE))
TOOL = os.environ.get('PICKLE_TOOL') or os.path.join(SRC, 'tests/interop/pickle_tool')
CASES = os.path.join(SRC, 'tests/interop/pickle_diff_cases')
PEEK = 8192  # BufferedReader's buffer: a smaller file is peeked whole
PREFETCH = 128 * 1024  # _pickle.c: a read of this much or more is a read(), never a peek


# ---- the C unpickler with an inert permissive stand-in ----------------------

def _anything(*a, **k):
    return None


class _Meta(type):
    """The class a global resolves to: calling it makes an instance;
    SETITEM, APPEND(S), ADDITEMS and BUILD on the class itself accepted."""

    def __call__(cls, *a, **k):
        return object.__new__(cls)

    def __setitem__(cls, k, v):
        pass

    def __getattr__(cls, name):
        if name in ('append', 'extend', 'add', '__setstate__'):
            return _anything
        raise AttributeError(name)


class Standin(metaclass=_Meta):
    """Accepts any args (call, NEWOBJ), state, items, keys; hashable."""

    def __new__(cls, *a, **k):
        return object.__new__(cls)

    def __call__(self, *a, **k):
        return object.__new__(Standin)

    def __setitem__(self, k, v):
        pass

    def __getattr__(self, name):
        if name in ('append', 'extend', 'add', '__setstate__'):
            return _anything
        raise AttributeError(name)


def _shown(module, name):
    """'module.name' as ckpt prints it: the UTF-8 bytes, one char each."""
    q = '%s.%s' % (module, name)
    return q.encode('utf-8', 'surrogatepass').decode('latin-1').replace('\0', '\\x00')


class Recorder(pickle.Unpickler):
    def __init__(self, f):
        super().__init__(f, encoding='utf-8')
        self.requests = []

    def find_class(self, module, name):
        self.requests.append((module, name))
        return Standin

    def persistent_load(self, pid):
        return Standin()


def names_of(module, name):
    """The names ckpt may print for a request: as written, and as
    find_class maps Python 2 names (protocol < 3)."""
    out = {_shown(module, name)}
    if isinstance(module, str) and isinstance(name, str):
        if (module, name) in _compat_pickle.NAME_MAPPING:
            out.add(_shown(*_compat_pickle.NAME_MAPPING[(module, name)]))
        elif module in _compat_pickle.IMPORT_MAPPING:
            out.add(_shown(_compat_pickle.IMPORT_MAPPING[module], name))
    return out


def run_c(f):
    u = Recorder(f)
    try:
        u.load()
        stop, err = True, ''
    except (MemoryError, RecursionError):
        return None
    except Exception as e:  # every failure of the unpickler is its answer
        stop, err = False, '%s: %s' % (type(e).__name__, e)
    return {'requests': u.requests, 'stop': stop, 'error': err, 'consumed': f.tell()}


# ---- ckpt -----------------------------------------------------------------------

def _unlimited():
    """The tool runs without Python's address-space limit (an ASan build
    reserves terabytes of shadow memory); only the soft limit was lowered."""
    hard = resource.getrlimit(resource.RLIMIT_AS)[1]
    resource.setrlimit(resource.RLIMIT_AS, (hard, hard))


def run_ckpt(feed, paths):
    out = subprocess.run([TOOL, feed] + paths, stdout=subprocess.PIPE, check=True,
                         preexec_fn=_unlimited).stdout
    lines = out.decode('latin-1').splitlines()
    assert len(lines) == len(paths), (feed, len(lines), len(paths))
    return [json.loads(line) for line in lines]


def compare(c, k, where_failed=False):
    """None when they agree, else what differs; WHERE_FAILED: also the file
    position when both fail (a BytesIO's: what the reads took)."""
    want = c['requests']
    got = k['globals']
    c_stop = c['stop']
    if k['computed']:
        at = k['computed'][0][2]
        got = [g for g in got if g[2] < at]
        if c_stop or not c['error'].startswith('UnpicklingError: STACK_GLOBAL requires str'):
            return 'ckpt found a computed name at %d; Python: %s' % (at, c['error'] or 'STOP')
        if len(got) != len(want):
            return 'globals before the computed name: ckpt %r, Python %r' % (
                [g[0] for g in got], want)
        for g, w in zip(got, want):
            if g[0] not in names_of(*w):
                return 'global %r, Python asked for %r' % (g[0], w)
        return None
    if not c_stop and c['error'].startswith('TypeError: memoryview: a bytes-like object') \
            and ("not 'Standin'" in c['error'] or "not '_Meta'" in c['error']):
        # READONLY_BUFFER on a stand-in: ckpt scans on (a real object may export a buffer)
        if len(got) < len(want) or any(g[0] not in names_of(*w) for g, w in zip(got, want)):
            return 'globals before READONLY_BUFFER: ckpt %r, Python %r' % (
                [g[0] for g in got], want)
        return None
    if len(got) != len(want) or any(g[0] not in names_of(*w) for g, w in zip(got, want)):
        return 'globals: ckpt %r, Python %r' % ([g[0] for g in got], want)
    if k['stop'] != c_stop:
        return 'ckpt %s, Python %s' % ('reached STOP' if k['stop'] else 'failed: ' + k['error'],
                                       'reached STOP' if c_stop else 'failed: ' + c['error'])
    if (c_stop or where_failed) and k['consumed'] != c['consumed']:
        return 'ends at %d, Python at %d%s' % (k['consumed'], c['consumed'],
                                               '' if c_stop else ' (%s)' % c['error'])
    return None


# ---- cases -------------------------------------------------------------------------

def le(n, v):
    return v.to_bytes(n, 'little')


class Gen:
    """A random pickle, opcode by opcode, as a list of chunks (an opcode and
    its argument each) so that frames can be cut at or inside them."""

    MODS = [('builtins', 'list'), ('collections', 'OrderedDict'), ('os', 'system'),
            ('torch._utils', '_rebuild_tensor_v2'), ('__builtin__', 'set'),
            ('copy_reg', '_reconstructor'), ('numpy.core.multiarray', 'scalar'),
            ('mymod', 'Thing'), ('posix', 'system'), ('builtins', 'getattr')]

    INT_TEXTS = [b'0x1f', b'0X1F', b'-0x_f', b'0o17', b'0O7', b'0b101', b'0B1_0', b'1_000',
                 b'1__0', b'_1', b'1_', b'0x', b'0x_', b'0b2', b'010', b'00', b'01', b'0_0',
                 b'0_7', b' 5', b'5 ', b'\t-7\x0b', b' 1', b'+1', b'-0', b'+ 5', b'1\x00x',
                 b'\x001', b'0777777777777777777777777', b'0xffffffffffffffffffff',
                 b'-0b' + b'1' * 70, b'9' * 25, b'0' * 30 + b'1', b' ' * 40 + b'1', b'1e3',
                 b'\xd9\xa1', b'0x1g', b'', b'-', b' ', b'1' * 4301, b'1' * 4300]

    def __init__(self, rnd, proto):
        self.r = rnd
        self.proto = proto
        self.memo = 0
        self.chunks = []

    def op(self, *parts):
        self.chunks.append(b''.join(parts))

    def text(self):
        r = self.r
        return r.choice(['a', 'os', 'system', 'key', 'é', '\n' * 0 + 'x' * r.randint(0, 40),
                         'w\u00ffz', ''])

    def string(self):
        r, s = self.r, self.text()
        b = s.encode('utf-8')
        k = r.randrange(7 if self.proto < 4 else 6)
        if k == 0:
            self.op(b'X', le(4, len(b)), b)
        elif k == 1 and len(b) < 256:
            self.op(b'\x8c', le(1, len(b)), b)
        elif k == 2:
            self.op(b'\x8d', le(8, len(b)), b)
        elif k == 3 and len(b) < 256:
            self.op(b'U', le(1, len(b)), b)
        elif k == 4:
            self.op(b'T', le(4, len(b)), b)
        elif k == 5:
            self.op(b'V', s.encode('raw_unicode_escape'), b'\n')
        else:
            self.op(b'S', repr(b).encode()[1:], b'\n')

    def scalar(self):
        r = self.r
        k = r.randrange(14)
        if k == 12:  # INT/LONG text strtol and int(text, 0) read otherwise
            t = r.choice(self.INT_TEXTS)
            if r.random() < 0.5:
                self.op(b'I', t, b'\n')
            else:
                self.op(b'L', t, r.choice([b'L', b'']), b'\n')
        elif k == 13:  # EXT1/2/4: no registry, an error after the argument
            n = r.choice([1, 2, 4])
            self.op(bytes([0x81 + n.bit_length()]), le(n, r.randrange(3)))
        elif k == 0:
            self.op(b'K', le(1, r.randrange(256)))
        elif k == 1:
            self.op(b'M', le(2, r.randrange(65536)))
        elif k == 2:
            self.op(b'J', struct.pack('<i', r.randint(-2**31, 2**31 - 1)))
        elif k == 3:
            n = r.randrange(12)
            self.op(b'\x8a', le(1, n), bytes(r.randrange(256) for _ in range(n)))
        elif k == 4:
            self.op(b'I', str(r.randint(-10**20, 10**20)).encode(), b'\n')
        elif k == 5:
            self.op(b'L', str(r.randint(-10**20, 10**20)).encode(), b'L\n')
        elif k == 6:
            self.op(b'G', struct.pack('>d', r.random()))
        elif k == 7:
            self.op(b'F', repr(r.random() * 100).encode(), b'\n')
        elif k == 8:
            self.op(r.choice([b'N', b'\x88', b'\x89']))
        elif k == 9:
            b = bytes(r.randrange(256) for _ in range(r.randrange(20)))
            self.op(r.choice([b'C' + le(1, len(b)), b'B' + le(4, len(b)),
                              b'\x8e' + le(8, len(b)), b'\x96' + le(8, len(b))]), b)
            if r.random() < 0.2:
                self.op(b'\x98')  # READONLY_BUFFER: bytes stay, a bytearray is viewed
        elif k == 10:
            self.op(b'\x8b', le(4, 2), b'\x01\x02')
        else:
            self.string()

    def global_(self):
        r = self.r
        m, n = r.choice(self.MODS)
        if r.random() < 0.5 or self.proto < 4:
            self.op(b'c', m.encode(), b'\n', n.encode(), b'\n')
        else:
            for s in (m, n):
                b = s.encode()
                self.op(b'\x8c', le(1, len(b)), b)
            self.op(b'\x93')

    def computed(self):
        """STACK_GLOBAL('<_codecs.encode('bf', 'rot13')>', 'system')."""
        self.op(b'c_codecs\nencode\n')
        self.op(b'\x8c\x02bf')
        self.op(b'\x8c\x05rot13')
        self.op(b'\x86')
        self.op(b'R')
        self.op(b'\x8c\x06system')
        self.op(b'\x93')

    def memoize(self):
        r = self.r
        k = r.randrange(4)
        if k == 0 and self.proto >= 4:
            self.op(b'\x94')
        elif k == 1:
            self.op(b'q', le(1, self.memo % 256))
        elif k == 2:
            self.op(b'r', le(4, self.memo))
        else:
            self.op(b'p', str(self.memo).encode(), b'\n')
        self.memo += 1

    def value(self, depth=0):
        r = self.r
        k = r.randrange(16) if depth < 4 else 0
        if k <= 3:
            self.scalar()
        elif k == 4:
            self.op(b']')
            if r.random() < 0.7:
                self.op(b'(')
                for _ in range(r.randrange(4)):
                    self.value(depth + 1)
                self.op(b'e')
        elif k == 5:
            self.op(b'(')
            for _ in range(r.randrange(4)):
                self.value(depth + 1)
            self.op(r.choice([b't', b'l', b'\x91']))
        elif k == 6:
            n = r.randrange(4)
            for _ in range(n):
                self.value(depth + 1)
            self.op([b')', b'\x85', b'\x86', b'\x87'][n])
        elif k == 7:
            self.op(b'}')
            self.op(b'(')
            for _ in range(r.randrange(3)):
                self.scalar()
                self.value(depth + 1)
            self.op(b'u')
        elif k == 8:
            self.op(b'(')
            for _ in range(r.randrange(3)):
                self.scalar()
                self.value(depth + 1)
            self.op(b'd')
        elif k == 9:
            self.op(b'\x8f(')
            for _ in range(r.randrange(3)):
                self.scalar()
            self.op(b'\x90')
        elif k == 10:
            self.global_()
            self.value(depth + 1)
            self.op(b'\x85R')
            if r.random() < 0.3:
                self.value(depth + 1)
                self.op(b'b')
        elif k == 11:
            self.global_()
            self.op(b')')
            self.op(r.choice([b'\x81', b'}\x92']))
        elif k == 12:
            self.op(b'(')
            self.value(depth + 1)
            m, n = r.choice(self.MODS)
            self.op(b'i', m.encode(), b'\n', n.encode(), b'\n')
        elif k == 13:
            self.op(b'(')
            self.global_()
            self.value(depth + 1)
            self.op(b'o')
        elif k == 14:
            self.computed()
            if r.random() < 0.2:
                self.op(b'\x98')  # READONLY_BUFFER on a call's result
        else:
            self.value(depth + 1)
            if r.random() < 0.5:
                self.op(b'Q')
            else:
                self.op(b'0')
                self.op(b'P', b'pid', b'\n')
        if r.random() < 0.3:
            self.memoize()
            if r.random() < 0.3:
                self.op(b'0')
                self.op(r.choice([b'h' + le(1, (self.memo - 1) % 256),
                                  b'j' + le(4, self.memo - 1),
                                  b'g' + str(self.memo - 1).encode() + b'\n']))

    def build(self):
        self.op(b'\x80', bytes([self.proto]))
        self.value()
        if self.r.random() < 0.2:
            self.op(b'2')
            self.op(b'0')
        self.op(b'.')
        return self.chunks


def frame(chunks, r):
    """Insert FRAMEs: at chunk boundaries or inside chunks; lengths exact,
    short (ending inside an argument), long, or past the end; nested."""
    data = b''.join(chunks)
    cuts = [0]
    for c in chunks:
        cuts.append(cuts[-1] + len(c))
    out = bytearray(data[:2])  # PROTO
    pos = 2
    while pos < len(data):
        if r.random() < 0.35:
            left = len(data) - pos
            k = r.randrange(6)
            if k == 0:
                n = left
            elif k == 1:
                later = [c - pos for c in cuts if c > pos]
                n = r.choice(later)
            elif k == 2:
                n = r.randrange(1, left + 1)
            elif k == 3:
                n = left + r.randrange(1, 4)
            elif k == 4:
                n = max(0, left - r.randrange(1, 4))
            else:
                n = r.randrange(0, 3)
            out += b'\x95' + le(8, n)
        step = r.randrange(1, 12)
        out += data[pos:pos + step]
        pos += step
    return bytes(out)


def big_frame_case(r):
    """A pickle over 8 KiB whose one FRAME is over 128 KiB (PREFETCH): the C
    unpickler reads that frame from a real file with read(), which then reads
    like a BytesIO.  The frame holds padding (BINBYTES8, popped) and a
    generated value, and ends exactly, inside an argument, or past the end."""
    g = Gen(r, r.choice([4, 5])).build()
    rest = b''.join(g[1:])
    pad = PREFETCH + r.randrange(64)
    body = b'\x8e' + le(8, pad) + bytes(pad) + b'0' + rest
    k = r.randrange(4)
    n = len(body) - (0 if k == 0 else r.randrange(len(rest) + 1) if k < 3 else -r.randrange(1, 4))
    return b'\x80' + bytes([g[0][1]]) + b'\x95' + le(8, n) + body


def peeked_frame_case(r):
    """A file over 8 KiB whose FRAME lies in its first 8 KiB: the first peek
    holds it whole, so a real file reads on past its end (the FILE feed);
    what follows STOP pads the file."""
    return frame(Gen(r, r.choice([4, 5])).build(), r)[:PEEK - 64] + bytes(PEEK + r.randrange(512))


def fixed_cases():
    hello = b'\x80\x04\x95' + le(8, 3) + b'\x8c\x05hello.'
    hidden = (b'\x80\x04\x95' + le(8, 2) + b'\x8c\x0a'
              + b'cos\nsystem\n(S"id"\ntR.' + b'xxxxxxx.')
    rline = b'\x80\x04\x95' + le(8, 4) + b'cos\nsys' + b'tem\n)R.'
    return [hello, hidden, rline,
            b'\x80\x04\x95' + le(8, 20) + b'\x8c\x03abc\x95' + le(8, 30) + b'N.',
            b'\x80\x04c_codecs\nencode\n\x8c\x02bf\x8c\x05rot13\x86R\x8c\x06system\x93)R.',
            b'\x80\x02cbuiltins\nstr\nC\x02os\x8c\x05ascii\x86R\x8c\x06system\x93.']


def fixture_pickles():
    out = []
    data_dir = os.path.join(SRC, 'tests/data')
    for root, _, files in os.walk(data_dir):
        for f in sorted(files):
            p = os.path.join(root, f)
            try:
                if zipfile.is_zipfile(p):
                    with zipfile.ZipFile(p) as z:
                        for n in z.namelist():
                            if n.endswith('.pkl'):
                                out.append(z.read(n))
                elif f.endswith(('.pth', '.pkl', '.pt')):
                    with open(p, 'rb') as fh:
                        b = fh.read()
                    if b[:1] == b'\x80':
                        out.append(b)
            except (OSError, zipfile.BadZipFile):
                pass
    return out


def mutate(b, r):
    b = bytearray(b)
    for _ in range(r.randint(1, 4)):
        k = r.randrange(5)
        if not b:
            b += b'.'
        i = r.randrange(len(b))
        if k == 0:
            b[i] = r.randrange(256)
        elif k == 1:
            b.insert(i, r.randrange(256))
        elif k == 2:
            del b[i]
        elif k == 3:
            b[i:i] = r.choice([b'\x95' + le(8, r.randrange(40)), b'(', b'0', b'1', b'2',
                               b'cos\nsystem\n', b'\x93', b'R', b'b', b'\n', b'.'])
        else:
            j = r.randrange(len(b))
            b[i:i] = b[j:j + r.randrange(1, 16)]
    return bytes(b)


def cases(n, seed):
    r = random.Random(seed)
    out = []
    if os.path.isdir(CASES):
        for f in sorted(os.listdir(CASES)):
            if not f.endswith('.pkl'):
                continue  # open/: differences not yet resolved (tests/fuzz/README.md)
            with open(os.path.join(CASES, f), 'rb') as fh:
                out.append(('saved:' + f, fh.read()))
    out += [('fixed:%d' % i, b) for i, b in enumerate(fixed_cases())]
    fixtures = fixture_pickles()
    out += [('fixture:%d' % i, b) for i, b in enumerate(fixtures)]
    gen = []
    while len(out) < n:
        k = r.random()
        if k < 0.01:
            out.append(('big', big_frame_case(r)))
        elif k < 0.03:
            out.append(('peeked', peeked_frame_case(r)))
        elif k < 0.45 or not gen:
            g = Gen(r, r.randrange(6)).build()
            b = frame(g, r) if r.random() < 0.7 else b''.join(g)
            gen.append(b)
            out.append(('gen', b))
        elif k < 0.85:
            out.append(('mut', mutate(r.choice(gen), r)))
        elif fixtures:
            out.append(('fixmut', mutate(r.choice(fixtures), r)))
    return out


# ---- the run ---------------------------------------------------------------------

def check(batch, tmp, stats, save):
    paths = []
    for i, (_, b) in enumerate(batch):
        p = os.path.join(tmp, '%d.pkl' % i)
        with open(p, 'wb') as fh:
            fh.write(b)
        paths.append(p)
    kb = run_ckpt('bytesio', paths)
    kf = run_ckpt('file', paths)
    bad = []
    for (name, b), p, kbio, kfile in zip(batch, paths, kb, kf):
        stats['cases'] += 1
        stats['crossed'] += kbio['frame_crossed']
        cb = run_c(io.BytesIO(b))
        with open(p, 'rb') as fh:
            cf = run_c(fh)
        if cb is None or cf is None:
            stats['resource'] += 1
            continue
        stats['globals'] += len(cb['requests'])
        why = compare(cb, kbio, where_failed=True)
        if why:
            why = 'BytesIO: ' + why
        elif name == 'big':  # the frame read with read(): as a BytesIO
            why = compare(cf, kbio)
            why = why and 'file (frame over 128 KiB, BYTESIO feed): ' + why
            stats['big'] += 1
        elif len(b) <= PEEK or not kbio['frame_crossed'] or name == 'peeked':
            why = compare(cf, kfile)
            why = why and 'file: ' + why
            stats['peeked'] += name == 'peeked'

        if why:
            bad.append((name, b, why))
    for name, b, why in bad:
        print('DIFF %s %s: %s' % (name, b[:80], why))
        if save:
            os.makedirs(save, exist_ok=True)
            import hashlib
            h = hashlib.sha256(b).hexdigest()[:16]
            with open(os.path.join(save, h + '.pkl'), 'wb') as fh:
                fh.write(b)
    return len(bad)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--long', type=int, default=0, help='this many cases')
    ap.add_argument('--seconds', type=float, default=0, help='run this long')
    ap.add_argument('--seed', type=int, default=15)
    ap.add_argument('--save', help='write differing cases here')
    a = ap.parse_args()
    print('Python', sys.version.split()[0], 'C unpickler', pickle.Unpickler.__module__)
    if not os.access(TOOL, os.X_OK):
        print('no pickle_tool at %s: skipped' % TOOL)
        return 77
    # a memo index of 2**32 makes Python ask for 32 GiB: a MemoryError
    lim = 4 << 30
    resource.setrlimit(resource.RLIMIT_AS, (lim, resource.getrlimit(resource.RLIMIT_AS)[1]))
    stats = dict(cases=0, crossed=0, resource=0, globals=0, big=0, peeked=0)
    bad = 0
    t0 = time.time()
    seed = a.seed
    n = a.long or 3000
    with tempfile.TemporaryDirectory() as tmp:
        while True:
            todo = cases(n, seed)
            for i in range(0, len(todo), 250):
                bad += check(todo[i:i + 250], tmp, stats, a.save)
            if not a.seconds or time.time() - t0 > a.seconds:
                break
            seed += 1
    print('%(cases)d cases, %(crossed)d with a frame crossing, %(globals)d globals requested, '
          '%(resource)d stopped by a resource limit, real files: %(big)d with a frame '
          'over 128 KiB, %(peeked)d over 8 KiB with a peeked frame' % stats, '; %d differ' % bad,
          '(%.1f s)' % (time.time() - t0))
    return 1 if bad else 0


if __name__ == '__main__':
    sys.exit(main())
