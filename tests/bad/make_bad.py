#!/usr/bin/env python3
"""Generate hostile / malformed checkpoint files for the ckpt tests.

usage: $PYTHON tests/bad/make_bad.py [--no-torch] OUTDIR

Every file written here must be refused by `ckpt inspect FILE` with exit
status 3 and one line on stderr, `ckpt: inspect: <file>: <message>`
(the files whose defect is in the record data, crc_flip.pth and a few
more: by `ckpt inspect --stats`; see README.md), and `ckpt convert` must
refuse it the same way.  Besides the
pth files: safetensors files (st_*.safetensors, each differing from a good
twin that safetensors.torch.load_file loads by its defect) and shard
indexes (sharded_*.index.json; the shards they name are absent, outside
the folder, or hostile themselves).

The pickles are crafted byte by byte (nothing here is ever unpickled by
Python's pickle).  Zip archives are built with zipfile: stored records,
fixed timestamps, folder `archive/` with `data.pkl`, `data/<key>` and
`version` (`3\\n`), as torch writes to a buffer; the zips whose defect is in
the zip structure itself (sizes that lie, zip64, overlapping or duplicate
records) are written field by field with struct (raw_zip), in the same
layout.  Each hostile file has a
"good twin" built by the same code with the defect left out; when torch can
be imported, the generator checks that torch loads every twin, so each file
differs from a loadable checkpoint by exactly its defect.  It also records
how torch 1.13's `torch.load(weights_only=True)` reacts to each hostile file
(in a child process; `weights_only=False` is never used on these files) in
README.md; for the safetensors files, how the `safetensors` package's
`safetensors.torch.load_file` reacts.

Only the standard library is needed, except for truncated_zip.pth, which is
the first half of ../data/mlp.pth (run make_fixtures.py first) and the torch
checks.
"""
import io
import json
import os
import pickle
import struct
import subprocess
import sys
import zipfile
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
FIXED_TIME = (1980, 1, 1, 0, 0, 0)
PWNED = '/tmp/ckpt_pwned'

# --------------------------------------------------------------------------
# pickle opcodes (protocol 2)

PROTO2 = b'\x80\x02'
MARK = b'('
STOP = b'.'
TUPLE = b't'
TUPLE1 = b'\x85'
TUPLE2 = b'\x86'
EMPTY_TUPLE = b')'
EMPTY_LIST = b']'
EMPTY_DICT = b'}'
APPEND = b'a'
SETITEM = b's'
SETITEMS = b'u'
REDUCE = b'R'
BINPERSID = b'Q'
NEWFALSE = b'\x89'
NONE = b'N'


def G(module, name):
    return b'c' + module.encode() + b'\n' + name.encode() + b'\n'


def U(s):
    b = s.encode('utf-8') if isinstance(s, str) else s
    return b'X' + struct.pack('<I', len(b)) + b


def I(v):  # noqa: E743
    if 0 <= v < 256:
        return b'K' + bytes([v])
    if 0 <= v < 65536:
        return b'M' + struct.pack('<H', v)
    if -2**31 <= v < 2**31:
        return b'J' + struct.pack('<i', v)
    n = (v.bit_length() + 8) // 8
    return b'\x8a' + bytes([n]) + v.to_bytes(n, 'little', signed=True)


def TUP(seq):
    if not seq:
        return EMPTY_TUPLE
    return MARK + b''.join(I(v) for v in seq) + TUPLE


def BINGET(i):
    return b'h' + bytes([i])


def BINPUT(i):
    return b'q' + bytes([i])


ODICT = G('collections', 'OrderedDict') + EMPTY_TUPLE + REDUCE


class T:
    """A tensor entry: storage (type, key, location, numel) + view."""

    def __init__(self, name, stype='FloatStorage', key='0', loc='cpu',
                 numel=6, offset=0, size=(2, 3), stride=(3, 1), v3=None):
        """V3: torch 2.x's form for new dtypes (_rebuild_tensor_v3 over a
        torch.storage.UntypedStorage of NUMEL bytes), the pickle code of
        its dtype argument (e.g. G('torch', 'uint16'))."""
        self.__dict__.update(locals())
        del self.__dict__['self']


def pid(t, legacy=False):
    stype = G('torch.storage', 'UntypedStorage') if t.v3 else G('torch', t.stype)
    return (MARK + U('storage') + stype + U(t.key) + U(t.loc)
            + I(t.numel) + (NONE if legacy else b'') + TUPLE + BINPERSID)


def tensor(t, legacy=False):
    fn = '_rebuild_tensor_v3' if t.v3 else '_rebuild_tensor_v2'
    return (G('torch._utils', fn) + MARK + pid(t, legacy)
            + I(t.offset) + TUP(t.size) + TUP(t.stride) + NEWFALSE + ODICT
            + (t.v3 or b'') + TUPLE + REDUCE)


def state_dict_pickle(tensors, legacy=False, extra=b''):
    """OrderedDict of tensors; `extra` is spliced in as more key/value
    pickle code inside the SETITEMS mark."""
    body = b''.join(U(t.name) + tensor(t, legacy) for t in tensors)
    return PROTO2 + ODICT + MARK + body + extra + SETITEMS + STOP


ESIZE = {'FloatStorage': 4, 'DoubleStorage': 8, 'LongStorage': 8,
         'HalfStorage': 2, 'ByteStorage': 1, 'FooStorage': 4}


def f32(n, start=0.0):
    return struct.pack('<%df' % n, *[start + 0.25 * i for i in range(n)])


def data_for(tensors):
    """data/<key> bytes, right-sized, for each distinct storage."""
    out = {}
    for t in tensors:
        out.setdefault(t.key, f32(t.numel) if t.stype == 'FloatStorage'
                       else bytes(t.numel * ESIZE[t.stype]))
    return out


def zip_bytes(pkl, data, prefix='archive/', version=b'3\n',
              compress=zipfile.ZIP_STORED):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, 'w') as z:
        def add(name, b):
            zi = zipfile.ZipInfo(prefix + name, date_time=FIXED_TIME)
            zi.compress_type = compress
            zi.external_attr = 0o644 << 16
            z.writestr(zi, b)
        add('data.pkl', pkl)
        for k in sorted(data):
            add('data/' + k, data[k])
        if version is not None:
            add('version', version)
    return buf.getvalue()


def ckpt_zip(tensors, data=None, **kw):
    return zip_bytes(state_dict_pickle(tensors),
                     data_for(tensors) if data is None else data, **kw)


def pickle_zip(pkl):
    """A zip checkpoint whose data.pkl is `pkl` and that has no storages."""
    return zip_bytes(pkl, {})


# --------------------------------------------------------------------------
# zips written field by field (struct), for the defects zipfile cannot make:
# declared sizes that lie, zip64 sizes, central entries that share or nest
# local data, duplicate names.  Same conventions as zip_bytes: DOS date
# 1980-01-01, version 20 (45 with zip64), external attributes 0644.

U32 = 0xFFFFFFFF


class Rec:
    """One zip record: NAME, the bytes PAYLOAD as they lie in the file, its
    METHOD (0 stored, 8 deflated), and the CRC-32 / compressed size /
    uncompressed size the headers declare (by default the true ones)."""

    def __init__(self, name, payload, method=0, crc=None, csize=None,
                 usize=None, plain=None):
        self.name = name.encode() if isinstance(name, str) else name
        self.payload = payload
        self.method = method
        plain = payload if plain is None else plain
        self.crc = zlib.crc32(plain) if crc is None else crc
        self.csize = len(payload) if csize is None else csize
        self.usize = len(plain) if usize is None else usize
        self.offset = None   # of its local header, once written


def deflated(name, plain, **kw):
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    return Rec(name, c.compress(plain) + c.flush(), method=8, plain=plain,
               **kw)


