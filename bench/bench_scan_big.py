#!/usr/bin/env python3
"""Benchmark: `ckpt scan` of a 2 GiB checkpoint against picklescan and
modelscan, in the same run (issue 31).

    /usr/bin/python3 bench/bench_scan_big.py [--workdir DIR] [--runs N]
                                             [--before CKPT] [--no-results]

The file: a pth-zip state dict of 100 float32 tensors (2304 x 2330 each,
2.0 GiB), written by torch.save under the Python given by --python (default:
this one) into WORKDIR, once, and kept there (delete it when done).  The
tools: `ckpt scan --quiet F`, `picklescan -p F` and `modelscan -p F` from the
virtual environment bench/bench_scan.py installs (a tool that cannot be had
is left out, and the output says so); --before CKPT adds another ckpt binary,
such as the build before issue 31, to the same run.  Every tool must call
the file clean (exit status 0), or the run stops.

Method: a warm-up run of each tool, then RUNS rounds per mode, the tools in
an order that rotates from round to round.  Warm: the file is read whole
before each round, so every byte is in the page cache.  Cold: the file's
pages are dropped (fsync, posix_fadvise(POSIX_FADV_DONTNEED)) before each
run; the tools' own programs and libraries stay cached.  Per run: the wall
time from spawn to exit, and the bytes the process read (rchar of
/proc/PID/io, taken after it exits and before it is reaped).  Peak RSS:
ru_maxrss through GNU time, one warm run per tool.  The table gives
medians, and each tool's time over ckpt scan's, mode by mode.
Prints the table and writes the section "ckpt scan of a 2 GiB file (issue
31)" of bench/RESULTS.md (not with --no-results)."""
import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from bench_inspect import machine_info, update_results, git_rev  # noqa: E402
from bench_scan import scanners, version  # noqa: E402
from bench_rewrite import drop, resident, warm  # noqa: E402  (the page cache, warm or cold)

SECTION = '## ckpt scan of a 2 GiB file (issue 31)'
GNU_TIME = '/usr/bin/time'
GOAL_MS = 50.0
TENSORS, ROWS, COLS = 100, 2304, 2330

GENERATE = r'''
import json, sys, torch
torch.manual_seed(0)
sd = {'layer%d.weight' % i: torch.randn(ROWS, COLS) for i in range(TENSORS)}
torch.save(sd, sys.argv[1])
print(json.dumps({'torch': torch.__version__}))
'''.replace('ROWS', str(ROWS)).replace('COLS', str(COLS)).replace('TENSORS', str(TENSORS))


def make_file(workdir, python):
    path = os.path.join(workdir, 'scan_state_dict_2gib.pth')
    meta = path + '.json'
    if not (os.path.exists(path) and os.path.exists(meta)):
        r = subprocess.run([python, '-c', GENERATE, path], capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit('bench_scan_big: torch.save failed:\n' + r.stderr[-2000:])
        info = json.loads(r.stdout.strip().splitlines()[-1])
        info['bytes'] = os.path.getsize(path)
        with open(meta, 'w') as f:
            json.dump(info, f)
    with open(meta) as f:
        return path, json.load(f)


def run_once(argv):
    """(wall seconds, bytes read) of one run; exits the bench unless it exits 0."""
    t0 = time.perf_counter()
    p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE)
    err = p.stderr.read()
    os.waitid(os.P_PID, p.pid, os.WEXITED | os.WNOWAIT)  # exited, not yet reaped
    wall = time.perf_counter() - t0
    with open('/proc/%d/io' % p.pid) as f:
        rchar = int(next(l.split()[1] for l in f if l.startswith('rchar:')))
    p.stderr.close()
    if p.wait() != 0:
        sys.exit('bench_scan_big: %s exited with %d (not clean):\n%s'
                 % (' '.join(argv), p.returncode, err.decode(errors='replace')[-2000:]))
    return wall, rchar


def peak_rss(argv, workdir):
    """KiB: ru_maxrss through GNU time (which forks from its own small address
    space: a child of this Python would inherit its peak as a floor)."""
    if not os.access(GNU_TIME, os.X_OK):
        return None
    fd, out = tempfile.mkstemp(dir=workdir, suffix='.rss')
    os.close(fd)
    subprocess.run([GNU_TIME, '-f', '%M', '-o', out] + argv, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, check=True)
    with open(out) as f:
        kib = int(f.read().strip().splitlines()[-1])
    os.unlink(out)
    return kib


