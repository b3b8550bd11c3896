#!/usr/bin/python3
"""bench_inplace.py - what a key rewrite costs in place (issue 18).

On generated DataParallel checkpoints (random bytes, not sparse: cp would
skip holes) of each size, in the same run:
  - cp + fsync of the copy (a durable copy: the floor of any new file);
  - `ckpt strip-module IN OUT`, today's streaming rewrite to a new OUT, and
    the same again with OUT already there (replacing an existing OUT);
  - `ckpt strip-module --in-place FILE` (and add-module, alternately): only
    the pickle and the zip directory are written.  Goal: under 100 ms at
    every size (time independent of the tensor bytes).
With --xfs, also a new OUT on a loop-mounted xfs image (root only): the
input's extents are shared (FICLONE) and the copy edited in place.

The checkpoint is written without tensors (none is ever in memory): a
pickle as torch.save writes it (persistent ids of FloatStorages,
_rebuild_tensor_v2) and a zip of stored records, through Python's zipfile;
the streaming rewrite's OUT is in torch's aligned layout and is the file
the in-place runs edit.

Usage (a Python with torch, to name its functions in the pickle):
       /usr/bin/python3 bench/bench_inplace.py [--sizes 2,20] [--runs 7] [--dir bench/out]
       [--xfs] [--keep]
Prints a Markdown section for bench/RESULTS.md.
"""
import argparse
import collections
import os
import pickle
import platform
import shutil
import statistics
import subprocess
import sys
import time
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(HERE)
CKPT = os.environ.get('CKPT') or os.path.join(SRC, 'ckpt')
BASELINE = None  # --baseline CKPT: replacing OUT with another build too
MARGIN = 16      # --margin: GiB of free space left to others
GIB = 1 << 30


class Storage:
    def __init__(self, key, numel):
        self.key, self.numel = key, numel


class Rebuild:
    """Pickles as torch's _rebuild_tensor_v2 call, without torch."""

    def __init__(self, storage, shape):
        self.storage, self.shape = storage, shape

    def __reduce__(self):
        stride = tuple(int(x) for x in _strides(self.shape))
        return (_global('torch._utils', '_rebuild_tensor_v2'),
                (self.storage, 0, self.shape, stride, False, collections.OrderedDict()))


def _strides(shape):
    s, out = 1, []
    for d in reversed(shape):
        out.append(s)
        s *= d
    return reversed(out)


def _global(module, name):
    """torch's own function or class (imported only to be named in the pickle)."""
    import importlib
    return getattr(importlib.import_module(module), name)


class Pickler(pickle.Pickler):
    def persistent_id(self, obj):
        if isinstance(obj, Storage):
            return ('storage', _global('torch', 'FloatStorage'), obj.key, 'cuda:0', obj.numel)
        return None