def _sizes(r, local):
    """(csize, usize, version, extra) for a header of R: sizes that do not
    fit 32 bits go into a zip64 extra field (0xFFFFFFFF in the header)."""
    big = r.csize >= U32 or r.usize >= U32
    if not big:
        return r.csize, r.usize, 20, b''
    if local:
        x = struct.pack('<QQ', r.usize, r.csize)
    else:
        x = b''
        if r.usize >= U32:
            x += struct.pack('<Q', r.usize)
        if r.csize >= U32:
            x += struct.pack('<Q', r.csize)
    cs = U32 if (local or r.csize >= U32) else r.csize
    us = U32 if (local or r.usize >= U32) else r.usize
    return cs, us, 45, struct.pack('<HH', 1, len(x)) + x


def local_header(r):
    cs, us, ver, extra = _sizes(r, True)
    return struct.pack('<IHHHHHIIIHH', 0x04034b50, ver, 0, r.method, 0, 0x21,
                       r.crc, cs, us, len(r.name), len(extra)) + r.name + extra


def central_header(r, offset):
    cs, us, ver, extra = _sizes(r, False)
    return struct.pack('<IHHHHHHIIIHHHHHII', 0x02014b50, ver, ver, 0,
                       r.method, 0, 0x21, r.crc, cs, us, len(r.name),
                       len(extra), 0, 0, 0, 0o644 << 16,
                       offset) + r.name + extra


def raw_zip(records, central=None):
    """The local records in order, then a central directory of CENTRAL,
    a list of (Rec, local header offset, or a function giving it once the
    records are laid out) (default: every record at its own offset), then
    the end record."""
    out = b''
    for r in records:
        r.offset = len(out)
        out += local_header(r) + r.payload
    if central is None:
        central = [(r, r.offset) for r in records]
    cd = b''.join(central_header(r, off() if callable(off) else off)
                  for r, off in central)
    return out + cd + struct.pack('<IHHHHIIH', 0x06054b50, 0, 0, len(central),
                                  len(central), len(cd), len(out), 0)


def ckpt_recs(tensors, pkl=None, data=None, prefix='archive/'):
    """The records of a checkpoint (data.pkl, data/<key> in order, version),
    stored, as Rec objects to edit before raw_zip."""
    pkl = state_dict_pickle(tensors) if pkl is None else pkl
    data = data_for(tensors) if data is None else data
    return ([Rec(prefix + 'data.pkl', pkl)]
            + [Rec(prefix + 'data/' + k, data[k]) for k in sorted(data)]
            + [Rec(prefix + 'version', b'3\n')])


MAGIC_NUMBER = 0x1950a86a20f9469cfc6c
LEGACY_HEAD = (pickle.dumps(MAGIC_NUMBER, protocol=2)
               + pickle.dumps(1001, protocol=2)
               + pickle.dumps({'protocol_version': 1001,
                               'little_endian': True,
                               'type_sizes': {'short': 2, 'int': 4,
                                              'long': 4}}, protocol=2))


def legacy_bytes(tensors, counts=None, data=None):
    """Legacy (pre-1.6) stream: magic, version, sys_info, main pickle,
    sorted key list, then per key int64 count + raw bytes."""
    data = data_for(tensors) if data is None else data
    numel = {t.key: t.numel for t in tensors}
    keys = sorted(numel)
    out = LEGACY_HEAD + state_dict_pickle(tensors, legacy=True)
    out += pickle.dumps(keys, protocol=2)
    for k in keys:
        c = numel[k] if counts is None else counts.get(k, numel[k])
        out += struct.pack('<q', c) + data[k]
    return out


LEGACY_KEYS = ('140000000004096', '140000000008192')
GOOD = [T('w', numel=12, size=(3, 4), stride=(4, 1)),
        T('b', key='1', numel=3, size=(3,), stride=(1,))]
GOOD_LEGACY = [T('w', key=LEGACY_KEYS[0], numel=12, size=(3, 4),
                 stride=(4, 1)),
               T('b', key=LEGACY_KEYS[1], numel=3, size=(3,), stride=(1,))]


# --------------------------------------------------------------------------
# safetensors: u64 little-endian header length, JSON header, packed data

def st_header(entries, metadata=True):
    """JSON header text (bytes) of (name, dtype, shape, [begin, end])
    entries, in order; `name` may be bytes (written as is, for bad UTF-8)."""
    parts = []
    if metadata:
        parts.append(b'"__metadata__":{"format":"pt"}')
    for name, dtype, shape, offsets in entries:
        if isinstance(name, bytes):
            n = b'"' + name + b'"'
        else:
            n = json.dumps(name).encode()
        parts.append(n + b':' + json.dumps(
            {'dtype': dtype, 'shape': list(shape),
             'data_offsets': list(offsets)}, separators=(',', ':')).encode())
    return b'{' + b','.join(parts) + b'}'


def st_bytes(header, data, length=None):
    """A safetensors file: HEADER (bytes) padded with spaces to a multiple
    of 8, DATA; LENGTH overrides the header length field."""
    header += b' ' * (-len(header) % 8)
    n = len(header) if length is None else length
    return struct.pack('<Q', n) + header + data


# the good file: w float32 [2, 3] at 0-24, b float32 [3] at 24-36
ST_GOOD = [('w', 'F32', (2, 3), (0, 24)), ('b', 'F32', (3,), (24, 36))]
ST_DATA = f32(9)


def st_good(entries=None, data=None):
    return st_bytes(st_header(ST_GOOD if entries is None else entries),
                    ST_DATA if data is None else data)


def index_json(weight_map):
    """A Hugging Face style shard index (*.index.json)."""
    return (json.dumps({'metadata': {'total_size': 36},
                        'weight_map': weight_map}, indent=2) + '\n').encode()


# --------------------------------------------------------------------------
# the files

FILES = []   # (name, bytes, what is wrong, how ckpt must fail, good twin)


# what ckpt must do with a defect that only reading the data can reveal
DATA_LEVEL = ('`inspect --stats` exits 3 (the data is read). Plain `inspect` '
              'reads no data and MAY succeed (exit 0)')


def bad(name, content, why, expect='`inspect` exits 3', twin=None):
    FILES.append((name, content, why, expect, twin))


def mlp_bytes(path):
    if not os.path.exists(path):
        sys.exit('make_bad.py: %s is missing; run make_fixtures.py first'
                 % path)
    with open(path, 'rb') as f:
        return f.read()


