#!/usr/bin/env python3
"""A checkpoint with one big tensor whose data record is damaged and whose
headers are intact (issue 31).

usage: python3 tests/bad/make_sparse_record.py OUT MIB [--intact]

OUT is torch's layout (`archive/data.pkl`: {'w': a float32 tensor of
MIB MiB}, `archive/data/0`, `archive/version`), stored records written field
by field.  The data record is a hole (a sparse file: MIB MiB on no disk) and
the CRC-32 its headers declare is not its bytes' (0x12345678 over zeros); with --intact
it is (the undamaged twin).
torch never checks a record's CRC-32, so torch.load takes it as it takes
any other (tests/interop/torch_load_verdict.py loads one); `ckpt scan`
reads the pickles and the headers, never the data, so its verdict is the
undamaged file's and it reads a few hundred KiB of a file of any size
(tests/cli/scan_cost.sh counts the bytes it reads); `ckpt inspect --stats`
reads every record and refuses it.  Python's standard library only.
"""
import struct
import sys
import zlib


def pkl(numel):
    """{'w': tensor of NUMEL floats over storage '0'}, protocol 2, as torch writes it."""
    n = struct.pack('<I', numel)
    return (b'\x80\x02}q\x00X\x01\x00\x00\x00wq\x01ctorch._utils\n_rebuild_tensor_v2\nq\x02'
            b'((X\x07\x00\x00\x00storageq\x03ctorch\nFloatStorage\nq\x04X\x01\x00\x00\x000q\x05'
            b'X\x03\x00\x00\x00cpuq\x06J' + n + b'tq\x07QK\x00J' + n + b'\x85q\x08K\x01\x85q\x09'
            b'\x89ccollections\nOrderedDict\nq\x0a)Rq\x0btq\x0cRq\x0ds.')


def zeros_crc(n):
    crc, block = 0, bytes(1 << 20)
    for _ in range(n >> 20):
        crc = zlib.crc32(block, crc)
    return crc


def write(path, mib, intact=False):
    size = mib << 20
    damaged = zeros_crc(size) if intact else 0x12345678
    records = [(b'archive/data.pkl', pkl(size // 4), None),
               (b'archive/data/0', None, damaged),
               (b'archive/version', b'3\n', None)]
    central, at = b'', 0
    with open(path, 'wb') as f:
        for name, data, crc in records:
            n = size if data is None else len(data)
            crc = zlib.crc32(data) if crc is None else crc
            f.write(struct.pack('<IHHHHHIIIHH', 0x04034b50, 20, 0, 0, 0, 0x21, crc, n, n,
                                len(name), 0) + name)
            if data is None:
                f.seek(n, 1)  # the hole: zeros that take no disk
            else:
                f.write(data)
            central += struct.pack('<IHHHHHHIIIHHHHHII', 0x02014b50, 20, 20, 0, 0, 0, 0x21,
                                   crc, n, n, len(name), 0, 0, 0, 0, 0o644 << 16, at) + name
            at = f.tell()
        f.write(central + struct.pack('<IHHHHIIH', 0x06054b50, 0, 0, len(records),
                                      len(records), len(central), at, 0))


if __name__ == '__main__':
    args = sys.argv[1:]
    intact = '--intact' in args
    args = [a for a in args if a != '--intact']
    if len(args) != 2 or not args[1].isdigit() or not 0 < int(args[1]) < 4096:
        sys.exit(__doc__.strip().split('\n\n')[1])
    write(args[0], int(args[1]), intact)
