#!/usr/bin/env python3
"""Zips that torch, Python's zipfile and libzip read differently (issue 15).

usage: python3 tests/bad/make_bad_zip.py OUTDIR     (OUTDIR: tests/bad/zip)

Every archive is written field by field (struct), stored records, folder
`archive/`, `version` = `3\\n`.  Each holds two pickles for `data.pkl`:
BENIGN (`{'which': 'benign'}`) and PAYLOAD (`builtins.print('owned')`, an
inert global: harmless if it ever ran, and the interop test only unpickles
it with a recording stand-in).  Which one a reader gets is the point of each
file; tests/interop/zip_readers.py checks that torch 1.13, torch 2.x and
zipfile really read what lib/container/zip_dir.c says, and
tests/unit/check_zip_dir.c checks the model and its findings.
"""
import os
import pickle
import struct
import sys
import zlib

BENIGN = pickle.dumps({'which': 'benign'}, protocol=2)
# GLOBAL builtins print, ('owned',), REDUCE: crafted, never unpickled for real
PAYLOAD = b'\x80\x02cbuiltins\nprint\nq\x00X\x05\x00\x00\x00ownedq\x01\x85q\x02Rq\x03.'
VERSION = b'3\n'


def local(name, data, crc=None, size=None, flags=0, method=0):
    crc = zlib.crc32(data) if crc is None else crc
    size = len(data) if size is None else size
    return struct.pack('<IHHHHHIIIHH', 0x04034b50, 20, flags, method, 0, 0x21, crc, size,
                       size, len(name), 0) + name + data


def central(name, data, at, crc=None, flags=0, method=0):
    crc = zlib.crc32(data) if crc is None else crc
    return struct.pack('<IHHHHHHIIIHHHHHII', 0x02014b50, 20, 20, flags, method, 0, 0x21, crc,
                       len(data), len(data), len(name), 0, 0, 0, 0, 0, at) + name


def end(n, cd_size, cd_at, comment=b''):
    return struct.pack('<IHHHHIIH', 0x06054b50, 0, 0, n, n, cd_size, cd_at,
                       len(comment)) + comment


def end64(n, cd_size, cd_at):
    return struct.pack('<IQHHIIQQQQ', 0x06064b50, 44, 45, 45, 0, 0, n, n, cd_size, cd_at)


class Zip:
    """Local records appended one by one; directories made of any of them."""

    def __init__(self, prefix=b''):
        self.b = bytearray(prefix)
        self.rec = {}

    def add(self, key, name, data, **kw):
        self.rec[key] = (name, data, len(self.b), kw)
        self.b += local(name, data, **kw)

    def directory(self, keys, names=None):
        """Central directory of KEYS at the current end; (bytes, offset)."""
        at = len(self.b)
        cd = b''
        for i, k in enumerate(keys):
            name, data, off, kw = self.rec[k]
            kw = {x: kw[x] for x in ('crc', 'flags', 'method') if x in kw}
            cd += central(names[i] if names else name, data, off, **kw)
        self.b += cd
        return len(cd), at


DATA, VERS = b'archive/data.pkl', b'archive/version'


def two_end_records():
    """Two complete directories, each with its end record: A (benign) then
    B (payload).  torch and zipfile take the last end record."""
    z = Zip()
    z.add('b', DATA, BENIGN)
    z.add('v', VERS, VERSION)
    z.add('p', DATA, PAYLOAD)
    n, at = z.directory(['b', 'v'])
    z.b += end(2, n, at)
    n, at = z.directory(['p', 'v'])
    z.b += end(2, n, at)
    return z.b


def end_in_comment():
    """Directory A (benign) whose end record's comment is the 22 bytes of an
    end record for directory B (payload)."""
    z = Zip()
    z.add('b', DATA, BENIGN)
    z.add('v', VERS, VERSION)
    z.add('p', DATA, PAYLOAD)
    na, ata = z.directory(['b', 'v'])
    nb, atb = z.directory(['p', 'v'])
    z.b += end(2, na, ata, comment=end(2, nb, atb))
    return z.b


def name_mismatch():
    """The directory says archive/data.pkl; the local header it points to
    names archive/xxxx.pkl (same length), data PAYLOAD."""
    z = Zip()
    z.add('p', b'archive/xxxx.pkl', PAYLOAD)
    z.add('v', VERS, VERSION)
    n, at = z.directory(['p', 'v'], names=[DATA, VERS])
    z.b += end(2, n, at)
    return z.b


