#!/usr/bin/env python3
"""Interop test: tools/ckpt-spec, the spec exporter, on every bundled model.

For each spec in models/ and the class of tests/fixtures/models.py behind
it, ckpt-spec traces the class (torch.fx, under the torch running this
test) and writes a spec into scratch; a checkpoint of the model (seeded
weights; trained-looking batch norm statistics) and a torch reference of
its outputs are made there too.  Then `ckpt verify --reference` must pass
with the committed spec and with the exported one, on the same checkpoint
and reference: the two specs may differ in form (a view's -1 or 0, a class
count written out) but must give torch's outputs within 1e-5 of their
scale.

And ckpt-spec's refusals: a model with ops the runtime lacks exits 1,
writes nothing, and names each node with its module or function; one with
a module that forward never calls exits 1 naming the state-dict keys no op
reads; a missing --input is a usage error (exit 2).  Each node that does
not map is named with the line of the model's code that made it, in both
routes; token-id inputs (--input ids=1,4:int64) are random integers below
the smallest nn.Embedding's rows, or below the N given, and the spec's
input says so (dtype, high).

Prints `ok NAME` or `FAIL NAME: why` per case, then `N passed, M failed`;
exits 1 if anything failed, 77 (skip) if torch cannot be imported.
"""
import json
import os
import sys
import textwrap

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as c  # noqa: E402  (exit 77 without torch)
import torch  # noqa: E402
import models  # noqa: E402  (tests/fixtures/models.py)
try:
    import torch.export  # noqa: E402  (torch >= 2.1)
    HAVE_EXPORT = callable(getattr(torch.export, 'export', None))
except ImportError:
    HAVE_EXPORT = False

TOOL = os.path.join(c.SRCDIR, 'tools', 'ckpt-spec')
FIXTURES = os.path.join(c.SRCDIR, 'tests', 'fixtures')

t = c.Tally()
t.need(c.CKPT, 'CKPT')
case = t.case


def ckpt_spec(*args):
    """tools/ckpt-spec ARGS under this test's Python (and torch) -> Ran."""
    return c.run([sys.executable, TOOL, '-C', FIXTURES] + list(args), timeout=300)


# spec in models/, the factory ckpt-spec is given, the model it makes
# (constructed here the same way), the input shape, the outputs
BUNDLED = [
    ('mnist_mlp.json', 'models:MLP', lambda: models.MLP(), [1, 1, 28, 28]),
    ('mnist_autoencoder.json', 'models:AutoEncoder', lambda: models.AutoEncoder(),
     [1, 1, 28, 28]),
    ('mnist_conv_autoencoder.json', 'models:Autoencoder', lambda: models.Autoencoder(),
     [1, 1, 28, 28]),
    ('ssd300.json', 'models:SSD300(width=8)', lambda: models.SSD300(width=8),
     [1, 3, 300, 300]),
    ('crnn_tiny.json', 'models:CRNNTiny', lambda: models.CRNNTiny(), [1, 1, 32, 32]),
    ('resnet18.json', 'models:resnet(18, num_classes=10, width=8)',
     lambda: models.resnet(18, num_classes=10, width=8), [1, 3, 224, 224]),
    ('resnet50.json', 'models:resnet(50, num_classes=10, width=8)',
     lambda: models.resnet(50, num_classes=10, width=8), [1, 3, 224, 224]),
]


def spec_outputs(path):
    with open(path) as f:
        return json.load(f)['outputs']


def check_pass(rc, doc, what):
    assert rc == 0 and doc['result'] == 'PASS', (what, doc.get('load'), doc.get('outputs'))
    for o in doc['outputs']:
        r = o['reference']
        assert r['pass'] and r['max_rel'] < 1e-5, (what, o)


covered = set()
for spec, factory, make, shape in BUNDLED:
    covered.add(spec)

    @case('%s: ckpt-spec %s exports a spec; it and the committed one pass against '
          "torch's outputs on the same checkpoint" % (spec, factory))
    def _(spec=spec, factory=factory, make=make, shape=shape):
        base = spec[:-5]
        outs = spec_outputs(os.path.join(c.SPECS, spec))
        exported = c.scratch(base + '.exported.json')
        r = ckpt_spec(factory, '--input', 'x=' + ','.join(map(str, shape)),
                      '--output', ','.join(outs), '-o', exported)
        assert r.rc == 0, 'ckpt-spec exited %d: %s' % (r.rc, r.err.strip()[-600:])
        assert spec_outputs(exported) == outs, spec_outputs(exported)
        torch.manual_seed(len(base))
        model = models.randomize_batch_norms(make()).eval()
        path = c.save(model.state_dict(), c.scratch(base + '.pth'))
        x = torch.rand([2] + shape[1:])
        ref = c.save_reference(model, x, outs, c.scratch(base + '.ref.pth'))
        for which in (spec, exported):
            rc, doc = c.verify_json(which, path, '--reference', ref)
            check_pass(rc, doc, which)


