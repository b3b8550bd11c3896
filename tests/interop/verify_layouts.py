#!/usr/bin/env python3
"""Interop test: `ckpt verify` proves a Llama-style model trained on many
ranks, straight from the folder the run wrote (issue 30), under torch 2.x
and transformers 5.24 (skipped, exit 77, where transformers cannot be
imported).

The fixtures (tests/data/llama_layouts, made by
tests/fixtures/make_llama_layouts.py) are tests/fixtures/tiny_transformers.py's
llama() trained one step under FSDP2 (a DCP folder of {"model", "optim"}),
DeepSpeed ZeRO-3 (its folder) and nn.DataParallel (keys "module."), each with
a reference: token ids and the logits transformers' own forward gave with the
run's full weights.  Here tools/ckpt-spec exports the same llama() with
torch.export, and for each layout

  - `ckpt verify --model SPEC --reference REF FOLDER` passes (the logits
    within 1e-5 relative, verify's CPU default), on the folder as the run
    wrote it and on its `ckpt convert` single file;
  - DataParallel's file fails the strict load as torch's load_state_dict
    does (every key "module."...), and passes after `ckpt strip-module`;
  - three perturbations are caught (exit 1, the logits output failing): a
    value of rank 1's ZeRO-3 shard changed, a square weight transposed, and
    decoder layers 0 and 1 swapped.

Prints `ok NAME` or `FAIL NAME: why` per case, then `N passed, M failed`.
"""
import os
import shutil
import subprocess
import sys

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as c  # noqa: E402  (exits 77 without torch)

transformers = c.need_transformers()

torch = c.torch
t = c.Tally(uses='transformers %s' % transformers.__version__)
LAYOUTS = os.path.join(c.DATA, 'llama_layouts')
FACTORY = os.path.join(c.SRCDIR, 'tests', 'fixtures', 'tiny_transformers.py') + ':llama'
TOOL = os.path.join(c.SRCDIR, 'tools', 'ckpt-spec')
SPEC = c.scratch('llama.json')
Q0 = 'model.layers.0.self_attn.q_proj.weight'


def spec():
    if not os.path.exists(SPEC):
        r = c.run([sys.executable, TOOL, FACTORY, '--input', 'input_ids=2,16:int64',
                   '-o', SPEC], timeout=300)
        assert r.rc == 0, (r.rc, r.err[-2000:])
    return SPEC


def verify(path, ref, *extra):
    """(exit status, JSON report) of ckpt verify on the CPU."""
    return c.verify_json(spec(), path, '--reference', os.path.join(LAYOUTS, ref), *extra)


def passes(path, ref, *extra):
    rc, doc = verify(path, ref, *extra)
    assert rc == 0 and doc['result'] == 'PASS', doc
    (out,) = doc['outputs']
    assert out['name'] == 'logits' and out['reference']['pass'], out
    assert out['reference']['rtol'] == 1e-5, out   # within 1e-5 relative on the CPU
    return doc


def caught(path, ref):
    """Exit 1 with the load passing and the logits failing."""
    rc, doc = verify(path, ref)
    assert rc == 1 and doc['result'] == 'FAIL', doc
    assert doc['load']['ok'], doc['load']
    (out,) = doc['outputs']
    assert out['name'] == 'logits' and not out['reference']['pass'], out
    assert out['reference']['mismatched'] > 0, out
    return doc


def single(folder, *select):
    out = c.scratch(os.path.basename(folder) + '.pth')
    if not os.path.exists(out):
        c.ckpt_expect(0, 'convert', *select, folder, out)
    return out


@t.case('ckpt-spec exports tiny_transformers.llama() with token-id input (torch.export)')
def _():
    spec()


@t.case('FSDP2: verify passes on the DCP folder of {"model", "optim"} as dcp.save wrote it')
def _():
    passes(os.path.join(LAYOUTS, 'fsdp2'), 'fsdp2.ref.pth')