def generate(path, size):
    """A DataParallel state dict of about SIZE bytes: 8 MiB weights and 32 KiB
    biases, float32, random bytes."""
    sd = collections.OrderedDict()
    sizes, total, i = [], 0, 0
    while total < size:
        n = (8 << 20) if i % 2 == 0 else (32 << 10)
        sizes.append(n)
        total += n
        i += 1
    for k, n in enumerate(sizes):
        numel = n // 4
        shape = (numel // 1024, 1024)
        sd['module.layer%d.%s' % (k // 2, 'weight' if k % 2 == 0 else 'bias')] = \
            Rebuild(Storage(str(k), numel), shape)
    import io
    b = io.BytesIO()
    Pickler(b, protocol=2).dump(sd)
    block = os.urandom(16 << 20)
    with zipfile.ZipFile(path, 'w', zipfile.ZIP_STORED, allowZip64=True) as z:
        z.writestr('gen/data.pkl', b.getvalue())
        z.writestr('gen/byteorder', 'little')
        for k, n in enumerate(sizes):
            with z.open('gen/data/%d' % k, 'w', force_zip64=True) as w:
                left, off = n, k * 4099
                while left:
                    m = min(left, len(block) - off % 4096)
                    w.write(block[off % 4096:off % 4096 + m])
                    left -= m
                    off += 1
        z.writestr('gen/version', '3\n')
    fd = os.open(path, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)
    return len(sizes), len(b.getvalue())


def timed(cmd, env=None):
    t = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    dt = time.perf_counter() - t
    if p.returncode != 0:
        raise RuntimeError('%s: exit %d: %s' % (' '.join(cmd), p.returncode, p.stderr.strip()))
    return dt, p


def cp_fsync(src, dst):
    t = time.perf_counter()
    subprocess.run(['cp', '--reflink=never', '--sparse=never', src, dst], check=True)
    fd = os.open(dst, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)
    return time.perf_counter() - t


def drop(path):
    if os.path.exists(path):
        os.unlink(path)
    os.sync()


def fmt(x):
    return '%.1f ms' % (x * 1000) if x < 1 else '%.2f s' % x


def bench_size(d, gib, runs, rows, notes):
    g = os.path.join(d, 'inplace_gen_%dgib.pth' % gib)
    s = os.path.join(d, 'inplace_out_%dgib.pth' % gib)
    c = os.path.join(d, 'inplace_cp_%dgib.pth' % gib)
    if not os.path.exists(g):
        t = time.perf_counter()
        n, plen = generate(g, gib * GIB)
        notes.append('%d GiB: %s, %d bytes, %d tensors, pickle %d bytes (generated in %.0f s)'
                     % (gib, os.path.basename(g), os.path.getsize(g), n, plen,
                        time.perf_counter() - t))
    slow = max(1, min(runs, 3 if gib <= 4 else 1))
    cps, news, repl, base = [], [], [], []
    for _ in range(slow):
        drop(c)
        cps.append(cp_fsync(g, c))
        drop(c)
        drop(s)
        news.append(timed([CKPT, 'strip-module', '--quiet', g, s])[0])
        os.sync()
        # replacing OUT: the old one, the new one and IN at once
        if shutil.disk_usage(d).free > os.path.getsize(g) + MARGIN * GIB:
            repl.append(timed([CKPT, 'strip-module', '--quiet', g, s])[0])
            os.sync()
            if BASELINE:
                base.append(timed([BASELINE, 'strip-module', '--quiet', g, s])[0])
                os.sync()
    inplace, direct = [], []
    for i in range(runs):
        cmd = 'add-module' if i % 2 == 0 else 'strip-module'
        dt, p = timed([CKPT, cmd, '--quiet', '--verbose', '--in-place', s])
        inplace.append(dt)
        direct.append('O_DIRECT' in p.stderr)
    if runs % 2:
        timed([CKPT, 'strip-module', '--quiet', '--in-place', s])
    size = os.path.getsize(s)
    rows.append((gib, 'cp + fsync of the copy', cps))
    rows.append((gib, 'ckpt strip-module IN OUT (new OUT, streamed)', news))
    if repl:
        rows.append((gib, 'ckpt strip-module IN OUT (OUT there from the run before)', repl))
    else:
        notes.append('%d GiB: replacing an existing OUT not measured (IN, the old OUT and the new '
                     'one do not fit on the disk at once)' % gib)
    if base:
        rows.append((gib, 'the same, replacing OUT, with %s (before this change)' % BASELINE, base))
    rows.append((gib, 'ckpt strip-module/add-module --in-place FILE', inplace))
    notes.append('%d GiB in place: %d of %d runs wrote the new end with O_DIRECT; FILE is %d '
                 'bytes after them' % (gib, sum(direct), len(direct), size))
    return g, s, c


def bench_xfs(d, g, rows, notes, runs):
    if os.geteuid() != 0 or not shutil.which('mkfs.xfs'):
        notes.append('new OUT on xfs: SKIPPED (needs root and mkfs.xfs)')
        return
    img = os.path.join(d, 'inplace_xfs.img')
    mnt = os.path.join(d, 'inplace_xfs')
    os.makedirs(mnt, exist_ok=True)
    gsize = os.path.getsize(g)
    with open(img, 'wb') as f:
        f.truncate(2 * gsize + (1 << 30))
    try:
        subprocess.run(['mkfs.xfs', '-q', '-f', '-m', 'reflink=1', img], check=True)
        subprocess.run(['mount', '-o', 'loop', img, mnt], check=True)
    except Exception as e:
        notes.append('new OUT on xfs: SKIPPED (%s)' % e)
        return
    try:
        src = os.path.join(mnt, 'in.pth')
        out = os.path.join(mnt, 'out.pth')
        # the input in torch's layout, as a streaming rewrite writes it
        subprocess.run([CKPT, 'strip-module', '--quiet', g, src], check=True)
        os.sync()
        cl, st, how = [], [], ''
        for _ in range(runs):
            drop(out)
            dt, p = timed([CKPT, 'add-module', '--quiet', '--verbose', src, out])
            cl.append(dt)
            how = p.stderr.strip().splitlines()[0] if p.stderr.strip() else ''
            drop(out)
            dt, _ = timed([CKPT, 'add-module', '--quiet', src, out],
                          env=dict(os.environ, CKPT_NO_CLONE='1'))
            st.append(dt)
        rows.append((gsize // GIB, 'xfs (loop): ckpt add-module IN OUT, new OUT', cl))
        rows.append((gsize // GIB, 'xfs (loop): the same streamed (CKPT_NO_CLONE=1)', st))
        notes.append('xfs: --verbose said: %s' % how)
    finally:
        subprocess.run(['umount', mnt])
        os.unlink(img)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--sizes', default='2,20')
    ap.add_argument('--runs', type=int, default=7)
    ap.add_argument('--dir', default=os.path.join(HERE, 'out'))
    ap.add_argument('--xfs', action='store_true')
    ap.add_argument('--keep', action='store_true')
    ap.add_argument('--margin', type=int, default=16,
                    help='GiB of free space to leave to others (default 16)')
    ap.add_argument('--baseline', help='another ckpt to time replacing OUT with')
    a = ap.parse_args()
    global BASELINE, MARGIN
    BASELINE, MARGIN = a.baseline, a.margin
    os.makedirs(a.dir, exist_ok=True)
    rows, notes = [], []
    for gib in [int(x) for x in a.sizes.split(',')]:
        # IN and a copy at once, and a margin for others sharing the disk
        free = shutil.disk_usage(a.dir).free
        need = 2 * gib * GIB + a.margin * GIB
        if free < need:
            fit = max(1, (free - a.margin * GIB) // (2 * GIB))
            notes.append('%d GiB does not fit (%.1f GiB free, %d GiB needed for IN and a copy '
                         'and %d GiB left to others): ran %d GiB instead'
                         % (gib, free / GIB, need // GIB, a.margin, fit))
            gib = int(fit)
        g, s, c = bench_size(a.dir, gib, a.runs, rows, notes)
        if a.xfs and gib == min(int(x) for x in a.sizes.split(',')):
            bench_xfs(a.dir, g, rows, notes, 3)
        if not a.keep:
            for p in (g, s, c):
                drop(p)
        report(a, rows, notes)


def report(a, rows, notes):
    uname = platform.uname()
    print('## ckpt --in-place (issue 18)\n')
    print('- Date: %s UTC' % time.strftime('%Y-%m-%d %H:%M', time.gmtime()))
    print('- Machine: %d cores; kernel %s; files in `%s` (%s)' % (
        os.cpu_count(), uname.release, a.dir,
        subprocess.run(['findmnt', '-no', 'FSTYPE,OPTIONS', '-T', a.dir], capture_output=True,
                       text=True).stdout.strip()))
    print('- Command: `%s`' % ' '.join(['bench/bench_inplace.py'] + sys.argv[1:]))
    for n in notes:
        print('- %s' % n)
    print('\n| size | what | median | min | runs |\n|---|---|---:|---:|---:|')
    for gib, what, ts in rows:
        print('| %d GiB | %s | %s | %s | %d |' % (gib, what, fmt(statistics.median(ts)),
                                                 fmt(min(ts)), len(ts)))
    print()
    sys.stdout.flush()


if __name__ == '__main__':
    main()
