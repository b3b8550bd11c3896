"""Hostile files run nothing through the package (issue 29).

Every hostile or malformed file of the repository (tests/bad, tests/bad/scan,
tests/bad/zip) and those the plain-Python generators write at test time with a
recording payload (tests/bad/make_bad_folders.py: builtins.open(MARKER, 'w');
tests/bad/frames.py's legacy chains, as tests/interop/legacy_frames.py builds
them; tests/bad/make_unsafe.py naming our canary module; make_bad_dcp.py and
make_bad_deepspeed.py's hostile folders), plus files naming a canary module
whose import writes a marker (a call, a STACK_GLOBAL, an object, a whole model
whose class lives there, saved by torch), is given to torch_load, load and
safe_open (keys, then every tensor):

  * where `ckpt inspect --stats` refuses it, each raises CheckpointError with
    the CLI's exit status (never another exception);
  * where the CLI reads it (a scanner evasion whose pickle is data, a zip the
    readers disagree on), the package reads the same names and nothing else;
  * no marker appears, nothing is printed, and no module the file names
    (`ckpt scan --json`'s globals) is imported (sys.modules before and after).

Under torch, the canary files are first loaded by torch.load(weights_only=False)
in a child process: the canary's import runs there (the payload is real).
"""
import collections
import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

import ckpt_toolkit
from oracle_helpers import ckpt_binary, sayer
from ckpt_toolkit import CheckpointError

try:
    import torch
except Exception:
    torch = None

HERE = os.path.dirname(os.path.abspath(__file__))
SRCDIR = os.environ.get('srcdir') or os.path.normpath(os.path.join(HERE, '..', '..'))
BAD = os.path.join(SRCDIR, 'tests', 'bad')
sys.path.insert(0, BAD)
os.environ.setdefault('CKPT_CUDA_DEVICES', '0')
CANARY = 'ckpt_oracle_canary_%d' % os.getpid()
COUNT = collections.Counter()
RAN_UNDER = ('torch %s' % torch.__version__) if torch is not None else 'no torch'


CKPT = ckpt_binary()


@pytest.fixture(scope='module', autouse=True)
def ran_under(pytestconfig):
    say = sayer(pytestconfig)
    say('test_hostile: ran under %s, Python %s, ckpt %s' % (RAN_UNDER, sys.version.split()[0], CKPT))
    yield
    say('test_hostile (%s): %s' % (RAN_UNDER, ', '.join('%s %d' % kv for kv in sorted(COUNT.items()))))


# ---------------------------------------------------------------------------------------
# the canary: a module whose import (or any call into it) leaves a marker

WORK = None


def work_dir(tmp_path_factory):
    global WORK
    if WORK is None:
        WORK = str(tmp_path_factory.mktemp('hostile'))
        canary_dir = os.path.join(WORK, 'canary')
        os.makedirs(canary_dir)
        with open(os.path.join(canary_dir, CANARY + '.py'), 'w') as f:
            f.write(textwrap.dedent('''\
                """Harmless recording payload: importing it writes MARKER."""
                import os
                MARKER = %r
                with open(MARKER, 'a') as _f:
                    _f.write('imported\\n')

                def record(*a):
                    with open(MARKER, 'a') as f:
                        f.write('record %%r\\n' %% (a,))
                    return 0

                class Config:
                    pass
                ''' % os.path.join(WORK, 'canary-ran')))
        # importable here: a loader that imported what the file names would run it
        sys.path.insert(0, canary_dir)
    return WORK


def marker(work):
    return os.path.join(work, 'canary-ran')


def payload_marker(work):
    return os.path.join(work, 'payload-ran')


def u(s):
    b = s.encode()
    return b'X' + len(b).to_bytes(4, 'little') + b


