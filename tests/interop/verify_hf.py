#!/usr/bin/env python3
"""Interop test: `ckpt verify` proves a Hugging Face model folder
(config.json beside its weights) against transformers' own forward (issue
30), under torch 2.x and transformers 5.24 (skipped, exit 77, where
transformers or torch.export cannot be imported).

The folders: a tiny GPT-2 (lm_head.weight tied to transformer.wte.weight)
and a tiny Llama (untied) written here by save_pretrained as safetensors,
in one file and sharded (max_shard_size small: several files and
model.safetensors.index.json), and as pytorch_model.bin the way
transformers 4.x's save_pretrained(safe_serialization=False) wrote it
(torch.save of the state dict: both tied keys; 5.24 writes safetensors
only); plus the committed tests/data/hf folders (transformers 4.57.6: .bin,
sharded .bin, sharded safetensors).  For each folder:

  - `ckpt-spec FOLDER --input input_ids=2,16:int64` builds the model from
    config.json alone and exports it; GPT-2's spec says
    "tied": {"lm_head.weight": "transformer.wte.weight"};
  - `ckpt verify --model SPEC --reference REF FOLDER` passes, REF holding
    fixed ids and the logits of from_pretrained(FOLDER); the safetensors
    folders lack lm_head.weight (save_pretrained leaves a tied key out) and
    the report names it tied in, the .bin files hold both keys;
  - the strict load passes exactly when from_pretrained finds no key
    missing or unexpected: a Llama folder without its (untied)
    lm_head.weight fails both, the key named;
  - one tensor changed (a value of one layer's weight) fails: the load
    passes, the logits do not;
  - a .bin holding both tied keys with different values verifies against
    torch's strict load_state_dict of it (the later key, lm_head.weight,
    copied last into the one shared tensor);
  - a folder ckpt-spec cannot build (no config.json; an unknown class)
    is a usage error naming why;
  - README.md's example (ckpt-spec on tests/data/hf/gpt2_st_sharded, then
    ckpt verify on it) prints the lines README shows.

Prints `ok NAME` or `FAIL NAME: why` per case, then `N passed, M failed`.
"""
import json
import os
import shutil
import subprocess
import sys

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as c  # noqa: E402  (exits 77 without torch)

T = c.need_transformers()
c.need('safetensors')
from safetensors.torch import load_file, save_file  # noqa: E402

T.logging.set_verbosity_error()  # no load reports: the test checks the loading info
T.utils.logging.disable_progress_bar()
torch = c.torch
t = c.Tally(uses='transformers %s' % T.__version__)
t.need(c.CKPT, 'CKPT')
TOOL = os.path.join(c.SRCDIR, 'tools', 'ckpt-spec')
HF = os.path.join(c.DATA, 'hf')
TIE = {'lm_head.weight': 'transformer.wte.weight'}


def gpt2():
    return T.GPT2LMHeadModel(T.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100,
                                          n_positions=64, bos_token_id=0, eos_token_id=0))


def llama():
    return T.LlamaForCausalLM(T.LlamaConfig(
        num_hidden_layers=2, hidden_size=32, intermediate_size=64, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=100, max_position_embeddings=64))


def save(model, name, how):
    """MODEL saved as a folder in scratch: 'st' one model.safetensors,
    'sharded' several, 'bin' one pytorch_model.bin (torch.save, as 4.x)."""
    folder = c.scratch(name)
    shutil.rmtree(folder, ignore_errors=True)
    if how == 'bin':
        model.config.save_pretrained(folder)
        torch.save(model.state_dict(), os.path.join(folder, 'pytorch_model.bin'))
    else:
        model.save_pretrained(folder, max_shard_size='20KB' if how == 'sharded' else '5GB')
    names = os.listdir(folder)
    if how == 'sharded':
        assert 'model.safetensors.index.json' in names and \
            sum(n.endswith('.safetensors') for n in names) > 1, names
    return folder


