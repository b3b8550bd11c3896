#!/usr/bin/env python3
"""Benchmark a safetensors file with a large header (issue 26): many tensors,
the header up to the format's 100,000,000-byte limit.

For each tensor count N it writes (once; reused while present) a file of N
empty U8 tensors named "0", "1", ... (each `"i":{"dtype":"U8","shape":[0],
"data_offsets":[0,0]}`: 1,740,000 of them make a 99.8 MB header, the
largest the format allows with such names), then times whole processes,
each after one warm-up run, and takes their peak RSS (ru_maxrss, wait4):

    ckpt inspect FILE > /dev/null
    ckpt convert FILE OUT.pth
    python -c 'safe_open(FILE, "pt"); keys()'      (safetensors' own reader)

and prints the ratios to safetensors and the time per tensor, whose being
flat across N shows the reading is linear.  Replaces the section
"## safetensors header (issue 26)" of bench/RESULTS.md.

    /opt/ckpt/torch2/bin/python bench/bench_safetensors_header.py \\
        [--counts 100000,200000,400000] [--runs 1] [--ckpt ./ckpt] \\
        [--workdir bench/out] [--results bench/RESULTS.md]

The python running this script must have the safetensors package; the
script itself imports neither torch nor safetensors (children do).
"""
import argparse
import datetime
import os
import platform
import re
import statistics
import struct
import subprocess
import sys
import time

SECTION = '## safetensors header (issue 26)'
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

SAFE_OPEN = ('import sys\nfrom safetensors import safe_open\n'
             'with safe_open(sys.argv[1], "pt") as f:\n    print(len(f.keys()))\n')


def make(path, n):
    """N empty U8 tensors; the header padded to a multiple of 8."""
    if os.path.exists(path):
        return
    parts = ['"%d":{"dtype":"U8","shape":[0],"data_offsets":[0,0]}' % i for i in range(n)]
    h = ('{' + ','.join(parts) + '}').encode()
    h += b' ' * (-len(h) % 8)
    tmp = path + '.tmp'
    with open(tmp, 'wb') as f:
        f.write(struct.pack('<Q', len(h)) + h)
    os.rename(tmp, path)


def header_len(path):
    with open(path, 'rb') as f:
        return struct.unpack('<Q', f.read(8))[0]


def measure(argv, out=None):
    """Seconds and peak RSS (MiB) of one run of ARGV; exit status checked."""
    t0 = time.perf_counter()
    p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, ru = os.wait4(p.pid, 0)
    dt = time.perf_counter() - t0
    err = p.stderr.read().decode(errors='replace')
    p.stderr.close()
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit('bench_safetensors_header.py: %s failed: %s' % (' '.join(argv), err.strip()))
    if out and os.path.exists(out):
        os.unlink(out)
    return dt, ru.ru_maxrss / 1024.0


def timed(argv, runs, out=None):
    measure(argv, out)  # warm-up: the page cache and the allocator
    got = [measure(argv, out) for _ in range(runs)]
    return statistics.median(g[0] for g in got), max(g[1] for g in got)


def git_rev():
    try:
        r = subprocess.run(['git', '-C', ROOT, 'describe', '--always', '--dirty'],
                           capture_output=True, text=True)
        return r.stdout.strip() or '?'
    except OSError:
        return '?'


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--counts', default='100000,200000,400000')
    ap.add_argument('--runs', type=int, default=1)
    ap.add_argument('--ckpt', default=os.path.join(ROOT, 'ckpt'))
    ap.add_argument('--workdir', default=os.path.join(HERE, 'out'))
    ap.add_argument('--results', default=os.path.join(HERE, 'RESULTS.md'))
    a = ap.parse_args()
    os.makedirs(a.workdir, exist_ok=True)
    counts = [int(x) for x in a.counts.split(',')]
    r = subprocess.run([sys.executable, '-c', 'import safetensors; print(safetensors.__version__)'],
                       capture_output=True, text=True)
    stv = r.stdout.strip() or 'not installed'
    rows = []
    for n in counts:
        path = os.path.join(a.workdir, 'st_header_%d.safetensors' % n)
        make(path, n)
        out = os.path.join(a.workdir, 'st_header_out.pth')
        ins = timed([a.ckpt, 'inspect', path], a.runs)
        conv = timed([a.ckpt, 'convert', path, out], a.runs, out)
        st = timed([sys.executable, '-c', SAFE_OPEN, path], a.runs)
        rows.append((n, header_len(path), ins, conv, st))
        print('%8d tensors, header %d B: inspect %.2f s %.0f MiB, convert %.2f s %.0f MiB, '
              'safe_open %.2f s %.0f MiB' % (n, header_len(path), ins[0], ins[1], conv[0],
                                              conv[1], st[0], st[1]))
        sys.stdout.flush()
    lines = [SECTION, '',
             'A safetensors file of N empty U8 tensors (the header of 1,740,000 of them is '
             '99.8 MB, the format\'s limit), read by `ckpt inspect`, by `ckpt convert` to .pth '
             'and by safetensors\' own `safe_open` + `keys()`, in the same run.', '',
             '- Date: %s UTC' % datetime.datetime.utcnow().strftime('%Y-%m-%d %H:%M'),
             '- Machine: %s, %d cores; %s' % (platform.machine(), os.cpu_count(),
                                               platform.platform()),
             '- Software: ckpt (git %s); safetensors %s (Python %s)'
             % (git_rev(), stv, platform.python_version()),
             '- Method: one warm-up run, then the median of %d timed run(s) of the whole '
             'process; peak RSS is ru_maxrss (wait4).' % a.runs,
             '- Command: `%s bench/bench_safetensors_header.py --counts %s --runs %d`'
             % (sys.executable, a.counts, a.runs), '',
             '| tensors | header bytes | ckpt inspect s | MiB | µs/tensor | ckpt convert s | MiB '
             '| safe_open s | MiB | inspect / safe_open RSS |',
             '|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|']
    for n, hl, ins, conv, st in rows:
        lines.append('| %d | %d | %.2f | %.0f | %.1f | %.2f | %.0f | %.2f | %.0f | %.2fx |' % (
            n, hl, ins[0], ins[1], ins[0] / n * 1e6, conv[0], conv[1], st[0], st[1],
            ins[1] / st[1]))
    lines.append('')
    text = '\n'.join(lines) + '\n'
    old = open(a.results).read() if os.path.exists(a.results) else '# Benchmark results\n'
    pat = re.compile(r'^%s\n.*?(?=^## |\Z)' % re.escape(SECTION), re.S | re.M)
    new = pat.sub(lambda m: text + '\n', old) if pat.search(old) else old.rstrip('\n') + '\n\n' + text
    with open(a.results, 'w') as f:
        f.write(new)


if __name__ == '__main__':
    main()
