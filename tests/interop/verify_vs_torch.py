#!/usr/bin/env python3
"""Interop test: `ckpt verify` against PyTorch on the same checkpoints.

Environment:
  CKPT    path of the ckpt binary (default: $srcdir/ckpt)
  srcdir  repository root (default: two levels above this script)

Strict load: for each case a checkpoint is made (or taken from tests/data)
and `model.load_state_dict(sd, strict=True)` is run in torch; `ckpt verify
--json` must say `ok` exactly when torch loads it, and otherwise carry
torch's RuntimeError text, byte for byte, in load.message (exit 1).

Numbers: torch runs the model on a batch and writes a reference file;
`ckpt verify --device cpu --reference` must PASS on the checkpoint and on
what `ckpt strip-module` and `ckpt convert` (safetensors, float16) make of
it, and FAIL (exit 1) on a checkpoint one weight of which was nudged.
`--against` must report identical outputs (bitwise) for the same weights
and FAIL for different ones.

Prints `ok NAME` or `FAIL NAME: why` per case, then `N passed, M failed`;
exits 1 if anything failed, 77 (skip) if torch cannot be imported.
"""
import collections
import json
import os
import sys

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as c  # noqa: E402  (exit 77 without torch)
import torch  # noqa: E402
import models  # noqa: E402  (tests/fixtures/models.py)

DATA = c.DATA
MLP_SPEC = 'mnist_mlp.json'
AE_SPEC = 'mnist_conv_autoencoder.json'
torch.manual_seed(0)
t = c.Tally()
t.need(c.CKPT, 'CKPT')
case = t.case


def load_sd(path, select=None):
    obj = c.load_trusted(path, map_location='cpu')
    if select:
        for k in select.split('/'):
            obj = obj[k]
    return obj


def check_load(spec, model, path, select=None):
    sd = load_sd(path, select)
    want = c.strict_load_error(model, sd)
    extra = ['--select', select] if select else []
    rc, doc = c.verify_json(spec, path, *extra)
    got_ok = doc['load']['ok']
    if want is None:
        assert got_ok and rc == 0, f'torch loads it, ckpt says: {doc["load"]["message"]!r}'
    else:
        assert not got_ok and rc == 1, f'torch fails ({want!r}), ckpt loads it'
        assert doc['load']['message'] == want, \
            f'\n ckpt:  {doc["load"]["message"]!r}\n torch: {want!r}'
    return doc


# ---- strict load: torch's own wording --------------------------------------

@case('load: plain MLP state dict')
def _():
    check_load(MLP_SPEC, models.MLP(), os.path.join(DATA, 'fmnist_mlp.pth'))


@case('load: DataParallel keys (module.) with the strip-module fix')
def _():
    path = os.path.join(DATA, 'fmnist_mlp_dp.pth')
    doc = check_load(MLP_SPEC, models.MLP(), path)
    fix = doc['fix'].split()
    assert fix[:2] == ['ckpt', 'strip-module'], doc['fix']
    out = c.scratch('dp_fixed.pth')
    rc, _, err = c.ckpt('strip-module', path, out)
    assert rc == 0, err
    check_load(MLP_SPEC, models.MLP(), out)


@case('load: DDP twice (module.module.)')
def _():
    doc = check_load(MLP_SPEC, models.MLP(), os.path.join(DATA, 'ddp2_mlp.pth'))
    assert doc['fix'].startswith('ckpt strip-module '), doc['fix']


@case('load: torch.compile keys (_orig_mod.) with the unwrap fix')
def _():
    doc = check_load(MLP_SPEC, models.MLP(), os.path.join(DATA, 'compiled.pth'))
    assert doc['fix'].startswith('ckpt unwrap '), doc['fix']


@case('load: training checkpoint, --select model_state_dict')
def _():
    check_load(MLP_SPEC, models.MLP(), os.path.join(DATA, 'train_ckpt.pth'), 'model_state_dict')


@case('load: Lightning state_dict (model. prefix)')
def _():
    doc = check_load(MLP_SPEC, models.MLP(hidden=16), os.path.join(DATA, 'lightning.pth'),
                     'state_dict')
    assert "--prefix 'model.'" in doc['fix'], doc['fix']


@case('load: autoencoder split over two GPUs')
def _():
    check_load(AE_SPEC, models.Autoencoder(), os.path.join(DATA, 'ae_model_parallel.pth'))


@case('load: autoencoder as pipeline stages (no prefix fix)')
def _():
    doc = check_load(AE_SPEC, models.Autoencoder(), os.path.join(DATA, 'pipeline.pth'))
    assert 'fix' not in doc


@case('load: size mismatch (hidden 128 then 64)')
def _():
    a, b = models.MLP(hidden=128).state_dict(), models.MLP(hidden=64).state_dict()
    sd = collections.OrderedDict(a)
    sd['n.3.weight'] = b['n.3.weight']
    doc = check_load(MLP_SPEC, models.MLP(hidden=128), c.save(sd, c.scratch('mismatch.pth')))
    assert doc['load']['size_mismatch'] == [
        {'key': 'n.3.weight', 'checkpoint': [10, 64], 'model': [10, 128]}], doc['load']


@case('load: a missing key, an extra key and a mismatch together')
def _():
    sd = collections.OrderedDict(models.MLP().state_dict())
    del sd['n.1.bias']
    sd['n.5.weight'] = torch.zeros(3)
    sd['n.3.bias'] = torch.zeros(12)
    check_load(MLP_SPEC, models.MLP(), c.save(sd, c.scratch('mixed.pth')))


