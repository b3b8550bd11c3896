#!/usr/bin/env python3
"""Interop test: tools/ckpt-spec on the transformers people train on many
GPUs (issue 30), under torch 2.x and transformers 5.24 (skipped, exit 77,
where transformers or torch.export cannot be imported).

Tiny configurations (2 layers, hidden 32 to 64, vocabulary 100) of GPT-2,
Llama (grouped-query attention: 4 heads, 2 key-value heads; untied and
tied embeddings), BERT and ViT, as transformers 5.24 defines them, made by
factories in a .py module in scratch and given to ckpt-spec with token ids
(`--input input_ids=2,16:int64[:100]`) or pixels.  torch.fx cannot trace
any of them; torch.export exports them all, and ckpt-spec maps every aten
op of the graph (GRAPH_OPS below, checked against torch.export here) onto
the spec ops of doc/design.md "Model specs":

  all five: embedding of int64 ids; add/sub/mul/div of a tensor or a number,
    broadcasting; scaled_dot_product_attention; expand; slice; the masks
    built from sizes (arange, cumsum, diff, ne, le, eq, __and__, index,
    new_ones, ge) folded at export: GPT-2's and Llama's causal one becomes
    is_causal, BERT's and ViT's (no padding: all kept) none, and a band
    (Windowed, a small model here) an additive "constant" of 0 and "-inf"
  GPT-2:  layer_norm; gelu_new written out (mul, pow, tanh, add); Conv1D as
          "addmm" of its [in, out] weight; split as slices; the tied wte and
          lm_head each named by the op of its module
  Llama:  RMSNorm written out (pow, mean over the last dim, add eps, rsqrt,
          mul by the weight as a "parameter" node); rotary cos/sin folded from
          the inv_freq buffer (not in the state dict) into constants; neg,
          slice, cat; silu; grouped-query heads by expand + reshape
  BERT:   layer_norm, gelu (erf), tanh and select (pooler); the
          token_type_ids buffer (not in the state dict) gathered and folded
  ViT:    conv2d (patches), flatten, the class token (a "parameter") expanded
          to the batch and cat, layer_norm, gelu, select

For each, ckpt-spec exits 0; `ckpt verify --reference` passes with its spec
on the model's state dict and torch's outputs; and the spec, run by a torch
interpreter of the spec format (run_spec below: make_verify_fixtures.run_node
for the ops the runtime had, torch's own functions for the new ones) with
the state dict, gives the model's outputs (torch.allclose, 1e-5); both on the
example input and, where the spec's batch is -1, on a batch of another
size.  ViT's class token is expanded to the batch size, which no spec op
says, so its spec is written at the example's batch size (ckpt-spec says
so on stderr).  A model with an op the runtime lacks (aten.sort) still
exits 1, no spec written, the node named with its aten op and FILE:LINE.
Spellings, a small model here, has the rarer aten spellings (split with
sizes, chunk, unbind, matmul with a parameter, bmm, rsub, sum, mean).
Under torch.fx (no export), torch.nn's Embedding, LayerNorm, RMSNorm, GELU,
SiLU, Tanh and F.gelu, F.silu, torch.tanh map too (Traced).

Prints `ok NAME` or `FAIL NAME: why` per case, then `N passed, M failed`.
"""
import json
import os
import re
import sys

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as c  # noqa: E402  (exits 77 without torch)

transformers = c.need_transformers()

import make_verify_fixtures as mvf  # noqa: E402  (tests/fixtures: on _common's path)

torch = c.torch
F = torch.nn.functional
t = c.Tally(uses='transformers %s' % transformers.__version__)
t.need(c.CKPT, 'CKPT')
TOOL = os.path.join(c.SRCDIR, 'tools', 'ckpt-spec')

