#!/usr/bin/env python3
"""Tar checkpoints of torch <= 0.1 (tests/data/tar/tar_*.pth, made by
tests/fixtures/make_tar_fixtures.py as torch 0.1.12's _save wrote them)
against torch itself, which still reads the format.

Under every torch:
  - torch.load(f, weights_only=False) reads each fixture (they are our own,
    data only), and `ckpt inspect --json --stats` gives every tensor the
    dtype, shape, stride and CRC-32 of its values that torch gives it; the
    tensors ckpt puts in one storage lie in one allocation for torch, at
    the byte offsets ckpt says (a storage view is a slice of its root);
  - `ckpt convert` to .pth writes a file that torch.load reads back (with
    weights_only, the safe default; under 1.13 not for the training
    checkpoint, whose floats its weights-only unpickler lacks) with every tensor bit for bit, the
    non-tensor values equal, the storage sharing kept; to .safetensors
    (the state dict, --select for the training checkpoint) a file that the
    safetensors package reads bit for bit.
Under torch 2.x, besides:
  - a weights-only torch.load refuses the tar format with torch's own
    message, before any pickle runs.
"""
import json
import os
import sys

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as c  # noqa: E402  (exit 77 without torch)
import torch  # noqa: E402

TORCH2 = int(torch.__version__.split('.')[0]) >= 2
FIXTURES = {'tar_state_dict.pth': None, 'tar_shared_view.pth': None,
            'tar_training.pth': 'state_dict'}

t = c.Tally(uses='fixtures written by tests/fixtures/make_tar_fixtures.py')
t.need(c.CKPT, 'CKPT')


def tensors(obj, path=()):
    """{path tuple: tensor} of every tensor in OBJ (dicts and lists)."""
    out = {}
    if isinstance(obj, torch.Tensor):
        out[path] = obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            out.update(tensors(v, path + (str(k),)))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            out.update(tensors(v, path + (str(i),)))
    return out


def plain(obj):
    """OBJ with its tensors replaced by a marker (to compare the rest)."""
    if isinstance(obj, torch.Tensor):
        return 'tensor'
    if isinstance(obj, dict):
        return {k: plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [plain(v) for v in obj]
    return obj


def same_values(a, b, where):
    """What differs between the tensors of A and B (same paths, bits)."""
    ta, tb = tensors(a), tensors(b)
    errs = []
    if sorted(ta) != sorted(tb):
        errs.append('%s: tensor paths %s vs %s' % (where, sorted(ta), sorted(tb)))
    for k in ta:
        if k in tb and (ta[k].dtype != tb[k].dtype or ta[k].shape != tb[k].shape or
                        c.raw_bytes(ta[k]) != c.raw_bytes(tb[k])):
            errs.append('%s: %s differs' % (where, '/'.join(k)))
    return errs


def groups(path):
    """ckpt's storages of PATH: {storage: [tensor paths]}."""
    got = json.loads(c.ckpt_expect(0, 'inspect', '--json', path).stdout)
    out = {}
    for x in got['tensors']:
        out.setdefault(x['storage'], []).append(tuple(str(p) for p in x['path']))
    return out


for name, select in FIXTURES.items():
    path = os.path.join(c.DATA, 'tar', name)

    @t.case('%s: ckpt inspect says what torch.load reads' % name)
    def _(path=path):
        want = c.load_trusted(path)
        got = json.loads(c.ckpt_expect(0, 'inspect', '--json', '--stats', path).stdout)
        if got['format'] != 'pth-tar':
            raise c.Fail('format %r' % got['format'])
        tt = tensors(want)
        errs = []
        bases = {}
        for x in got['tensors']:
            k = tuple(str(p) for p in x['path'])
            w = tt.pop(k, None)
            if w is None:
                errs.append('%s: not a tensor for torch' % '/'.join(k))
                continue
            for field, v in (('dtype', c.dtype_name(w.dtype)), ('shape', list(w.shape)),
                             ('stride', list(w.stride())), ('crc32', c.crc32(w))):
                if x[field] != v:
                    errs.append('%s: %s %r, torch %r' % ('/'.join(k), field, x[field], v))
            # ckpt's storage and offset place the tensor where torch has it
            base = w.data_ptr() - x['offset'] * w.element_size()
            if bases.setdefault(x['storage'], base) != base:
                errs.append('%s: not at offset %d of storage %s for torch'
                            % ('/'.join(k), x['offset'], x['storage']))
        errs += ['%s: only torch has it' % '/'.join(k) for k in tt]
        if errs:
            raise c.Fail('; '.join(errs[:6]))

    @t.case('%s: converted to .pth, torch reads the same values (weights-only)' % name)
    def _(path=path):
        want = c.load_trusted(path)
        out = c.scratch(name.replace('.pth', '.conv.pth'))
        c.ckpt_expect(0, 'convert', path, out)
        # torch 1.13's weights-only unpickler lacks BINFLOAT (the training
        # checkpoint's floats): there the file is loaded as trusted
        got = torch.load(out, weights_only=TORCH2 or name != 'tar_training.pth')
        errs = same_values(want, got, 'pth')
        if plain(want) != plain(got):
            errs.append('non-tensor values differ: %r vs %r' % (plain(want), plain(got)))
        # sharing kept: the tensors of one storage in the tar (which the
        # first check proves torch puts in one allocation) share one after
        tg = tensors(got)
        for keys in groups(path).values():
            if len({c.sid(tg[k]) for k in keys if k in tg}) > 1:
                errs.append('%s no longer share a storage' % ', '.join('/'.join(k) for k in keys))
        if errs:
            raise c.Fail('; '.join(errs[:6]))

    @t.case('%s: converted to .safetensors, the package reads the same values' % name)
    def _(path=path, select=select):
        from safetensors.torch import load_file
        want = c.load_trusted(path)
        if select:
            want = want[select]
        out = c.scratch(name.replace('.pth', '.safetensors'))
        c.ckpt_expect(0, 'convert', *(['--select', select] if select else []), path, out)
        got = load_file(out)
        errs = same_values(dict(want), got, 'safetensors')
        if errs:
            raise c.Fail('; '.join(errs[:6]))

    if TORCH2:
        @t.case('%s: torch 2.x refuses it with weights_only' % name)
        def _(path=path):
            try:
                torch.load(path, weights_only=True)
                why = 'accepted'
            except RuntimeError as e:
                why = str(e)
            if not why.startswith('Cannot use ``weights_only=True`` with files saved in the '
                                  'legacy .tar format.'):
                raise c.Fail('weights-only load: %s' % why[:300])

sys.exit(t.summary())
