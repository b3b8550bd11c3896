"""Legacy checkpoints whose pickle chain torch.load reads otherwise than a contiguous reader
(issue 26), built opcode by opcode: never pickled, never unpickled here.

torch's legacy loader calls pickle_module.load(f) five times on one buffered file object
(magic number, protocol version, sys_info, the data pickle, the storage keys).  CPython's C
unpickler reads a protocol-4 FRAME either by peeking the file's buffer (then the next
pickle.load starts right after STOP) or, for a frame of 128 KiB or more or one past what the
buffer holds, with read(): the frame's rest is then dropped and the next pickle.load starts
after the frame.  And torch compares the magic number and protocol version with `!=`, so a
value made by a call (int("0x1950...", 16)) passes.

Each generator takes PAYLOAD, a pickle (ending in STOP) that torch must reach: used by
tests/bad/make_scan_corpus.py (with bypasses.PAYLOAD) and tests/interop/legacy_frames.py
(with a payload that leaves a marker file).  Plain python3."""
import struct

MAGIC = b'\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19\x2e'
PROTO = b'\x80\x02M\xe9\x03.'
SYS_INFO = b'\x80\x02}q\x00(X\x0d\x00\x00\x00little_endianq\x01\x88u.'
DATA = b'\x80\x02}q\x00.'          # an empty state dict
KEYS = b'\x80\x02]q\x00.'          # no storages
BIG = 128 * 1024                   # _pickle.c's PREFETCH: a frame this long is read()


def frame(body):
    return b'\x95' + struct.pack('<Q', len(body)) + body


def decoy_chain():
    """The header and data pickles of an empty legacy checkpoint (no payload)."""
    return PROTO + SYS_INFO + DATA + KEYS


def stop_in_frame(payload, size=BIG):
    """The magic number as a protocol-4 pickle whose FRAME (SIZE bytes) holds its STOP
    early, then a whole decoy chain, then padding.  A contiguous reader reads the decoys as
    the next pickles; CPython reading the frame whole (SIZE >= 128 KiB from a file, or a
    BytesIO) goes on after the frame, where the real chain carries PAYLOAD as sys_info."""
    body = MAGIC[2:] + decoy_chain()
    body += b'\x00' * (size - len(body))
    return (b'\x80\x04' + frame(body) + PROTO + payload + DATA + KEYS)


def stop_in_small_frame(payload, at=4000, size=400):
    """As stop_in_frame, but the frame is small (SIZE bytes) and starts AT bytes into the
    file (its FRAME opcode there; NONE, POP pairs before it, in the magic number's pickle).  When it crosses a
    boundary of the file's buffer (AT + SIZE > 4096 with a 4 KiB buffer) peek() holds only
    part of it and it is read() and dropped; with a larger buffer it is peeked and the
    decoys are read: which depends on the file system, so both are torch's."""
    n = at - 2
    assert n >= 0 and n % 2 == 0, at
    lead = b'\x80\x04' + b'N0' * (n // 2)
    body = MAGIC[2:] + decoy_chain()
    body += b'\x00' * (size - len(body))
    return lead + frame(body) + PROTO + payload + DATA + KEYS


def magic_by_call(payload):
    """The magic number made by a call, int('0x1950a86a20f9469cfc6c', 16) (REDUCE on
    builtins.int, which torch.load runs), then a protocol version that starts with LONG1,
    then PAYLOAD as sys_info."""
    magic = b'cbuiltins\nint\n(V0x1950a86a20f9469cfc6c\nI16\ntR.'
    proto = b'\x8a\x02\xe9\x03.'                    # LONG1 1001, no PROTO
    return magic + proto + payload + DATA + KEYS


def protocol_float(payload):
    """The protocol version as the float 1001.0 (1001.0 != 1001 is False: torch goes on)."""
    return MAGIC + b'G' + struct.pack('>d', 1001.0) + b'.' + payload + DATA + KEYS


def mixed_frames(payload):
    """Two frames, one small (peeked from the file's first buffer) and one of 128 KiB (read
    whole): torch reads the one chain that neither 'every frame peeked' nor 'every frame read
    whole' gives.  The magic number's FRAME A holds its STOP and the protocol version's whole
    pickle, whose FRAME B (128 KiB) holds its STOP and a decoy chain.  A peeked and B read: the
    next pickle is after B, where PAYLOAD is.  Both peeked: the decoys inside B.  A read: the
    decoys right after A's end (B's body)."""
    b_body = PROTO[2:]                              # BININT2 1001, STOP
    y = decoy_chain()
    b_body += y + b'\x00' * (BIG - len(b_body) - len(y))
    proto = b'\x80\x04' + frame(b_body)
    a_body = MAGIC[2:] + proto[:2 + 9 + len(PROTO) - 2]   # A ends where the decoys start
    return b'\x80\x04' + frame(a_body) + proto[2 + 9 + len(PROTO) - 2:] + payload + DATA + KEYS