def loadavg():
    with open('/proc/loadavg') as f:
        return ' '.join(f.read().split()[:3])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('--workdir', default=os.path.join(HERE, 'out'))
    ap.add_argument('--runs', type=int, default=7)
    ap.add_argument('--ckpt', default=os.path.join(ROOT, 'ckpt'))
    ap.add_argument('--before', metavar='CKPT', help='another ckpt binary, in the same run')
    ap.add_argument('--before-label', default='ckpt scan, before issue 31')
    ap.add_argument('--python', default=sys.executable, help='a Python with torch')
    ap.add_argument('--no-results', action='store_true')
    a = ap.parse_args()
    os.makedirs(a.workdir, exist_ok=True)
    path, meta = make_file(a.workdir, a.python)
    tools = [('ckpt scan', [os.path.abspath(a.ckpt), 'scan', '--quiet', path])]
    if a.before:
        tools.append((a.before_label, [os.path.abspath(a.before), 'scan', '--quiet', path]))
    have = scanners()
    missing = [t for t in ('picklescan', 'modelscan') if t not in have]
    for t in ('picklescan', 'modelscan'):
        if t in have:
            tools.append((t, [have[t], '-p', path]))
    load_before = loadavg()
    for _, argv in tools:  # warm-up, and each must call it clean
        run_once(argv)
    res = {(n, m): [] for n, _ in tools for m in ('warm', 'cold')}
    left = []
    for mode in ('warm', 'cold'):
        for r in range(a.runs):
            if mode == 'warm':
                warm(path)
            order = tools[r % len(tools):] + tools[:r % len(tools)]
            for name, argv in order:
                if mode == 'cold':
                    drop(path)
                    left.append(resident(path))
                res[(name, mode)].append(run_once(argv))
    warm(path)
    rss = {name: peak_rss(argv, a.workdir) for name, argv in tools}
    load_after = loadavg()

    def med(name, mode):
        return statistics.median(w for w, _ in res[(name, mode)])

    def read(name, mode):
        return statistics.median(b for _, b in res[(name, mode)])

    def size(b):
        return '%.2f MiB' % (b / 2**20) if b < 2**30 else '%.2f GiB' % (b / 2**30)

    base_w, base_c = med('ckpt scan', 'warm'), med('ckpt scan', 'cold')
    lines = ['| tool | warm: median ms | cold: median ms | bytes read (cold) | peak RSS MiB '
             '| time / ckpt scan\'s (warm, cold) |',
             '|---|---:|---:|---:|---:|---:|']
    for name, _ in tools:
        w, c = med(name, 'warm'), med(name, 'cold')
        lines.append('| %s | %.1f | %.1f | %s | %s | %s |' % (
            name, w * 1000, c * 1000, size(read(name, 'cold')),
            '%.1f' % (rss[name] / 1024) if rss[name] else '?',
            '1' if name == 'ckpt scan' else '%.1fx, %.1fx' % (w / base_w, c / base_c)))
    table = '\n'.join(lines)
    print(table)
    cold_left = [x for x in left if x is not None]
    print('resident after each drop: at most %s bytes' % (max(cold_left) if cold_left else '?'))
    peers = [n for n, _ in tools if n in ('picklescan', 'modelscan')]
    goals = []
    for mode, t in (('warm', base_w), ('cold', base_c)):
        goals.append('%s: ckpt scan %.1f ms, %s the %.0f ms goal' % (
            mode, t * 1000, 'under' if t * 1000 < GOAL_MS else 'OVER (missed)', GOAL_MS))
        if peers:
            fastest = min(peers, key=lambda n: med(n, mode))
            ratio = med(fastest, mode) / t
            goals.append('%s: %.1fx faster than %s, the fastest peer%s' % (
                mode, ratio, fastest, '' if ratio > 1 else ' (MISSED)'))
    print('\n'.join(goals))
    if a.no_results:
        return
    vers = ', '.join('%s %s' % (t, version(t, None)) for t in peers)
    text = '\n'.join([
        SECTION, '',
        'Requirement (issue 31): on a 2 GiB pth-zip state dict of about 100 tensors, `ckpt scan` '
        'under %.0f ms and faster than picklescan in the same run, every verdict of the test '
        'corpora unchanged. Scan reads the pickles, the end records, central directories and '
        'local headers, never a data record (doc/safety.md section 6).' % GOAL_MS, '',
        '- Date: %s' % datetime.datetime.utcnow().strftime('%Y-%m-%d %H:%M UTC'),
        '- Machine: %s; load average %s before, %s after' % (
            machine_info(), load_before, load_after),
        '- Software: ckpt (git %s)%s; %s (from PyPI, in a virtual environment)%s' % (
            git_rev(), '; `%s`: %s' % (a.before_label, a.before) if a.before else '',
            vers or 'neither picklescan nor modelscan could be installed',
            '; not installable here: %s' % ', '.join(missing) if missing else ''),
        '- File: `torch.save` (torch %s) of {layer0.weight ... layer%d.weight}, %d float32 '
        'tensors of %d x %d, %d bytes (%s), stored records' % (
            meta['torch'], TENSORS - 1, TENSORS, ROWS, COLS, meta['bytes'],
            size(meta['bytes'])),
        '- Method: each tool as a process (`ckpt scan --quiet F`, `picklescan -p F`, '
        '`modelscan -p F`), every one exiting 0 (clean); a warm-up run each, then %d rounds '
        'per mode in rotating order; warm: the file read whole before each round; cold: '
        'fsync + posix_fadvise(DONTNEED) on the file before every run (the tools\' programs '
        'stay cached; resident after a drop: at most %s bytes); wall time spawn to exit, '
        'median; bytes read: rchar of /proc/PID/io at exit (the file and everything else the '
        'process read: Python\'s modules for the peers); peak RSS: GNU time, one warm run.'
        % (a.runs, max(cold_left) if cold_left else '?'),
        '- Command: `/usr/bin/python3 bench/bench_scan_big.py --workdir %s%s`' % (
            a.workdir, ' --before %s' % a.before if a.before else ''), '',
        table, '',
        '- Goals: ' + '; '.join(goals) + '.', ''])
    update_results(os.path.join(HERE, 'RESULTS.md'), text, SECTION)


if __name__ == '__main__':
    main()
