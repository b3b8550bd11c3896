#!/usr/bin/env python3
"""Files torch writes that ckpt once refused or misreported, read as torch
reads them, under the torch this runs under (tests/data/quirks, made by
tests/fixtures/make_torch_quirks.py with torch 2.15, and the same files
saved here by the running torch where it can):

  - torch.serialization.skip_data: every storage record has CRC-32 0 (the
    bytes zeros, or filled in later through a MAP_SHARED mmap load): torch
    loads them; `inspect --stats` reads every value torch reads, with a
    note, and a rewrite gives a file torch loads equal;
  - PyTorch 0.3's storage views (legacy view_metadata): torch's
    legacy_load makes each view a slice of its root; ckpt lists the values
    torch loads, and converts the file to pth and safetensors that load
    equal;
  - a whole pickled model: each parameter listed as a parameter with the
    requires_grad torch gives it (named_parameters()), buffers not; and the
    tensors it holds outside its state dict (plain tensor attributes, one in
    a list, a non-persistent buffer) listed apart under `other_tensors`,
    with torch's values, and never written by extract.
"""
import json
import mmap
import os
import sys

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as c  # noqa: E402  (exit 77 without torch)
import torch  # noqa: E402

t = c.Tally()
t.need(c.CKPT, 'CKPT')
QUIRKS = os.path.join(c.DATA, 'quirks')
HAS_SKIP = hasattr(torch.serialization, 'skip_data')  # torch 2.4+
print('torch %s' % torch.__version__)


def inspected(path):
    r = c.ckpt_expect(0, 'inspect', '--json', '--stats', path)
    return json.loads(r.stdout.decode()), r.err


def values_equal(d, ref, what):
    """ckpt's listing (inspect --json --stats) against torch's state dict."""
    errs = []
    got = {x['path'][-1]: x for x in d['tensors']}
    if list(got) != list(ref):
        errs.append('%s: keys %s, torch %s' % (what, list(got), list(ref)))
    for k, v in ref.items():
        g = got.get(k)
        if g and (g['dtype'], g['shape'], g['crc32']) != (c.dtype_name(v.dtype), list(v.shape),
                                                           c.crc32(v)):
            errs.append('%s %s: ckpt %s, torch %s' % (what, k, (g['dtype'], g['shape'], g['crc32']),
                                                      (c.dtype_name(v.dtype), list(v.shape),
                                                       c.crc32(v))))
    return errs


def check_skip(path, label):
    ref = torch.load(path, weights_only=True)
    d, err = inspected(path)
    errs = values_equal(d, ref, label)
    if 'skip_data' not in err or 'not checked' not in err:
        errs.append('no note about the CRC-32s skip_data wrote: %r' % err)
    for fmt in ('pth', 'safetensors'):
        out = os.path.join(c.scratch(), os.path.basename(path) + '.' + fmt)
        c.ckpt_expect(0, 'convert', path, out)
        if fmt == 'pth':
            back = torch.load(out, weights_only=True)
            if list(back) != list(ref) or not all(torch.equal(back[k], ref[k]) for k in ref):
                errs.append('%s: the pth ckpt wrote loads otherwise' % label)
            d2, err2 = inspected(out)
            if 'skip_data' in err2:
                errs.append('%s: the rewrite still has CRC-32 0' % label)
    t.report('%s: torch loads it; inspect --stats lists the same values, with a note; '
             'convert writes real CRC-32s' % label, errs)


def skip_data_files():
    for name in ('skip_data.pth', 'skip_filled.pth'):
        check_skip(os.path.join(QUIRKS, name), name)
    r = c.ckpt('inspect', '--stats', os.path.join(c.BAD, 'crc_one_zeroed.pth'))
    t.report('one storage record with CRC-32 0 beside a computed one is still corrupt',
             [] if r.rc == 3 and 'CRC-32 mismatch' in r.err else ['exit %d: %s' % (r.rc, r.err)])
    if not HAS_SKIP:
        t.skip('skip_data files saved by this torch', 'torch %s has no skip_data'
               % torch.__version__)
        return
    tmp = c.scratch()
    sd = {'w': torch.randn(4, 3), 'i': torch.arange(5), 'e': torch.zeros(0)}
    for fill in (False, True):
        path = os.path.join(tmp, 'filled.pth' if fill else 'skeleton.pth')
        with torch.serialization.skip_data():
            torch.save(sd, path)
        if fill:
            with torch.serialization.set_default_mmap_options(mmap.MAP_SHARED):
                m = torch.load(path, mmap=True, weights_only=True)
            for k, v in sd.items():
                m[k].copy_(v)
            del m
        check_skip(path, 'skip_data (this torch%s)' % (', filled in' if fill else ''))


