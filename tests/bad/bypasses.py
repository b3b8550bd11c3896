"""The files that once scanned SAFE (or exit 3) while torch.load would run their payload
(issue 15), built opcode by opcode: never pickled, never unpickled here.

Used by tests/bad/make_scan_corpus.py (which writes them into tests/bad/scan with the globals
`ckpt scan` must report) and tests/interop/scan_bypasses.py (which checks, with inert
recording stand-ins, that torch 1.13 and 2.x really ask for those globals).  Plain python3."""
import io
import struct
import zipfile


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
