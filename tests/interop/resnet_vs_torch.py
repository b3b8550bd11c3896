#!/usr/bin/env python3
"""Interop test: torchvision's ResNet18 and ResNet50 (tests/fixtures/models.py,
the same module names) through `ckpt verify` (models/resnet18.json,
resnet50.json), against torch in eval mode.

Per depth, a small-width model (8 stem channels, batch norms with trained-
looking statistics) saved as nn.DataParallel saves it on a GPU (`module.`
keys, every storage tagged cuda:0, made here in scratch):
  - verify refuses it with torch's own strict-load message and the
    strip-module fix;
  - `ckpt strip-module` fixes it, and verify then passes against torch's
    outputs (batch 2) within 1e-5 of their scale on the CPU;
  - one running_var changed (x 1.5 on one channel) makes verify fail.
And once per depth the full-width model (11.7M / 25.6M parameters) at batch 2,
timed.

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


def small(depth, seed):
    torch.manual_seed(seed)
    return models.randomize_batch_norms(models.resnet(depth, num_classes=10, width=8)).eval()


def reference(model, batch, name):
    x = torch.rand(batch, 3, 224, 224)
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


def check_pass(doc, rc):
    assert rc == 0 and doc['result'] == 'PASS', doc
    o = doc['outputs'][0]
    assert o['name'] == 'logits' and o['reference']['max_rel'] < 1e-5, o


for depth in (18, 50):
    spec = 'resnet%d.json' % depth

    @case('resnet%d: DataParallel checkpoint refused with torch\'s message and the strip-module '
          'fix; stripped, it verifies; a perturbed running_var fails' % depth)
    def _(depth=depth, spec=spec):
        model = small(depth, depth)
        dp = save_dp(model, c.scratch('resnet%d_dp.pth' % depth))
        ref = reference(model, 2, 'resnet%d.ref.pth' % depth)
        rc, doc = c.verify_json(spec, dp, '--reference', ref)
        want = c.strict_load_error(models.resnet(depth, num_classes=10, width=8),
                                   torch.load(dp, map_location='cpu'))
        assert rc == 1 and not doc['load']['ok'], doc['load']
        assert doc['load']['message'] == want, (doc['load']['message'][:300], want[:300])
        assert doc['fix'].startswith('ckpt strip-module '), doc.get('fix')
        fixed = c.scratch('resnet%d_fixed.pth' % depth)
        rc, _, err = c.ckpt('strip-module', dp, fixed)
        assert rc == 0, err
        rc, doc = c.verify_json(spec, fixed, '--reference', ref)
        check_pass(doc, rc)
        # one channel's running variance: the output moves, verify fails
        sd = torch.load(fixed, map_location='cpu')
        key = 'layer2.0.bn1.running_var'
        sd[key][3] *= 1.5
        bad = c.save(sd, c.scratch('resnet%d_badvar.pth' % depth))
        rc, doc = c.verify_json(spec, bad, '--reference', ref)
        assert rc == 1 and doc['load']['ok'], doc['load']
        assert not doc['outputs'][0]['reference']['pass'], doc['outputs'][0]

    @case('resnet%d full width, batch 2: within 1e-5 of torch (timed)' % depth)
    def _(depth=depth, spec=spec):
        torch.manual_seed(100 + depth)
        model = models.randomize_batch_norms(models.resnet(depth)).eval()
        path = c.save(model.state_dict(), c.scratch('resnet%d_full.pth' % depth))
        ref = reference(model, 2, 'resnet%d_full.ref.pth' % depth)
        t0 = time.time()
        rc, doc = c.verify_json(spec, path, '--reference', ref)
        print('  resnet%d full width: ckpt verify %.2f s' % (depth, time.time() - t0))
        check_pass(doc, rc)

sys.exit(t.summary())