def duplicate_data_pkl():
    """Two entries named archive/data.pkl: BENIGN first, PAYLOAD last."""
    z = Zip()
    z.add('b', DATA, BENIGN)
    z.add('v', VERS, VERSION)
    z.add('p', DATA, PAYLOAD)
    n, at = z.directory(['b', 'v', 'p'])
    z.b += end(3, n, at)
    return z.b


def duplicate_case():
    """archive/data.pkl (BENIGN) and archive/DATA.PKL (PAYLOAD): one name to
    torch, two to zipfile and libzip."""
    z = Zip()
    z.add('b', DATA, BENIGN)
    z.add('v', VERS, VERSION)
    z.add('p', b'archive/DATA.PKL', PAYLOAD)
    n, at = z.directory(['b', 'v', 'p'])
    z.b += end(3, n, at)
    return z.b


def crc_global():
    """data.pkl is PAYLOAD with a wrong CRC-32 (in both headers)."""
    z = Zip()
    z.add('p', DATA, PAYLOAD, crc=zlib.crc32(PAYLOAD) ^ 1)
    z.add('v', VERS, VERSION)
    n, at = z.directory(['p', 'v'])
    z.b += end(2, n, at)
    return z.b


def overlapping():
    """data.pkl's data is BENIGN, then the local record of archive/inner.pkl
    (PAYLOAD), which a second directory entry points into."""
    inner = local(b'archive/inner.pkl', PAYLOAD)
    z = Zip()
    z.add('b', DATA, BENIGN + inner)
    z.add('v', VERS, VERSION)
    z.rec['i'] = (b'archive/inner.pkl', PAYLOAD, 30 + len(DATA) + len(BENIGN), {})
    n, at = z.directory(['b', 'v', 'i'])
    z.b += end(3, n, at)
    return z.b


def prefixed():
    """PAYLOAD, then a zip whose offsets count from byte 0 (BENIGN): torch.load
    does not take it for a zip and unpickles byte 0."""
    z = Zip(prefix=PAYLOAD)
    z.add('b', DATA, BENIGN)
    z.add('v', VERS, VERSION)
    n, at = z.directory(['b', 'v'])
    z.b += end(2, n, at)
    return z.b


def zip64_locator():
    """A zip64 locator pointing to the zip64 end record of directory A
    (PAYLOAD), while the 56 bytes just before the locator are the zip64 end
    record of directory B (BENIGN): miniz follows the locator, zipfile takes
    the record before it."""
    z = Zip()
    z.add('b', DATA, BENIGN)
    z.add('v', VERS, VERSION)
    z.add('p', DATA, PAYLOAD)
    na, ata = z.directory(['p', 'v'])
    e64a = len(z.b)
    z.b += end64(2, na, ata)
    nb, atb = z.directory(['b', 'v'])
    z.b += end64(2, nb, atb)
    z.b += struct.pack('<IIQI', 0x07064b50, 0, e64a, 1)
    z.b += struct.pack('<IHHHHIIH', 0x06054b50, 0, 0, 0xFFFF, 0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0)
    return z.b


def plain():
    """The good twin: BENIGN and version, nothing ambiguous."""
    z = Zip()
    z.add('b', DATA, BENIGN)
    z.add('v', VERS, VERSION)
    n, at = z.directory(['b', 'v'])
    z.b += end(2, n, at)
    return z.b


FILES = {
    'plain.pth': plain, 'two_end_records.pth': two_end_records,
    'end_in_comment.pth': end_in_comment, 'name_mismatch.pth': name_mismatch,
    'duplicate_data_pkl.pth': duplicate_data_pkl, 'duplicate_case.pth': duplicate_case,
    'crc_global.pth': crc_global, 'overlapping.pth': overlapping, 'prefixed.pth': prefixed,
    'zip64_locator.pth': zip64_locator,
}

if __name__ == '__main__':
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), 'zip')
    os.makedirs(out, exist_ok=True)
    for name, make in FILES.items():
        with open(os.path.join(out, name), 'wb') as f:
            f.write(make())
    print(f'wrote {len(FILES)} files to {out}')
