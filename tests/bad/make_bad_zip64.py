#!/usr/bin/env python3
"""Zips whose zip64 sizes, offsets or end records, or other directory fields, are
wrong (issue 27).

usage: python3 tests/bad/make_bad_zip64.py OUTDIR

Each file is a checkpoint in torch's layout (`archive/data.pkl`, one tensor
`archive/data/0` of 3 floats, `archive/version`), stored, written field by
field with struct, with one zip64 field wrong: what the file says, what is
wrong, and the words ckpt's message must hold are in FILES and printed by
--list.  tests/cli/zip64.sh runs `ckpt inspect` on each (exit 3, a message
that names the field) and checks that `good.pth`, written by the same code
with every field right, reads.  Python's standard library only.
"""
import os
import struct
import sys
import zlib

U32 = 0xFFFFFFFF

# {'w': tensor of 3 floats, storage key '0'}, protocol 2, as torch writes it
PKL = (b'\x80\x02}q\x00X\x01\x00\x00\x00wq\x01ctorch._utils\n_rebuild_tensor_v2\nq\x02'
       b'((X\x07\x00\x00\x00storageq\x03ctorch\nFloatStorage\nq\x04X\x01\x00\x00\x000q\x05'
       b'X\x03\x00\x00\x00cpuq\x06K\x03tq\x07QK\x00K\x03\x85q\x08K\x01\x85q\x09\x89'
       b'ccollections\nOrderedDict\nq\x0a)Rq\x0btq\x0cRq\x0ds.')
DATA = struct.pack('<3f', 1.0, 2.0, 3.0)
RECORDS = [(b'archive/data.pkl', PKL), (b'archive/data/0', DATA), (b'archive/version', b'3\n')]


def zip64_extra(*values):
    """A zip64 extended information field holding VALUES (8 bytes each)."""
    body = b''.join(struct.pack('<Q', v) for v in values)
    return struct.pack('<HH', 1, len(body)) + body


def build(bad=None, size=None, offset=None, extra=None, local_extra=None, end=None,
          cname=None, cd_pad=b''):
    """The archive; BAD (a record name) gets the zip64 fields given:
    SIZE (its compressed and uncompressed sizes in the central header),
    OFFSET (its local header offset there), EXTRA (its central extra field),
    LOCAL_EXTRA (its local one); END: 'no locator', 'locator past the end',
    'count' (the zip64 end record counts one record more), or None; CNAME:
    BAD's name in the central directory (flags: UTF-8); CD_PAD: bytes after
    the last entry, counted in the central directory's size."""
    out, central = b'', b''
    for name, data in RECORDS:
        crc, at = zlib.crc32(data), len(out)
        mine = name == bad
        lx = local_extra if mine and local_extra is not None else b''
        lsize = U32 if lx else len(data)
        out += struct.pack('<IHHHHHIIIHH', 0x04034b50, 45 if lx else 20, 0, 0, 0, 0x21, crc,
                           lsize, lsize, len(name), len(lx)) + name + lx + data
        cs = size if mine and size is not None else len(data)
        off = offset if mine and offset is not None else at
        cx = extra if mine and extra is not None else b''
        cn = cname if mine and cname is not None else name
        central += struct.pack('<IHHHHHHIIIHHHHHII', 0x02014b50, 45, 45, 0x800, 0, 0, 0x21, crc,
                               cs, cs, len(cn), len(cx), 0, 0, 0, 0o644 << 16, off) + cn + cx
    central += cd_pad
    n, cd_at = len(RECORDS), len(out)
    out += central
    if end is None:
        return out + struct.pack('<IHHHHIIH', 0x06054b50, 0, 0, n, n, len(central), cd_at, 0)
    # the classic end record defers every field to the zip64 one
    e64_at = len(out)
    e64 = struct.pack('<IQHHIIQQQQ', 0x06064b50, 44, 45, 45, 0, 0, n + (end == 'count'),
                      n + (end == 'count'), len(central), cd_at)
    loc_at = e64_at if end != 'locator past the end' else e64_at + 2**40
    loc = struct.pack('<IIQI', 0x07064b50, 0, loc_at, 1)
    if end == 'no locator':
        loc = b''
    return out + e64 + loc + struct.pack('<IHHHHIIH', 0x06054b50, 0xFFFF, 0xFFFF, 0xFFFF,
                                         0xFFFF, U32, U32, 0)


D0 = b'archive/data/0'
# name: (the archive, what is wrong, a regular expression the message must match)
FILES = {
    'good.pth': (build(end='zip64'), 'nothing: every zip64 field right (zip64 end record '
                 'and locator)', None),
    'size_no_extra.pth': (build(D0, size=U32), "record 'archive/data/0' says its sizes are in "
                          'a zip64 extra field (0xFFFFFFFF) but has none',
                          'zip64 extra field'),
    'size_short_extra.pth': (build(D0, size=U32, extra=zip64_extra(12)),
                             "record 'archive/data/0' says both sizes are in its zip64 extra "
                             'field, which holds one (8 bytes)', 'zip64 extra field'),
    'offset_no_extra.pth': (build(D0, offset=U32), "record 'archive/data/0' says its local "
                            'header offset is in a zip64 extra field but has none',
                            'zip64 extra field'),
    'size_past_end.pth': (build(D0, size=U32, extra=zip64_extra(2**40, 2**40)),
                          "record 'archive/data/0' declares 2^40 bytes in its zip64 extra "
                          'field; the file is under 1 KiB', 'declares 1099511627776 bytes'),
    'no_locator.pth': (build(end='no locator'), 'the end record defers its counts and offset '
                       'to a zip64 end record (0xFFFF, 0xFFFFFFFF), but no zip64 locator '
                       'precedes it', 'zip64'),
    'locator_past_end.pth': (build(end='locator past the end'), 'the zip64 locator points '
                             '1 TiB past the end of the file', 'zip64 end'),
    'count_disagrees.pth': (build(end='count'), 'the zip64 end record counts 4 records; the '
                            'central directory holds 3', 'zip64 end'),
    'name_not_utf8.pth': (build(D0, cname=b'archive/data/\xff'), "record "
                          "'archive/data/\\xff' says (flag bit 11) its name is UTF-8; it is not",
                          'not UTF-8'),
    'directory_padded.pth': (build(cd_pad=b'\0' * 11), 'the central directory is 11 bytes '
                             'longer than its 3 entries', 'records end after'),
}


def main():
    if sys.argv[1:] == ['--list']:
        for name, (_, why, words) in FILES.items():
            print('%s\t%s\t%s' % (name, words or '-', why))
        return
    if len(sys.argv) != 2:
        sys.exit('usage: make_bad_zip64.py OUTDIR | --list')
    os.makedirs(sys.argv[1], exist_ok=True)
    for name, (content, _, _) in FILES.items():
        with open(os.path.join(sys.argv[1], name), 'wb') as f:
            f.write(content)


if __name__ == '__main__':
    main()
