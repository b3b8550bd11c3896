#!/usr/bin/env python3
"""Benchmark: `ckpt scan` against picklescan, fickling and modelscan on the same files.

    /usr/bin/python3 bench/bench_scan.py [--no-results]

Files: the scanner evasions of tests/bad/scan (tests/bad/make_scan_corpus.py;
every one would import something unsafe) and the dangerous files of
tests/bad, which must be flagged; the good fixtures of tests/data, which
must not be.  picklescan and fickling are installed from the package index
into a virtual environment under bench/out/ (skipped, and said so, when they
cannot be had).  For each tool and file: its verdict from the exit status
(picklescan: 1 infected; fickling --check-safety: 1 unsafe; ckpt scan: 1
unsafe; modelscan -p: 1 issues found; 0 is a clean bill; anything else an
error) and its wall time.
Prints a table and writes the "ckpt scan" section of bench/RESULTS.md."""
import argparse
import datetime
import glob
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from bench_inspect import machine_info, update_results, git_rev  # noqa: E402

SECTION = '## ckpt scan: against picklescan and fickling (issue 7)'
VENV = os.path.join(HERE, 'out', 'scanners-venv')


def scanners():
    """Paths of the picklescan and fickling commands, installing them if needed."""
    bin_ = os.path.join(VENV, 'bin')
    tools = {'picklescan': os.path.join(bin_, 'picklescan'),
             'fickling': os.path.join(bin_, 'fickling'),
             'modelscan': os.path.join(bin_, 'modelscan')}
    if not all(os.path.exists(p) for p in tools.values()):
        try:
            subprocess.run([sys.executable, '-m', 'venv', VENV], check=True, timeout=300)
            subprocess.run([os.path.join(bin_, 'pip'), 'install', '-q', 'picklescan',
                            'fickling', 'modelscan', 'typing_extensions'], check=True,
                           timeout=600)
        except Exception as e:  # offline, or no venv module
            print('bench_scan: cannot install picklescan / fickling: %s' % e, file=sys.stderr)
    return {k: v for k, v in tools.items() if os.path.exists(v)}


def version(tool, path):
    pip = os.path.join(VENV, 'bin', 'pip')
    try:
        out = subprocess.run([pip, 'show', tool], capture_output=True, text=True).stdout
        return next(l.split(':', 1)[1].strip() for l in out.splitlines()
                    if l.startswith('Version:'))
    except Exception:
        return '?'


def command(tool, path, file):
    if tool == 'ckpt scan':
        return [path, 'scan', '--quiet', file]
    if tool in ('picklescan', 'modelscan'):
        return [path, '-p', file]
    return [path, '--check-safety', file]


def run(tool, path, file):
    t0 = time.perf_counter()
    # fickling writes safety_results.json into its working directory
    p = subprocess.run(command(tool, path, os.path.join(ROOT, file)), capture_output=True,
                       timeout=120, cwd=os.path.join(HERE, 'out'))
    dt = time.perf_counter() - t0
    verdict = {0: 'clean', 1: 'flagged'}.get(p.returncode, 'error')
    return verdict, dt


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--no-results', action='store_true')
    ap.add_argument('--ckpt', default=os.path.join(ROOT, 'ckpt'))
    args = ap.parse_args()
    with open(os.path.join(ROOT, 'tests', 'bad', 'scan', 'expected.json')) as f:
        evasions = sorted(json.load(f))
    unsafe = [os.path.join('tests', 'bad', 'scan', n) for n in evasions] + \
        [os.path.join('tests', 'bad', n) for n in ('os_system.pth', 'os_system_nested.pth',
                                                    'posix_system.pth', 'builtins_eval.pth')]
    safe = sorted(os.path.relpath(p, ROOT) for pat in ('*.pth', 'torch2/*.pth',
                                                       'torch2/*.safetensors')
                  for p in glob.glob(os.path.join(ROOT, 'tests', 'data', pat)))
    tools = {'ckpt scan': args.ckpt}
    tools.update(scanners())
    os.chdir(ROOT)
    rows, missed = [], {}
    for tool, path in tools.items():
        res = {f: run(tool, path, f) for f in unsafe + safe}
        flagged = [f for f in unsafe if res[f][0] == 'flagged']
        miss = [f for f in unsafe if res[f][0] != 'flagged']
        false = [f for f in safe if res[f][0] == 'flagged']
        errs = [f for f in unsafe + safe if res[f][0] == 'error']
        times = [res[f][1] for f in unsafe + safe]
        rows.append((tool, len(flagged), len(unsafe), len(false), len(safe), len(errs),
                     statistics.median(times) * 1000, sum(times)))
        missed[tool] = (miss, false, errs)
    lines = ['| tool | unsafe flagged | missed | false alarms on good fixtures | errors '
             '| median ms / file | total s |', '|---|---:|---:|---:|---:|---:|---:|']
    for tool, fl, nu, fa, ns, er, med, tot in rows:
        lines.append('| %s | %d / %d | %d | %d / %d | %d | %.1f | %.2f |' % (
            tool, fl, nu, nu - fl, fa, ns, er, med, tot))
    table = '\n'.join(lines)
    print(table)
    detail = []
    for tool, (miss, false, errs) in missed.items():
        detail.append('- %s: missed %s; false alarms %s; errors (exit not 0/1) on %s' % (
            tool, ', '.join('`%s`' % os.path.basename(m) for m in miss) or 'none',
            ', '.join('`%s`' % os.path.basename(m) for m in false) or 'none',
            ', '.join('`%s`' % os.path.basename(m) for m in errs) or 'none'))
    print('\n'.join(detail))
    if args.no_results:
        return
    vers = ', '.join('%s %s' % (t, version(t, p)) for t, p in tools.items() if t != 'ckpt scan')
    text = '\n'.join([
        SECTION, '',
        'Requirement: `ckpt scan` flags every scanner evasion of the corpus (doc/safety.md '
        'section 10) and no good fixture; picklescan and fickling run on the same files '
        'for comparison; modelscan too since issue 15, whose bypasses (a FRAME ending inside an '
        'argument, a safetensors header that is a pickle, names computed by a call, ...) joined '
        'the corpus.', '',
        '- Date: %s' % datetime.datetime.utcnow().strftime('%Y-%m-%d %H:%M UTC'),
        '- Machine: %s' % machine_info(),
        '- Software: ckpt (git %s); %s (from PyPI, in a virtual environment)' % (
            git_rev(), vers or 'picklescan / fickling not installable here'),
        '- Files: %d unsafe (the %d evasions of `tests/bad/scan`, built opcode by opcode by '
        '`tests/bad/make_scan_corpus.py`, and 4 dangerous files of `tests/bad`); %d good '
        'fixtures (`tests/data/*.pth`, `tests/data/torch2/*.pth|*.safetensors`: zip, legacy '
        'and safetensors checkpoints, training checkpoints with known data).' % (len(unsafe), len(evasions), len(safe)),
        '- Method: each tool once per file, as a process; verdict from its exit status '
        '(1 flagged, 0 clean, anything else an error: it could not judge the file); '
        'commands: `ckpt scan --quiet F`, `picklescan -p F`, `fickling --check-safety F`, '
        '`modelscan -p F`.',
        '- Command: `/usr/bin/python3 bench/bench_scan.py`', '',
        table, '', '\n'.join(detail), ''])
    update_results(os.path.join(HERE, 'RESULTS.md'), text, SECTION)


if __name__ == '__main__':
    main()