# crnn.pytorch's forward asserts on a traced size (`b, c, h, w = conv.size(); assert h ==
# 1`), which torch.fx cannot trace.  Where torch.export exists (torch >= 2.1) ckpt-spec
# exports it with torch.export instead, and the exported spec must give torch's outputs
# as the committed models/crnn.json does (crnn_vs_torch.py checks that one at full size);
# under an older torch it refuses, saying why, and writes nothing.
covered.add('crnn.json')
CRNN = 'models:CRNN(width=8, nclass=11)'


def crnn_model():
    torch.manual_seed(4)
    return models.randomize_batch_norms(models.CRNN(width=8, nclass=11)).eval()


if HAVE_EXPORT:
    @case('crnn.json: torch.fx cannot trace crnn.pytorch (an assert on a size); ckpt-spec '
          "exports it with torch.export, and it and the committed spec pass against torch's "
          'outputs on the same checkpoint')
    def _():
        exported = c.scratch('crnn.exported.json')
        r = ckpt_spec(CRNN, '--input', 'input=1,1,32,256', '--output', 'logits',
                      '-o', exported)
        assert r.rc == 0, 'ckpt-spec exited %d: %s' % (r.rc, r.err.strip()[-600:])
        assert 'torch.fx cannot trace CRNN' in r.err and 'trying torch.export' in r.err, r.err
        with open(exported) as f:
            spec = json.load(f)
        ops = [nd['op'] for nd in spec['nodes']]
        assert ops.count('lstm') == 2 and ops.count('batch_norm') == 3, ops
        lstms = [nd['params']['module'] for nd in spec['nodes'] if nd['op'] == 'lstm']
        assert lstms == ['rnn.0.rnn', 'rnn.1.rnn'], lstms
        model = crnn_model()
        path = c.save(model.state_dict(), c.scratch('crnn.pth'))
        ref = c.save_reference(model, torch.rand(3, 1, 32, 256), ['logits'],
                               c.scratch('crnn.ref.pth'))
        for which in ('crnn.json', exported):
            rc, doc = c.verify_json(which, path, '--reference', ref)
            check_pass(rc, doc, which)

    @case('the torch.export route checks --input against forward too: CRNN takes input')
    def _():
        r = ckpt_spec(CRNN, '--input', 'x=1,1,32,256', '-o', c.scratch('crnn.x.json'))
        assert r.rc == 2 and 'forward takes input; --input gave x' in r.err, (r.rc, r.err)
else:
    @case('crnn.json: crnn.pytorch asserts on a traced size; under torch %s (no '
          'torch.export) ckpt-spec refuses it naming torch.fx and torch >= 2.1, writes '
          'nothing' % torch.__version__)
    def _():
        out = c.scratch('crnn.exported.json')
        r = ckpt_spec(CRNN, '--input', 'input=1,1,32,256', '-o', out)
        assert r.rc == 1, (r.rc, r.err)
        assert not os.path.exists(out), 'a spec was written'
        assert r.err.startswith('ckpt-spec: torch.fx cannot trace CRNN: TraceError: '), r.err
        assert 'has no torch.export: torch >= 2.1 would try it' in r.err, r.err


@case('every spec in models/ has a case here')
def _():
    bundled = {f for f in os.listdir(c.SPECS) if f.endswith('.json')}
    missing = sorted(bundled - covered)
    assert not missing, 'no export case for %s' % missing


