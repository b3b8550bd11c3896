"""In-place rewrites stopped at every write, as a crash or a power cut
would stop them (issue 18): the file is then the old checkpoint or the new
one, bit for bit, to torch 1.13 (weights_only), torch 2.x (plain and
mmap=True), Python's zipfile and every reader that zip_dir models.

tests/crash/shim.c (built here with cc) counts the calls that change the
file (write, pwrite, fsync, ftruncate, rename) and kills ckpt before the
Nth; in its log mode it records them, and a power cut before call N is
replayed as the original file plus the writes made durable (followed by an
fsync) before N.  Every N is tried, for a first in-place rewrite of a file
torch saved, for a second one (which reuses dead space), and for a
safetensors header rewritten in place (read by the safetensors package
under torch 2.x).  Then 1,000
successive in-place renames of one file: each result read by every reader
zip_dir models (and torch every 100th), its dead bytes within the bound;
and with a small bound (CKPT_INPLACE_DEAD_MAX) the file is compacted.

Runs once, under torch 1.x, and loads the files with torch 2.x through
$PYTHON2 (torch import is slow: one process per torch for all files).
"""
import hashlib
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import zipfile

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as c  # noqa: E402

import torch  # noqa: E402

PY1 = os.environ.get('PYTHON') or '/usr/bin/python3'
PY2 = os.environ.get('PYTHON2') or '/opt/ckpt/torch2/bin/python'
ZIP_DIR_TOOL = os.environ.get('ZIP_DIR_TOOL') or os.path.join(
    c.SRCDIR, 'tests', 'interop', 'zip_dir_tool')
SHIM_SRC = os.path.join(c.SRCDIR, 'tests', 'crash', 'shim.c')

if torch.__version__.startswith('2.') and os.access(PY1, os.X_OK) and \
        subprocess.run([PY1, '-c', 'import torch'], capture_output=True).returncode == 0:
    print('torch %s: this test runs once, under torch 1.x (%s), and loads '
          'with torch 2.x itself' % (torch.__version__, PY1))
    sys.exit(c.SKIP)

t = c.Tally()
t.need(c.CKPT, 'CKPT')
t.need(ZIP_DIR_TOOL, 'ZIP_DIR_TOOL')

# What one torch makes of each file: a fingerprint of the loaded state dict
# (keys in order, dtype, shape, bytes; _metadata), or the error.  Run as one
# process per torch over every file.
LOADER = r'''
import hashlib, json, sys, torch
def sig(sd):
    h = hashlib.sha256()
    for k, v in sd.items():
        h.update(repr(k).encode())
        if isinstance(v, torch.Tensor):
            v = v.detach().cpu().contiguous()
            h.update(repr((str(v.dtype), tuple(v.shape))).encode())
            h.update(v.numpy().tobytes())
        else:
            h.update(repr(v).encode())
    h.update(repr(getattr(sd, '_metadata', None)).encode())
    return h.hexdigest()[:16]
out = {}
v2 = torch.__version__.startswith('2.')
for f in sys.argv[1:]:
    r = {}
    modes = (('plain', {}), ('mmap', {'mmap': True})) if v2 else (('plain', {'weights_only': True}),)
    for name, kw in modes:
        try:
            r[name] = sig(torch.load(f, map_location='cpu', **kw))
        except Exception as e:
            r[name] = 'error: %s' % str(e).splitlines()[0][:120]
    out[f] = r
print(json.dumps(out))
'''


# The safetensors package's view of each file: names, dtypes, shapes, bytes.
ST_LOADER = r'''
import hashlib, json, sys
from safetensors.torch import load_file
out = {}
for f in sys.argv[1:]:
    try:
        h = hashlib.sha256()
        for k, v in load_file(f).items():
            h.update(repr((k, str(v.dtype), tuple(v.shape))).encode())
            h.update(v.contiguous().view(-1).numpy().tobytes())
        out[f] = h.hexdigest()[:16]
    except Exception as e:
        out[f] = 'error: %s' % str(e).splitlines()[0][:120]
print(json.dumps(out))
'''


def torch_sigs(py, files):
    """{file: {mode: sig}} under the torch of PY; None when it has none."""
    p = subprocess.run([py, '-c', LOADER] + files, capture_output=True, text=True,
                       timeout=600)
    if p.returncode != 0:
        return None
    return json.loads(p.stdout.splitlines()[-1])