def legacy_views():
    path = os.path.join(QUIRKS, 'legacy_views.pth')
    ref = torch.load(path, weights_only=True)
    d, _ = inspected(path)
    errs = values_equal(d, ref, 'legacy_views.pth')
    views = [s for s in d['storages'] if 'view_of' in s]
    if sorted((s['view_of']['offset'], s['numel']) for s in views) != [(1, 2), (2, 6)]:
        errs.append('storages: %s' % d['storages'])
    if d['summary']['bytes'] != 72:  # the roots' bytes, each once
        errs.append('summary bytes %s, the file holds 72' % d['summary']['bytes'])
    t.report('legacy_views.pth (PyTorch 0.3 storage views): torch loads it, ckpt lists the '
             'same values and says which storages are views', errs)
    errs = []
    tmp = c.scratch()
    for fmt in ('pth', 'safetensors'):
        out = os.path.join(tmp, 'views.' + fmt)
        c.ckpt_expect(0, 'convert', path, out)
        if fmt == 'pth':
            back = torch.load(out, weights_only=True)
        else:
            try:
                from safetensors.torch import load_file
            except ImportError:  # not beside this torch: read back through a pth
                c.ckpt_expect(0, 'convert', out, out + '.pth')
                back = torch.load(out + '.pth', weights_only=True)
            else:
                back = load_file(out)
        # safetensors' load_file lists names in the data's order, which ckpt
        # chooses for 64-byte alignment: the names must be the same, not their order
        names_differ = list(back) != list(ref) if fmt == 'pth' else sorted(back) != sorted(ref)
        if names_differ or not all(torch.equal(back[k], ref[k]) for k in ref):
            errs.append('%s: loads otherwise: %s' % (fmt, {k: back[k].tolist() for k in back}))
    t.report('legacy_views.pth converts to pth and safetensors that load equal', errs)


def whole_model(path, label):
    model = torch.load(path, weights_only=False)  # torch.nn classes only: our own fixture
    d, _ = inspected(path)
    errs = values_equal(d, model.state_dict(), label)
    params = dict(model.named_parameters())
    for x in d['tensors']:
        k = x['path'][-1]
        want = (k in params, params[k].requires_grad if k in params else False)
        if (x['parameter'], x['requires_grad']) != want:
            errs.append('%s: parameter/requires_grad %s, torch %s'
                        % (k, (x['parameter'], x['requires_grad']), want))
    t.report('%s: parameters listed as parameters with the requires_grad torch gives them' % label,
             errs)
    errs = []
    want = {'scratch': ('non-persistent buffer', model.scratch),
            'anchors': ('attribute', model.anchors),
            '0.stride': ('attribute', model[0].stride),
            'extra.0': ('attribute', model.extra[0])}
    got = {x['path'][-1]: x for x in d['other_tensors']}
    if sorted(got) != sorted(want):
        errs.append('other tensors %s, want %s' % (sorted(got), sorted(want)))
    for k, (why, v) in want.items():
        g = got.get(k)
        if g and (g['why'], g['dtype'], g['shape'], g['crc32']) != (
                why, c.dtype_name(v.dtype), list(v.shape), c.crc32(v)):
            errs.append('%s: ckpt %s' % (k, (g['why'], g['dtype'], g['shape'], g['crc32'])))
    out = os.path.join(c.scratch(), 'extracted.pth')
    c.ckpt_expect(0, 'extract', path, out)
    if list(torch.load(out, weights_only=True)) != list(model.state_dict()):
        errs.append('extract wrote more than the state dict')
    t.report('%s: the tensors outside the state dict are listed apart with torch\'s values, '
             'and not extracted' % label, errs)


def whole_models():
    whole_model(os.path.join(QUIRKS, 'whole_attrs.pt'), 'whole_attrs.pt')
    import make_torch_quirks
    tmp = c.scratch()
    path = os.path.join(tmp, 'whole_here.pt')
    torch.save(make_torch_quirks.whole_model(), path)
    whole_model(path, 'the same model saved by this torch')
    legacy = os.path.join(tmp, 'whole_legacy.pt')
    torch.save(make_torch_quirks.whole_model(), legacy, _use_new_zipfile_serialization=False)
    whole_model(legacy, 'the same model in the legacy format')


skip_data_files()
legacy_views()
whole_models()
sys.exit(t.summary())