UNSUPPORTED = '''
import torch
import torch.nn as nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(4, 8, 3, groups=2)
        self.act = nn.Hardswish()
        self.fc = nn.Linear(8, 3)

    def forward(self, x):
        h = self.act(self.conv(x))
        h = torch.erf(h).mean((2, 3))
        return self.fc(h[:, :8])


class Unused(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)
        self.aux = nn.Linear(4, 2)

    def forward(self, x):
        return self.fc(x)


class Pools(nn.Module):
    """max_pool2d spelled both ways: torch.max_pool2d and nn.functional.max_pool2d."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.fc = nn.Linear(4 * 2 * 2, 3)

    def forward(self, x):
        h = torch.max_pool2d(torch.relu(self.conv(x)), 2)
        h = nn.functional.max_pool2d(h, kernel_size=2, stride=2)
        return self.fc(torch.flatten(h, 1))


# torch.fx cannot trace these two (an assert on a size); torch.export can
class Mixed(nn.Module):
    """Most ops of the torch.export route: a batch-first 2-layer LSTM, a
    residual add, a size read in forward and used in a reshape."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 8, 3, stride=1, padding=1)
        self.pool = nn.AdaptiveAvgPool2d((1, 4))
        self.lstm = nn.LSTM(8, 6, num_layers=2, batch_first=True)
        self.fc = nn.Linear(24 + 32, 5)

    def forward(self, x):
        h = torch.relu(self.bn(self.conv(x)))
        b, c, hh, w = h.shape
        assert hh == w, 'square images only'
        h = h + self.conv2(h)
        p = self.pool(nn.functional.max_pool2d(h, 2))  # [B, 8, 1, 4]
        seq = p.squeeze(2).transpose(1, 2)              # [B, 4, 8]
        out, _ = self.lstm(seq)                          # [B, 4, 6]
        feat = torch.cat([out.reshape(b, -1), torch.flatten(p, 1)], 1)
        return torch.softmax(self.fc(feat), dim=1), torch.sigmoid(feat)


class Asserts(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(4, 8, 3)
        self.act = nn.Hardswish()
        self.fc = nn.Linear(8, 3)

    def forward(self, x):
        h = self.conv(x)
        b, c, hh, w = h.size()
        assert hh == w
        return self.fc(self.act(h).amax((2, 3)))


class Checked(nn.Module):
    """A ResNet18 behind an assert on the input's size."""

    def __init__(self):
        super().__init__()
        import models
        self.net = models.resnet(18, num_classes=10, width=8)

    def forward(self, x):
        b, c, h, w = x.shape
        assert h == w, 'square images only'
        return self.net(x)


class Tokens(nn.Module):
    """Token ids through two tables: 10 rows, and 5."""

    def __init__(self):
        super().__init__()
        self.words = nn.Embedding(10, 4)
        self.places = nn.Embedding(5, 4)
        self.fc = nn.Linear(4, 3)

    def forward(self, ids):
        return self.fc(self.words(ids) + self.places(ids))


class DataDependent(nn.Module):
    """Neither can trace this: forward branches on a tensor's value."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        return self.fc(x) if x.sum() > 0 else -self.fc(x)
'''


def line_of(text):
    """The line of the models' file that holds TEXT (once)."""
    lines = textwrap.dedent(UNSUPPORTED).splitlines()
    at = [i + 1 for i, ln in enumerate(lines) if text in ln]
    assert len(at) == 1, (text, at)
    return at[0]


def user_models():
    """The models above in a .py file in scratch; its path."""
    return c.scratch_source('usermodels.py', UNSUPPORTED)


@case('unsupported ops: exit 1, no spec written, each node named with its module or '
      'function')
def _():
    src = user_models()
    out = c.scratch('net.json')
    r = ckpt_spec(src + ':Net', '--input', 'x=1,4,8,8', '-o', out)
    assert r.rc == 1, (r.rc, r.err)
    assert not os.path.exists(out), 'a spec was written'
    err = r.err
    for want in ('conv: call_module conv (Conv2d): groups=2',
                 'act: call_module act (Hardswish)', 'erf: call_function torch.erf',
                 'mean: call_method Tensor.mean',
                 'getitem: call_function _operator.getitem: indexing or slicing'):
        assert want in err, (want, err)
    assert err.startswith('ckpt-spec: Net: '), err
    # each named with the line of forward that made it (torch.fx's node.stack_trace)
    for text, node in (('h = self.act(self.conv(x))', 'conv'),
                       ('h = self.act(self.conv(x))', 'act'),
                       ('h = torch.erf(h).mean((2, 3))', 'erf'),
                       ('h = torch.erf(h).mean((2, 3))', 'mean')):
        want = 'usermodels.py:%d: %s: call_' % (line_of(text), node)
        assert want in err, (want, err)


@case('token ids: --input ids=1,4:int64 gives integers below the smallest nn.Embedding\'s '
      'rows (5, not 10), and the spec\'s input says int64 and that bound, each nn.Embedding '
      'an embedding; :int64:10 gives them below 10, which the 5-row table refuses; a '
      'bound on float32 or on a model without nn.Embedding is a usage error')