FACTORIES = '''
import torch
import transformers as T


def gpt2():
    return T.GPT2LMHeadModel(T.GPT2Config(
        n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=64,
        bos_token_id=0, eos_token_id=0, use_cache=False))


def llama(tied=False):
    return T.LlamaForCausalLM(T.LlamaConfig(
        num_hidden_layers=2, hidden_size=64, intermediate_size=128,
        num_attention_heads=4, num_key_value_heads=2, vocab_size=100,
        max_position_embeddings=64, tie_word_embeddings=tied, use_cache=False))


def bert():
    return T.BertModel(T.BertConfig(
        num_hidden_layers=2, hidden_size=32, intermediate_size=64,
        num_attention_heads=2, vocab_size=100, max_position_embeddings=64))


def vit():
    return T.ViTForImageClassification(T.ViTConfig(
        num_hidden_layers=2, hidden_size=32, intermediate_size=64,
        num_attention_heads=2, image_size=32, patch_size=8, num_labels=10))


class Windowed(torch.nn.Module):
    """Attention over a band of 4 positions each side: a constant bool mask
    that is not causal (sdpa gets it as an additive mask)."""

    def __init__(self):
        super().__init__()
        self.qkv = torch.nn.Linear(8, 24)

    def forward(self, x):
        if x.shape[-1] != 8:  # a branch on a size: torch.fx fails, torch.export is tried
            raise ValueError('want 8 features')
        b, n, _ = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, 2, 4).permute(2, 0, 3, 1, 4)
        i = torch.arange(n)
        band = (i[:, None] - i[None, :]).abs() < 4
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=band)
        return y.transpose(1, 2).reshape(b, n, 8)


class Traced(torch.nn.Module):
    """torch.nn's transformer modules, which torch.fx traces (no export)."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(50, 16, padding_idx=0)
        self.ln = torch.nn.LayerNorm(16)
        self.act = torch.nn.GELU(approximate='tanh')
        self.fc = torch.nn.Linear(16, 16)
        self.rms = torch.nn.RMSNorm(16)
        self.out = torch.nn.Linear(16, 7)

    def forward(self, ids):
        h = self.act(self.fc(self.ln(self.emb(ids))))
        h = torch.nn.functional.silu(torch.nn.functional.gelu(h)) + torch.tanh(h)
        return self.out(self.rms(h))


class Spellings(torch.nn.Module):
    """The rarer aten spellings: split with sizes, chunk, unbind, matmul with a
    parameter, bmm, rsub, sum and mean over dims, select, a python number."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(12, 12)
        self.w = torch.nn.Parameter(torch.randn(12, 6))

    def forward(self, x):
        if x.shape[-1] != 12:  # a branch on a size: torch.fx fails, torch.export is tried
            raise ValueError('want 12 features')
        h = self.fc(x)
        a, b, c = torch.split(h, [4, 4, 4], dim=-1)
        p, q = h.chunk(2, dim=-1)
        u = h.view(h.shape[0], 5, 3, 4).unbind(2)
        m = torch.matmul(h, self.w) + torch.bmm(p, q.transpose(1, 2)).sum(-1, keepdim=True)
        r = (1 - a).exp() - (b * b).sqrt() / 2 + c.mean((1, 2), keepdim=True)
        return torch.cat([m, r, u[2]], -1), h.select(1, 0) * 3


class Sorted(torch.nn.Module):
    """A linear layer, then its outputs sorted: aten.sort has no spec op."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x):
        if x.shape[-1] != 8:  # a branch on a size: torch.fx fails, torch.export is tried
            raise ValueError('want 8 features')
        return torch.sort(self.fc(x), dim=-1).values
'''

MASK = {'__and__.Tensor', 'cumsum.default', 'diff.default', 'eq.Tensor', 'index.Tensor',
        'le.Tensor', 'ne.Scalar', 'new_ones.default', 'sub.Tensor', 'to.dtype_layout'}
COMMON = {'add.Tensor', 'arange.default', 'embedding.default', 'expand.default',
          'linear.default', 'reshape.default', 'scaled_dot_product_attention.default',
          'slice.Tensor', 'transpose.int', 'unsqueeze.default', 'view.default'}
LLAMA = COMMON | MASK | {'_assert_tensor_metadata.default', 'alias.default', 'cat.default',
                         'cos.default', 'mean.dim', 'mul.Tensor', 'neg.default',
                         'pow.Tensor_Scalar', 'rsqrt.default', 'silu.default', 'sin.default',
                         'to.device', 'to.dtype'}