def zip_sig(path):
    """What Python's zipfile reads: every entry's name and bytes (CRC-checked)."""
    try:
        with zipfile.ZipFile(path) as z:
            h = hashlib.sha256()
            for i in z.infolist():
                h.update(i.filename.encode())
                h.update(z.read(i))
            return h.hexdigest()[:16]
    except Exception as e:
        return 'error: %s' % e


def zip_dir(path):
    """zip_dir_tool's readers (torch, zipfile, libzip): {reader: pickle hex
    or 'refuses ...'}, and its findings."""
    p = subprocess.run([ZIP_DIR_TOOL, path], capture_output=True, text=True)
    readers, findings = {}, []
    for line in p.stdout.splitlines():
        w = line.split(' ')
        if line.startswith('finding: '):
            findings.append(line[9:])
        elif len(w) >= 2 and w[0] in ('torch', 'zipfile', 'libzip'):
            readers[w[0]] = w[-1] if w[1] == 'ok' else 'refuses'
    return readers, findings


def ckpt(args, env=None, check=True):
    p = subprocess.run([c.CKPT] + args, capture_output=True, text=True,
                       env=env, timeout=c.TIMEOUT)
    if check and p.returncode != 0:
        raise RuntimeError('ckpt %s: exit %d: %s' % (' '.join(args), p.returncode,
                                                     p.stderr.strip()))
    return p


def build_shim(d):
    cc = os.environ.get('CC') or 'cc'
    so = os.path.join(d, 'shim.so')
    p = subprocess.run([cc.split()[0], '-shared', '-fPIC', '-O1', '-o', so, SHIM_SRC, '-ldl'],
                       capture_output=True, text=True)
    if p.returncode != 0:
        raise c.Skip('cannot build tests/crash/shim.c: %s' % p.stderr.strip()[:200])
    return so


def shim_env(so, target, **kw):
    env = dict(os.environ)
    env.update({'LD_PRELOAD': so, 'CRASH_FILE': target, 'CRASH_ONLY': 'ckpt'})
    # a sanitizer build (./configure --enable-sanitizers) wants its runtime
    # first among the libraries; the shim only wraps libc's calls
    env['ASAN_OPTIONS'] = ':'.join(filter(None, [env.get('ASAN_OPTIONS'),
                                                 'verify_asan_link_order=0']))
    env.update({k: str(v) for k, v in kw.items()})
    return env


def replay(orig, log, cut, dst):
    """DST: ORIG with the writes and truncations of LOG made durable before
    counted call CUT (those followed by an fsync among calls 1..CUT-1)."""
    ops = []
    with open(log, 'rb') as f:
        data = f.read()
    i = 0
    while i < len(data):
        op = chr(data[i])
        off, n = struct.unpack('<QQ', data[i + 1:i + 17])
        i += 17
        payload = data[i:i + n] if op == 'W' else b''
        i += len(payload)
        ops.append((op, off, payload))
    done = ops[:cut - 1]
    last_sync = max([k for k, o in enumerate(done) if o[0] == 'S'], default=-1)
    shutil.copyfile(orig, dst)
    with open(dst, 'r+b') as f:
        for op, off, payload in done[:last_sync + 1]:
            if op == 'W':
                f.seek(off)
                f.write(payload)
            elif op == 'T':
                f.truncate(off)


def crash_states(d, so, base, args, tag):
    """Every state a kill or a power cut can leave of an in-place rewrite
    ARGS (FILE last) of BASE: [(label, path)], and the finished file."""
    ext = os.path.splitext(base)[1]  # OUT's name picks the format: keep it
    done = os.path.join(d, tag + '.done' + ext)
    shutil.copyfile(base, done)
    count = os.path.join(d, tag + '.count')
    log = os.path.join(d, tag + '.log')
    ckpt(args + [done], env=shim_env(so, done, CRASH_COUNT=count, CRASH_LOG=log))
    total = int(open(count).read())
    states = []
    for n in range(1, total + 2):
        k = os.path.join(d, '%s.kill%02d%s' % (tag, n, ext))
        shutil.copyfile(base, k)
        p = subprocess.run([c.CKPT] + args + [k], capture_output=True,
                           env=shim_env(so, k, CRASH_AT=n), timeout=c.TIMEOUT)
        if n <= total and p.returncode != -9:
            raise RuntimeError('%s: ckpt was not killed at call %d (exit %d)' % (tag, n, p.returncode))
        states.append(('%s: killed before call %d of %d' % (tag, n, total), k))
        pc = os.path.join(d, '%s.power%02d%s' % (tag, n, ext))
        replay(base, log, n, pc)
        states.append(('%s: power cut before call %d of %d' % (tag, n, total), pc))
    return states, done, total