def canary_pickles():
    """Pickles naming the canary in the ways scanners have missed (tests/bad/make_scan_corpus.py)."""
    g = b'c' + CANARY.encode() + b'\nrecord\n'
    sg = b'\x80\x04' + b'\x8c' + bytes([len(CANARY)]) + CANARY.encode() + b'\x94' + \
        b'\x8c\x06record\x94\x93'
    return {
        'call.pkl': b'\x80\x02' + g + u('call') + b'\x85R.',
        'stack_global.pkl': sg + u('sg') + b'\x85R.',
        'object.pkl': b'\x80\x02c' + CANARY.encode() + b'\nConfig\n)\x81}' + u('lr') + b'K\x01sb.',
        'in_dict.pkl': b'\x80\x02}' + u('cfg') + g + u('v') + b'\x85Rs.',
    }


def zip_pth(data_pkl):
    import io
    import zipfile
    b = io.BytesIO()
    with zipfile.ZipFile(b, 'w', zipfile.ZIP_STORED) as z:
        for n, d in (('archive/data.pkl', data_pkl), ('archive/version', b'3\n')):
            z.writestr(zipfile.ZipInfo(n, date_time=(2020, 1, 1, 0, 0, 0)), d)
    return b.getvalue()


def generated(work):
    """(id, path) of the hostile files written at test time."""
    out = []
    d = os.path.join(work, 'gen')
    if os.path.isdir(d):
        shutil.rmtree(d)
    os.makedirs(d)
    for name, body in canary_pickles().items():
        for fname, data in ((name, body), (name.replace('.pkl', '_zip.pth'), zip_pth(body))):
            p = os.path.join(d, fname)
            with open(p, 'wb') as f:
                f.write(data)
            out.append(('canary/' + fname, p))
    # legacy chains whose payload torch runs (tests/interop/legacy_frames.py)
    import frames
    m = payload_marker(work).encode()
    pay = b'cbuiltins\nopen\n(V' + m + b'\nVw\ntR.'
    for name, fn in (('stop_in_frame', frames.stop_in_frame), ('mixed_frames', frames.mixed_frames),
                     ('magic_by_call', frames.magic_by_call), ('protocol_float', frames.protocol_float)):
        p = os.path.join(d, 'legacy_%s.pth' % name)
        with open(p, 'wb') as f:
            f.write(fn(pay))
        out.append(('frames/' + name, p))
    for script, args in (('make_bad_folders.py', [payload_marker(work)]), ('make_unsafe.py', [CANARY]),
                         ('make_bad_dcp.py', []), ('make_bad_deepspeed.py', [])):
        sub = os.path.join(d, script[:-3])
        r = subprocess.run([sys.executable, os.path.join(BAD, script), sub] + args,
                           capture_output=True, timeout=300)
        assert r.returncode == 0, '%s: %s' % (script, r.stderr.decode()[-400:])
        for n in sorted(os.listdir(sub)):
            p = os.path.join(sub, n)
            if n.startswith('good') or n.endswith(('.txt', '.json', '.md')) or n == 'EXPECTED.pth':
                continue
            if script == 'make_bad_folders.py' and os.path.isdir(p) and n == 'hf_snapshot':
                p = os.path.join(p, 'snapshots')
                p = os.path.join(p, os.listdir(p)[0])
            out.append(('%s/%s' % (script[:-3], n), p))
    return out


def committed():
    out = []
    for sub in ('', 'scan', 'zip'):
        d = os.path.join(BAD, sub)
        for n in sorted(os.listdir(d)):
            p = os.path.join(d, n)
            if os.path.isfile(p) and not n.endswith(('.py', '.md', 'expected.json')):
                out.append(('bad/%s' % os.path.join(sub, n), p))
    return out


COMMITTED = committed()


# ---------------------------------------------------------------------------------------

def cli(path):
    """(exit status of `ckpt inspect`, of `ckpt inspect --stats`, its message, modules named).
    --stats reads the data: it also refuses a stored record whose CRC-32 is wrong, which
    torch does not check either; the package, mapping the bytes, may read such a file."""
    p = subprocess.run([CKPT, 'inspect', '--json', '--stats', path], capture_output=True, timeout=300)
    q = subprocess.run([CKPT, 'inspect', '--json', path], capture_output=True, timeout=300)
    s = subprocess.run([CKPT, 'scan', '--json', path], capture_output=True, timeout=300)
    named = set()
    try:
        for f in json.loads(s.stdout)['files']:
            for g in f.get('globals', []):
                named.add(g['global'].rsplit('.', 1)[0])
    except Exception:
        pass
    return q.returncode, p.returncode, p.stderr.decode(errors='replace'), named


