#!/usr/bin/env python3
"""A rewrite never writes a global that runs code into its output (issue 26), and the warning
of --keep-unsafe is true: torch itself runs what it kept.

The inputs come from tests/bad/make_unsafe.py (built opcode by opcode), naming a module of this
test's own, written into a throwaway folder: `ckpt_probe_<pid>`, whose import, `record()` and
`Config.__setstate__` append a line to a marker file and do nothing else (loaded here, the
module forgotten before each load so that its import runs again).  For each file and
each rewriting command (strip-module, add-module, unwrap, rename, remap, convert to pth and to
pth-legacy):

- torch.load(IN, weights_only=False) runs the payload (the marker gets lines): the file is
  what the test says;
- `ckpt CMD --allow-global G IN OUT` exits 3 naming G and `ckpt extract`, and leaves no OUT;
- `ckpt CMD --allow-global G --keep-unsafe IN OUT` exits 0 with the warning on stderr, and
  torch.load(OUT, weights_only=False), in a child process, runs the payload: OUT is unsafe,
  as the warning says; plain torch.load(OUT) (weights-only) refuses it where that torch has
  a weights-only default (2.6+);
- `ckpt extract --allow-global G IN OUT` (the way out the message names; `--to safetensors`
  when the global is in the state dict's _metadata) writes a file that torch loads with
  weights_only=True, and loading it runs nothing.
Also scan's fix for a file that calls builtins.print is `ckpt extract`, never an allow-list.
"""
import contextlib
import io
import json
import os
import subprocess
import sys

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as c  # noqa: E402  (exits 77 without torch)

t = c.Tally()
t.need(c.CKPT, 'CKPT')
torch = c.torch
HERE = c.scratch()
PROBE = 'ckpt_probe_%d' % os.getpid()
MARK = os.path.join(HERE, 'marker')
TORCH2 = int(torch.__version__.split('.')[0]) >= 2

with open(os.path.join(HERE, PROBE + '.py'), 'w') as f:
    f.write('''"""Harmless recording payload for tests/interop/rewrite_unsafe.py."""
import os


def _note(what):
    with open(os.environ['CKPT_PROBE_MARK'], 'a') as f:
        f.write(what + '\\n')


_note('import')


def record(tag):
    _note('record ' + str(tag))
    return tag


class Config:
    def __setstate__(self, state):
        _note('setstate')
        self.__dict__.update(state)
''')

subprocess.run([sys.executable, os.path.join(c.SRCDIR, 'tests', 'bad', 'make_unsafe.py'),
                HERE, PROBE], check=True)
GLOBALS = dict(line.split() for line in open(os.path.join(HERE, 'unsafe_globals.txt')))
COMMANDS = [['strip-module'], ['add-module'], ['unwrap'], ['rename', '-e', 's/^module\\./m./'],
            ['remap', '--to', 'cpu'], ['convert'], ['convert', '--to', 'pth-legacy']]

sys.path.insert(0, HERE)
os.environ['CKPT_PROBE_MARK'] = MARK


def torch_load(path, weights_only):
    """torch.load(PATH, weights_only=...) here ('default': as plain torch.load), the probe
    module forgotten first so that its import runs again: (0, or 3 when torch refused; the
    marker's lines; what was printed)."""
    if os.path.exists(MARK):
        os.remove(MARK)
    sys.modules.pop(PROBE, None)
    kw = {} if weights_only == 'default' else {'weights_only': weights_only == 'true'}
    buf = io.StringIO()
    rc = 0
    try:
        with contextlib.redirect_stdout(buf):
            torch.load(path, map_location='cpu', **kw)
    except Exception:
        rc = 3
    lines = open(MARK).read().split() if os.path.exists(MARK) else []
    return rc, lines, buf.getvalue()