def _():
    src = user_models()
    out = c.scratch('tokens.json')
    r = ckpt_spec(src + ':Tokens', '--input', 'ids=1,4:int64', '-o', out)
    assert r.rc == 0, (r.rc, r.err)
    with open(out) as f:
        spec = json.load(f)
    assert spec['inputs'] == [{'name': 'ids', 'shape': [-1, 4], 'dtype': 'int64',
                               'high': 5}], spec['inputs']
    assert [(nd['op'], nd.get('params', {}).get('weight')) for nd in spec['nodes']] == [
        ('embedding', 'words.weight'), ('embedding', 'places.weight'), ('add', None),
        ('linear', 'fc.weight')], spec['nodes']
    out = c.scratch('tokens10.json')
    r = ckpt_spec(src + ':Tokens', '--input', 'ids=1,64:int64:10', '-o', out)
    assert r.rc == 1 and not os.path.exists(out), (r.rc, r.err)
    assert 'fails on inputs ids [1, 64] int64: IndexError' in r.err, r.err
    for args, want in (([src + ':Tokens', '--input', 'ids=1,4:float32:5'], 'want NAME=SIZES'),
                       ([src + ':Tokens', '--input', 'ids=1,4:int8'], 'want NAME=SIZES'),
                       ([src + ':Tokens', '--input', 'ids=1,4:int32:0'], 'want NAME=SIZES'),
                       (['models:MLP', '--input', 'x=1,784:int64'],
                        'no nn.Embedding to bound the integers by: give N, as in '
                        'x=1,784:int64:N')):
        r = ckpt_spec(*args, '-o', out)
        assert r.rc == 2 and want in r.err and not os.path.exists(out), (args, r.rc, r.err)


@case('torch.max_pool2d and nn.functional.max_pool2d both map to max_pool2d; the spec '
      "passes against torch's outputs")
def _():
    out = c.scratch('pools.json')
    r = ckpt_spec(user_models() + ':Pools', '--input', 'x=1,3,8,8', '-o', out)
    assert r.rc == 0, 'ckpt-spec exited %d: %s' % (r.rc, r.err.strip()[-600:])
    with open(out) as f:
        ops = [nd['op'] for nd in json.load(f)['nodes']]
    assert ops.count('max_pool2d') == 2, ops
    sys.path.insert(0, c.scratch())
    import usermodels
    torch.manual_seed(3)
    model = usermodels.Pools().eval()
    path = c.save(model.state_dict(), c.scratch('pools.pth'))
    ref = c.save_reference(model, torch.rand(2, 3, 8, 8), spec_outputs(out),
                           c.scratch('pools.ref.pth'))
    check_pass(*c.verify_json(out, path, '--reference', ref), out)


@case('ckpt-spec --help needs no torch (python -S: no site-packages)')
def _():
    r = c.run([sys.executable, '-S', TOOL, '--help'])
    assert r.rc == 0 and r.out.startswith('usage: ckpt-spec'), (r.rc, r.err)
    r = c.run([sys.executable, '-S', TOOL, 'models:MLP'])
    assert r.rc == 2 and 'torch cannot be imported' in r.err, (r.rc, r.err)


@case('a module forward never calls: exit 1 naming its state-dict keys')
def _():
    src = user_models()
    r = ckpt_spec(src + ':Unused', '--input', 'x=1,4', '-o', c.scratch('unused.json'))
    assert r.rc == 1, (r.rc, r.err)
    assert 'aux.weight, aux.bias' in r.err, r.err


