#!/usr/bin/env python3
"""bench_dcp.py - a ~2 GiB FSDP2 torch.distributed.checkpoint folder (4 ranks)
into one .pth: ckpt against torch's dcp_to_torch_save and against a durable
copy of the output's bytes, in the same run, time and peak RSS of each.

    /opt/ckpt/torch2/bin/python bench/bench_dcp.py [--work DIR] [--data DIR] [--runs N] [--keep]
                                                   [--base CKPT]

The folder is made once by tests/fixtures/make_distributed.py's 'big_dcp'
case (32 x Linear(4096, 4096) under fully_shard on a 4-process gloo group:
every weight and bias split along dim 0 in 4 chunks, one per rank file)
in DATA (default bench/out/dcp-data; with --keep it stays for later runs;
its files are read just before each run, so every contender reads them from
the page cache).  Outputs go to WORK (default bench/out/, the same file system
as DATA, as a real conversion has it) one at a time and are deleted after each
run; 6 GiB of free space are needed in all:

  ckpt        ckpt convert DIR out.pth              (fsyncs OUT before naming it)
  torch       dcp_to_torch_save(DIR, out.pth); fsync(out.pth)
  copy        the ckpt output's bytes (staged in DATA) copied to WORK (sendfile)
              and fsynced: what writing those bytes durably costs at best
  base        with --base: another ckpt binary (an earlier build) converting
              the same folder, to compare two builds under the same load

ckpt, base and copy take turns in a rotating order (a shared machine's load
falls on each alike); torch runs last in each round.

Each contender runs as its own process, RUNS times (default 3) in turn;
the median, min and max wall time, the median CPU time (user + system) and
the largest peak RSS (wait4's
ru_maxrss) are printed, with ckpt/copy of each round, then the ratios and the goals:
ckpt >= 2x faster than torch, within 1.5x of the copy, peak RSS under
64 MiB + the largest tensor.  ckpt's output is checked equal to torch's
(`ckpt diff`) before anything is reported.
"""
import argparse
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(HERE)
CKPT = os.environ.get('CKPT') or os.path.join(SRC, 'ckpt')

TORCH_SNIPPET = r'''
import os, sys
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
dcp_to_torch_save(sys.argv[1], sys.argv[2])
fd = os.open(sys.argv[2], os.O_RDONLY)
os.fsync(fd)
os.close(fd)
'''

COPY_SNIPPET = r'''
import os, sys
src, dst = sys.argv[1], sys.argv[2]
fi = os.open(src, os.O_RDONLY)
fo = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
n = os.fstat(fi).st_size
off = 0
while off < n:
    k = os.sendfile(fo, fi, off, min(n - off, 1 << 30))  # across file systems too
    if k <= 0:
        raise SystemExit('sendfile stopped')
    off += k
os.fsync(fo)
os.close(fo)
os.close(fi)
'''


def timed(argv):
    """Run ARGV; (seconds, peak RSS in bytes, CPU seconds) of that process alone."""
    t0 = time.perf_counter()
    p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, ru = os.wait4(p.pid, 0)
    dt = time.perf_counter() - t0
    err = p.stderr.read().decode(errors='replace')
    p.stderr.close()
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != 0:
        raise SystemExit('%s: exit %d\n%s' % (' '.join(argv), p.returncode, err[-2000:]))
    return dt, ru.ru_maxrss * 1024, ru.ru_utime + ru.ru_stime


def drop(path):
    if os.path.exists(path):
        os.unlink(path)


def make_folder(data):
    folder = os.path.join(data, 'big_dcp')
    if os.path.exists(os.path.join(folder, '.metadata')):
        return folder
    spec = importlib.util.spec_from_file_location(
        'make_distributed', os.path.join(SRC, 'tests', 'fixtures', 'make_distributed.py'))
    md = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(md)
    os.makedirs(data, exist_ok=True)
    t0 = time.time()
    md.run_ranks('big_dcp', 4, data, timeout=3600, big=True)
    print('made %s in %.0f s' % (folder, time.time() - t0), flush=True)
    return folder