@t.case('README.md\'s example: its verify of the FSDP2 folder prints the lines shown there')
def _():
    with open(os.path.join(c.SRCDIR, 'README.md')) as f:
        text = f.read()
    start = text.index('    $ ckpt verify --model llama.json --reference tests/data/llama_layouts/')
    block = text[start:text.index('    result      PASS\n', start)].splitlines()
    shown = [ln[4:] for ln in block[2:]] + ['result      PASS']
    r = subprocess.run([c.CKPT, 'verify', '--device', 'cpu', '--model', spec(), '--reference',
                        'tests/data/llama_layouts/fsdp2.ref.pth', 'tests/data/llama_layouts/fsdp2'],
                       cwd=c.SRCDIR, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    got = r.stdout.splitlines()
    assert len(got) == len(shown), (got, shown)
    for g, w in zip(got, shown):
        if w.startswith(('model ', 'device ')):      # the spec's path, this machine's CPU
            assert g.split()[0] == w.split()[0], (g, w)
        elif w.startswith('output '):                # the error's digits follow the CPU path
            assert g.split(': max abs')[0] == w.split(': max abs')[0] and g.endswith(': PASS'), (g, w)
        else:
            assert g == w, (g, w)


@t.case('FSDP2: verify passes on its converted single file (convert --select model)')
def _():
    passes(single(os.path.join(LAYOUTS, 'fsdp2'), '--select', 'model'), 'fsdp2.ref.pth')


@t.case('ZeRO-3: verify passes on the DeepSpeed folder as save_checkpoint wrote it')
def _():
    passes(os.path.join(LAYOUTS, 'zero3'), 'zero3.ref.pth')


@t.case('ZeRO-3: verify passes on its converted single file')
def _():
    passes(single(os.path.join(LAYOUTS, 'zero3')), 'zero3.ref.pth')


@t.case('DataParallel: its "module." keys fail the strict load as torch says it, and pass '
        'after strip-module')
def _():
    dp = os.path.join(LAYOUTS, 'dp.pth')
    rc, doc = verify(dp, 'dp.ref.pth')
    assert rc == 1, doc
    assert 'Unexpected key(s) in state_dict: "module.model.embed_tokens.weight"' in repr(doc), doc
    out = c.scratch('dp_stripped.pth')
    c.ckpt_expect(0, 'strip-module', dp, out)
    passes(out, 'dp.ref.pth')


@t.case('a perturbed shard is caught: one value of rank 1\'s ZeRO-3 fp32 partition changed')
def _():
    folder = c.scratch('zero3_perturbed')
    shutil.rmtree(folder, ignore_errors=True)
    shutil.copytree(os.path.join(LAYOUTS, 'zero3'), folder)
    rank1 = os.path.join(folder, 'global_step1', 'zero_pp_rank_1_mp_rank_00_optim_states.pt')
    o = torch.load(rank1, weights_only=False)   # our own fixture: DeepSpeed pickles objects
    flat = o['optimizer_state_dict']['fp32_flat_groups'][0]
    with torch.no_grad():
        flat[flat.numel() // 2] += 0.5
    torch.save(o, rank1)
    caught(folder, 'zero3.ref.pth')


@t.case('a transposed weight is caught (a square one: the strict load passes)')
def _():
    sd = torch.load(single(os.path.join(LAYOUTS, 'zero3')), weights_only=True)
    assert sd[Q0].shape[0] == sd[Q0].shape[1], sd[Q0].shape
    sd[Q0] = sd[Q0].t().contiguous()
    out = c.scratch('transposed.pth')
    torch.save(sd, out)
    caught(out, 'zero3.ref.pth')


@t.case('swapped decoder layers are caught (layers 0 and 1 exchanged: same keys and shapes)')
def _():
    sd = torch.load(single(os.path.join(LAYOUTS, 'zero3')), weights_only=True)
    swap = {}
    for k, v in sd.items():
        k2 = k.replace('layers.0.', 'layers.@.').replace('layers.1.', 'layers.0.') \
              .replace('layers.@.', 'layers.1.')
        swap[k2] = v
    out = c.scratch('swapped.pth')
    torch.save(swap, out)
    caught(out, 'zero3.ref.pth')


sys.exit(t.summary())
