#!/usr/bin/env python3
"""Interop test: the model-parallel MNIST autoencoder (models/mnist_autoencoder.json,
tests/fixtures/models.py AutoEncoder) through `ckpt verify`, against PyTorch.

The checkpoints (2.4 million parameters, 9.6 MB each) are not in the tree:
tests/fixtures/make_mp_ae_fixtures.py makes them here, with the torch this
run is under, into a scratch directory: mp_ae.pth as the model-parallel
run saves it (encoder storages cuda:0, decoder cuda:1), mp_ae_dp.pth as
nn.DataParallel saves it (module. keys, cuda:0) and mp_ae.ref.pth, torch's
x_hat and z for 16 images.

Checks: the tags as torch reads them and as ckpt inspect shows them; the
strict load and the outputs within 1e-5 of each output's scale; the
DataParallel file refused with torch's message and the strip-module fix,
then verified once stripped; a nudged weight fails; and the two
autoencoder specs against each other's checkpoints fail with torch's
missing and unexpected keys and the size mismatch of encoder.fc.weight.

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
import make_mp_ae_fixtures  # noqa: E402  (tests/fixtures)

SPEC = 'mnist_autoencoder.json'          # the article's network
CONV_SPEC = 'mnist_conv_autoencoder.json'  # the strided-conv one of tests/data
t = c.Tally()
t.need(c.CKPT, 'CKPT')
case = t.case
torch.set_num_threads(1)
F = make_mp_ae_fixtures.make(c.scratch('mp_ae'), check=False)   # ckpt is the check
MP, DP, REF = F['mp_ae'], F['mp_ae_dp'], F['mp_ae.ref']


def load_sd(path):
    return c.load_trusted(path, map_location='cpu')


def torch_message(model, path):
    msg = c.strict_load_error(model, load_sd(path))
    assert msg is not None, 'torch loads %s' % path
    return msg


def verify_ok(path):
    """ckpt verify --reference REF PATH: PASS, each output within 1e-5 of its scale."""
    rc, doc = c.verify_json(SPEC, path, '--reference', REF)
    outs = {o['name']: o for o in doc.get('outputs', [])}
    assert rc == 0 and doc['load']['ok'], 'exit %d, %s; outputs %s' % (
        rc, doc['load'].get('message', 'loaded'),
        {n: o['reference'] for n, o in outs.items()})
    assert sorted(outs) == ['x_hat', 'z'], sorted(outs)
    for name, o in outs.items():
        assert o['reference']['pass'] and o['reference']['max_rel'] < 1e-5, o
    return doc


@case('fixtures: %d parameters, trained (loss %.4f), 3 files' % (F['params'], F['loss']))
def _():
    assert F['params'] == 2405633, F['params']
    sd = load_sd(MP)
    fresh = models.AutoEncoder().state_dict()
    assert list(sd) == list(fresh), list(sd)
    assert not torch.equal(sd['encoder.fc.weight'], fresh['encoder.fc.weight'])


@case('tags: encoder cuda:0, decoder cuda:1 (torch.load and ckpt inspect agree)')
def _():
    sd, tags = c.load_tagged(MP)
    want = {k: 'cuda:0' if k.startswith('encoder.') else 'cuda:1' for k in sd}
    got = {k: tags[c.sid(v)] for k, v in sd.items()}
    assert got == want, got
    r = c.ckpt_expect(0, 'inspect', '--json', MP)
    doc = json.loads(r.out)
    got = {'.'.join(x['path']): x['device'] for x in doc['tensors']}
    assert got == want, got
    sd, tags = c.load_tagged(DP)
    assert set(tags.values()) == {'cuda:0'}, set(tags.values())
    assert all(k.startswith('module.') for k in sd), list(sd)


@case('load and numbers: the model-parallel checkpoint, x_hat and z within 1e-5 of scale')
def _():
    assert c.strict_load_error(models.AutoEncoder(), load_sd(MP)) is None
    verify_ok(MP)


@case('DataParallel: refused with torch\'s message and the strip-module fix, then verified')
def _():
    rc, doc = c.verify_json(SPEC, DP, '--reference', REF)
    assert rc == 1 and not doc['load']['ok'], doc['load']
    want = torch_message(models.AutoEncoder(), DP)
    assert doc['load']['message'] == want, '\n ckpt:  %r\n torch: %r' % (
        doc['load']['message'], want)
    fix = doc['fix'].split()
    # its storages are on cuda:0, which this machine lacks (CKPT_CUDA_DEVICES=0): remapped too
    assert fix[:4] == ['ckpt', 'strip-module', '--map-location', 'cpu'] and fix[4] == DP, \
        doc['fix']
    out = c.scratch('mp_ae_stripped.pth')
    c.ckpt_expect(0, *(fix[1:-1] + [out]))  # the fix as printed
    assert c.strict_load_error(models.AutoEncoder(), load_sd(out)) is None
    verify_ok(out)


@case('numbers: a nudged decoder weight fails')
def _():
    sd = collections.OrderedDict(load_sd(MP))
    sd['decoder.conv1.bias'] = sd['decoder.conv1.bias'] + 0.05
    bad = c.save(sd, c.scratch('mp_ae_nudged.pth'))
    rc, doc = c.verify_json(SPEC, bad, '--reference', REF)
    assert rc == 1 and doc['load']['ok'], doc['load']
    outs = {o['name']: o['reference'] for o in doc['outputs']}
    assert not outs['x_hat']['pass'] and outs['z']['pass'], outs


def check_other_net(spec, model, path, fc_ckpt, fc_model):
    """SPEC against a checkpoint of the other autoencoder: torch's missing
    and unexpected keys, and the size mismatch of encoder.fc.weight.
    PyTorch also names decoder.fc's, which a spec cannot see: it holds no
    layer sizes, and decoder.fc's width comes from its own weight.  So
    ckpt's message is torch's first lines, and the rest are decoder.fc's."""
    rc, doc = c.verify_json(spec, path)
    load = doc['load']
    assert rc == 1 and not load['ok'], load
    sd = load_sd(path)
    want = model.state_dict()
    missing = [k for k in want if k not in sd]
    unexpected = [k for k in sd if k not in want]
    assert load['missing'] == missing, (load['missing'], missing)
    assert load['unexpected'] == unexpected, (load['unexpected'], unexpected)
    assert load['size_mismatch'] == [{'key': 'encoder.fc.weight', 'checkpoint': fc_ckpt,
                                      'model': fc_model}], load['size_mismatch']
    tmsg = torch_message(model, path).splitlines()
    ours = load['message'].splitlines()
    assert ours == tmsg[:len(ours)], '\n ckpt:  %r\n torch: %r' % (ours, tmsg)
    assert all('decoder.fc.' in line for line in tmsg[len(ours):]), tmsg[len(ours):]


@case('old spec, new checkpoint: missing, unexpected, size mismatch for encoder.fc.weight')
def _():
    check_other_net(CONV_SPEC, models.Autoencoder(), MP, [32, 36864], [32, 3136])


@case('new spec, old checkpoint (tests/data/fmnist_ae.pth): the same, the other way')
def _():
    check_other_net(SPEC, models.AutoEncoder(), os.path.join(c.DATA, 'fmnist_ae.pth'),
                    [32, 3136], [32, 36864])


sys.exit(t.summary())