@case('load: unexpected keys at several depths come in module order')
def _():
    sd = collections.OrderedDict()
    base = models.MLP().state_dict()
    sd['n.1.extra'] = torch.zeros(1)
    sd['zzz'] = torch.zeros(1)
    sd.update(base)
    sd['n.7.x'] = torch.zeros(1)
    sd['encoder.x'] = torch.zeros(1)
    check_load(MLP_SPEC, models.MLP(), c.save(sd, c.scratch('depths.pth')))


@case('load: wrong autoencoder channel count in the decoder')
def _():
    sd = collections.OrderedDict(models.Autoencoder().state_dict())
    sd['decoder.deconv2.weight'] = torch.zeros(16, 1, 3, 3)
    check_load(AE_SPEC, models.Autoencoder(), c.save(sd, c.scratch('ae_bad.pth')))


# ---- numbers: ckpt's forward against torch's ---------------------------------

def reference(model, sd, outputs, batch=32, name='ref.pth'):
    """torch's outputs for a random batch, as a --reference file."""
    model.load_state_dict(sd)
    return c.save_reference(model, torch.rand(batch, 1, 28, 28), outputs, c.scratch(name))


def check_pass(spec, path, ref, want_rc=0):
    rc, doc = c.verify_json(spec, path, '--reference', ref)
    assert rc == want_rc, f'exit {rc}, result {doc["result"]}: {json.dumps(doc["outputs"])}'
    return doc


@case('numbers: MLP and autoencoder on random inputs, torch as reference')
def _():
    sd = load_sd(os.path.join(DATA, 'fmnist_mlp.pth'))
    ref = reference(models.MLP(), sd, ['logits'])
    doc = check_pass(MLP_SPEC, os.path.join(DATA, 'fmnist_mlp.pth'), ref)
    assert doc['outputs'][0]['reference']['max_rel'] < 1e-5, doc['outputs']
    sd = load_sd(os.path.join(DATA, 'fmnist_ae.pth'))
    ref = reference(models.Autoencoder(), sd, ['x_hat', 'z'], name='ae_ref.pth')
    doc = check_pass(AE_SPEC, os.path.join(DATA, 'fmnist_ae.pth'), ref)
    for o in doc['outputs']:
        assert o['reference']['max_rel'] < 1e-5, doc['outputs']


@case('numbers: strip-module and convert keep the outputs')
def _():
    dp = os.path.join(DATA, 'fmnist_mlp_dp.pth')
    ref = os.path.join(DATA, 'fmnist_mlp.ref.pth')
    stripped = c.scratch('stripped.pth')
    st = c.scratch('stripped.safetensors')
    assert c.ckpt('strip-module', dp, stripped)[0] == 0
    assert c.ckpt('convert', stripped, st)[0] == 0
    for path in (stripped, st):
        check_pass(MLP_SPEC, path, ref)
    # float16 weights: torch's own outputs for the rounded weights
    half = c.scratch('half.pth')
    assert c.ckpt('convert', '--dtype', 'float16', stripped, half)[0] == 0
    sd = {k: v.float() for k, v in load_sd(half).items()}
    r = load_sd(ref)
    ref16 = reference(models.MLP(), sd, ['logits'], batch=4, name='ref16.pth')
    check_pass(MLP_SPEC, half, ref16)
    # against the float32 model's outputs, float16 rounding is far past 1e-5
    doc = check_pass(MLP_SPEC, half, ref, want_rc=1)
    assert doc['outputs'][0]['shape'] == list(r['output.logits'].shape), doc['outputs'][0]
    assert doc['outputs'][0]['reference']['max_abs'] > 1e-4, doc['outputs'][0]


@case('numbers: a bfloat16 copy keeps the accuracy but fails, max abs about 0.02 (README)')
def _():
    bf = c.scratch('bf16.pth')
    assert c.ckpt('convert', '--dtype', 'bfloat16', os.path.join(DATA, 'fmnist_mlp.pth'), bf)[0] == 0
    doc = check_pass(MLP_SPEC, bf, os.path.join(DATA, 'fmnist_mlp.ref.pth'), want_rc=1)
    out = doc['outputs'][0]
    assert out['accuracy'] == out['reference_accuracy'], out
    assert 0.005 < out['reference']['max_abs'] < 0.05, out
    rc, doc = c.verify_json(MLP_SPEC, bf, '--atol', '0.05', '--reference',
                            os.path.join(DATA, 'fmnist_mlp.ref.pth'))
    assert rc == 0, doc['outputs']


@case('numbers: a nudged weight fails')
def _():
    sd = collections.OrderedDict(load_sd(os.path.join(DATA, 'fmnist_mlp.pth')))
    sd['n.3.bias'] = sd['n.3.bias'].clone()
    sd['n.3.bias'][3] += 0.01
    bad = c.save(sd, c.scratch('nudged.pth'))
    doc = check_pass(MLP_SPEC, bad, os.path.join(DATA, 'fmnist_mlp.ref.pth'), want_rc=1)
    ref = doc['outputs'][0]['reference']
    assert not ref['pass'] and ref['mismatched'] > 0, ref
    assert abs(ref['max_abs'] - 0.01) < 1e-4, ref


@case('against: same weights bitwise, other weights fail')
def _():
    dp = os.path.join(DATA, 'fmnist_mlp_dp.pth')
    stripped = c.scratch('against.pth')
    assert c.ckpt('strip-module', dp, stripped)[0] == 0
    rc, doc = c.verify_json(MLP_SPEC, os.path.join(DATA, 'fmnist_mlp.pth'), '--against', stripped)
    assert rc == 0 and doc['outputs'][0]['against']['max_abs'] == 0, doc
    rc, doc = c.verify_json(MLP_SPEC, os.path.join(DATA, 'fmnist_mlp.pth'), '--against',
                            c.scratch('nudged.pth'))
    assert rc == 1 and not doc['outputs'][0]['against']['pass'], doc


sys.exit(t.summary())
