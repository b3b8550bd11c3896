"""Files that are a zip checkpoint and a safetensors file at once (issue 26), built byte by
byte: never pickled or unpickled here.  Plain python3, no torch.

Used by tests/interop/polyglots.py (which loads them with torch 2.15 under both names, with
safetensors 0.8 and with Python's zipfile, and checks that ckpt calls them ambiguous) and by
tests/bad/make_scan_corpus.py (the small one, into tests/bad/scan).

- zip_first(): a torch.save zip from byte 0 whose first 8 bytes also read as a safetensors
  header length.  "PK\\x03\\x04" then version-needed and flags 0 make that length 0x04034B50
  (64 MiB, under safetensors' 100 MB limit); the first record's local header fields after them
  are the JSON's first bytes ('{"__metadata__":{"'), its name and extra field sit inside a
  metadata key, and the rest of the zip (data.pkl, the storages, the central directory) is the
  data of one U8 tensor.  torch.load reads the zip under any name but *.safetensors, and
  safetensors under that one (as transformers loads model.safetensors by name).
- safetensors_first(): a safetensors file whose one U8 tensor holds a whole torch.save zip:
  safetensors reads its tensor, Python's zipfile (and libzip) find the zip at the end.
"""
import io
import struct
import zipfile
import zlib

# the zip's own tensor: data.pkl of {'w': tensor([1., 2.])}, protocol 2, as torch.save writes it
DATA_PKL = (b'\x80\x02}q\x00X\x01\x00\x00\x00wq\x01ctorch._utils\n_rebuild_tensor_v2\nq\x02'
            b'((X\x07\x00\x00\x00storageq\x03ctorch\nFloatStorage\nq\x04X\x01\x00\x00\x000q\x05'
            b'X\x03\x00\x00\x00cpuq\x06K\x02tq\x07QK\x00K\x02\x85q\x08K\x01\x85q\x09\x89'
            b'ccollections\nOrderedDict\nq\x0a)Rq\x0btq\x0cRq\x0ds.')
STORAGE = struct.pack('<2f', 1.0, 2.0)
# the safetensors reading's tensor name (never in the zip)
ST_NAME = 'from_safetensors'

SIG_LOCAL, SIG_CENTRAL, SIG_END = 0x04034b50, 0x02014b50, 0x06054b50


def _local(name, data, fields=None, extra=b''):
    """A stored local header + data; FIELDS: the 16 bytes after version/flags/method
    (time, date, crc, sizes) when they must be something else (miniz and zipfile read the
    central directory's)."""
    crc = zlib.crc32(data)
    if fields is None:
        fields = struct.pack('<HHIII', 0, 0x21, crc, len(data), len(data))
    return (struct.pack('<IHH', SIG_LOCAL, 20, 0) + struct.pack('<H', 0) + fields +
            struct.pack('<HH', len(name), len(extra)) + name + extra + data)


def _central(name, data, at):
    crc = zlib.crc32(data)
    return (struct.pack('<IHHHHHHIIIHHHHHII', SIG_CENTRAL, 20, 20, 0, 0, 0, 0x21, crc,
                        len(data), len(data), len(name), 0, 0, 0, 0, 0, at) + name)


def _end(count, cd_size, cd_at):
    return struct.pack('<IHHHHIIH', SIG_END, 0, 0, count, count, cd_size, cd_at, 0)


def _records(prefix):
    return [(prefix + b'/data.pkl', DATA_PKL), (prefix + b'/data/0', STORAGE),
            (prefix + b'/version', b'3\n')]


def _st(header, data):
    return struct.pack('<Q', len(header)) + header + data


def zip_first(full=True):
    """The 64 MiB polyglot: a zip at byte 0 that is a strictly valid safetensors file.
    FULL=False: without the header's padding (17 KiB: a seed for the fuzzers, its header
    length past the end of the file)."""
    n = 0x04034b50                       # bytes 0..7 as a little-endian u64
    head = b'__metadata__":{"'           # local header bytes 10..25: time, date, crc, sizes
    assert len(head) == 16
    # name and extra lengths are bytes 26..29, the first four characters of the metadata key:
    # printable, so each is >= 0x2020 (8224)
    nlen, xlen = 0x2020, 0x2020
    name = b'archive/' + b'n' * (nlen - 8)      # the archive's folder, for torch
    extra = b'x' * xlen                       # miniz and zipfile skip a local extra field
    first_data = b'polyglot'
    first = (struct.pack('<IHH', SIG_LOCAL, 0, 0) + b'{"' + head +
             struct.pack('<HH', nlen, xlen) + name + extra + first_data)
    assert first[8:10] == b'{"'
    # the rest of the zip: the tensor's data, right after the header
    rest = io.BytesIO()
    central = [_central(name, first_data, 0)]
    for rname, rdata in _records(b'archive'):
        at = 8 + n + rest.tell()
        rest.write(_local(rname, rdata))
        central.append(_central(rname, rdata, at))
    cd_at = 8 + n + rest.tell()
    cd = b''.join(central)
    rest.write(cd + _end(len(central), len(cd), cd_at))
    data = rest.getvalue()
    json_tail = ('":"v"},"%s":{"dtype":"U8","shape":[%d],"data_offsets":[0,%d]}}'
                 % (ST_NAME, len(data), len(data))).encode()
    header = first[8:] + json_tail
    assert len(header) <= n
    if not full:
        return first + data
    header += b' ' * (n - len(header))   # safetensors allows trailing spaces in the header
    out = first[:8] + header + data
    assert struct.unpack('<Q', out[:8])[0] == n
    return out


def safetensors_first():
    """A small safetensors file whose U8 tensor is a whole torch.save zip."""
    z = io.BytesIO()
    with zipfile.ZipFile(z, 'w', zipfile.ZIP_STORED) as zf:
        for rname, rdata in _records(b'archive'):
            zf.writestr(zipfile.ZipInfo(rname.decode(), date_time=(2020, 1, 1, 0, 0, 0)), rdata)
    data = z.getvalue()
    header = ('{"%s":{"dtype":"U8","shape":[%d],"data_offsets":[0,%d]}}'
              % (ST_NAME, len(data), len(data))).encode()
    header += b' ' * (-len(header) % 8)
    return _st(header, data)


def safetensors_first_absolute():
    """As safetensors_first, with the zip's offsets counted from the start of the file (where
    it lies inside the tensor data): every zip reader, torch's miniz too, reads the same zip."""
    header = b'{"%s":{"dtype":"U8","shape":[%s],"data_offsets":[0,%s]}}' % (
        ST_NAME.encode(), b'LENGTH__', b'LENGTH__')
    header += b' ' * (-len(header) % 8)
    base = 8 + len(header)
    body = io.BytesIO()
    central = []
    for rname, rdata in _records(b'archive'):
        central.append(_central(rname, rdata, base + body.tell()))
        body.write(_local(rname, rdata))
    cd_at = base + body.tell()
    cd = b''.join(central)
    body.write(cd + _end(len(central), len(cd), cd_at))
    data = body.getvalue()
    n = (b'%d' % len(data)).ljust(8)
    return _st(header.replace(b'LENGTH__', n), data)
