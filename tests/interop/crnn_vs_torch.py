#!/usr/bin/env python3
"""Interop test: crnn.pytorch's CRNN (tests/fixtures/models.py CRNN, the same
module names), the network of the DataParallel article, through `ckpt
verify` (models/crnn.json), against torch in eval mode.

A small-width CRNN (conv0 of 4 channels, nh 8, 11 classes, 32 x 256
images) saved as nn.DataParallel saves it on a GPU (`module.` keys, every
storage tagged cuda:0, made here in scratch):
  - verify refuses it with torch's own strict-load message and the
    strip-module fix;
  - `ckpt strip-module` fixes it, and verify then passes against torch's
    outputs within 1e-5 of their scale on the CPU;
  - rnn.0.rnn's weight_ih_l0 and weight_ih_l0_reverse swapped (the two
    directions' input weights: same shapes, it loads) makes verify fail;
  - a weight_hh of the wrong width is refused with torch's message;
  - `--replicas 2` on a batch of 32 reports [130, 16, C] where one device
    gives [65, 32, C]: torch's DataParallel gather, computed here on the CPU
    by running the two halves of the batch and concatenating along dim 0.
And once the article's full model (5530 classes, nh 256: 11.1M parameters)
on 32 x 256 images at batch 2, timed.

Prints `ok NAME` or `FAIL NAME: why` per case, then `N passed, M failed`;
exits 1 if anything failed, 77 (skip) if torch cannot be imported.
"""
import os
import sys
import time

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as c  # noqa: E402  (exit 77 without torch)
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import models  # noqa: E402  (tests/fixtures/models.py)
from make_fixtures import assign_tag, clear_tags  # noqa: E402  (cuda:N tags without a GPU)

t = c.Tally()
t.need(c.CKPT, 'CKPT')
case = t.case
SPEC = 'crnn.json'
T = models.crnn_steps(256)
SMALL = dict(imgH=32, nc=1, nclass=11, nh=8, width=4)


def small(seed):
    torch.manual_seed(seed)
    return models.randomize_batch_norms(models.CRNN(**SMALL)).eval()


def reference(model, batch, name, seed=0):
    torch.manual_seed(seed)
    x = torch.rand(batch, 1, 32, 256)
    return c.save_reference(model, x, ['logits'], c.scratch(name))


def save_dp(model, path):
    """model.state_dict() of nn.DataParallel(model) on cuda:0, as saved there."""
    sd = nn.DataParallel(model).state_dict()
    assert all(k.startswith('module.') for k in sd)
    assign_tag(sd, 'cuda:0')
    try:
        torch.save(sd, path)
    finally:
        clear_tags()
    _, tags = c.load_tagged(path)
    assert set(tags.values()) == {'cuda:0'}, set(tags.values())
    return path


def check_pass(doc, rc, shape):
    assert rc == 0 and doc['result'] == 'PASS', doc
    o = doc['outputs'][0]
    assert o['name'] == 'logits' and o['shape'] == shape, o
    assert o['reference']['max_rel'] < 1e-5, o


def data_parallel_shape(model, x, n):
    """The shape nn.DataParallel over N devices returns: the batch chunked
    along dim 0, a replica per chunk, the outputs concatenated along dim 0
    (torch's gather)."""
    parts = [c.forward(model, part)[0] for part in x.chunk(n, 0)]
    return list(torch.cat(parts, 0).shape), len(parts)


@case('crnn: DataParallel checkpoint refused with torch\'s message and the strip-module fix; '
      'stripped, it verifies within 1e-5 of torch')