# every aten op of torch.export's graph (torch 2.15, transformers 5.24)
GRAPH_OPS = {
    'gpt2': COMMON | MASK | {
        '_assert_tensor_metadata.default', 'addmm.default', 'alias.default',
        'dropout.default', 'layer_norm.default', 'mul.Tensor', 'pow.Tensor_Scalar',
        'split.Tensor', 'tanh.default'},
    'llama': LLAMA,
    'llama(tied=True)': LLAMA,
    'bert': COMMON | {'dropout.default', 'gather.default', 'ge.Scalar', 'gelu.default',
                      'layer_norm.default', 'select.int', 'tanh.default'},
    'vit': COMMON - {'embedding.default', 'slice.Tensor'} | {
        'cat.default', 'conv2d.default', 'dropout.default', 'flatten.using_ints',
        'ge.Scalar', 'gelu.default', 'layer_norm.default', 'select.int'},
}
# the factory, its --input, the example input torch.export is given here,
# and whether the spec's batch follows the input (-1)
CASES = [
    ('gpt2', 'input_ids=2,16:int64', lambda b: torch.randint(0, 64, (b, 16)), True),
    ('llama', 'input_ids=2,16:int64:100', lambda b: torch.randint(0, 100, (b, 16)), True),
    ('llama(tied=True)', 'input_ids=2,16:int64', lambda b: torch.randint(0, 100, (b, 16)),
     True),
    ('bert', 'input_ids=2,16:int64:100', lambda b: torch.randint(0, 100, (b, 16)), True),
    ('vit', 'pixel_values=1,3,32,32', lambda b: torch.rand(b, 3, 32, 32), False),
    ('Windowed', 'x=2,16,8', lambda b: torch.rand(b, 16, 8), True),
    ('Spellings', 'x=2,5,12', lambda b: torch.rand(b, 5, 12), True),
]
OUTPUTS = {'bert': 'hidden,pooled', 'Windowed': 'y', 'Spellings': 'y,z'}
# a causal mask is written as is_causal, one that keeps all as no mask; the
# band of Windowed is an additive mask: 0 and the most negative float32
MASKS = {'gpt2': 'is_causal', 'llama': 'is_causal', 'bert': None, 'vit': None,
         'Windowed': 'additive'}
# the spec ops of doc/design.md "Model specs": the runtime's before issue 30,
# then issue 30's
SPEC_OPS = set(mvf.OPS) | {
    'gelu', 'silu', 'tanh', 'cos', 'sin', 'neg', 'exp', 'sqrt', 'rsqrt', 'pow', 'sub',
    'mul', 'div', 'rsub', 'transpose', 'slice', 'select', 'expand', 'contiguous', 'clone',
    'alias', 'mean', 'sum', 'layer_norm', 'rms_norm', 'embedding', 'matmul', 'bmm',
    'addmm', 'scaled_dot_product_attention', 'parameter', 'constant'}
# '  FILE:LINE: NODE: call_function aten.OP.OVERLOAD (in PATH: CLASS): WHY'
LINE = re.compile(r'^  (.+?):(\d+): (\w+): call_function aten\.(\w+)\.(\w+) \(in [^)]*\): ')


def factories():
    return c.scratch_source('hf_factories.py', FACTORIES)


def make(factory):
    sys.path.insert(0, c.scratch())
    import hf_factories
    model = eval('hf_factories.' + factory)
    return (model if isinstance(model, torch.nn.Module) else model()).eval()


def graph_ops(factory, x):
    ep = torch.export.export(make(factory), (x,))
    return {'%s.%s' % tuple(str(n.target).split('.')[1:3]) for n in ep.graph.nodes
            if n.op == 'call_function' and str(n.target).startswith('aten.')}


def run_node(op, xs, a, p):
    """The ops of issue 30 as torch computes them; the others as
    make_verify_fixtures.run_node does."""
    x = xs[0] if xs else None
    if op == 'constant':  # non-finite values written "inf", "-inf", "nan"
        return torch.tensor([float(v) for v in a['values']],
                            dtype=torch.float32).reshape(a['shape'])
    if op == 'parameter':
        return p['weight']
    if op in ('add', 'sub', 'mul', 'div'):
        y = xs[1] if len(xs) == 2 else a['other']
        return getattr(torch, op)(x, y)
    if op == 'rsub':
        return a['other'] - x
    if op == 'pow':
        return torch.pow(x, a['exponent'])
    if op == 'gelu':
        return F.gelu(x, approximate=a.get('approximate', 'none'))
    if op in ('silu', 'tanh', 'cos', 'sin', 'neg', 'exp', 'sqrt', 'rsqrt'):
        return getattr(F if op == 'silu' else torch, op)(x)
    if op == 'transpose':
        return x.transpose(a['dim0'], a['dim1'])
    if op == 'slice':
        idx = [slice(None)] * (a['dim'] % x.dim()) + [
            slice(a.get('start', 0), a.get('end'), a.get('step', 1))]
        return x[tuple(idx)]
    if op == 'select':
        return x.select(a['dim'], a['index'])
    if op == 'expand':
        return x.expand(a['size'])
    if op in ('contiguous', 'clone', 'alias'):
        return x
    if op in ('mean', 'sum'):
        return getattr(torch, op)(x, a['dim'], keepdim=a.get('keepdim', False))
    if op == 'layer_norm':
        return F.layer_norm(x, a['normalized_shape'], p.get('weight'), p.get('bias'),
                            a.get('eps', 1e-5))
    if op == 'rms_norm':
        return F.rms_norm(x, a['normalized_shape'], p.get('weight'), a.get('eps'))
    if op == 'embedding':
        # the runtime holds ids as float32: whole numbers, read back as indices
        assert torch.equal(x, x.round()) and x.min() >= 0, 'ids that are no indices'
        return F.embedding(x.long(), p['weight'])
    if op in ('matmul', 'bmm'):
        return getattr(torch, op)(x, xs[1])
    if op == 'addmm':
        return x @ p['weight'] + p['bias']
    if op == 'scaled_dot_product_attention':
        return F.scaled_dot_product_attention(
            x, xs[1], xs[2], attn_mask=xs[3] if len(xs) == 4 else None,
            is_causal=a.get('is_causal', False), scale=a.get('scale'),
            enable_gqa=a.get('enable_gqa', False))
    return mvf.run_node(op, xs, a, p)


