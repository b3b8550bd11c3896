#!/usr/bin/env python3
"""Differential test: where each successive pickle.load stops, CPython's C unpickler against
ckpt's framing model (issue 26).

torch's legacy loader calls pickle.load(f) again and again on one file object, so where one
pickle leaves the file is where the next one starts.  CPython's C unpickler reads a protocol-4
FRAME either by peeking the file's buffer (read on contiguously, after STOP too) or with
read() (a frame of 128 KiB or more, or one past what peek() returns: the frame's rest is
dropped where a read crosses its end or STOP comes first).  Which, depends on the file
object and, for a real file, on its buffer's size and boundaries.

Hundreds of streams of small pickles (no globals: ints, strings, bytes, lists and tuples under
MARK, memo PUT/GET/MEMOIZE, protocol-0 lines) are generated, and FRAME headers put in at
random opcode boundaries with random lengths: exact, ending inside an argument or a text line,
with STOP inside (bytes of the frame after it), nested, of 128 KiB and more, past the first
buffer boundary.  Each stream goes to

  (a) CPython: pickle.load on io.BytesIO, and on the file opened 'rb' with buffers of 4 KiB,
      8 KiB, 64 KiB and 1 MiB (torch opens it with the file system's st_blksize); the file
      position after each load, until EOF or an error;
  (b) ckpt: tests/interop/pickle_tool chain bytesio|choose (the VM in scan mode, the pickles
      back to back; CKPT_FEED_CHOOSE: every reading of the frames ckpt scan walks).

It fails when the BytesIO positions differ from ckpt's BYTESIO feed, or when a real file's
positions are not one of ckpt's CHOOSE readings (ckpt scan would then not have scanned what
torch reads).  It also checks ckpt scan's list of opcodes a pickle may start with against
every opcode the C unpickler runs first without failing.

Usage: frame_chain.py [--cases N] [--seed K].  Needs only Python (no torch).
"""
import argparse
import io
import json
import os
import pickle
import pickletools
import random
import re
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.environ.get('srcdir') or os.path.dirname(os.path.dirname(HERE))
TOOL = os.environ.get('PICKLE_TOOL') or os.path.join(SRC, 'tests/interop/pickle_tool')
BUFFERS = (4096, 8192, 65536, 1 << 20)


# ---- generated streams ---------------------------------------------------------------

def su(s):
    b = s.encode()
    return b'\x8c' + bytes([len(b)]) + b


def value(r, memo):
    """One value's opcodes (a list of whole opcodes); MEMO: indices put so far."""
    k = r.randrange(9)
    if k == 0:
        return [b'K' + bytes([r.randrange(256)])]
    if k == 1:
        return [su('x' * r.randrange(12))]
    if k == 2:
        return [b'V' + b'line' * r.randrange(4) + b'\n']          # a text line
    if k == 3:
        n = r.randrange(30)
        return [b'C' + bytes([n]) + bytes(r.randrange(256) for _ in range(n))]
    if k == 4 and memo:
        return [b'h' + bytes([r.choice(memo)])]
    if k == 5:
        ops = [b'(']
        for _ in range(r.randrange(4)):
            ops += value(r, memo)
        return ops + [r.choice([b'l', b't'])]
    if k == 6:
        i = len(memo)
        memo.append(i)
        return [b'\x8a\x01' + bytes([r.randrange(128)]), b'q' + bytes([i])]
    if k == 7:
        return [b'N', b'N', b'0']                                  # POP
    return [b'\x88']


def pickle_ops(r):
    memo = []
    ops = [b'\x80\x04']
    for _ in range(r.randrange(1, 4)):
        ops += value(r, memo)
        if r.random() < 0.3:
            ops.append(b'0')                                       # POP it again
            ops += value(r, memo)
    return ops + [b'.']