def case(name, glob):
    src = os.path.join(HERE, name)

    def inputs_run():
        rc, mark, _ = torch_load(src, 'false')
        if rc != 0 or 'import' not in mark:
            return ['torch.load(IN, weights_only=False) exited %d, marker %s: the input does '
                    'not run its payload' % (rc, mark)]
        return []
    if not t.run('%s: torch runs its payload (%s)' % (name, glob), inputs_run):
        return

    for cmd in COMMANDS:
        out = os.path.join(HERE, 'out.pth')

        def refused():
            line = c.refused(3, *cmd, '--allow-global', glob, src, out)
            errs = ['no %r in %r' % (w, line) for w in (glob, 'ckpt extract', '--keep-unsafe')
                    if w not in line]
            if os.path.exists(out):
                errs.append('OUT was written')
            return errs

        def kept():
            r = c.ckpt_expect(0, *cmd, '--quiet', '--allow-global', glob, '--keep-unsafe', src,
                              out)
            errs = []
            if 'warning: keeps the global %s' % glob not in r.err or \
                    'unsafe to load' not in r.err:
                errs.append('no warning on stderr: %r' % r.err)
            rc, mark, _ = torch_load(out, 'false')
            if rc != 0 or 'import' not in mark:
                errs.append('torch.load(OUT, weights_only=False) exited %d and ran %s: the '
                            'warning would be false' % (rc, mark))
            if TORCH2:
                rc, mark, _ = torch_load(out, 'default')
                if rc != 3 or mark:
                    errs.append('plain torch.load(OUT) exited %d, ran %s (want refused, '
                                'nothing run)' % (rc, mark))
            os.remove(out)
            return errs

        t.run('%s: ckpt %s --allow-global %s: refused, naming extract, no OUT'
              % (name, ' '.join(cmd), glob), refused)
        t.run('%s: ckpt %s --allow-global %s --keep-unsafe: torch.load(OUT, '
              'weights_only=False) runs the payload, as the warning says'
              % (name, ' '.join(cmd), glob), kept)

    def extracted():
        st = name == 'unsafe_metadata.pth'
        out = os.path.join(HERE, 'sd.safetensors' if st else 'sd.pth')
        c.ckpt_expect(0, 'extract', '--quiet', '--allow-global', glob,
                      *(['--to', 'safetensors'] if st else []), src, out)
        if st:
            import safetensors.torch as stt
            sd = stt.load_file(out)
            rc, mark = 0, []
        else:
            rc, mark, _ = torch_load(out, 'true')
            sd = torch.load(out, map_location='cpu', weights_only=True)
        errs = []
        if rc != 0 or mark:
            errs.append('torch.load(OUT, weights_only=True) exited %d and ran %s' % (rc, mark))
        if sorted(sd) != ['module.b', 'module.w']:
            errs.append('extracted keys %s' % sorted(sd))
        os.remove(out)
        return errs
    if name == 'unsafe_metadata.pth':
        try:
            import safetensors.torch  # noqa: F401
        except ImportError:
            t.skip('%s: extract --to safetensors' % name, 'no safetensors package')
            return
    t.run('%s: ckpt extract --allow-global %s writes the weights only: nothing runs'
          % (name, glob), extracted)


for name in ('unsafe_call.pth', 'unsafe_object.pth', 'unsafe_nested.pth', 'unsafe_key.pth',
             'unsafe_metadata.pth'):
    case(name, GLOBALS[name])


@t.case('os.system: no option writes it (--allow-global os.system --keep-unsafe)')
def _():
    src = os.path.join(HERE, 'unsafe_os_system.pth')
    for cmd in COMMANDS:
        line = c.refused(3, *cmd, '--allow-global', 'os.system', '--keep-unsafe', src,
                         os.path.join(HERE, 'o.pth'))
        assert 'os.system' in line, line
        assert not os.path.exists(os.path.join(HERE, 'o.pth'))


@t.case("scan's fix for a file that calls builtins.print is ckpt extract, never an allow-list")
def _():
    src = os.path.join(HERE, 'unsafe_print.pth')
    r = c.ckpt('scan', '--json', src)
    assert r.rc == 1, r.err
    verdicts = json.loads(r.out)['files'][0]['torch_load']
    for v, d in verdicts.items():
        fix = d.get('fix') or ''
        assert fix.startswith('ckpt extract --allow-global builtins.print '), (v, fix)
        assert 'add_safe_globals' not in fix and 'weights_only=False' not in fix, (v, fix)
    # and the fix works: what it writes loads weights-only, printing nothing
    out = os.path.join(HERE, 'print_sd.pth')
    c.ckpt_expect(0, 'extract', '--quiet', '--allow-global', 'builtins.print', src, out)
    rc, _, printed = torch_load(out, 'true')
    assert rc == 0 and 'ckpt-probe' not in printed, (rc, printed)
    # while torch.load(IN, weights_only=False) does call print
    rc, _, printed = torch_load(src, 'false')
    assert rc == 0 and 'ckpt-probe: print' in printed, (rc, printed)


sys.exit(t.summary())
