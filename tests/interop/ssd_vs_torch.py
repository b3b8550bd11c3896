#!/usr/bin/env python3
"""Interop test: SSD300 and DataParallel's scatter/gather, ckpt against torch.

Environment:
  CKPT    path of the ckpt binary (default: $srcdir/ckpt)
  srcdir  repository root (default: two levels above this script)

SSD300 (tests/fixtures/models.py, ssd.pytorch's layout): the narrow model of
tests/data and a full-width one made here (26M parameters, seeded) run in
ckpt (`--device cpu`) and in torch on the same input; loc and conf must agree
within the CPU tolerance and priors exactly.

DataParallel: torch's own scatter / gather is replayed in Python -- the
batch split with torch.chunk along dim 0, the module run on each chunk,
every output concatenated along dim 0 (what nn.DataParallel does on N GPUs)
-- and `ckpt verify --replicas N --json` must report the same gathered
shapes, flag exactly the outputs whose gathered shape differs from the
single run (SSD's priors; the CRNN's [T, B, C] logits; nothing for the
MLP), and say when torch's gather could not concatenate at all.

Prints `ok NAME` or `FAIL NAME: why` per case, then `N passed, M failed`;
exits 1 if anything failed, 77 (skip) if torch cannot be imported.
"""
import json
import os
import sys

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as c  # noqa: E402  (exit 77 without torch)
import torch  # noqa: E402
import models  # noqa: E402  (tests/fixtures/models.py)

DATA = c.DATA
t = c.Tally()
t.need(c.CKPT, 'CKPT')
case = t.case
verify = c.verify_json
forward = c.forward


def save_ref(model, x, names, name):
    return c.save_reference(model, x, names, c.scratch(name))


def data_parallel_shapes(model, x, n):
    """What nn.DataParallel over N devices returns: scatter (torch.chunk along
    dim 0), replicas, gather (torch.cat along dim 0); None where gather raises."""
    parts = [forward(model, part) for part in x.chunk(n, 0)]
    out = []
    for k in range(len(parts[0])):
        try:
            out.append(list(torch.cat([p[k] for p in parts], 0).shape))
        except RuntimeError:
            out.append(None)
    return out, len(parts)


def load_model(cls, path, **kw):
    m = cls(**kw)
    m.load_state_dict(torch.load(path, map_location='cpu'))
    return m


def check_replicas(doc, names, torch_shapes, used, broken):
    rep = doc['replicas']
    assert rep['used'] == used, rep
    got = {o['name']: o for o in rep['outputs']}
    for n, want in zip(names, torch_shapes):
        assert got[n]['gathered_shape'] == want, (n, got[n], want)
        assert got[n]['ok'] == (n not in broken), (n, got[n])
        if n in broken:
            assert got[n]['reason'], got[n]


# ---- SSD300 outputs against torch ----------------------------------------------

@case('ssd300 narrow: the committed reference')
def _():
    rc, doc = verify('ssd300.json', os.path.join(DATA, 'ssd300_narrow.pth'),
                     '--reference', os.path.join(DATA, 'ssd300_narrow.ref.pth'))
    assert rc == 0, doc
    pri = doc['outputs'][2]
    assert pri['name'] == 'priors' and pri['reference']['max_abs'] == 0, pri


@case('ssd300 full width (26M parameters): loc, conf within 1e-5, priors exact')
def _():
    torch.manual_seed(3)
    model = models.SSD300(width=1)
    path = c.scratch('ssd300_full.pth')
    torch.save(model.state_dict(), path)
    x = torch.rand(1, 3, 300, 300)
    ref = save_ref(model, x, ['loc', 'conf', 'priors'], 'ssd300_full.ref.pth')
    rc, doc = verify('ssd300.json', path, '--reference', ref)
    assert rc == 0, json.dumps(doc['outputs'])
    assert doc['outputs'][2]['reference']['max_abs'] == 0, doc['outputs'][2]
    for o in doc['outputs'][:2]:
        assert o['reference']['max_rel'] < 1e-5, o


def gpu_present():
    """Whether `--device auto` picks a GPU; a ckpt that fails here is a failure, not a skip."""
    rc, doc = verify('mnist_mlp.json', os.path.join(DATA, 'fmnist_mlp.pth'), device=None)
    assert rc == 0, f'ckpt verify exit {rc}: {json.dumps(doc.get("outputs"))}'
    return doc['device'].startswith('cuda')


@case('ssd300 full width, batch 8 on the GPU (CUDA backend) against torch on the CPU')
def _():
    if not gpu_present():
        raise c.Skip('no GPU')
    torch.manual_seed(4)
    model = models.SSD300(width=1)
    path = c.scratch('ssd300_full_b8.pth')
    torch.save(model.state_dict(), path)
    x = torch.rand(8, 3, 300, 300)
    ref = save_ref(model, x, ['loc', 'conf', 'priors'], 'ssd300_full_b8.ref.pth')
    rc, doc = verify('ssd300.json', path, '--reference', ref, device='cuda')
    assert rc == 0, json.dumps(doc.get('outputs'))
    assert doc['outputs'][2]['reference']['max_abs'] == 0, doc['outputs'][2]


# ---- DataParallel's scatter / gather ---------------------------------------------