def spec(folder):
    out = c.scratch(os.path.basename(folder) + '.json')
    if not os.path.exists(out):
        r = c.run([sys.executable, TOOL, folder, '--input', 'input_ids=2,16:int64',
                   '-o', out], timeout=300)
        assert r.rc == 0, (r.rc, r.err[-2000:])
    return out


def reference(folder):
    """from_pretrained(FOLDER)'s logits on fixed ids, and whether it found
    every key (none missing or unexpected)."""
    model, info = T.AutoModelForCausalLM.from_pretrained(folder, output_loading_info=True)
    model.eval()
    gen = torch.Generator().manual_seed(30)
    ids = torch.randint(0, model.config.vocab_size, (2, 16), generator=gen)
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    ref = c.scratch(os.path.basename(folder) + '.ref.pth')
    c.save({'input': ids, 'output.logits': logits.contiguous()}, ref)
    return ref, not info['missing_keys'] and not info['unexpected_keys']


def verify(folder, spec_of=None):
    ref, whole = reference(folder)
    rc, doc = c.verify_json(spec(spec_of or folder), folder, '--reference', ref)
    return rc, doc, whole


def passes(folder, tied_in):
    rc, doc, whole = verify(folder)
    assert whole, 'from_pretrained found keys missing or unexpected in %s' % folder
    assert rc == 0 and doc['result'] == 'PASS', doc
    assert doc['load']['ok'] and doc['load']['tied_in'] == tied_in, doc['load']
    (out,) = doc['outputs']
    assert out['name'] == 'logits' and out['reference']['pass'], out
    assert out['reference']['rtol'] == 1e-5, out


torch.manual_seed(30)
MODELS = {'gpt2': gpt2(), 'llama': llama()}


def tied_of(name, how):
    """What verify reports tied in: GPT-2's lm_head.weight where the file lacks it."""
    return TIE if name == 'gpt2' and how != 'bin' else {}


for name in ('gpt2', 'llama'):
    for how in ('st', 'sharded', 'bin'):
        @t.case('%s, %s: ckpt-spec FOLDER; verify passes against from_pretrained\'s logits'
                % (name, {'st': 'model.safetensors', 'sharded': 'safetensors sharded',
                          'bin': 'pytorch_model.bin'}[how]))
        def _(name=name, how=how):
            folder = save(MODELS[name], '%s_%s' % (name, how), how)
            with open(spec(folder)) as f:
                s = json.load(f)
            assert s.get('tied', {}) == (TIE if name == 'gpt2' else {}), s.get('tied')
            assert s['name'] == os.path.basename(folder), s['name']
            passes(folder, tied_of(name, how))


for d in sorted(os.listdir(HF)):
    @t.case('tests/data/hf/%s (transformers 4.57.6): verify passes against 5.24\'s logits' % d)
    def _(d=d):
        folder = c.scratch('hf_' + d)
        shutil.rmtree(folder, ignore_errors=True)
        shutil.copytree(os.path.join(HF, d), folder)
        passes(folder, TIE if 'st' in d.split('_') else {})


@t.case('an untied Llama folder without lm_head.weight fails the strict load, as '
        'from_pretrained finds it missing')
def _():
    folder = save(MODELS['llama'], 'llama_nohead', 'st')
    path = os.path.join(folder, 'model.safetensors')
    sd = load_file(path)
    del sd['lm_head.weight']
    save_file(sd, path, metadata={'format': 'pt'})
    rc, doc, whole = verify(folder, spec_of=c.scratch('llama_st'))
    assert not whole and rc == 1 and not doc['load']['ok'], doc['load']
    assert doc['load']['missing'] == ['lm_head.weight'], doc['load']


@t.case('one tensor changed in a sharded folder is caught: the load passes, the logits fail')
def _():
    folder = save(MODELS['gpt2'], 'gpt2_changed', 'sharded')
    ref, _ = reference(folder)  # the logits of the folder as saved
    key = 'transformer.h.1.mlp.c_fc.weight'
    with open(os.path.join(folder, 'model.safetensors.index.json')) as f:
        shard = os.path.join(folder, json.load(f)['weight_map'][key])
    sd = load_file(shard)
    sd[key][0, 0] += 1.0
    save_file(sd, shard, metadata={'format': 'pt'})
    rc, doc = c.verify_json(spec(c.scratch('gpt2_sharded')), folder, '--reference', ref)
    assert rc == 1 and doc['result'] == 'FAIL' and doc['load']['ok'], doc
    (out,) = doc['outputs']
    assert not out['reference']['pass'] and out['reference']['mismatched'] > 0, out