def exercise(path):
    """What torch_load, load and safe_open do with PATH: [(call, None or exception)]."""
    res = []

    def run(name, fn):
        try:
            fn()
            res.append((name, None))
        except BaseException as e:  # noqa: B902 - anything but CheckpointError is a bug
            res.append((name, e))

    run('torch_load', lambda: ckpt_toolkit.torch_load(path, map_location='cpu') if torch is not None
        else ckpt_toolkit.load(path, framework='np'))
    run('load(np)', lambda: ckpt_toolkit.load(path, framework='np'))

    def so():
        with ckpt_toolkit.safe_open(path, framework='np') as f:
            for k in f.keys():
                try:
                    f.get_tensor(k)
                except CheckpointError:
                    raise
                except Exception as e:  # bfloat16 without ml_dtypes: said, not a hostile failure
                    if 'ml_dtypes' not in str(e):
                        raise
            f.metadata()
    run('safe_open', so)
    return res


def judge(fid, path, work, capfd):
    rc, rc_stats, err, named = cli(path)
    crc_only = rc == 0 and rc_stats != 0 and 'CRC-32 mismatch' in err
    named.add(CANARY)
    before = set(sys.modules)
    for m in (marker(work), payload_marker(work), '/tmp/ckpt_pwned'):
        if m != '/tmp/ckpt_pwned' and os.path.exists(m):
            os.unlink(m)
    pwned = os.stat('/tmp/ckpt_pwned').st_mtime_ns if os.path.exists('/tmp/ckpt_pwned') else None
    capfd.readouterr()
    res = exercise(path)
    out, errout = capfd.readouterr()
    errs = []
    for name, e in res:
        if crc_only and (e is None or isinstance(e, CheckpointError)):
            continue
        if rc != 0 or rc_stats != 0:
            rc = rc or rc_stats
            if e is None:
                errs.append('%s read it; ckpt inspect --stats exits %d: %s' % (name, rc, err.strip()))
            elif not isinstance(e, CheckpointError):
                errs.append('%s raised %s: %s (not CheckpointError)' % (name, type(e).__name__, e))
            elif e.exit_status != rc:
                errs.append('%s: exit_status %s, the CLI %d' % (name, e.exit_status, rc))
        elif e is not None and not isinstance(e, CheckpointError):
            # the CLI reads it: the package may find no state dict in it (CheckpointError),
            # never fail another way
            errs.append('%s raised %s: %s; the CLI reads the file' % (name, type(e).__name__, e))
    new = set(sys.modules) - before
    tops = {n.split('.')[0] for n in named} - {m.split('.')[0] for m in before}
    imported = sorted(m for m in new if m in named or m.split('.')[0] in tops)
    if imported:
        errs.append('imported %s' % imported)
    for m in (marker(work), payload_marker(work)):
        if os.path.exists(m):
            errs.append('the payload ran: %s' % open(m).read()[:200])
    if os.path.exists('/tmp/ckpt_pwned') and os.stat('/tmp/ckpt_pwned').st_mtime_ns != pwned:
        errs.append('/tmp/ckpt_pwned was touched')
    if 'owned' in out or 'ckpt-probe' in out or 'CKPT-TS-PAYLOAD-RAN' in out:
        errs.append('a payload printed: %r' % out[-200:])
    assert not errs, '%s:\n%s' % (fid, '\n'.join(errs))
    COUNT['CRC-32 mismatch only, read (as torch does)' if crc_only and any(e is None for _, e in res)
          else 'refused' if rc or rc_stats else 'read as data'] += 1


@pytest.mark.parametrize('fid,path', COMMITTED, ids=[c[0] for c in COMMITTED])
def test_committed_hostile(fid, path, tmp_path_factory, capfd):
    judge(fid, path, work_dir(tmp_path_factory), capfd)