@case('replicas 2: SSD flags priors and only priors, with torch gather shapes')
def _():
    model = load_model(models.SSD300, os.path.join(DATA, 'ssd300_narrow.pth'), width=8)
    torch.manual_seed(5)
    x = torch.rand(2, 3, 300, 300)
    ref = save_ref(model, x, ['loc', 'conf', 'priors'], 'ssd_b2.ref.pth')
    shapes, used = data_parallel_shapes(model, x, 2)
    assert shapes[2] == [17464, 4], shapes
    rc, doc = verify('ssd300.json', os.path.join(DATA, 'ssd300_narrow.pth'), '--reference', ref,
                     '--replicas', '2')
    assert rc == 1 and doc['result'] == 'FAIL', doc['result']
    assert all(o['reference']['pass'] for o in doc['outputs']), doc['outputs']
    check_replicas(doc, ['loc', 'conf', 'priors'], shapes, used, {'priors'})
    pri = doc['replicas']['outputs'][2]
    assert pri['batch_dim'] == -1 and 'no batch dimension' in pri['reason'], pri


@case('replicas 2: the CRNN output [T, B, C] is flagged, batch dim 1')
def _():
    model = load_model(models.CRNNTiny, os.path.join(DATA, 'crnn_tiny.pth'))
    x = torch.load(os.path.join(DATA, 'crnn_tiny.ref.pth'))['input']
    shapes, used = data_parallel_shapes(model, x, 2)
    assert shapes == [[16, 2, 11]], shapes
    rc, doc = verify('crnn_tiny.json', os.path.join(DATA, 'crnn_tiny.pth'), '--reference',
                     os.path.join(DATA, 'crnn_tiny.ref.pth'), '--replicas', '2')
    assert rc == 1, doc
    check_replicas(doc, ['logits'], shapes, used, {'logits'})
    o = doc['replicas']['outputs'][0]
    assert o['batch_dim'] == 1 and 'not 0' in o['reason'], o


@case('replicas 2 on a batch of 3: the CRNN cannot even be gathered (torch raises)')
def _():
    model = load_model(models.CRNNTiny, os.path.join(DATA, 'crnn_tiny.pth'))
    torch.manual_seed(7)
    x = torch.rand(3, 1, 32, 32)
    ref = save_ref(model, x, ['logits'], 'crnn_b3.ref.pth')
    shapes, used = data_parallel_shapes(model, x, 2)
    assert shapes == [None], shapes
    rc, doc = verify('crnn_tiny.json', os.path.join(DATA, 'crnn_tiny.pth'), '--reference', ref,
                     '--replicas', '2')
    assert rc == 1, doc
    check_replicas(doc, ['logits'], shapes, used, {'logits'})
    assert 'cannot concatenate' in doc['replicas']['outputs'][0]['reason']


@case('replicas 2 and 3: the MLP gathers back; 3 replicas of 256 use 3 chunks')
def _():
    model = load_model(models.MLP, os.path.join(DATA, 'fmnist_mlp.pth'))
    x = torch.load(os.path.join(DATA, 'fmnist_mlp.ref.pth'))['input']
    for n in (2, 3):
        shapes, used = data_parallel_shapes(model, x, n)
        rc, doc = verify('mnist_mlp.json', os.path.join(DATA, 'fmnist_mlp.pth'), '--reference',
                         os.path.join(DATA, 'fmnist_mlp.ref.pth'), '--replicas', str(n))
        assert rc == 0, doc
        check_replicas(doc, ['logits'], shapes, used, set())


@case('replicas 4 on a batch of 2: torch.chunk makes 2 chunks, so 2 replicas run')
def _():
    model = load_model(models.SSD300, os.path.join(DATA, 'ssd300_narrow.pth'), width=8)
    x = torch.load(c.scratch('ssd_b2.ref.pth'))['input']
    shapes, used = data_parallel_shapes(model, x, 4)
    assert used == 2, used
    rc, doc = verify('ssd300.json', os.path.join(DATA, 'ssd300_narrow.pth'), '--reference',
                     c.scratch('ssd_b2.ref.pth'), '--replicas', '4')
    assert rc == 1
    check_replicas(doc, ['loc', 'conf', 'priors'], shapes, used, {'priors'})


@case('tests/data/replicas.json (torch gather shapes, from the fixture generator) = ckpt report')
def _():
    with open(os.path.join(DATA, 'replicas.json')) as f:
        table = json.load(f)
    # inputs of the table's batch sizes: the CRNN's reference, the batch-2 SSD one made above
    for name, spec, ref in (('crnn_tiny', 'crnn_tiny.json', os.path.join(DATA, 'crnn_tiny.ref.pth')),
                            ('ssd300_narrow', 'ssd300.json', c.scratch('ssd_b2.ref.pth'))):
        row = table[name]
        assert list(torch.load(ref)['input'].shape) == row['input'], (name, row['input'])
        rc, doc = verify(spec, os.path.join(DATA, name + '.pth'), '--reference', ref,
                         '--replicas', str(row['replicas']))
        got = {o['name']: o['gathered_shape'] for o in doc['replicas']['outputs']}
        assert got == row['gathered'], (name, got, row['gathered'])


sys.exit(t.summary())
