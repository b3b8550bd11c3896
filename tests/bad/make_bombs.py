#!/usr/bin/env python3
"""Write the memory bombs of issue 26 into DIR (stdlib only, a second or two).

    python3 tests/bad/make_bombs.py DIR

Small files that ask for gigabytes; ckpt must refuse each (exit 3, the message
naming the limit and its option) within the default limits, which bound
memory to 2 GiB (doc/safety.md, section 5, "Limits").  tests/cli/limits.sh
runs ckpt on them under a memory cap, so that a regression fails instead of
eating the machine.  Each is a torch zip (archive/data.pkl deflated,
archive/version) written by hand, so that the deflate stream can be made
from one compressed segment repeated: a segment ended by a full flush
refers to nothing before it, so N copies inflate to N copies of its input.

  inflate_bomb.pth   1 MB: data.pkl inflates to 1000 MiB (under the 1 GiB
                     --max-pickle-bytes) of NONE POP, which made one value per
                     2 bytes: 70 GiB of values.  Refused by the memory budget
                     (the pickle and its values within --max-pickle-bytes).
  inflate_liar.pth   the same stream, but the zip headers declare 1000 bytes:
                     inflating must stop there (refused: it inflates past its
                     declared size), not at 1000 MiB.
  nesting_bomb.pth   95 KB: EMPTY_TUPLE then 10^8 TUPLE1, each tuple holding
                     the last: refused at --max-depth (10000) as the tuples
                     are made, not after 10^8 of them.
  bytes_bomb.pth     1 MB: a BINBYTES of 1000 MiB, whose copy with the
                     pickle's own bytes would be 2000 MiB: refused before the
                     copy is made.
"""
import os
import struct
import sys
import zlib

MiB = 1 << 20


def segment(data):
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    return c.compress(data) + c.flush(zlib.Z_FULL_FLUSH)


def deflated(parts):
    """(deflate stream, crc, size) of the concatenation of (bytes, count) parts."""
    stream, crc, size = [], 0, 0
    for data, count in parts:
        seg = segment(data)
        for _ in range(count):
            stream.append(seg)
            crc = zlib.crc32(data, crc)
        size += len(data) * count
    stream.append(b"\x03\x00")  # an empty final block
    return b"".join(stream), crc, size


def write_zip(path, records):
    """records: (name, method, data-as-stored, crc, size, declared size)."""
    out, central = bytearray(), bytearray()
    for name, method, stored, crc, size, declared in records:
        n = name.encode()
        at = len(out)
        out += struct.pack("<IHHHHHIIIHH", 0x04034B50, 20, 0, method, 0, 0x21, crc,
                           len(stored), declared, len(n), 0) + n + stored
        central += struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 20, 20, 0, method, 0, 0x21,
                               crc, len(stored), declared, len(n), 0, 0, 0, 0, 0, at) + n
    cd_at = len(out)
    out += central
    out += struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, len(records), len(records),
                       len(central), cd_at, 0)
    with open(path, "wb") as f:
        f.write(out)


def torch_zip(path, pickle_parts, declared=None):
    stream, crc, size = deflated(pickle_parts)
    version = b"3\n"
    write_zip(path, [
        ("archive/data.pkl", 8, stream, crc, size, size if declared is None else declared),
        ("archive/version", 0, version, zlib.crc32(version), 2, 2),
    ])


def main():
    d = sys.argv[1]
    os.makedirs(d, exist_ok=True)
    none_pop = [(b"\x80\x02", 1), (b"N0" * (MiB // 2), 1000), (b"}.", 1)]
    torch_zip(os.path.join(d, "inflate_bomb.pth"), none_pop)
    torch_zip(os.path.join(d, "inflate_liar.pth"), none_pop, declared=1000)
    torch_zip(os.path.join(d, "nesting_bomb.pth"),
              [(b"\x80\x02)", 1), (b"\x85" * MiB, 95), (b"\x85" * (10**8 - 95 * MiB), 1),
               (b".", 1)])
    n = 1000 * MiB
    torch_zip(os.path.join(d, "bytes_bomb.pth"),
              [(b"\x80\x03B" + struct.pack("<I", n), 1), (b"\0" * MiB, 1000), (b".", 1)])


if __name__ == "__main__":
    main()
