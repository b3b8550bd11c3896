"""Hostile zips (tests/bad/make_bad_zip.py): do torch and Python's zipfile
read the data.pkl that lib/container/zip_dir.c says they do?

For each file, tests/interop/zip_dir_tool prints the model: per reader the
data.pkl bytes it reads (or that it refuses), and the findings.  Then:
- torch.load(f, pickle_module=recorder, weights_only=False): the recorder's
  Unpickler.find_class records every global and returns an inert stand-in
  (nothing is imported or run); what torch unpickled must equal the model's
  bytes unpickled by the same recorder (from byte 0 when the model says
  torch.load does not take the file for a zip);
- torch.load(f, weights_only=True) must accept exactly the files whose
  torch bytes are the benign pickle;
- zipfile.ZipFile(f).read('archive/data.pkl') must succeed exactly when the
  model says zipfile reads it with a good CRC-32, and give the model's bytes;
- every file but plain.pth has at least one finding or a bad CRC, plain.pth none;
- the committed files are what the generator writes now.
"""
import io
import os
import pickle
import subprocess
import sys
import tempfile
import types
import zipfile

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as c  # noqa: E402

sys.path.insert(0, os.path.join(c.SRCDIR, 'tests', 'bad'))
import make_bad_zip as mbz  # noqa: E402

TOOL = os.environ.get('ZIP_DIR_TOOL') or os.path.join(c.SRCDIR, 'tests', 'interop',
                                                       'zip_dir_tool')
ZIPS = os.path.join(c.SRCDIR, 'tests', 'bad', 'zip')


def recorder():
    """A pickle module whose Unpickler runs nothing: globals become stand-ins."""
    seen = []

    class Unpickler(pickle.Unpickler):
        def find_class(self, mod, name):
            seen.append(mod + '.' + name)

            def standin(*args, **kw):
                return ('called', mod + '.' + name, args)
            return standin

    m = types.ModuleType('zip_readers_recorder')
    m.Unpickler = Unpickler
    m.load = lambda f, **kw: Unpickler(f, **kw).load()
    m.loads = lambda b, **kw: Unpickler(io.BytesIO(b), **kw).load()
    return m, seen


def unpickled(data):
    """(result, globals) of DATA under the recorder; result None on error."""
    m, seen = recorder()
    try:
        return m.loads(data), seen
    except Exception:
        return None, seen


def model(path):
    out = subprocess.run([TOOL, path], capture_output=True, text=True, timeout=60).stdout
    m = {'findings': [], 'readers': {}}
    for line in out.splitlines():
        if line.startswith('finding: '):
            m['findings'].append(line[9:])
        elif line.startswith('sniffs '):
            m['sniffs'] = line.split()[1] == '1'
        else:
            w = line.split(' ', 6)
            if w[1] == 'refuses':
                m['readers'][w[0]] = None
            elif len(w) == 7:
                m['readers'][w[0]] = {'crc_ok': w[4] == '1', 'rc': int(w[5]),
                                      'data': bytes.fromhex(w[6]) if w[6] != '-' else b''}
            else:
                m['readers'][w[0]] = {'crc_ok': False, 'rc': -1, 'data': None}
    return m


def torch_reads(path):
    """What torch.load unpickles (through the recorder), and the globals.
    torch 1.13 ignores pickle_module when weights_only is False (it sets
    pickle_module = pickle), so the module's own `pickle` is replaced too."""
    import torch.serialization as ts
    m, seen = recorder()
    real = ts.pickle
    ts.pickle = m
    try:
        obj = c.torch.load(path, pickle_module=m, weights_only=False)
    except Exception as e:
        obj = ('error', type(e).__name__)
    finally:
        ts.pickle = real
    return obj, seen


def weights_only_accepts(path):
    try:
        c.torch.load(path, weights_only=True)
        return True
    except Exception:
        return False


def check(name):
    path = os.path.join(ZIPS, name)
    errs = []
    m = model(path)
    t = m['readers'].get('torch')
    with open(path, 'rb') as f:
        whole = f.read()
    if not m.get('sniffs'):
        want, want_globals = unpickled(whole)   # torch.load's legacy path from byte 0
    elif t and t['data'] is not None:
        want, want_globals = unpickled(t['data'])
    else:
        want, want_globals = None, []
    got, got_globals = torch_reads(path)
    if want is not None and got != want and not (not m.get('sniffs') and got_globals == want_globals):
        errs.append(f'torch unpickled {got!r}, the model says {want!r}')
    if got_globals != want_globals:
        errs.append(f'torch asked for {got_globals}, the model says {want_globals}')
    benign = bool(m.get('sniffs')) and want is not None and not want_globals
    if weights_only_accepts(path) != bool(benign):
        errs.append(f'weights_only=True {"refuses" if benign else "accepts"} it, the model '
                    f'says torch reads {"the benign" if benign else "another"} pickle')
    z = m['readers'].get('zipfile')
    try:
        zdata = zipfile.ZipFile(path).read('archive/data.pkl')
    except Exception as e:
        zdata = e
    zok = z is not None and z['rc'] == 0 and z['crc_ok']
    if isinstance(zdata, bytes) != zok:
        errs.append(f'zipfile gives {zdata!r:.80}, the model {z!r:.120}')
    elif zok and zdata != z['data']:
        errs.append('zipfile reads other bytes than the model says')
    flagged = bool(m['findings']) or (t is not None and not t['crc_ok'])
    if flagged != (name != 'plain.pth'):
        errs.append(f'findings {m["findings"]} (crc_ok {t and t["crc_ok"]})')
    print(f'  {name}: torch reads {got!r:.60}, globals {got_globals}; '
          f'zipfile {"reads " + str(len(zdata)) + " bytes" if isinstance(zdata, bytes) else zdata!r:.70}')
    for f in m['findings']:
        print(f'    finding: {f}')
    return errs


t = c.Tally()
t.need(TOOL, 'ZIP_DIR_TOOL')
with tempfile.TemporaryDirectory() as d:
    subprocess.run([sys.executable, os.path.join(c.SRCDIR, 'tests', 'bad', 'make_bad_zip.py'), d],
                   check=True, capture_output=True)
    stale = [n for n in mbz.FILES if open(os.path.join(d, n), 'rb').read() !=
             open(os.path.join(ZIPS, n), 'rb').read()]
    t.report('the committed zips are what make_bad_zip.py writes', stale)
for name in mbz.FILES:
    t.report(name, check(name))
sys.exit(t.summary())