def _():
    model = small(16)
    dp = save_dp(model, c.scratch('crnn_dp.pth'))
    ref = reference(model, 3, 'crnn.ref.pth')
    rc, doc = c.verify_json(SPEC, dp, '--reference', ref)
    want = c.strict_load_error(models.CRNN(**SMALL), torch.load(dp, map_location='cpu'))
    assert rc == 1 and not doc['load']['ok'], doc['load']
    assert doc['load']['message'] == want, (doc['load']['message'][:300], want[:300])
    assert doc['fix'].startswith('ckpt strip-module '), doc.get('fix')
    rc, _, err = c.ckpt('strip-module', dp, c.scratch('crnn_fixed.pth'))
    assert rc == 0, err
    rc, doc = c.verify_json(SPEC, c.scratch('crnn_fixed.pth'), '--reference', ref)
    check_pass(doc, rc, [T, 3, 11])


@case('crnn: the two directions\' input weights swapped (weight_ih_l0 <-> '
      'weight_ih_l0_reverse) load, and verify fails')
def _():
    model = small(16)
    ref = reference(model, 3, 'crnn_swap.ref.pth')
    sd = model.state_dict()
    a, b = 'rnn.0.rnn.weight_ih_l0', 'rnn.0.rnn.weight_ih_l0_reverse'
    sd[a], sd[b] = sd[b].clone(), sd[a].clone()
    bad = c.save(sd, c.scratch('crnn_swapped.pth'))
    rc, doc = c.verify_json(SPEC, bad, '--reference', ref)
    assert rc == 1 and doc['load']['ok'], doc['load']
    assert not doc['outputs'][0]['reference']['pass'], doc['outputs'][0]
    # and unswapped, the same file passes: the swap is what fails
    rc, doc = c.verify_json(SPEC, c.save(model.state_dict(), c.scratch('crnn_plain.pth')),
                            '--reference', ref)
    check_pass(doc, rc, [T, 3, 11])


@case('crnn: a weight_hh_l0_reverse of the wrong width is refused with torch\'s message')
def _():
    sd = small(17).state_dict()
    sd['rnn.1.rnn.weight_hh_l0_reverse'] = torch.zeros(32, 7)
    path = c.save(sd, c.scratch('crnn_badhh.pth'))
    rc, doc = c.verify_json(SPEC, path)
    want = c.strict_load_error(models.CRNN(**SMALL), sd)
    assert 'weight_hh_l0_reverse' in want, want
    assert rc == 1 and doc['load']['message'] == want, (doc['load']['message'], want)


@case('crnn --replicas 2, batch 32: [%d, 16, 11] gathered where one device gives '
      '[%d, 32, 11], as torch\'s DataParallel' % (2 * T, T))
def _():
    model = small(18)
    path = c.save(model.state_dict(), c.scratch('crnn_rep.pth'))
    ref = reference(model, 32, 'crnn_b32.ref.pth', seed=3)
    x = torch.load(ref)['input']
    shape, used = data_parallel_shape(model, x, 2)
    assert shape == [2 * T, 16, 11], shape
    rc, doc = c.verify_json(SPEC, path, '--reference', ref, '--replicas', '2')
    assert rc == 1 and doc['result'] == 'FAIL', doc['result']
    o = doc['outputs'][0]
    assert o['shape'] == [T, 32, 11] and o['reference']['pass'], o
    rep = doc['replicas']
    assert rep['used'] == used, rep
    r = rep['outputs'][0]
    assert r['name'] == 'logits' and r['gathered_shape'] == shape, r
    assert not r['ok'] and r['batch_dim'] == 1 and 'not 0' in r['reason'], r


@case('crnn full size (5530 classes, nh 256), 32 x 256, batch 2: within 1e-5 of torch (timed)')
def _():
    torch.manual_seed(5530)
    model = models.randomize_batch_norms(models.CRNN(32, 1, 5530, 256)).eval()
    path = c.save(model.state_dict(), c.scratch('crnn_full.pth'))
    ref = reference(model, 2, 'crnn_full.ref.pth', seed=1)
    t0 = time.time()
    rc, doc = c.verify_json(SPEC, path, '--reference', ref)
    print('  crnn full size: ckpt verify %.2f s' % (time.time() - t0))
    check_pass(doc, rc, [T, 2, 5530])


sys.exit(t.summary())