@t.case('a .bin holding both tied keys, lm_head.weight changed, loads as torch\'s strict '
        'load does: the later key\'s values serve both')
def _():
    folder = save(MODELS['gpt2'], 'gpt2_both', 'bin')
    path = os.path.join(folder, 'pytorch_model.bin')
    sd = {k: v.clone() for k, v in torch.load(path, weights_only=True).items()}
    sd['lm_head.weight'][3] += 0.25  # token 3's row: its embedding and its logit
    torch.save(sd, path)
    model = gpt2().eval()
    model.load_state_dict(sd, strict=True)  # both copied into one tensor, lm_head's last
    assert torch.equal(model.transformer.wte.weight, sd['lm_head.weight'])
    ids = torch.randint(0, 100, (2, 16), generator=torch.Generator().manual_seed(30))
    ids[:, 5] = 3
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    ref = c.save({'input': ids, 'output.logits': logits.contiguous()},
                 c.scratch('gpt2_both.ref.pth'))
    rc, doc = c.verify_json(spec(c.scratch('gpt2_bin')), folder, '--reference', ref)
    assert rc == 0 and doc['load']['tied_in'] == {}, doc


@t.case('ckpt-spec refuses a folder it cannot build (exit 2): no config.json, an unknown '
        'class under "architectures"')
def _():
    folder = c.scratch('not_a_model')
    os.makedirs(folder, exist_ok=True)
    r = c.run([sys.executable, TOOL, folder, '--input', 'input_ids=2,16:int64'])
    assert r.rc == 2 and 'this folder has no config.json' in r.err, (r.rc, r.err)
    cfg = MODELS['gpt2'].config.to_dict()
    cfg['architectures'] = ['NoSuchModelForCausalLM']
    with open(os.path.join(folder, 'config.json'), 'w') as f:
        json.dump(cfg, f)
    r = c.run([sys.executable, TOOL, folder, '--input', 'input_ids=2,16:int64'])
    assert r.rc == 2 and '"architectures" must name one class' in r.err, (r.rc, r.err)


@t.case('README.md\'s example of a model folder: ckpt-spec FOLDER, then ckpt verify FOLDER, '
        'print what it shows')
def _():
    with open(os.path.join(c.SRCDIR, 'README.md')) as f:
        text = f.read()
    start = text.index('    $ ckpt-spec tests/data/hf/')
    block = text[start:text.index('\n\n', start)].splitlines()
    steps = []  # (command, the lines it must print, in order)
    for line in block:
        line = line[4:]
        if line.startswith('$ '):
            steps.append((line[2:].split(), []))
        elif line != '...':
            steps[-1][1].append(line)
    assert [s[0][0] for s in steps] == ['ckpt-spec', 'ckpt'], steps
    cwd = c.scratch('readme')
    os.makedirs(cwd, exist_ok=True)
    for argv, want in steps:
        # from a scratch folder: the spec is written there, the fixture read in place
        argv = [os.path.join(c.SRCDIR, a) if a.startswith('tests/') else a for a in argv]
        argv = ([sys.executable, TOOL] if argv[0] == 'ckpt-spec' else [c.CKPT]) + argv[1:]
        r = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=cwd)
        assert r.returncode == 0, (argv, r.returncode, r.stderr[-2000:])
        got = (r.stderr + r.stdout).splitlines()
        at = 0
        for w in want:
            assert w in got[at:], 'README says %r; %s printed:\n%s' % (
                w, os.path.basename(argv[0]), '\n'.join(got))
            at = got.index(w, at) + 1


sys.exit(t.summary())