def main():
    d = tempfile.mkdtemp(prefix='ckpt-inplace-')
    try:
        so = build_shim(d)
    except c.Skip as e:
        t.skip('crash states', e)
        return
    # a checkpoint torch saved, with the DataParallel prefix
    base = os.path.join(d, 'base.pth')
    torch.manual_seed(0)
    sd = c.OD(('module.l%d.%s' % (i, w), torch.randn(64, 32) if w == 'weight' else torch.randn(64))
              for i in range(6) for w in ('weight', 'bias'))
    torch.save(sd, base)
    # a second rewrite starts from a file an in-place rewrite made
    base2 = os.path.join(d, 'base2.pth')
    shutil.copyfile(base, base2)
    ckpt(['strip-module', '--quiet', '--in-place', base2])
    cases = [('first', base, ['strip-module', '--in-place']),
             ('second', base2, ['rename', '-e', 's/^l/layer/', '--in-place'])]
    states, ends = [], {}
    for tag, b, args in cases:
        s, done, total = crash_states(d, so, b, args, tag)
        states += s
        ends[tag] = (b, done, total)
    files = sorted({p for _, p in states} | {p for b, dn, _ in ends.values() for p in (b, dn)})
    s1 = torch_sigs(PY1, files)
    s2 = torch_sigs(PY2, files) if os.access(PY2, os.X_OK) else None
    if s2 is None:
        t.skip('torch 2.x loads', 'no torch 2.x at %s' % PY2)

    def views(path):
        v = {'torch1': s1[path]['plain'], 'zipfile': zip_sig(path)}
        if s2:
            v['torch2'] = s2[path]['plain']
            v['torch2 mmap'] = s2[path]['mmap']
        rd, _ = zip_dir(path)
        for r, x in rd.items():
            v['zip_dir ' + r] = x
        return v

    for tag, (b, done, total) in ends.items():
        old, new = views(b), views(done)
        errs = ['%s reads the new file as the old one' % k for k in old if old[k] == new[k]]
        errs += ['%s: %s' % (k, v) for k, v in list(old.items()) + list(new.items())
                 if v.startswith('error') or v == 'refuses']
        _, findings = zip_dir(done)
        errs += ['the finished file: %s' % f for f in findings]
        t.report('%s rewrite (%d counted calls): old and new load everywhere, differ, and '
                 'the result has no zip finding' % (tag, total), errs)
        counts = {'old': 0, 'new': 0}
        errs = []
        for label, p in states:
            if not label.startswith(tag + ':'):
                continue
            v = views(p)
            which = {('old' if v[k] == old[k] else 'new' if v[k] == new[k] else 'neither')
                     for k in v}
            if which - {'old', 'new'}:
                errs.append('%s: %s' % (label, ', '.join(
                    '%s reads %s' % (k, v[k][:60]) for k in v if v[k] not in (old[k], new[k]))))
            elif len(which) > 1:
                errs.append('%s: the readers disagree (%s)' % (label, ', '.join(
                    '%s %s' % (k, 'old' if v[k] == old[k] else 'new') for k in v)))
            else:
                counts[which.pop()] += 1
        t.report('%s rewrite, %d states (kill and power cut before each call): every reader '
                 'reads the old checkpoint (%d) or the new one (%d), all the same one'
                 % (tag, len([1 for lb, _ in states if lb.startswith(tag + ':')]),
                    counts['old'], counts['new']), errs)
        if not errs:
            last_kill = [p for lb, p in states if lb.startswith(tag + ': killed before call %d'
                                                               % (total + 1))]
            t.report('%s rewrite: the run that was never killed is the new file byte for byte'
                     % tag, [] if last_kill and open(last_kill[0], 'rb').read() ==
                     open(done, 'rb').read() else ['it differs'])

    # ---- a safetensors header rewritten in place -----------------------------------
    st = os.path.join(d, 'sd.safetensors')
    ckpt(['convert', '--quiet', os.path.join(c.DATA, 'dp_mlp.pth'), st])  # a 360-byte header
    st_states, st_done, st_total = crash_states(d, so, st, ['strip-module', '--in-place'], 'st')
    if s2:
        st_files = [st, st_done] + [p for _, p in st_states]
        p = subprocess.run([PY2, '-c', ST_LOADER] + st_files, capture_output=True, text=True,
                           timeout=600)
        got = json.loads(p.stdout.splitlines()[-1]) if p.returncode == 0 else None
        if got is None:
            t.skip('safetensors states', 'the safetensors package cannot load them: %s'
                   % p.stderr.strip()[-200:])
        else:
            old, new = got[st], got[st_done]
            errs = ['the new header reads as the old one'] if old == new else []
            errs += ['%s: %s' % (label, got[p][:80]) for label, p in st_states
                     if got[p] not in (old, new)]
            t.report('safetensors header in place (%d counted calls), %d states (kill and power '
                     'cut before each call): the safetensors package reads the old file or the '
                     'new one' % (st_total, len(st_states)), errs)
    else:
        t.skip('safetensors states', 'no torch 2.x with safetensors at %s' % PY2)

    # ---- 1,000 successive renames of one file --------------------------------------
    f = os.path.join(d, 'many.pth')
    shutil.copyfile(base, f)
    size0 = os.path.getsize(f)
    bound = max(64 << 20, size0 // 20)
    errs, kept, sizes, deads = [], [], [], []
    rules = (['-e', 's/^module\\./m./'], ['-e', 's/^m\\./module./'])
    for i in range(1000):
        p = ckpt(['rename', '--quiet', '--verbose'] + rules[i % 2] + ['--in-place', f], check=False)
        if p.returncode != 0:
            errs.append('rename %d: exit %d: %s' % (i + 1, p.returncode, p.stderr.strip()))
            break
        rd, findings = zip_dir(f)
        if len(set(rd.values())) != 1 or 'refuses' in rd.values() or findings:
            errs.append('rename %d: readers %s, findings %s' % (i + 1, rd, findings))
            break
        info = json.loads(ckpt(['inspect', '--json', f]).stdout)
        deads.append(info.get('dead_bytes', -1))
        sizes.append(os.path.getsize(f))
        if (i + 1) % 100 == 0:
            k = os.path.join(d, 'many.%04d.pth' % (i + 1))
            shutil.copyfile(f, k)
            kept.append((i + 1, k))
    if kept:
        m1 = torch_sigs(PY1, [k for _, k in kept])
        m2 = torch_sigs(PY2, [k for _, k in kept]) if s2 else None
        ref = {0: s1[base]['plain']}
        for n, k in kept:
            want = ref[0] if n % 2 == 0 else None
            got = [m1[k]['plain']] + ([m2[k]['plain'], m2[k]['mmap']] if m2 else [])
            if any(g.startswith('error') for g in got) or (want and any(g != want for g in got)):
                errs.append('after %d renames torch reads %s' % (n, got))
    t.report('1,000 in-place renames: every result read alike by torch, zipfile, libzip '
             '(no zip finding), torch 1.13/2.x load every 100th (the original after an even '
             'number); size %d..%d bytes (started at %d), dead bytes at most %d (bound %d)'
             % (min(sizes or [0]), max(sizes or [0]), size0, max(deads or [0]), bound),
             errs + (['dead bytes over the bound'] if deads and max(deads) > bound else []) +
             (['inspect --json has no dead_bytes'] if -1 in deads else []))

    # ---- a small bound: the file is compacted when dead bytes would pass it -----------
    f = os.path.join(d, 'bound.pth')
    shutil.copyfile(base, f)
    env = dict(os.environ, CKPT_INPLACE_DEAD_MAX='2500')
    errs, streamed, edited, dead_max = [], 0, 0, 0
    for i in range(40):
        p = ckpt(['rename', '--verbose'] + rules[i % 2] + ['--in-place', f], env=env, check=False)
        if p.returncode != 0:
            errs.append('rename %d: %s' % (i + 1, p.stderr.strip()))
            break
        streamed += 'compacting' in p.stderr
        edited += ': in place: ' in p.stderr
        dead_max = max(dead_max, json.loads(ckpt(['inspect', '--json', f]).stdout).get(
            'dead_bytes', 1 << 62))
    t.report('a bound of 2500 dead bytes: of 40 renames, %d edited in place, %d compacted the '
             'file; dead bytes at most %d' % (edited, streamed, dead_max),
             errs + (['never compacted'] if not streamed else []) +
             (['never in place'] if not edited else []) +
             (['over the bound'] if dead_max > 2500 else []))
    shutil.rmtree(d)


main()
sys.exit(t.summary())
