#!/usr/bin/env python3
"""torch.load runs what a legacy checkpoint's pickle chain hides from a contiguous reader, and
ckpt scan calls each such file unsafe (issue 26).

The files come from tests/bad/frames.py, with a recording payload in the sys_info pickle:
builtins.open(MARKER, 'w'), which leaves an empty file and nothing else.  For each, in a
throwaway folder, torch.load(path, weights_only=False) (the torch this runs under: 1.13 and
2.x) must create MARKER (the payload ran), and `ckpt scan` must exit 1 naming builtins.open
as dangerous:

- stop_in_frame: the magic number's FRAME (128 KiB) holds its STOP and a decoy chain; torch
  reads the frame with read() and goes on after it;
- stop_in_small_frame: the same with a 400-byte frame across the file's first buffer
  boundary (placed by this file system's st_blksize, the buffer torch's open() gets): peek()
  holds part of it, so it is read() too;
- mixed_frames: a small frame (peeked) then one of 128 KiB (read whole): torch reads the
  chain that neither "every frame peeked" nor "every frame read whole" gives;
- magic_by_call: the magic number is int('0x1950a86a20f9469cfc6c', 16), the protocol version
  a LONG1;
- protocol_float: the protocol version is 1001.0.
"""
import os
import sys

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as c  # noqa: E402  (exits 77 without torch)

sys.path.insert(0, os.path.join(c.SRCDIR, 'tests', 'bad'))
import frames  # noqa: E402

torch = c.torch
t = c.Tally()
t.need(c.CKPT, 'CKPT')


def payload(marker):
    """builtins.open(MARKER, 'w') as protocol 0: a recording call, nothing more."""
    return b'cbuiltins\nopen\n(V' + marker.encode() + b'\nVw\ntR.'


def small_frame_file(marker, folder):
    """stop_in_small_frame with its frame across this file system's first buffer boundary."""
    blk = os.statvfs(folder).f_bsize
    probe = os.path.join(folder, 'probe')
    with open(probe, 'wb') as f:
        f.write(b'x')
    blk = os.stat(probe).st_blksize or blk
    os.unlink(probe)
    return frames.stop_in_small_frame(payload(marker), at=blk - 96, size=400)


CASES = [
    ('stop_in_frame', lambda m, d: frames.stop_in_frame(payload(m))),
    ('stop_in_small_frame', small_frame_file),
    ('mixed_frames', lambda m, d: frames.mixed_frames(payload(m))),
    ('magic_by_call', lambda m, d: frames.magic_by_call(payload(m))),
    ('protocol_float', lambda m, d: frames.protocol_float(payload(m))),
]


def check(folder, make):
    errs = []
    marker = os.path.join(folder, 'payload-ran')
    path = os.path.join(folder, 'model.pth')
    with open(path, 'wb') as f:
        f.write(make(marker, folder))
    try:
        torch.load(path, weights_only=False)
    except Exception as e:  # the payload runs before anything can fail
        print('  (torch.load then raised %s: %s)' % (type(e).__name__, str(e)[:100]))
    if not os.path.exists(marker):
        errs.append('torch.load did not run the payload: the case does not test anything here')
    r = c.ckpt('scan', '--json', path)
    if r.rc != 1:
        errs.append('ckpt scan exits %d, not 1: %s' % (r.rc, (r.out + r.err)[-400:]))
    elif '"builtins.open"' not in r.out:
        errs.append('ckpt scan does not name builtins.open: %s' % r.out[-400:])
    return errs


for name, make in CASES:
    t.run(name, check, make, tmp=True, prefix='ckpt-frames-')

sys.exit(t.summary())