def run_spec(spec, sd, inputs):
    """SPEC's outputs for INPUTS ({name: tensor}; integer ids given as the
    float32 the runtime holds), parameters from state dict SD, every key of
    which a node must name."""
    env, used = {}, set()
    for i in spec['inputs']:
        x = inputs[i['name']]
        assert x.dim() == len(i['shape']) and all(
            s in (-1, d) for s, d in zip(i['shape'], x.shape)), (i, list(x.shape))
        env[i['name']] = x.float()
    for nd in spec['nodes']:
        assert nd['output'] not in env, 'value %s assigned twice' % nd['output']
        assert nd['op'] in SPEC_OPS, nd['op']
        p = {slot: sd[k] for slot, k in nd.get('params', {}).items()}
        used.update(nd.get('params', {}).values())
        with torch.no_grad():
            env[nd['output']] = run_node(nd['op'], [env[v] for v in nd['inputs']],
                                         nd.get('attrs', {}), p)
    assert used == set(sd), ('named no key', sorted(set(sd) - used),
                             'not in the state dict', sorted(used - set(sd)))
    return [env[o] for o in spec['outputs']]


for factory, given, example, dynamic in CASES:
    @t.case('%s: ckpt-spec --input %s writes a spec of the spec ops only; run with the '
            'state dict it gives the model\'s outputs%s' % (
                factory, given, ', at the batch size given and another' if dynamic else
                ' (at the batch size given: the class token is expanded to it)'))
    def _(factory=factory, given=given, example=example, dynamic=dynamic):
        out = c.scratch(re.sub(r'\W', '_', factory) + '.json')
        cmd = [sys.executable, TOOL, factories() + ':' + factory, '--input', given, '-o', out]
        arch = re.match(r'\w+', factory).group(0)
        cmd += ['--output', OUTPUTS.get(arch, 'logits')]
        r = c.run(cmd, timeout=300)
        assert r.rc == 0, (r.rc, r.err[-2000:])
        assert 'trying torch.export' in r.err, r.err
        assert ('cannot follow the batch size' in r.err) == (not dynamic), r.err
        with open(out) as f:
            spec = json.load(f)
        b = int(re.search(r'=(\d+)', given).group(1))
        (inp,) = spec['inputs']
        assert inp['shape'][0] == (-1 if dynamic else b), inp
        if ':int64' in given:
            assert inp['dtype'] == 'int64' and inp['high'] == 100, inp
        ops = {nd['op'] for nd in spec['nodes']}
        assert ops <= SPEC_OPS, sorted(ops - SPEC_OPS)
        consts = [json.dumps(nd['attrs']) for nd in spec['nodes'] if nd['op'] == 'constant']
        assert len(set(consts)) == len(consts), 'a constant written twice'
        sdpa = [nd for nd in spec['nodes'] if nd['op'] == 'scaled_dot_product_attention']
        assert bool(sdpa) == (arch in MASKS), sorted(ops)
        if arch == 'Spellings':
            assert {'slice', 'select', 'parameter', 'matmul', 'bmm', 'sum', 'rsub', 'exp',
                    'sqrt', 'mean'} <= ops, sorted(ops)
        for nd in sdpa:
            mask = MASKS[arch]
            assert nd.get('attrs', {}).get('is_causal', False) == (mask == 'is_causal'), nd
            assert len(nd['inputs']) == (4 if mask == 'additive' else 3), nd
            if mask == 'additive':
                (m,) = [c for c in spec['nodes'] if c['output'] == nd['inputs'][3]]
                assert m['op'] == 'constant' and m['attrs']['shape'] == [16, 16], m
                assert set(m['attrs']['values']) == {0, '-inf'}, set(m['attrs']['values'])
        torch.manual_seed(1)
        model = make(factory)
        sd = model.state_dict()
        for batch in (b, b + 3) if dynamic else (b,):
            x = example(batch)
            with torch.no_grad():
                want = model(x)
            want = [want[k] for k in ('last_hidden_state', 'pooler_output')] \
                if arch == 'bert' else list(want) if isinstance(want, tuple) else \
                [getattr(want, 'logits', want)]
            got = run_spec(spec, sd, {inp['name']: x})
            assert len(got) == len(want)
            for g, w in zip(got, want):
                assert g.shape == w.shape, (batch, list(g.shape), list(w.shape))
                assert torch.allclose(g, w, rtol=1e-5, atol=1e-5), (
                    batch, (g - w).abs().max().item())
            # and the runtime: ckpt verify of the state dict against torch's outputs
            names = spec['outputs']
            ref = {'input': x}
            ref.update(('output.' + k, w.contiguous()) for k, w in zip(names, want))
            stem = re.sub(r'\W', '_', factory)
            path = c.save(sd, c.scratch(stem + '.pth'))
            ref = c.save(ref, c.scratch('%s.%d.ref.pth' % (stem, batch)))
            rc, doc = c.verify_json(out, path, '--reference', ref)
            assert rc == 0 and doc['result'] == 'PASS', (batch, doc.get('load'),
                                                         doc.get('outputs'))
            for o in doc['outputs']:
                assert o['reference']['pass'] and o['reference']['max_rel'] < 1e-5, o

    if factory not in GRAPH_OPS:
        continue

    @t.case('%s: the aten ops of its torch.export graph are those listed here' % factory)
    def _(factory=factory, example=example):
        factories()
        ops = graph_ops(factory, example(int(re.search(r'=(\d+)', given).group(1))))
        assert ops == GRAPH_OPS[factory], ('graph', sorted(ops), 'listed',
                                           sorted(GRAPH_OPS[factory]))