if HAVE_EXPORT:
    @case('the torch.export route: a model fx cannot trace, with a batch-first LSTM, a '
          'residual add, cat, softmax and a reshape by a size read in forward, passes '
          "against torch's outputs")
    def _():
        exported = c.scratch('mixed.json')
        r = ckpt_spec(user_models() + ':Mixed', '--input', 'x=1,3,16,16',
                      '--output', 'probs,gate', '-o', exported)
        assert r.rc == 0, 'ckpt-spec exited %d: %s' % (r.rc, r.err.strip()[-600:])
        with open(exported) as f:
            nodes = json.load(f)['nodes']
        lstm = [nd for nd in nodes if nd['op'] == 'lstm']
        assert lstm and lstm[0]['attrs']['num_layers'] == 2, lstm
        reshape = [nd['attrs']['shape'] for nd in nodes if nd['op'] == 'reshape']
        assert reshape == [[0, -1]], reshape  # reshape(b, -1): b follows the batch
        sys.path.insert(0, c.scratch())
        import usermodels
        torch.manual_seed(7)
        model = models.randomize_batch_norms(usermodels.Mixed()).eval()
        path = c.save(model.state_dict(), c.scratch('mixed.pth'))
        ref = c.save_reference(model, torch.rand(3, 3, 16, 16), ['probs', 'gate'],
                               c.scratch('mixed.ref.pth'))
        check_pass(*c.verify_json(exported, path, '--reference', ref), exported)

    # torch 2.1 to 2.4 export decomposed further than later ones: linear as addmm of
    # t(weight), conv2d as convolution, batch_norm as _native_batch_norm_legit_no_training,
    # max_pool2d with indices, adaptive_avg_pool2d(1) as mean.  A run with torch.export's
    # graph decomposed (run_decompositions) checks that those forms map too.
    DECOMPOSED = '''
import runpy
import sys
import torch.export
export = torch.export.export
torch.export.export = lambda *a, **k: export(*a, **k).run_decompositions()
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name='__main__')
'''

    @case('the torch.export route on decomposed aten ops (convolution, addmm, '
          "_native_batch_norm_legit_no_training, mean): a ResNet18 passes against torch's "
          'outputs')
    def _():
        driver = c.scratch('decomposed.py')
        with open(driver, 'w') as f:
            f.write(DECOMPOSED)
        exported = c.scratch('checked.json')
        r = c.run([sys.executable, driver, TOOL, '-C', FIXTURES, user_models() + ':Checked',
                   '--input', 'x=1,3,64,64', '--output', 'logits', '-o', exported],
                  timeout=300)
        assert r.rc == 0, 'ckpt-spec exited %d: %s' % (r.rc, r.err.strip()[-600:])
        with open(exported) as f:
            ops = [nd['op'] for nd in json.load(f)['nodes']]
        assert ops.count('conv2d') == 20 and ops.count('batch_norm') == 20, ops
        assert ops[-3:] == ['adaptive_avg_pool2d', 'reshape', 'linear'], ops
        sys.path.insert(0, c.scratch())
        import usermodels
        torch.manual_seed(9)
        model = models.randomize_batch_norms(usermodels.Checked()).eval()
        path = c.save(model.state_dict(), c.scratch('checked.pth'))
        ref = c.save_reference(model, torch.rand(2, 3, 64, 64), ['logits'],
                               c.scratch('checked.ref.pth'))
        check_pass(*c.verify_json(exported, path, '--reference', ref), exported)

    @case('the torch.export route: unsupported aten ops: exit 1, no spec written, each '
          'op named with the module that called it')
    def _():
        out = c.scratch('asserts.json')
        r = ckpt_spec(user_models() + ':Asserts', '--input', 'x=1,4,8,8', '-o', out)
        assert r.rc == 1, (r.rc, r.err)
        assert not os.path.exists(out), 'a spec was written'
        for want in ('trying torch.export', 'ckpt-spec: Asserts: 2 node(s) with no spec op',
                     'call_function aten.hardswish.default (in act: Hardswish): no spec op '
                     'for it', 'call_function aten.amax.default (in forward: Asserts): no '
                     'spec op'):
            assert want in r.err, (want, r.err)
        # each named with the line of forward that made it (node.meta['stack_trace'])
        line = line_of('return self.fc(self.act(h).amax((2, 3)))')
        for node in ('hardswish', 'amax'):
            want = 'usermodels.py:%d: %s: call_function aten.' % (line, node)
            assert want in r.err, (want, r.err)
        r = ckpt_spec(user_models() + ':DataDependent', '--input', 'x=1,4', '-o', out)
        assert r.rc == 1 and not os.path.exists(out), (r.rc, r.err)
        assert 'torch.export cannot export DataDependent either, on inputs x [1, 4]: ' \
            in r.err, r.err
        assert len(r.err.splitlines()) == 2, r.err  # torch's own dump of the graph set aside
else:
    @case('models fx cannot trace are refused under torch %s, naming torch >= 2.1'
          % torch.__version__)
    def _():
        for cls in ('Mixed', 'Asserts'):
            out = c.scratch(cls + '.json')
            r = ckpt_spec(user_models() + ':' + cls, '--input', 'x=1,4,8,8', '-o', out)
            assert r.rc == 1 and not os.path.exists(out), (cls, r.rc, r.err)
            assert r.err.startswith('ckpt-spec: torch.fx cannot trace %s: ' % cls), r.err
            assert 'torch >= 2.1 would try it' in r.err, r.err


@case('usage errors exit 2: no --input, an --input forward does not take, a bad factory')
def _():
    for args, want in ((['models:MLP'], 'give --input'),
                       (['models:MLP', '--input', 'y=1,784'], 'forward takes x'),
                       (['models:NoSuchNet', '--input', 'x=1,784'], 'no attribute'),
                       (['models', '--input', 'x=1,784'], 'want MODULE:FACTORY'),
                       (['models:MLP', '--input', 'x=1,a'], 'want NAME=SIZES')):
        r = ckpt_spec(*args)
        assert r.rc == 2 and want in r.err, (args, r.rc, r.err)

sys.exit(t.summary())