def size_of(folder):
    return sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder))


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--data', default=os.path.join(HERE, 'out', 'dcp-data'))
    ap.add_argument('--runs', type=int, default=3)
    ap.add_argument('--work', default=HERE)
    ap.add_argument('--keep', action='store_true', help='keep DATA (the folder) afterwards')
    ap.add_argument('--base', help='another ckpt binary to time beside this one')
    a = ap.parse_args()
    folder = make_folder(a.data)
    work = os.path.join(a.work, 'out')
    os.makedirs(work, exist_ok=True)
    out = os.path.join(work, 'out.pth')
    staged = os.path.join(a.data, 'ckpt_out.pth')
    r = subprocess.run([CKPT, 'inspect', '--json', folder], capture_output=True, check=True)
    d = json.loads(r.stdout)
    largest = max(t['nbytes'] for t in d['tensors'])
    total = d['summary']['bytes']
    print('folder %s: %.2f GiB on disk, %d tensors, %.2f GiB of tensors, largest %.0f MiB'
          % (folder, size_of(folder) / 2**30, len(d['tensors']), total / 2**30, largest / 2**20))
    def warm():
        # every contender reads the folder from the page cache: read it just before
        subprocess.run(['cat'] + [os.path.join(folder, f) for f in os.listdir(folder)],
                       stdout=subprocess.DEVNULL, check=True)
    runs = {'ckpt': [], 'copy': [], 'torch': []}
    if a.base:
        runs['base'] = []
    same = True
    def run_ckpt(binary, key):
        drop(out)
        warm()
        runs[key].append(timed([binary, 'convert', '--quiet', folder, out]))
        drop(out)
    def run_copy():
        drop(out)
        runs['copy'].append(timed([sys.executable, '-c', COPY_SNIPPET, staged, out]))
        drop(out)
    try:
        # an untimed first conversion: the bytes the copy copies
        subprocess.run([CKPT, 'convert', '--quiet', folder, staged], check=True)
        steps = [lambda: run_ckpt(CKPT, 'ckpt'), run_copy]
        if a.base:
            steps.append(lambda: run_ckpt(a.base, 'base'))
        for i in range(a.runs):
            k = i % len(steps)
            for step in steps[k:] + steps[:k]:
                step()
            drop(out)
            warm()
            runs['torch'].append(timed([sys.executable, '-c', TORCH_SNIPPET, folder, out]))
            r = subprocess.run([CKPT, 'diff', '--quiet', staged, out])
            same = same and r.returncode == 0
            drop(out)
            print('round %d: ckpt %.2f s, copy %.2f s%s, torch %.2f s' % (
                i + 1, runs['ckpt'][-1][0], runs['copy'][-1][0],
                ', base %.2f s' % runs['base'][-1][0] if a.base else '', runs['torch'][-1][0]),
                flush=True)
    finally:
        drop(out)
        drop(staged)
        if not a.keep:
            shutil.rmtree(a.data, ignore_errors=True)
    res = {k: (statistics.median(t for t, _, _ in v), max(m for _, m, _ in v),
               min(t for t, _, _ in v), max(t for t, _, _ in v),
               statistics.median(c for _, _, c in v))
           for k, v in runs.items()}
    # CPU seconds (user + system, every thread) weigh less with the load than wall time
    print('%-6s %9s %9s %9s %9s %12s   (%d runs each)' % ('', 'median s', 'min s', 'max s',
                                                          'CPU s', 'peak RSS', a.runs))
    for k in ('ckpt', 'base', 'torch', 'copy'):
        if k in res:
            print('%-6s %9.2f %9.2f %9.2f %9.2f %8.0f MiB' % (k, res[k][0], res[k][2], res[k][3],
                                                             res[k][4], res[k][1] / 2**20))
    # the ratio within each round, where ckpt and the copy met the same load
    per = sorted(c[0] / p[0] for c, p in zip(runs['ckpt'], runs['copy']))
    print('ckpt/copy per round: %s (median %.2f)'
          % (' '.join('%.2f' % x for x in per), statistics.median(per)))
    if a.base:
        per = sorted(c[0] / p[0] for c, p in zip(runs['base'], runs['copy']))
        print('base/copy per round: %s (median %.2f)'
              % (' '.join('%.2f' % x for x in per), statistics.median(per)))
    ck, to, cp = res['ckpt'], res['torch'], res['copy']
    goals = [
        ('ckpt output equals dcp_to_torch_save output (ckpt diff)', same),
        ('ckpt >= 2x faster than dcp_to_torch_save + fsync: %.2fx' % (to[0] / ck[0]),
         to[0] / ck[0] >= 2),
        ('ckpt within 1.5x of a durable copy of its output: %.2fx' % (ck[0] / cp[0]),
         ck[0] / cp[0] <= 1.5),
        ('ckpt peak RSS %.0f MiB < 64 MiB + largest tensor %.0f MiB'
         % (ck[1] / 2**20, largest / 2**20), ck[1] < 64 * 2**20 + largest),
    ]
    for text, ok in goals:
        print('%s %s' % ('met ' if ok else 'MISS', text))
    return 0 if all(ok for _, ok in goals) else 1


if __name__ == '__main__':
    sys.exit(main())