def build():
    good_zip = ckpt_zip(GOOD)
    good_legacy = legacy_bytes(GOOD_LEGACY)

    mlp = mlp_bytes(os.path.join(HERE, '..', 'data', 'mlp.pth'))
    bad('truncated_zip.pth', mlp[:len(mlp) // 2],
        'first half (%d of %d bytes) of tests/data/mlp.pth: no central '
        'directory, the last local record is cut' % (len(mlp) // 2,
                                                      len(mlp)))

    pkl = state_dict_pickle(GOOD)
    cut = pkl[:len(pkl) // 2]
    bad('truncated_pickle.pth', zip_bytes(cut, data_for(GOOD)),
        'well-formed zip; `data.pkl` is the first %d of %d bytes of a valid '
        'state-dict pickle (ends mid-stream, no STOP)' % (len(cut), len(pkl)),
        twin=good_zip)

    # data section: [count w][48 bytes w][count b][12 bytes b]; keep 24
    # bytes of w's data
    cut_at = len(good_legacy) - (8 + 12) - 24
    bad('truncated_legacy.pth', good_legacy[:cut_at],
        'legacy stream (2 storages: 48 and 12 bytes) cut in the middle of '
        'the data of the first storage: 24 of its 48 bytes present, the '
        'second storage absent (%d bytes missing)'
        % (len(good_legacy) - cut_at), twin=good_legacy)

    # crc_flip: flip one byte in the middle of data/0
    z = bytearray(good_zip)
    with zipfile.ZipFile(io.BytesIO(good_zip)) as zz:
        info = zz.getinfo('archive/data/0')
    name_len, extra_len = struct.unpack_from('<HH', z, info.header_offset + 26)
    pos = info.header_offset + 30 + name_len + extra_len + info.file_size // 2
    z[pos] ^= 0x01
    bad('crc_flip.pth', bytes(z),
        'one bit flipped in the middle of record `archive/data/0` (byte %d '
        'of the file); its CRC-32 in the local header and central directory '
        'no longer matches' % pos,
        expect='`inspect --stats` exits 3 (the data is read and its CRC '
        'checked). Plain `inspect` reads no data and MAY succeed (exit 0)',
        twin=good_zip)

    # one zeroed CRC among computed ones: a torch file written without CRCs
    # has every CRC 0, one written under skip_data every storage record's,
    # so this is tampering and must still be checked
    two = [T('w', numel=6), T('b', key='1', numel=3, size=(3,), stride=(1,))]
    recs = ckpt_recs(two)
    recs[1].crc = 0
    bad('crc_one_zeroed.pth', raw_zip(recs),
        'record `archive/data/0` declares CRC-32 0 while `archive/data/1`, '
        '`data.pkl` and `version` carry theirs (torch with compute_crc32 off '
        'zeroes every CRC, under skip_data every storage record\'s, never one '
        'of them): its data no longer matches',
        expect='`inspect --stats` exits 3 (the data is read and its CRC '
        'checked). Plain `inspect` reads no data and MAY succeed (exit 0)',
        twin=raw_zip(ckpt_recs(two)))

    touch = 'touch ' + PWNED
    bad('os_system.pth',
        pickle_zip(PROTO2 + G('os', 'system') + U(touch) + TUPLE1 + REDUCE
                   + STOP),
        "data.pkl is `GLOBAL 'os system'` + REDUCE `('%s',)`: code "
        'execution on unpickling; must be refused naming the global, and '
        '%s must not appear' % (touch, PWNED))
    bad('posix_system.pth',
        pickle_zip(PROTO2 + G('posix', 'system') + U(touch) + TUPLE1 + REDUCE
                   + STOP),
        "as os_system.pth with `GLOBAL 'posix system'`")
    bad('builtins_eval.pth',
        pickle_zip(PROTO2 + G('builtins', 'eval')
                   + U("__import__('os').system('%s')" % touch) + TUPLE1
                   + REDUCE + STOP),
        "`GLOBAL 'builtins eval'` + REDUCE of a string that runs `%s`"
        % touch)
    bad('os_system_nested.pth',
        zip_bytes(state_dict_pickle(
            GOOD, extra=U('hook') + G('os', 'system') + U(touch) + TUPLE1
            + REDUCE), data_for(GOOD)),
        'a valid state dict (2 tensors) with one more entry `hook` whose '
        "value is `os.system('%s')` (GLOBAL + REDUCE); the refusal should "
        'name the global and the path `hook`' % touch, twin=good_zip)

    bad('memo_bad_index.pth',
        pickle_zip(PROTO2 + EMPTY_DICT + BINPUT(0) + U('k') + BINGET(7)
                   + SETITEM + STOP),
        'BINGET 7 (memo index never PUT; only memo 0 exists)')
    bad('stack_underflow.pth',
        pickle_zip(PROTO2 + TUPLE2 + STOP),
        'TUPLE2 on an empty stack')
    bad('stack_underflow_reduce.pth',
        pickle_zip(PROTO2 + G('collections', 'OrderedDict') + REDUCE + STOP),
        'REDUCE with only the callable on the stack (no argument tuple)')
    bad('mark_bomb.pth',
        pickle_zip(PROTO2 + MARK * 10**6 + STOP),
        '10^6 MARK opcodes, then STOP with an empty stack')
    bad('setitems_on_list.pth',
        pickle_zip(PROTO2 + EMPTY_LIST + MARK + U('a') + I(1) + SETITEMS
                   + STOP),
        'SETITEMS applied to a list (EMPTY_LIST MARK "a" 1 SETITEMS)')
    depth = 100000
    bad('deep_nesting.pth',
        pickle_zip(PROTO2 + EMPTY_LIST * depth + APPEND * (depth - 1) + STOP),
        'list inside a list ... %d deep (EMPTY_LIST x %d, APPEND x %d): a '
        'well-formed pickle that must hit a nesting limit, not the C stack'
        % (depth, depth, depth - 1))

    too_small = [T('w', numel=6, size=(4, 4), stride=(4, 1))]
    bad('storage_too_small.pth', ckpt_zip(too_small),
        'tensor `w` of shape (4,4) stride (4,1) (reaches element 15) on a '
        'FloatStorage of numel 6; the record holds the 24 bytes it announces',
        twin=ckpt_zip([T('w', numel=16, size=(4, 4), stride=(4, 1))]))
    past = [T('w', numel=6, offset=10, size=(2,), stride=(1,))]
    bad('storage_offset_past_end.pth', ckpt_zip(past),
        'tensor `w` with storage_offset 10, size (2,) on a FloatStorage of '
        'numel 6',
        twin=ckpt_zip([T('w', numel=6, offset=4, size=(2,), stride=(1,))]))

    short = data_for(GOOD)
    short['0'] = short['0'][:40]
    bad('record_size_mismatch.pth', ckpt_zip(GOOD, data=short),
        'storage 0 is FloatStorage numel 12 (48 bytes) but record '
        '`archive/data/0` holds 40 bytes (torch 1.13 does not check this '
        'and reads past the buffer)', twin=good_zip)
    # issue 26: the second local header's signature zeroed.  torch's miniz
    # checks it when it extracts the record (torch 2.15 and 1.13: "invalid
    # header or archive is corrupted"); libzip reads past it
    zeroed = bytearray(good_zip)
    at = zipfile.ZipFile(io.BytesIO(good_zip)).infolist()[1].header_offset
    zeroed[at:at + 4] = bytes(4)
    bad('local_header_zeroed.pth', bytes(zeroed),
        'the local header signature of the second record (`archive/data/0`) '
        'zeroed; the central directory is intact', twin=good_zip)
    missing = data_for(GOOD)
    del missing['1']
    bad('missing_record.pth', ckpt_zip(GOOD, data=missing),
        'storage key "1" is referenced by tensor `b` but there is no record '
        '`archive/data/1`', twin=good_zip)

    foo = [T('w', stype='FooStorage', numel=6)]
    bad('unknown_storage_type.pth', ckpt_zip(foo),
        "persistent id names `GLOBAL 'torch FooStorage'` (no such storage "
        'type)', twin=ckpt_zip([T('w', numel=6)]))

    bad('bad_utf8.pth',
        pickle_zip(PROTO2 + EMPTY_DICT + U(b'ok\xff\xfe\xc0\x80') + I(1)
                   + SETITEM + STOP),
        'dict key is BINUNICODE with invalid UTF-8 (ff fe, and overlong '
        'c0 80)')
    bad('huge_length.pth',
        pickle_zip(PROTO2 + b'X' + struct.pack('<I', 0x80000000) + b'abc'
                   + STOP),
        'BINUNICODE whose u32 length field is 0x80000000 (2 GiB) in a '
        'data.pkl of a few bytes')

    bad('legacy_bad_count.pth',
        legacy_bytes(GOOD_LEGACY, counts={LEGACY_KEYS[0]: 13},
                     data={LEGACY_KEYS[0]: f32(13), LEGACY_KEYS[1]: f32(3)}),
        'legacy file: storage %s is FloatStorage numel 12 in the pickle but '
        'its int64 element count in the data section says 13 (and 13 '
        'elements follow, so the file is otherwise self-consistent)'
        % LEGACY_KEYS[0], twin=good_legacy)

    bad('not_a_checkpoint.pth',
        b'This is not a PyTorch checkpoint.\n'
        b'It is plain text that happens to end in .pth; no zip signature,\n'
        b'no pickle protocol header, nothing to load.\n' * 3,
        'plain ASCII text')
    bad('empty.pth', b'', 'empty file (0 bytes)')
    bad('no_prefix_dir.pth', ckpt_zip(GOOD, prefix=''),
        'valid records but not inside a folder (`data.pkl`, `data/0`, '
        '`data/1`, `version` at the top level): torch refuses with "file in '
        'archive is not in a subdirectory"', twin=good_zip)


    # ---- zip container: sizes that lie, records that share bytes or names
    # (written field by field: raw_zip)
    good_raw = raw_zip(ckpt_recs(GOOD))
    n29 = [T('w', numel=2**29, size=(2**29,), stride=(1,))]
    recs = ckpt_recs(n29, data={'0': f32(12)})
    recs[1].csize = recs[1].usize = 2**31
    z = raw_zip(recs)
    bad('zip_bomb_stored.pth', z,
        'zip bomb by declaration: stored record `archive/data/0` holds 48 '
        'bytes, but its local header and central directory entry both say '
        '2147483648 (2 GiB, exactly what its storage, FloatStorage numel '
        '2^29, needs): the record would run 2 GiB past the end of the '
        '%d-byte file, through the next records and the central directory'
        % len(z))
    n38 = [T('w', numel=2**38, size=(2**38,), stride=(1,))]
    recs = ckpt_recs(n38, data={'0': f32(12)})
    recs[1].csize = recs[1].usize = 2**40
    z = raw_zip(recs)
    bad('zip_bomb_zip64.pth', z,
        'as zip_bomb_stored.pth with zip64 sizes: `archive/data/0` (48 bytes '
        'in the file) declares 2^40 bytes (1 TiB) in the zip64 extra fields '
        'of its local and central headers, what its storage (FloatStorage '
        'numel 2^38) needs; the file is %d bytes' % len(z))
    recs = ckpt_recs(n29, data={'0': b''})
    recs[1] = deflated('archive/data/0', f32(12), usize=2**31)
    z = raw_zip(recs)
    bad('zip_bomb_deflate.pth', z,
        'deflated record `archive/data/0` whose headers declare an '
        'uncompressed size of 2147483648 (2 GiB, what its storage, '
        'FloatStorage numel 2^29, needs); the deflate stream (%d bytes) '
        'inflates to 48' % len(recs[1].payload), expect=DATA_LEVEL)
    recs = ckpt_recs(GOOD)
    recs[0] = deflated('archive/data.pkl', recs[0].payload)
    twin = raw_zip(recs)
    recs[0].usize = 2**30 - 64
    bad('zip_bomb_pickle.pth', raw_zip(recs),
        'deflated `archive/data.pkl` whose headers declare an uncompressed '
        'size of 1073741760 bytes (64 under the 1 GiB pickle limit); the '
        '%d-byte stream inflates to %d' % (len(recs[0].payload),
                                         len(state_dict_pickle(GOOD))),
        twin=twin)
    recs = ckpt_recs(GOOD)
    plain = data_for(GOOD)['0']
    recs[1] = deflated('archive/data/0', plain)
    twin = raw_zip(recs)
    recs[1] = deflated('archive/data/0', plain + bytes(1 << 20),
                       crc=zlib.crc32(plain), usize=len(plain))
    bad('zip_deflate_overrun.pth', raw_zip(recs),
        'deflated `archive/data/0` declares 48 bytes (and the CRC-32 of its '
        'first 48), but its %d-byte deflate stream inflates to 48 + 1048576 '
        'bytes: a reader that stops at the declared size and checks the CRC '
        'sees nothing wrong' % len(recs[1].payload), twin=twin,
        expect=DATA_LEVEL)

    pair = [T('w', numel=6, size=(2, 3), stride=(3, 1)),
            T('b', key='1', numel=6, size=(6,), stride=(1,))]
    recs = ckpt_recs(pair)
    twin = raw_zip(recs)
    d1 = recs.pop(2)    # archive/data/1: central entry only
    d1.payload = recs[1].payload
    d1.crc = recs[1].crc
    cen = [(recs[0], recs[0]), (recs[1], recs[1]), (d1, recs[1]),
           (recs[2], recs[2])]
    cen = [(r, (lambda o=o: o.offset)) for r, o in cen]
    bad('overlapping_records.pth', raw_zip(recs, cen),
        'the central directory entries of `archive/data/0` and '
        '`archive/data/1` (two 24-byte storages) point at the same local '
        'header (named `archive/data/0`): both tensors would read the same '
        'bytes; sizes and CRC-32s agree, so only the overlap is wrong',
        twin=twin)
    pair = [T('w', numel=16, size=(4, 4), stride=(4, 1)),
            T('b', key='1', numel=3, size=(3,), stride=(1,))]
    recs = ckpt_recs(pair)
    twin = raw_zip(recs)
    d1 = recs.pop(2)
    inner = local_header(d1) + d1.payload            # 30 + 14 + 12 bytes
    recs[1] = Rec('archive/data/0', b'\0' * 4 + inner
                  + b'\0' * (64 - 4 - len(inner)))
    d0 = recs[1]
    cen = [(recs[0], lambda: recs[0].offset), (d0, lambda: d0.offset),
           (d1, lambda: d0.offset + 30 + len(d0.name) + 4),
           (recs[2], lambda: recs[2].offset)]
    bad('overlapping_records_nested.pth', raw_zip(recs, cen),
        '`archive/data/1` (12 bytes) has no local record of its own: its '
        'central entry points at a complete local header + data hidden at '
        'byte 4 of the 64-byte data of `archive/data/0`, so the two '
        'records overlap (each CRC-32 is right)', twin=twin)

    recs = ckpt_recs(GOOD)
    recs.insert(2, Rec('archive/data/0', f32(12, start=100.0)))
    bad('duplicate_record.pth', raw_zip(recs),
        'two records named `archive/data/0` (both 48 bytes, different '
        'values: 0.0, 0.25, ... and 100.0, 100.25, ...); which one is '
        'tensor `w` depends on the reader', twin=good_raw)
    recs = ckpt_recs(GOOD)
    recs.append(Rec('archive/data.pkl',
                    PROTO2 + G('os', 'system') + U('touch ' + PWNED) + TUPLE1
                    + REDUCE + STOP))
    bad('duplicate_data_pkl.pth', raw_zip(recs),
        'two records named `archive/data.pkl`: the first a valid state dict, '
        "the last (which Python's zipfile reads) `os.system('touch %s')`; a "
        'reader that takes the first one sees a clean file' % PWNED,
        twin=good_raw)

    zrecs = zipfile.ZipFile(io.BytesIO(good_zip)).infolist()
    d0_at = zrecs[1].header_offset
    cd_at = len(good_zip) - 22 - sum(46 + len(i.filename) for i in zrecs)
    bad('truncated_local_header.pth', good_zip[:d0_at + 20],
        'the good twin of crc_flip.pth (2 tensors, %d bytes) cut 20 bytes '
        'into the local header of `archive/data/0` (byte %d): no record '
        'data after it, no central directory' % (len(good_zip), d0_at + 20),
        twin=good_zip)
    bad('truncated_central_directory.pth', good_zip[:cd_at + 46 + 10],
        'the same zip cut in its central directory: the first central '
        'entry (at byte %d) is complete up to 10 bytes into its name, the '
        'rest and the end record are missing' % cd_at, twin=good_zip)
    bad('truncated_end_record.pth', good_zip[:-10],
        'the same zip without the last 10 bytes: the end-of-central-'
        'directory record is cut (its directory size and offset fields are '
        'gone)', twin=good_zip)

    # ---- tensors: shapes, strides, offsets, storage sizes
    one = ckpt_zip([T('w', numel=6)])   # w (2,3) stride (3,1) on 6 floats
    bad('shape_overflow.pth',
        ckpt_zip([T('w', numel=6, size=(2**32, 2**32), stride=(2**32, 1))]),
        'tensor `w` of shape (2^32, 2^32): its element count, 2^64, wraps '
        'to 0 in 64 bits (stride (2^32, 1), storage of 6 floats)', twin=one)
    bad('shape_overflow_int64.pth',
        ckpt_zip([T('w', numel=6, size=(2**62, 3), stride=(0, 0))]),
        'tensor `w` of shape (2^62, 3) and stride (0, 0) (every element is '
        'element 0, inside the storage): 3 x 2^62 elements fit in uint64 '
        'but not in int64', twin=one)
    bad('stride_outside.pth',
        ckpt_zip([T('w', numel=6, size=(2, 3), stride=(6, 1))]),
        'tensor `w` of shape (2, 3), offset 0, on a FloatStorage of numel 6: '
        'its 6 elements fit, but stride (6, 1) reaches element 8',
        twin=one)
    bad('stride_overflow.pth',
        ckpt_zip([T('w', numel=6, size=(2, 3), stride=(2**62, 1))]),
        'tensor `w` of shape (2, 3) with stride (2^62, 1): it reaches '
        'element 2^62 + 2, whose byte offset overflows 64 bits', twin=one)
    bad('negative_size.pth',
        ckpt_zip([T('w', numel=6, size=(-1, 3), stride=(3, 1))]),
        'tensor `w` of shape (-1, 3)', twin=one)
    # torch 2.x's untyped storages (v3): sizes count bytes
    u16 = G('torch', 'uint16')
    bad('v3_view_past_end.pth',
        ckpt_zip([T('w', numel=6, size=(4,), stride=(1,), v3=u16)],
                 data={'0': bytes(6)}),
        'a uint16 tensor `w` of 4 elements (8 bytes) over an untyped storage of 6 bytes',
        twin=one)
    bad('v3_unknown_dtype.pth',
        ckpt_zip([T('w', numel=8, size=(8,), stride=(1,), v3=G('torch', 'int4'))],
                 data={'0': bytes(8)}),
        '`_rebuild_tensor_v3` whose dtype is `torch.int4`, which torch cannot save',
        twin=one)
    bad('v3_dtype_not_global.pth',
        ckpt_zip([T('w', numel=8, size=(4,), stride=(1,), v3=U('uint16'))],
                 data={'0': bytes(8)}),
        '`_rebuild_tensor_v3` whose dtype argument is the string `uint16`, not a dtype',
        twin=one)
    # classes that are neither state-dict data nor modules: the refusal's hint
    # names every one of them (tests/cli/inspect.sh runs it), or says that
    # no option reads the file when it also names code
    def obj_of(mod, name, v):
        return (G(mod, name) + EMPTY_TUPLE + b'\x81' + EMPTY_DICT + U('v') + I(v) + SETITEM
                + b'b')
    two = (PROTO2 + ODICT + MARK + U('w') + tensor(T('w', numel=6)) + U('x')
           + obj_of('mymods', 'X', 1) + U('y') + obj_of('mymods', 'Y', 2) + SETITEMS + STOP)
    bad('two_unknown_classes.pth', zip_bytes(two, data_for([T('w', numel=6)])),
        'objects of two classes of the user\'s, `mymods.X` and `mymods.Y` (not modules)',
        twin=one)
    dang = (PROTO2 + ODICT + MARK + U('w') + tensor(T('w', numel=6)) + U('x')
            + obj_of('mymods', 'X', 1) + U('g') + G('operator', 'attrgetter') + U('a')
            + b'\x85' + REDUCE + SETITEMS + STOP)
    bad('unknown_and_dangerous.pth', zip_bytes(dang, data_for([T('w', numel=6)])),
        'an object of `mymods.X`, then `operator.attrgetter(\'a\')`', twin=one)
    # module trees (torch.save(model)) that cannot be a model's
    def module(children=b'', cls=('mymods', 'Net'), put=None):
        head = G(*cls) + EMPTY_TUPLE + b'\x81' + (BINPUT(put) if put is not None else b'')
        return (head + EMPTY_DICT + MARK + U('_parameters') + EMPTY_DICT + U('_buffers')
                + EMPTY_DICT + U('_modules') + EMPTY_DICT + children + SETITEMS + b'b')
    cyc = module(children=MARK + U('self') + BINGET(0) + SETITEMS, put=0)
    # a module whose child is itself: SETITEMS into _modules must come from
    # a MARK; the child is a memo reference to the module
    bad('module_cycle.pth', zip_bytes(PROTO2 + cyc + STOP, {}),
        'a module whose `_modules` holds the module itself', twin=one)
    deep = b''
    for _ in range(300):
        deep = module(children=(U('m') + deep + SETITEM) if deep else b'')
    bad('module_too_deep.pth', zip_bytes(PROTO2 + deep + STOP, {}),
        'modules nested 300 deep', twin=one)
    # torch 2.x's small records, with what torch.load refuses in them
    def with_record(name, payload):
        buf = io.BytesIO(ckpt_zip([T('w', numel=6)]))
        with zipfile.ZipFile(buf, 'a') as z:
            zi = zipfile.ZipInfo('archive/' + name, date_time=FIXED_TIME)
            zi.external_attr = 0o644 << 16
            z.writestr(zi, payload)
        return buf.getvalue()
    bad('byteorder_junk.pth', with_record('byteorder', b'middle\x00'),
        'a `byteorder` record holding `middle\\0`, neither little nor big', twin=one)
    bad('storage_alignment_junk.pth', with_record('.storage_alignment', b'6x4'),
        'a `.storage_alignment` record holding `6x4`, which torch parses with int()',
        twin=one)
    # quantized tensors: torch 2.x checks the quantizer when it loads
    def qtensor(stype, nbytes, size, stride, qparams):
        t = T('q', stype=stype, key='0', numel=nbytes, size=size, stride=stride)
        return (G('torch._utils', '_rebuild_qtensor') + MARK + pid(t) + I(0) + TUP(size)
                + TUP(stride) + qparams + NEWFALSE + ODICT + TUPLE + REDUCE)

    def per_channel(nscales, axis, scheme='per_channel_affine'):
        sc = T('s', stype='DoubleStorage', key='1', numel=nscales, size=(nscales,), stride=(1,))
        zp = T('z', stype='LongStorage', key='2', numel=nscales, size=(nscales,), stride=(1,))
        return MARK + G('torch', scheme) + tensor(sc) + tensor(zp) + I(axis) + TUPLE

    def q_zip(q, nbytes=6, nscales=2):
        pkl = PROTO2 + ODICT + MARK + U('q') + q + SETITEMS + STOP
        return zip_bytes(pkl, {'0': bytes(range(nbytes)),
                               '1': struct.pack('<%dd' % nscales, *[0.5] * nscales),
                               '2': bytes(8 * nscales)})
    q_good = q_zip(qtensor('QInt8Storage', 6, (2, 3), (3, 1), per_channel(2, 0)))
    bad('q_axis_out_of_range.pth',
        q_zip(qtensor('QInt8Storage', 6, (2, 3), (3, 1), per_channel(2, 2))),
        'a per-channel quantized tensor `q` of shape (2, 3) whose axis is 2', twin=q_good)
    bad('q_scales_disagree.pth',
        q_zip(qtensor('QInt8Storage', 6, (2, 3), (3, 1), per_channel(3, 0)), nscales=3),
        'a per-channel quantized tensor `q` of shape (2, 3), axis 0, with 3 scales and 3 '
        'zero points for its 2 channels', twin=q_good)
    bad('q_not_a_qscheme.pth',
        q_zip(qtensor('QInt8Storage', 6, (2, 3), (3, 1),
                      MARK + G('torch', 'float32') + b'G' + struct.pack('>d', 0.5) + I(0)
                      + TUPLE)),
        'a quantized tensor whose qscheme is `torch.float32`', twin=q_good)
    bad('q_packed_short.pth',
        q_zip(qtensor('QUInt4x2Storage', 6, (3, 5), (5, 1),
                      MARK + G('torch', 'per_tensor_affine') + b'G' + struct.pack('>d', 0.5)
                      + I(0) + TUPLE)),
        'a quint4x2 tensor `q` of shape (3, 5): each row of 5 values packs into 3 bytes, '
        '9 in all, over a storage of 6 bytes', twin=q_good)
    bad('q_float_storage.pth',
        q_zip(qtensor('FloatStorage', 8, (2,), (1,),
                      MARK + G('torch', 'per_tensor_affine') + b'G' + struct.pack('>d', 0.5)
                      + I(0) + TUPLE), nbytes=8),
        '`_rebuild_qtensor` over a FloatStorage, which is not a quantized storage', twin=q_good)
    # sparse COO: the indices name one value per column
    coo_i = T('i', stype='LongStorage', key='0', numel=6, size=(2, 3), stride=(3, 1))
    coo_v = T('v', stype='FloatStorage', key='1', numel=2, size=(2,), stride=(1,))
    layout = G('torch.serialization', '_get_layout') + U('torch.sparse_coo') + b'\x85' + REDUCE
    coo = (G('torch._utils', '_rebuild_sparse_tensor') + MARK + layout + MARK + tensor(coo_i)
           + tensor(coo_v) + G('torch', 'Size') + MARK + TUP((4, 4)) + TUPLE + REDUCE
           + NEWFALSE + TUPLE + TUPLE + REDUCE)
    bad('sparse_coo_count.pth',
        zip_bytes(PROTO2 + ODICT + MARK + U('s') + coo + SETITEMS + STOP,
                  {'0': bytes(48), '1': f32(2)}),
        'a sparse COO tensor whose indices name 3 values and whose values tensor has 2',
        twin=one)
    bad('negative_stride.pth',
        ckpt_zip([T('w', numel=6, offset=2, size=(2, 3), stride=(3, -1))]),
        'tensor `w` of shape (2, 3), stride (3, -1), offset 2 (every element '
        'it names is inside the storage; torch has no negative strides)',
        twin=one)
    bad('negative_offset.pth',
        ckpt_zip([T('w', numel=6, offset=-1, size=(2,), stride=(1,))]),
        'tensor `w` with storage_offset -1', twin=one)
    bad('storage_numel_overflow.pth',
        ckpt_zip([T('w', numel=2**62, size=(0,), stride=(1,))],
                 data={'0': b''}),
        'FloatStorage of numel 2^62: its byte size, 2^64, wraps to 0, which '
        'is the size of its (empty) record; the tensor is empty (shape (0,))',
        twin=ckpt_zip([T('w', numel=0, size=(0,), stride=(1,))]))
    bad('storage_negative_numel.pth',
        ckpt_zip([T('w', numel=-1, size=(0,), stride=(1,))],
                 data={'0': b''}),
        'FloatStorage of numel -1 (empty record, empty tensor)',
        twin=ckpt_zip([T('w', numel=0, size=(0,), stride=(1,))]))
    huge = [T('w', key=LEGACY_KEYS[0], numel=2**61, size=(3, 4),
              stride=(4, 1)), GOOD_LEGACY[1]]
    bad('legacy_huge_storage.pth',
        legacy_bytes(huge, counts={LEGACY_KEYS[0]: 2**61},
                     data={LEGACY_KEYS[0]: f32(12), LEGACY_KEYS[1]: f32(3)}),
        'legacy file: storage %s is FloatStorage numel 2^61 (2^63 bytes) in '
        'the pickle and in its element count, but 48 bytes follow'
        % LEGACY_KEYS[0], twin=good_legacy)

    # ---- pickle VM: memo, BUILD, lengths
    bad('binget_before_binput.pth',
        pickle_zip(PROTO2 + EMPTY_DICT + U('k') + BINGET(0) + SETITEM + STOP),
        'BINGET 0 with an empty memo (no PUT of any kind before it)')
    bad('memo_index_out_of_range.pth',
        pickle_zip(PROTO2 + EMPTY_LIST + b'p4294967296\n' + STOP),
        'protocol-0 PUT with memo index 4294967296 (2^32; BINPUT and '
        'LONG_BINPUT can only say up to 2^32 - 1)')
    bad('build_on_tensor_junk.pth',
        zip_bytes(PROTO2 + ODICT + MARK + U('w') + tensor(T('w', numel=6))
                  + U('junk') + I(7) + TUPLE2 + b'b' + SETITEMS + STOP,
                  data_for([T('w', numel=6)])),
        "state dict {w: tensor} where BUILD is applied to the rebuilt "
        "tensor with the state ('junk', 7) (torch would call "
        "tensor.set_('junk', 7))", twin=one)
    bad('storage_key_newline.pth',
        ckpt_zip([T('w', key='0\n\x1b[2J', numel=6)], data={'0': f32(6)}),
        'the storage key is `0`, newline, `ESC [2J` (a terminal\'s clear '
        'screen) and there is no record of that name (only '
        '`archive/data/0`): the message that names the key must still be '
        'one line, with the control characters escaped', twin=one)
    bad('huge_length8.pth',
        pickle_zip(b'\x80\x04' + b'\x8e' + struct.pack('<Q', 2**64 - 1)
                   + b'abc' + STOP),
        'BINBYTES8 whose u64 length field is 2^64 - 1, in a data.pkl of a '
        'few bytes')

    # ---- safetensors (the last column is what safetensors' own loader,
    # safetensors.torch.load_file, does with them)
    good_st = st_good()
    hdr = st_header(ST_GOOD)
    hlen = len(hdr) + (-len(hdr) % 8)
    bad('st_header_past_eof.safetensors',
        st_bytes(hdr, ST_DATA, length=hlen + 1000),
        'safetensors file of %d bytes whose 8-byte header length field says '
        '%d: the header would end 964 bytes past the end of the file'
        % (len(good_st), hlen + 1000), twin=good_st)
    bad('st_huge_header.safetensors',
        st_bytes(hdr, ST_DATA, length=100000001),
        'header length field 100000001, one byte over the 100,000,000-byte '
        'limit of the format (the file is %d bytes; tests/cli/convert.sh '
        'also checks a sparse file that really is that long)' % len(good_st),
        twin=good_st)
    bad('st_overlap.safetensors',
        st_good([('w', 'F32', (2, 3), (0, 24)), ('b', 'F32', (3,), (12, 24))],
                f32(6)),
        'tensors `w` (bytes 0-24) and `b` (bytes 12-24) overlap; each size '
        'matches its shape and both are inside the data', twin=st_good(
            [('w', 'F32', (2, 3), (0, 24)), ('b', 'F32', (3,), (24, 36))]))
    bad('st_size_mismatch.safetensors',
        st_good([('w', 'F32', (2, 3), (0, 20)), ('b', 'F32', (3,), (20, 32))],
                f32(8)),
        '`w` is F32 [2, 3] (24 bytes) but its data_offsets [0, 20] give it '
        '20 bytes', twin=good_st)
    bad('st_offsets_out_of_bounds.safetensors',
        st_good(ST_GOOD, f32(7)),
        '`b` (F32 [3], data_offsets [24, 36]) ends 8 bytes past the end of '
        'the 28-byte data section', twin=good_st)
    bad('st_bad_utf8.safetensors',
        st_bytes(st_header([(b'w\xff\xfe', 'F32', (2, 3), (0, 24)),
                            (b'b\xc0\x80', 'F32', (3,), (24, 36))]),
                 ST_DATA),
        'tensor names with invalid UTF-8 in the JSON header (`w` ff fe, '
        '`b` and the overlong c0 80)', twin=good_st)
    bad('st_bad_json.safetensors',
        st_bytes(hdr[:-1], ST_DATA),
        'the JSON header lacks its closing brace (padded with spaces to a '
        'multiple of 8, as usual)', twin=good_st)
    bad('st_unknown_dtype.safetensors',
        st_good([('w', 'Q4', (2, 3), (0, 24)), ('b', 'F32', (3,), (24, 36))]),
        '`w` has dtype "Q4", which is not a safetensors dtype', twin=good_st)
    bad('st_truncated_data.safetensors', good_st[:-4],
        'the good file without its last 4 bytes: tensor `b` (data_offsets '
        '[24, 36]) ends 4 bytes past the end of the data', twin=good_st)
    bad('st_duplicate_name.safetensors',
        st_good([('w', 'F32', (2, 3), (0, 24)), ('w', 'F32', (3,), (24, 36))]),
        'the name `w` appears twice in the JSON header (a JSON parser keeps '
        'one of them silently)', twin=good_st)

    # the sub-byte dtypes of safetensors 0.6+: F4 (4 bits, a torch
    # float4_e2m1fn_x2 byte holds two along the last dimension) and F6_E2M3 /
    # F6_E3M2 (6 bits, packed; no torch dtype)
    bad('st_f4_half_byte.safetensors',
        st_good([('w', 'F4', (5,), (0, 3)), ('b', 'F32', (3,), (3, 15))],
                bytes(3) + f32(3)),
        '`w` is F4 [5]: 20 bits, which do not end on a byte boundary (its '
        'data_offsets give it 3 bytes)', twin=good_st)
    bad('st_f4_size_mismatch.safetensors',
        st_good([('w', 'F4', (2, 6), (0, 4)), ('b', 'F32', (3,), (4, 16))],
                bytes(4) + f32(3)),
        '`w` is F4 [2, 6] (12 values, 6 bytes) but its data_offsets [0, 4] '
        'give it 4 bytes', twin=good_st)
    bad('st_f4_odd_last_dim.safetensors',
        st_good([('w', 'F4', (2, 3), (0, 3)), ('b', 'F32', (3,), (3, 15))],
                bytes(3) + f32(3)),
        '`w` is F4 [2, 3]: whole bytes (3), but torch\'s float4_e2m1fn_x2 '
        'packs the last dimension in pairs and 3 is odd', twin=good_st)
    bad('st_f6_partial_byte.safetensors',
        st_good([('w', 'F6_E2M3', (3,), (0, 3)), ('b', 'F32', (3,), (3, 15))],
                bytes(3) + f32(3)),
        '`w` is F6_E2M3 [3]: 18 bits, which do not end on a byte boundary '
        '(its data_offsets give it 3 bytes)', twin=good_st)
    bad('st_f6_size_mismatch.safetensors',
        st_good([('w', 'F6_E3M2', (4,), (0, 4)), ('b', 'F32', (3,), (4, 16))],
                bytes(4) + f32(3)),
        '`w` is F6_E3M2 [4] (24 bits, 3 bytes) but its data_offsets [0, 4] '
        'give it 4 bytes', twin=good_st)

    # strict safetensors (issue 26): what safetensors 0.8's reader refuses
    # (serde_json into usize fields, then Metadata::validate), each a
    # one-place edit of the good header; tests/interop/safetensors_strict.py
    # checks that safetensors 0.8 refuses every one of them too
    def st_edit(old, new_text, data=ST_DATA):
        h = st_header(ST_GOOD)
        assert h.count(old) == 1, old
        return st_bytes(h.replace(old, new_text), data)
    bad('st_float_shape.safetensors',
        st_edit(b'"shape":[2,3]', b'"shape":[2.0,3]'),
        '`w` has shape [2.0, 3]: a float where safetensors reads an integer '
        '(serde: "invalid type: floating point")', twin=good_st)
    bad('st_exponent_offset.safetensors',
        st_edit(b'"data_offsets":[24,36]', b'"data_offsets":[24,36e0]'),
        '`b` has data_offsets [24, 36e0]: an exponent makes it a float',
        twin=good_st)
    bad('st_negative_zero.safetensors',
        st_edit(b'"data_offsets":[0,24]', b'"data_offsets":[-0,24]'),
        '`w` has data_offsets [-0, 24]: -0 is a float to serde, not a usize',
        twin=good_st)
    bad('st_hole.safetensors',
        st_good([('w', 'F32', (2, 3), (0, 24)), ('b', 'F32', (3,), (28, 40))],
                f32(10)),
        'bytes 24-28 of the data belong to no tensor (`b` starts at 28): '
        'safetensors wants the tensors back to back', twin=good_st)
    bad('st_trailing_bytes.safetensors',
        st_good(ST_GOOD, ST_DATA + b'\0' * 4),
        'the good file with 4 bytes after the last tensor\'s data '
        '(safetensors: "incomplete metadata, file not fully covered")',
        twin=good_st)
    bad('st_empty_tensor_inside.safetensors',
        st_good(ST_GOOD + [('e', 'F32', (0,), (4, 4))]),
        'an empty tensor `e` at data_offsets [4, 4], inside `w`: safetensors '
        'wants even an empty tensor where the one before it ends',
        twin=good_st)
    bad('st_lone_surrogate.safetensors',
        st_bytes(st_header(ST_GOOD).replace(b'"w"', b'"w\\ud800"'), ST_DATA),
        'the name `w` followed by the escape \\ud800, a lone surrogate: no '
        'character (serde: "lone leading surrogate")', twin=good_st)
    bad('st_control_char.safetensors',
        st_bytes(st_header(ST_GOOD).replace(b'"w"', b'"w\x1b[2J"'), ST_DATA),
        'a raw ESC byte (0x1b) inside the name `w`: JSON wants control '
        'characters escaped', twin=good_st)
    bad('st_nul_name.safetensors',
        st_bytes(st_header(ST_GOOD).replace(b'"w"', b'"w\\u0000x"'), ST_DATA),
        'the name `w\\u0000x`: safetensors 0.8 reads it whole (its one '
        'departure here: ckpt refuses a NUL in a name rather than cut the name '
        'at it)', twin=good_st)
    bad('st_metadata_not_string.safetensors',
        st_bytes(st_header(ST_GOOD).replace(b'{"format":"pt"}',
                                            b'{"format":"pt","epoch":3}'),
                 ST_DATA),
        '__metadata__ value `epoch` is the number 3: metadata values are '
        'strings', twin=good_st)
    bad('st_two_metadata.safetensors',
        st_bytes(st_header(ST_GOOD).replace(
            b'{"__metadata__":{"format":"pt"}',
            b'{"__metadata__":{"format":"pt"},"__metadata__":{"format":"np"}'),
            ST_DATA),
        '__metadata__ twice (serde: "duplicate field")', twin=good_st)
    bad('st_duplicate_field.safetensors',
        st_edit(b'"dtype":"F32","shape":[2,3]',
                b'"dtype":"F32","dtype":"F16","shape":[2,3]'),
        '`w` has dtype twice, F32 then F16 (serde: "duplicate field")',
        twin=good_st)
    bad('st_deep_nesting.safetensors',
        st_edit(b'"data_offsets":[0,24]',
                b'"data_offsets":[0,24],"x":' + b'[' * 200 + b']' * 200),
        '`w` has an unknown field `x` of 200 nested lists: safetensors skips '
        'unknown fields but refuses JSON nested 128 deep', twin=good_st)
    bad('st_huge_dimension.safetensors',
        st_edit(b'"shape":[3]', b'"shape":[18446744073709551616]'),
        '`b` has a dimension of 2^64, past any usize', twin=good_st)
    bad('st_trailing_garbage.safetensors',
        st_bytes(st_header(ST_GOOD) + b'x', ST_DATA),
        'the JSON header followed by `x` and padding: only spaces may follow '
        'the object', twin=good_st)

    # ---- shard indexes (*.index.json); torch has no loader for them
    bad('sharded_missing_shard.index.json',
        index_json({'w': 'model-00001-of-00002.safetensors',
                    'b': 'model-00002-of-00002.safetensors'}),
        'a shard index whose weight_map names two shards, neither of which '
        'exists beside it')
    bad('sharded_escape.index.json',
        index_json({'n.1.weight': '../data/mlp.pth'}),
        'the weight_map names `../data/mlp.pth` (a real checkpoint, outside '
        'the folder of the index): shards must be plain file names beside it')
    bad('sharded_absolute.index.json',
        index_json({'w': '/etc/passwd'}),
        'the weight_map names the absolute path `/etc/passwd`')
    bad('sharded_bad_shard.index.json',
        index_json({'w': 'st_overlap.safetensors',
                    'b': 'st_overlap.safetensors'}),
        'a shard index over `st_overlap.safetensors` (above): the refusal '
        'names the shard')
    bad('sharded_nul_shard.index.json',
        index_json({'w': 'st_overlap.safetensors\u0000.bin'}),
        'the weight_map names `st_overlap.safetensors\\u0000.bin`: cut at the '
        'NUL it would name a hostile file beside it; Python cannot open it')


    # ---- TorchScript archives (torch.jit.save): data.pkl is a module object
    # of an archive class; code/ says which attributes are its tensors
    w = T('weight', numel=6)
    mod_pkl = (PROTO2 + G('__torch__.m', 'Net') + EMPTY_TUPLE + b'\x81'
               + EMPTY_DICT + MARK + U('training') + NEWFALSE + U('weight')
               + tensor(w) + SETITEMS + b'b' + STOP)
    good_code = b'class Net(Module):\n  __parameters__ = ["weight", ]\n' \
                b'  __buffers__ = []\n  weight : Tensor\n'
    bad('ts_unterminated_list.pt',
        ts_zip(mod_pkl, b'class Net(Module):\n  __parameters__ = ["weight", \n'
               b'  __buffers__ = []\n', data_for([w])),
        'a TorchScript archive whose `code/__torch__/m.py` opens '
        '`__parameters__ = [` and never closes it on its line')
    bad('ts_huge_line.pt',
        ts_zip(mod_pkl, b'class ' + b'N' * (2 << 20) + b'(Module):\n'
               + good_code, data_for([w])),
        'a TorchScript archive whose code file starts with a 2 MiB class '
        'header line (the class name is longer than any ckpt reads)')
    bad('ts_no_lists.pt',
        ts_zip(mod_pkl, b'class Net(Module):\n  training : bool\n'
               b'  weight : Tensor\n', data_for([w])),
        'a TorchScript archive whose module class `Net` has no '
        '`__parameters__` / `__buffers__` lists')
    bad('ts_missing_class.pt',
        ts_zip(mod_pkl.replace(b'\nNet\n', b'\nOther\n'), good_code,
               data_for([w])),
        'a TorchScript archive whose data.pkl builds `__torch__.m.Other`, '
        'which no code file defines (the code defines `Net`)')


def ts_zip(pkl, code, data):
    """A TorchScript archive: data.pkl, constants.pkl (empty tuple), one
    code file `code/__torch__/m.py`, the storages, version."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, 'w') as z:
        def add(name, b):
            zi = zipfile.ZipInfo('archive/' + name, date_time=FIXED_TIME)
            zi.external_attr = 0o644 << 16
            z.writestr(zi, b)
        add('data.pkl', pkl)
        add('code/__torch__/m.py', code)
        for k in sorted(data):
            add('data/' + k, data[k])
        add('constants.pkl', b'\x80\x02).')
        add('version', b'3\n')
    return buf.getvalue()


TORCH_PROBE = r'''
import sys, signal, io, os
import torch
def h(*a): raise TimeoutError('timeout')
signal.signal(signal.SIGALRM, h)
for p in sys.argv[1:]:
    signal.alarm(20)
    try:
        kind = p.split(':', 1)[0]
        path = p.split(':', 1)[1]
        if path.endswith('.json'):
            r = 'n/a (no shard index loader)'
            print(kind + '\t' + os.path.basename(path) + '\t' + r, flush=True)
            continue
        if path.endswith('.safetensors'):
            try:
                import safetensors.torch
            except ImportError:
                print(kind + '\t' + os.path.basename(path)
                      + '\tn/a (safetensors not installed)', flush=True)
                continue
            safetensors.torch.load_file(path)
        else:
            try:
                torch.load(path, map_location='cpu', weights_only=True)
            except Exception as e:
                # a good twin of a kind 1.13's weights-only loader lacks
                # (quantized): our own file, loaded trusted
                if kind != 'twin' or 'Unsupported class' not in str(e):
                    raise
                torch.load(path, map_location='cpu', weights_only=False)
        r = 'loads'
    except BaseException as e:
        m = str(e).replace('\n', ' ')
        m = ''.join(c if c.isprintable() else ascii(c)[1:-1] for c in m)
        k = m.find('WeightsUnpickler error: ')
        if k >= 0:
            m = 'weights-only: ' + m[k + 24:]
        r = '%s: %s' % (type(e).__name__, m[:160])
        if path.endswith('.safetensors'):
            r = 'safetensors: ' + r
    signal.alarm(0)
    print(kind + '\t' + os.path.basename(path) + '\t' + r, flush=True)
'''


def torch_reactions(outdir, twins):
    """{name: reaction} for hostile files; raises if a twin fails."""
    args = ['bad:' + os.path.join(outdir, n) for n, *_ in FILES]
    args += ['twin:' + p for p in twins]
    try:
        r = subprocess.run([sys.executable, '-c', TORCH_PROBE] + args,
                           capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired:
        return None
    if r.returncode != 0 and not r.stdout:
        return None
    out = {}
    for line in r.stdout.splitlines():
        kind, name, res = line.split('\t', 2)
        if kind == 'twin' and res != 'loads' and not res.startswith('n/a'):
            raise SystemExit('make_bad.py: good twin %s does not load: %s'
                             % (name, res))
        if kind == 'bad':
            out[name] = res
    return out


def main():
    argv = sys.argv[1:]
    use_torch = True
    if argv and argv[0] == '--no-torch':
        use_torch = False
        argv = argv[1:]
    if len(argv) != 1:
        sys.exit('usage: make_bad.py [--no-torch] OUTDIR')
    out = argv[0]
    os.makedirs(out, exist_ok=True)
    if os.path.exists(PWNED):
        os.unlink(PWNED)
    build()
    for name, content, *_ in FILES:
        with open(os.path.join(out, name), 'wb') as f:
            f.write(content)

    reactions = None
    tv = None
    if use_torch:
        try:
            import torch
            tv = torch.__version__
            try:
                import safetensors
                stv = safetensors.__version__
            except ImportError:
                stv = 'not installed'
        except ImportError:
            use_torch = False
    if use_torch:
        import tempfile
        with tempfile.TemporaryDirectory() as td:
            twins = []
            for name, _, _, _, twin in FILES:
                if twin is not None:
                    p = os.path.join(td, 'twin_' + name)
                    with open(p, 'wb') as f:
                        f.write(twin)
                    twins.append(p)
            reactions = torch_reactions(out, twins)
        if os.path.exists(PWNED):
            raise SystemExit('make_bad.py: %s was created!' % PWNED)

    lines = [
        '# tests/bad — hostile and malformed inputs',
        '',
        'Generated by `tests/bad/make_bad.py` (pickles crafted byte by byte; '
        'zips built with Python zipfile, stored, folder `archive/`, '
        '`version` = `3\\n`; safetensors headers and shard indexes '
        '(`*.index.json`) written as bytes):',
        '',
        '    $PYTHON tests/bad/make_bad.py tests/bad    # after make_fixtures.py',
        '',
        'Every file must be refused by `ckpt inspect FILE` with exit status '
        '3 and exactly one stderr line `ckpt: inspect: <file>: <message>`, '
        'and nothing may be executed (`%s` must never appear). Exception: '
        'the files whose defect is in the record data (%s) are refused by '
        '`ckpt inspect --stats` (plain `inspect` reads no data and may exit '
        '0). `ckpt convert FILE OUT.safetensors` must refuse every file the '
        'same way (exit 3, one line `ckpt: convert: <file>: <message>`), '
        'leaving no OUT behind. tests/cli/bad_inputs.sh checks all this, and '
        'the gist of each message.' % (PWNED, ', '.join(
            '`%s`' % n for n, _, _, e, _ in FILES
            if e != '`inspect` exits 3')),
        '',
        'Files marked "twin" differ from a checkpoint that torch loads by '
        'exactly the defect: the generator builds that twin with the same '
        'code and checks that torch loads it.',
    ]
    if reactions is not None:
        lines.append('The last column is what torch `%s` does with '
                     '`torch.load(f, map_location="cpu", weights_only=True)`'
                     ' (never run without weights_only); for the '
                     '`.safetensors` files, what `safetensors.torch.load_file'
                     '(f)` of safetensors `%s` does.' % (tv, stv))
    lines += ['']
    if reactions is not None:
        lines += ['| file | what is wrong | ckpt must | twin | torch %s, '
                  'weights_only=True |' % tv, '|---|---|---|---|---|']
    else:
        lines += ['| file | what is wrong | ckpt must | twin |',
                  '|---|---|---|---|']
    for name, content, why, expect, twin in FILES:
        row = '| `%s` | %s | %s | %s |' % (name, why, expect,
                                           'yes' if twin else '')
        if reactions is not None:
            row += ' %s |' % reactions.get(name, '?').replace('|', '\\|')
        lines.append(row)
    lines.append('')
    with open(os.path.join(out, 'README.md'), 'w') as f:
        f.write('\n'.join(lines))
    for name, content, *_ in FILES:
        print('%-36s %8d  %s' % (name, len(content),
                                 (reactions or {}).get(name, '')))


if __name__ == '__main__':
    main()
