"""Hugging Face model folders (issue 27), under torch 2.x and transformers
5.24 (skipped with a message where transformers cannot be imported):

  - ckpt convert MODEL_DIR OUT converts the tied, sharded .bin folder that
    transformers 4.57 wrote (tests/data/hf/gpt2_bin_sharded) folder to
    folder: safetensors by default (one model.safetensors, as
    save_pretrained writes it under its 50GB default), or shards with
    --shard-size and their index as transformers writes it (metadata
    total_parameters and total_size, weight_map sorted, only the names the
    shards hold), or pytorch_model.bin with --to pth; every other file
    copied byte for byte;
  - from_pretrained loads OUT with no warning (transformers' logging and
    Python's warnings both captured) and its logits equal, bit for bit,
    those of the input folder as from_pretrained loads it;
  - the index text is json.dumps(index, indent=2, sort_keys=True) + "\n",
    as save_pretrained writes it, with the metadata save_pretrained writes
    for the model loaded from OUT.

Fixtures: tests/fixtures/make_hf_fixtures.py (transformers 4.57.6).
"""
import io
import json
import logging
import os
import sys
import warnings

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as c  # noqa: E402  (exits 77 without torch)

try:
    import transformers
    from transformers import AutoModelForCausalLM
except Exception as e:  # pragma: no cover
    print('transformers cannot be imported (%s): skipping (./bootstrap --deps installs '
          'transformers 5.24.0 beside torch 2.x)' % e)
    sys.exit(c.SKIP)

transformers.utils.logging.disable_progress_bar()
t = c.Tally(uses='ckpt %s, transformers %s' % (c.CKPT, transformers.__version__))
t.need(c.CKPT, 'CKPT')
HF = os.path.join(c.DATA, 'hf')
BIN = os.path.join(HF, 'gpt2_bin_sharded')
IDS = c.torch.tensor([[1, 5, 9, 2, 30, 7, 7, 3]])


def load(d):
    """from_pretrained(D) with every warning it gives: (model, warnings)."""
    said = io.StringIO()
    h = logging.StreamHandler(said)
    h.setLevel(logging.WARNING)
    tl = transformers.utils.logging.get_logger('transformers')
    tl.addHandler(h)
    try:
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter('always')
            m = AutoModelForCausalLM.from_pretrained(d).eval()
    finally:
        tl.removeHandler(h)
    return m, [x for x in said.getvalue().splitlines() if x.strip()] + [str(x.message) for x in w]


def logits(m):
    with c.torch.no_grad():
        return m(IDS).logits


REF, _ = load(BIN)
REF_OUT = logits(REF)


def same_files(a, b, names):
    return ['%s differs from the input\'s' % n for n in names
            if open(os.path.join(a, n), 'rb').read() != open(os.path.join(b, n), 'rb').read()]


def check_out(out, weights):
    errs = []
    names = sorted(os.listdir(out))
    extra = ['config.json', 'generation_config.json', 'special_tokens_map.json', 'tokenizer.json',
             'tokenizer_config.json']
    if names != sorted(weights + extra):
        errs.append('OUT holds %s' % names)
    errs += same_files(out, BIN, extra)
    m, said = load(out)
    if said:
        errs.append('from_pretrained warned: %s' % said)
    got = logits(m)
    if not c.torch.equal(got, REF_OUT):
        errs.append('logits differ from the input folder\'s: max |d| %g'
                    % (got - REF_OUT).abs().max().item())
    if m.lm_head.weight.data_ptr() != m.transformer.wte.weight.data_ptr():
        errs.append('lm_head is not tied to wte once loaded')
    return errs, m


def default(tmp):
    out = os.path.join(tmp, 'out')
    c.ckpt_expect(0, 'convert', BIN, out)
    errs, _ = check_out(out, ['model.safetensors'])
    return errs


def sharded(tmp):
    out = os.path.join(tmp, 'out')
    c.ckpt_expect(0, 'convert', '--shard-size', '3KB', BIN, out)
    shards = ['model-%05d-of-00004.safetensors' % k for k in range(1, 5)]
    errs, m = check_out(out, shards + ['model.safetensors.index.json'])
    idx = json.load(open(os.path.join(out, 'model.safetensors.index.json')))
    if idx['metadata'] != {'total_parameters': m.num_parameters(), 'total_size': 8576}:
        errs.append('index metadata %s' % idx['metadata'])
    if 'lm_head.weight' in idx['weight_map']:
        errs.append('the index lists lm_head.weight, which no shard holds')
    # the text save_pretrained writes: json.dumps(index, indent=2, sort_keys=True) + "\n"
    mine = open(os.path.join(out, 'model.safetensors.index.json')).read()
    if mine != json.dumps(idx, indent=2, sort_keys=True) + '\n':
        errs.append('the index is not written as json.dumps(indent=2, sort_keys=True): %r'
                    % mine[:200])
    # and the metadata it writes for the model loaded from OUT
    again = os.path.join(tmp, 'again')
    m.save_pretrained(again, max_shard_size='3KB')
    theirs = json.load(open(os.path.join(again, 'model.safetensors.index.json')))
    if theirs['metadata'] != idx['metadata']:
        errs.append('save_pretrained writes metadata %s, ckpt %s'
                    % (theirs['metadata'], idx['metadata']))
    return errs


def pth(tmp):
    out = os.path.join(tmp, 'out')
    c.ckpt_expect(0, 'convert', '--to', 'pth', BIN, out)
    errs, _ = check_out(out, ['pytorch_model.bin'])
    return errs


def safetensors_in(tmp):
    out = os.path.join(tmp, 'out')
    c.ckpt_expect(0, 'convert', '--to', 'pth', '--shard-size', '4KB',
                  os.path.join(HF, 'gpt2_st_sharded'), out)
    idx = json.load(open(os.path.join(out, 'pytorch_model.bin.index.json')))
    shards = sorted(set(idx['weight_map'].values()))
    errs, _ = check_out(out, shards + ['pytorch_model.bin.index.json'])
    return errs


t.run('convert the tied, sharded .bin folder to a folder (model.safetensors); '
      'from_pretrained: no warning, logits equal bit for bit', default, tmp=True)
t.run('--shard-size 3KB: 4 safetensors shards, the index as save_pretrained writes it',
      sharded, tmp=True)
t.run('--to pth: pytorch_model.bin, loaded the same', pth, tmp=True)
t.run('a sharded safetensors folder (4.57) to .bin shards of 4KB', safetensors_in, tmp=True)
sys.exit(t.summary())