def stream(r):
    """Back-to-back pickles, FRAMEs put in at opcode boundaries."""
    ops = []
    if r.random() < 0.3:
        # a first pickle that carries the rest past the first buffers' boundaries
        n = r.choice([3900, 4050, 8100, 65400]) + r.randrange(200)
        ops += [b'\x80\x04', b'B' + struct.pack('<I', n) + b'p' * n, b'0']
        ops += pickle_ops(r)[1:]
    for _ in range(r.randrange(1, 6)):
        ops += pickle_ops(r)
    out = b''
    big = []                                                       # (where, length)
    i = 0
    while i < len(ops):
        if r.random() < 0.35:
            # a FRAME over the next few opcodes, its end moved a little
            j = min(len(ops), i + r.randrange(1, 12))
            n = sum(len(o) for o in ops[i:j])
            rest = sum(len(o) for o in ops[i:])
            k = r.random()
            if k < 0.4:
                n = max(0, n + r.randrange(-3, 4))                 # inside an argument
            elif k < 0.5:
                n = rest
            elif k < 0.55:
                n = 128 * 1024 + r.randrange(64)                   # read(), never peeked
                big.append((len(out) + 9, n))
            out += b'\x95' + struct.pack('<Q', n)
        out += ops[i]
        i += 1
    for at, n in big:
        if len(out) - at < n:
            out += b'N.' * ((n - (len(out) - at)) // 2 + 1)       # fill a big frame up
    return out


# ---- CPython's side ---------------------------------------------------------------------

def cpython_ends(f):
    ends = []
    while True:
        try:
            pickle.load(f)
        except Exception:
            return ends
        ends.append(f.tell())


def cpython(path, data):
    got = {'bytesio': cpython_ends(io.BytesIO(data))}
    for b in BUFFERS:
        with open(path, 'rb', buffering=b) as f:
            got[b] = cpython_ends(f)
    return got


# ---- ckpt's side --------------------------------------------------------------------------

def ckpt(mode, path):
    p = subprocess.run([TOOL, 'chain', mode, path], capture_output=True, timeout=60)
    if p.returncode != 0:
        raise RuntimeError('pickle_tool chain %s: exit %d: %s' % (mode, p.returncode,
                                                                 p.stderr.decode()[-300:]))
    return [tuple(json.loads(line)['ends']) for line in p.stdout.decode().splitlines()]


# ---- the first opcodes ---------------------------------------------------------------------

ARGS = {
    None: b'', 'uint1': b'\x01', 'uint2': b'\x01\x00', 'uint4': b'\x01\x00\x00\x00',
    'uint8': struct.pack('<Q', 1), 'int4': b'\x01\x00\x00\x00', 'long1': b'\x01\x05',
    'long4': b'\x01\x00\x00\x00\x05', 'string1': b'\x01a', 'string4': b'\x01\x00\x00\x00a',
    'bytes1': b'\x01a', 'bytes4': b'\x01\x00\x00\x00a', 'bytes8': struct.pack('<Q', 1) + b'a',
    'bytearray8': struct.pack('<Q', 1) + b'a', 'unicodestring1': b'\x01a',
    'unicodestring4': b'\x01\x00\x00\x00a', 'unicodestring8': struct.pack('<Q', 1) + b'a',
    'decimalnl_short': b'1\n', 'decimalnl_long': b'1L\n', 'floatnl': b'1.0\n',
    'float8': struct.pack('>d', 1.0), 'stringnl': b"'a'\n", 'stringnl_noescape': b'a\n',
    'stringnl_noescape_pair': b'builtins\nint\n', 'unicodestringnl': b'a\n',
}


def first_opcodes():
    """The opcodes CPython runs first without failing (then None, STOP: a whole pickle)."""
    ok = set()
    for op in pickletools.opcodes:
        arg = struct.pack('<Q', 2) if op.name == 'FRAME' else ARGS[op.arg.name if op.arg else None]
        try:
            pickle.load(io.BytesIO(op.code.encode('latin-1') + arg + b'N.'))
            ok.add(op.code.encode('latin-1')[0])
        except Exception:
            pass
    return ok


def scan_starts():
    """ckpt scan's pickle_start list, read from lib/analysis/scan.c."""
    src = open(os.path.join(SRC, 'lib/analysis/scan.c')).read()
    body = src[src.index('static int pickle_start('):]
    body = body[:body.index('return 1;')]
    names = re.findall(r'CKPT_OP_(\w+)', body)
    codes = {op.name: op.code.encode('latin-1')[0] for op in pickletools.opcodes}
    return {codes[n] for n in names}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--cases', type=int, default=100)
    ap.add_argument('--seed', type=int, default=26)
    a = ap.parse_args()
    print('Python %s; %s' % (sys.version.split()[0], TOOL))
    failed = passed = 0

    missing = first_opcodes() - scan_starts()
    if missing:
        failed += 1
        print('FAIL first opcodes: CPython starts a pickle with %s, ckpt scan does not' %
              ', '.join(pickletools.code2op[chr(c)].name for c in sorted(missing)))
    else:
        passed += 1
        print('ok first opcodes: every opcode CPython runs first starts a pickle for ckpt scan')

    r = random.Random(a.seed)
    kinds = {'stop inside a frame': 0, 'frame read differently': 0}
    with tempfile.TemporaryDirectory(prefix='ckpt-frames-') as d:
        for i in range(a.cases):
            data = stream(r)
            path = os.path.join(d, 'case%d.pkl' % i)
            with open(path, 'wb') as f:
                f.write(data)
            want = cpython(path, data)
            bio = ckpt('bytesio', path)
            readings = set(ckpt('choose', path))
            errs = []
            if tuple(want['bytesio']) != bio[0]:
                errs.append('io.BytesIO stops at %s, ckpt BYTESIO at %s' %
                            (want['bytesio'], list(bio[0])))
            for b in BUFFERS:
                if tuple(want[b]) not in readings:
                    errs.append('a file with a %d-byte buffer stops at %s, not one of ckpt\'s '
                                '%d readings %s' % (b, want[b], len(readings),
                                                    sorted(readings)[:4]))
            if len({tuple(v) for v in want.values()}) > 1:
                kinds['frame read differently'] += 1
            if len(readings) > 1:
                kinds['stop inside a frame'] += 1
            if errs:
                failed += 1
                keep = os.path.join(os.environ.get('TMPDIR', '/tmp'), 'frame_chain_%d.pkl' % i)
                with open(keep, 'wb') as f:
                    f.write(data)
                print('FAIL case %d (kept as %s): %s' % (i, keep, '; '.join(errs)))
            else:
                passed += 1
    print('%d cases: %d where CPython\'s readers disagree, %d where ckpt walks more than one '
          'reading' % (a.cases, kinds['frame read differently'], kinds['stop inside a frame']))
    print('%d passed, %d failed' % (passed, failed))
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main())