def test_generated_hostile(tmp_path_factory, capfd):
    work = work_dir(tmp_path_factory)
    gen = generated(work)
    assert len(gen) > 20, gen
    failures = []
    for fid, path in gen:
        try:
            judge(fid, path, work, capfd)
        except AssertionError as e:
            failures.append(str(e))
    assert not failures, '\n\n'.join(failures)


@pytest.mark.skipif(torch is None, reason='torch is not installed here')
def test_canary_runs_under_torch(tmp_path_factory, capfd):
    """The canary is a real payload: torch.load(weights_only=False), in a child, imports it
    (our own files). A whole model whose class lives in the canary: torch imports the module
    to load it; the package gives its state dict and imports nothing."""
    work = work_dir(tmp_path_factory)
    canary_dir = os.path.join(work, 'canary')
    whole = os.path.join(work, 'whole_canary.pth')
    env = dict(os.environ, PYTHONPATH=canary_dir + os.pathsep + os.environ.get('PYTHONPATH', ''))
    save = textwrap.dedent('''
        import sys, torch, %(c)s
        class Net(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = torch.nn.Linear(2, 3)
        Net.__module__ = %(c)r
        setattr(%(c)s, 'Net', Net)
        torch.manual_seed(0)
        net = Net()
        torch.save(net, sys.argv[1])
        torch.save(net.state_dict(), sys.argv[2])
        ''' % {'c': CANARY})
    sd_path = os.path.join(work, 'whole_canary.sd.pth')
    r = subprocess.run([sys.executable, '-c', save, whole, sd_path], env=env, capture_output=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr.decode()[-600:]
    gen = generated(work)
    files = [p for fid, p in gen if fid.startswith('canary/')] + [whole]
    load = 'import sys, torch\ntry:\n    torch.load(sys.argv[1], weights_only=False)\nexcept Exception:\n    pass\n'
    ran = 0
    for p in files:
        if os.path.exists(marker(work)):
            os.unlink(marker(work))
        subprocess.run([sys.executable, '-c', load, p], env=env, capture_output=True, timeout=300)
        assert os.path.exists(marker(work)), 'torch.load did not run the canary of %s' % p
        ran += 1
    os.unlink(marker(work))
    # the whole model: the package reads it as its state dict, canary untouched
    judge('whole_canary.pth', whole, work, capfd)
    ours = ckpt_toolkit.torch_load(whole)
    ref = torch.load(sd_path, weights_only=True)
    assert list(ours) == list(ref)
    for k in ref:
        assert torch.equal(ours[k], ref[k]), k
    assert CANARY not in sys.modules and not os.path.exists(marker(work))
    COUNT['canary files torch.load runs'] += ran


BOMB_CHILD = r"""
import json, resource, sys
resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
import ckpt_toolkit
out = {}
for path in sys.argv[1:]:
    try:
        ckpt_toolkit.load(path, framework='np')
        out[path] = 'read'
    except ckpt_toolkit.CheckpointError as e:
        out[path] = [e.exit_status, e.message]
    except BaseException as e:
        out[path] = '%s: %s' % (type(e).__name__, e)
print(json.dumps(out))
"""


def test_memory_bombs_refused_within_limits(tmp_path):
    """tests/bad/make_bombs.py's inflation, nesting and bytes bombs (as tests/cli/limits.sh):
    load() refuses each with exit status 3 in a process capped at 3 GiB of address space."""
    d = str(tmp_path)
    r = subprocess.run([sys.executable, os.path.join(BAD, 'make_bombs.py'), d], capture_output=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr.decode()[-400:]
    bombs = sorted(os.path.join(d, n) for n in os.listdir(d))
    assert len(bombs) >= 4, bombs
    r = subprocess.run([sys.executable, '-c', BOMB_CHILD] + bombs, capture_output=True, timeout=600)
    assert r.returncode == 0, r.stderr.decode()[-1000:]
    got = json.loads(r.stdout.decode().strip().splitlines()[-1])
    bad = {os.path.basename(k): v for k, v in got.items() if not (isinstance(v, list) and v[0] == 3)}
    assert not bad, bad
    COUNT['memory bombs refused'] += len(got)
