#!/usr/bin/env python3
"""The job of issue 27: a DataParallel checkpoint saved on cuda:0, fixed in ONE command on a
machine without CUDA, loads with plain torch.load(f) and no map_location.

The input is made here: nn.DataParallel(MLP()) (tests/fixtures/models.py) saved with torch.save
on the CPU, then its storages tagged cuda:0 by `ckpt remap --to cuda:0`, as a GPU run saves them
(checked: torch records cuda:0 for each storage, through a recording map_location).  On this
machine (no CUDA, or CKPT_CUDA_DEVICES=0 where the test environment sets it):

- plain torch.load(IN) fails with torch's "Attempting to deserialize object on a CUDA device"
  (where this torch has no CUDA device), and the torch_load verdict of `ckpt inspect --json IN`
  says so: accepted, but missing_here ["cuda:0"], its fix `ckpt strip-module --map-location cpu
  IN OUT.pth`;
- `ckpt strip-module --map-location cpu IN OUT` (one command) writes a file that plain
  torch.load(OUT) reads (torch 2.x: its weights-only default; torch 1.13: weights_only=True),
  every storage on the cpu, whose state dict MLP().load_state_dict(strict=True) takes with the
  values saved; the verdict of OUT has missing_here [];
- the fixes ckpt proposes are whole: the verdict's fix and verify's fix, run as printed, give
  files that load the same way;
- --map-location cpu on add-module, unwrap, rename, extract, convert (pth-zip and pth-legacy)
  gives files plain torch.load reads here;
- with CKPT_CUDA_DEVICES unset, the driver is probed: missing_here is [] exactly when this
  torch (a CUDA build) finds a device.
"""
import json
import os
import shlex
import subprocess
import sys

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as c  # noqa: E402  (exits 77 without torch)

import models  # noqa: E402  (tests/fixtures)

t = c.Tally()
t.need(c.CKPT, 'CKPT')
torch = c.torch
TORCH2 = int(torch.__version__.split('.')[0]) >= 2
W = c.scratch()
os.environ['CKPT_CUDA_DEVICES'] = '0'   # this machine, GPU or not: no CUDA device
HAS_CUDA = torch.cuda.is_available()


def plain_load(path):
    """torch.load(path) as a user types it: no map_location; 1.13 needs weights_only=True
    for the weights-only unpickler (its default is the full one)."""
    return torch.load(path) if TORCH2 else torch.load(path, weights_only=True)


def verdict(path, env=None):
    """The torch_load object of `ckpt inspect --json PATH` (under ENV: else this process's)."""
    p = subprocess.run([c.CKPT, 'inspect', '--json', path], capture_output=True, env=env,
                       timeout=c.TIMEOUT)
    assert p.returncode == 0, p.stderr.decode(errors='replace')
    return json.loads(p.stdout)['torch_load']


torch.manual_seed(27)
model = models.MLP()
SAVED = {k: v.clone() for k, v in model.state_dict().items()}
CPU = os.path.join(W, 'dp_cpu.pth')
DP = os.path.join(W, 'dp_cuda.pth')
torch.save(torch.nn.DataParallel(model).state_dict(), CPU)
c.ckpt_expect(0, 'remap', '--quiet', '--to', 'cuda:0', CPU, DP)


def check_fixed(path, want_keys=None):
    """PATH loads with plain torch.load here, every storage on the cpu, and holds SAVED
    (under WANT_KEYS' names: the plain model's by default)."""
    sd = plain_load(path)
    _, tags = c.load_tagged(path)
    assert set(tags.values()) == {'cpu'}, 'location tags %s' % sorted(set(tags.values()))
    if want_keys is None:
        m = models.MLP()
        m.load_state_dict(sd, strict=True)
        got = m.state_dict()
    else:
        got = {want_keys(k): v for k, v in sd.items()}
    for k, v in SAVED.items():
        assert torch.equal(got[k], v), 'values of %s differ' % k
    for ver in ('2.6+', '1.13'):
        v = verdict(path)[ver]
        assert v['accepted'] and v['missing_here'] == [], '%s verdict after: %s' % (ver, v)


@t.case('the input: DataParallel keys, every storage tagged cuda:0 (as a GPU save)')
def _():
    sd, tags = c.load_tagged(DP)
    assert set(tags.values()) == {'cuda:0'}, sorted(set(tags.values()))
    assert all(k.startswith('module.') for k in sd), list(sd)


