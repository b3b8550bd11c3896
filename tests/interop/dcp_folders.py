#!/usr/bin/env python3
"""torch.distributed.checkpoint folders (tests/fixtures/distributed: every
DCP case of MANIFEST.json, written by real multi-process runs under torch
2.15) read by ckpt, against torch's own converter and the true state dict.

Under torch 2.x (the fixtures' torch; torch 1.13 has no DCP: skipped):
  - `ckpt convert FOLDER out.pth` equals the case's reference (what
    dcp_to_torch_save wrote) tensor for tensor (dtype, shape, values),
    nesting, container types and key order, wherever the reference exists
    and is right;
  - it always equals the live state dict the trainer saved (the truth),
    with DCP's documented rules applied to it (int keys become str, empty
    mappings vanish; key order is the metadata's);
  - out.pth loads with plain torch.load (weights-only), and where the case
    has a model its `model` state dict loads with load_state_dict(strict=True);
  - the model state dict converted to .safetensors holds the same tensors;
  - `ckpt diff FOLDER live.pth` finds nothing different;
  - `ckpt scan FOLDER` finds it safe (every pickle: .metadata, each item);
  - `ckpt inspect --stats` (every item read, every CRC) succeeds, and
    inspect's chunks cover each tensor exactly.
"""
import importlib.util
import json
import os
import sys

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as c  # noqa: E402  (exit 77 without torch)
import torch  # noqa: E402

if int(torch.__version__.split('.')[0]) < 2:
    print('torch %s has no torch.distributed.checkpoint: skipped' % torch.__version__)
    sys.exit(c.SKIP)

FIX = os.path.join(c.SRCDIR, 'tests', 'fixtures', 'distributed')
MANIFEST = os.path.join(FIX, 'MANIFEST.json')
if not os.path.exists(MANIFEST):
    print('no %s: skipped' % MANIFEST)
    sys.exit(c.SKIP)

t = c.Tally(uses='fixtures written by tests/fixtures/make_distributed.py (torch 2.15)')
t.need(c.CKPT, 'CKPT')

# the generator's own comparison and DCP's flattening rules (reference 1.5)
_spec = importlib.util.spec_from_file_location(
    'make_distributed', os.path.join(c.SRCDIR, 'tests', 'fixtures', 'make_distributed.py'))
md = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(md)

cases = [e for e in json.load(open(MANIFEST))['cases'] if e['kind'] == 'dcp']


def model_of(entry):
    if not entry.get('model'):
        return None
    return dict(zip(('DcpNet', 'DsNet', 'PlainNet'), md._models()))[entry['model']]()


def check_case(tmp, entry):
    errs = []
    folder = os.path.join(FIX, entry['path'])
    out = os.path.join(tmp, entry['name'] + '.pth')
    r = c.ckpt('convert', folder, out)
    if r.rc != 0:
        return ['%s: exit %d: %s' % (r.cmd, r.rc, r.err.strip())]
    got = torch.load(out)            # plain, weights-only
    ref_ok = entry.get('reference') and not entry.get('reference_error') \
        and not entry.get('reference_wrong')
    if ref_ok:
        ref = torch.load(os.path.join(FIX, entry['reference']), weights_only=False)
        order = []
        errs += ['vs reference: ' + e for e in md.compare(got, ref, order=order)]
        errs += ['vs reference: key order differs in ' + w for w in order]
    live = torch.load(os.path.join(FIX, entry['live']), weights_only=False)
    errs += ['vs live: ' + e for e in md.compare(got, md.dcp_expected(live))]
    model = model_of(entry)
    if model is not None:
        try:
            model.load_state_dict(got['model'], strict=True)
        except Exception as e:
            errs.append('load_state_dict(strict=True): %s' % c.describe(e))
        st = os.path.join(tmp, entry['name'] + '.safetensors')
        r = c.ckpt('convert', '--select', 'model', folder, st)
        if r.rc != 0:
            errs.append('%s: exit %d: %s' % (r.cmd, r.rc, r.err.strip()))
        else:
            from safetensors.torch import load_file
            errs += ['safetensors: ' + e for e in md.compare(load_file(st), dict(got['model']))]
    r = c.ckpt('diff', folder, os.path.join(FIX, entry['live']))
    if r.rc != 0:
        errs.append('%s: exit %d: %s' % (r.cmd, r.rc, r.out.strip()[-400:]))
    r = c.ckpt('scan', '--quiet', folder)
    if r.rc != 0:
        errs.append('%s: exit %d (a clean folder scans safe): %s' % (r.cmd, r.rc, r.err.strip()))
    r = c.ckpt('inspect', '--stats', '--json', folder)
    if r.rc != 0:
        errs.append('%s: exit %d: %s' % (r.cmd, r.rc, r.err.strip()))
    else:
        d = json.loads(r.out)
        if d['format'] != 'dcp':
            errs.append('inspect: format %r' % d['format'])
        for tj in d['tensors']:
            if 'chunks' not in tj:
                continue          # a BYTES item's tensor, stored whole
            n = 1
            for s in tj['shape']:
                n *= s
            cover = 0
            for ch in tj['chunks']:
                k = 1
                for s in ch['sizes']:
                    k *= s
                cover += k
                if any(o + s > g for o, s, g in zip(ch['offsets'], ch['sizes'], tj['shape'])):
                    errs.append('inspect: %s: a chunk past the shape' % tj['path'])
            if cover != n:
                errs.append('inspect: %s: chunks hold %d of %d elements' % (tj['path'], cover, n))
    return errs


for entry in cases:
    t.run('%s (%s)' % (entry['name'], entry.get('what', '')), check_case, entry, tmp=True)

sys.exit(t.summary())