@t.case('torch.fx: nn.Embedding, LayerNorm, GELU (tanh), RMSNorm, F.silu, F.gelu, torch.tanh '
        'map to the spec ops; the spec gives the model\'s outputs at any batch')
def _():
    out = c.scratch('traced.json')
    r = c.run([sys.executable, TOOL, factories() + ':Traced', '--input', 'ids=2,5:int64',
               '--output', 'logits', '-o', out], timeout=300)
    assert r.rc == 0 and 'torch.export' not in r.err, (r.rc, r.err[-2000:])
    with open(out) as f:
        spec = json.load(f)
    assert [nd['op'] for nd in spec['nodes']] == [
        'embedding', 'layer_norm', 'linear', 'gelu', 'gelu', 'silu', 'tanh', 'add',
        'rms_norm', 'linear'], spec['nodes']
    assert spec['inputs'] == [{'name': 'ids', 'shape': [-1, 5], 'dtype': 'int64',
                               'high': 50}], spec['inputs']
    torch.manual_seed(2)
    model = make('Traced')
    for batch in (2, 7):
        x = torch.randint(0, 50, (batch, 5))
        with torch.no_grad():
            want = model(x)
        (got,) = run_spec(spec, model.state_dict(), {'ids': x})
        assert torch.allclose(got, want, rtol=1e-5, atol=1e-5), (got - want).abs().max()


@t.case('an op the runtime lacks (aten.sort): exit 1, no spec, the node named with its aten '
        'op and the line of the model\'s code that made it')
def _():
    out = c.scratch('sorted.json')
    r = c.run([sys.executable, TOOL, factories() + ':Sorted', '--input', 'x=2,8', '-o', out],
              timeout=300)
    assert r.rc == 1, (r.rc, r.err[-2000:])
    assert not os.path.exists(out), 'a spec was written'
    body = [ln for ln in r.err.splitlines() if ln.startswith('  ')]
    assert len(body) == 1, r.err
    m = LINE.match(body[0])
    assert m and m.group(4) == 'sort', body
    with open(factories()) as f:
        line = f.read().splitlines()[int(m.group(2)) - 1]
    assert os.path.realpath(m.group(1)) == os.path.realpath(factories()), body
    assert 'torch.sort(' in line, line

sys.exit(t.summary())