@t.case('plain torch.load of the input fails here: "Attempting to deserialize object on a '
        'CUDA device", raised as the verdict says')
def _():
    if HAS_CUDA:
        raise c.Skip('this torch has a CUDA device')
    try:
        plain_load(DP)
    except Exception as e:  # 2.x: RuntimeError; 1.13: its weights-only UnpicklingError
        msg = 'Attempting to deserialize object on a CUDA device'
        assert msg in str(e), str(e)
        note = verdict(DP)['2.6+' if TORCH2 else '1.13']['note']
        assert ('raises %s: ' % type(e).__name__) in note, (type(e).__name__, note)
    else:
        raise c.Fail('torch.load succeeded')


@t.case('the verdict before: accepted, missing_here ["cuda:0"], torch\'s message, the '
        'whole fix')
def _():
    for ver, v in verdict(DP).items():
        assert v['accepted'], v
        assert v['devices'] == ['cuda:0'] and v['missing_here'] == ['cuda:0'], v
        assert 'Attempting to deserialize object on a CUDA device' in v['note'], v['note']
        assert v['fix'].startswith('ckpt strip-module --map-location cpu %s OUT.pth' % DP), \
            v['fix']
    r = c.ckpt_expect(0, 'inspect', DP)
    assert 'accepted by the unpickler, but not on this machine' in r.out, r.out


@t.case('ckpt strip-module --map-location cpu IN OUT: one command, plain torch.load(OUT) '
        'here, load_state_dict(strict=True) takes it, the verdict after misses nothing')
def _():
    out = os.path.join(W, 'fixed.pth')
    r = c.ckpt_expect(0, 'strip-module', '--map-location', 'cpu', DP, out)
    assert 'storages: 4 of 4 remapped (cuda:0 -> cpu)' in r.out, r.out
    check_fixed(out)


def run_fix(fix, out):
    """Runs a fix as ckpt printed it (`ckpt ...`, OUT.pth or its own OUT replaced by OUT)."""
    argv = shlex.split(fix.split(' (')[0])
    assert argv[0] == 'ckpt', fix
    argv[-1] = out
    c.ckpt_expect(0, *argv[1:])


@t.case("the verdict's fix, run as printed, gives a file that loads here")
def _():
    out = os.path.join(W, 'verdict_fix.pth')
    run_fix(verdict(DP)['2.6+']['fix'], out)
    check_fixed(out)


@t.case("verify's fix, run as printed, gives a file that loads here")
def _():
    r = c.ckpt(*['verify', '--json', '--model', os.path.join(c.SPECS, 'mnist_mlp.json'),
                 '--device', 'cpu', DP])
    assert r.rc == 1, r.err
    fix = json.loads(r.out)['fix']
    assert '--map-location cpu' in fix, fix
    out = os.path.join(W, 'verify_fix.pth')
    run_fix(fix, out)
    check_fixed(out)


for name, args, keys in [
        ('unwrap', ['unwrap'], None),
        ('extract', ['extract'], lambda k: k[len('module.'):]),
        ('convert', ['convert'], lambda k: k[len('module.'):]),
        ('convert --to pth-legacy', ['convert', '--to', 'pth-legacy'],
         lambda k: k[len('module.'):]),
        ('rename', ['rename', '-e', 's/^module\\.//'], None),
        ('strip-module then add-module', ['add-module'], lambda k: k[len('module.'):])]:
    def one(d, name=name, args=args, keys=keys):
        src = DP
        if name.startswith('strip-module then'):
            src = os.path.join(d, 'plain_cuda.pth')
            c.ckpt_expect(0, 'strip-module', '--quiet', DP, src)
        out = os.path.join(d, 'out.pth')
        c.ckpt_expect(0, *(args + ['--map-location', 'cpu', src, out]))
        check_fixed(out, keys)
    t.run('%s --map-location cpu: plain torch.load here' % name, one, tmp=True)


@t.case('the probe: with CKPT_CUDA_DEVICES unset, missing_here is [] exactly when this torch '
        'finds a CUDA device')
def _():
    if torch.version.cuda is None:
        raise c.Skip('this torch is a CPU build: it never sees the driver ckpt probes')
    env = {k: v for k, v in os.environ.items() if k != 'CKPT_CUDA_DEVICES'}
    v = verdict(DP, env)['2.6+']
    assert v['missing_here'] == ([] if HAS_CUDA else ['cuda:0']), v


sys.exit(t.summary())
