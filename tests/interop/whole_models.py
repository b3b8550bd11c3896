#!/usr/bin/env python3
"""Whole pickled models (torch.save(model)), read by their structure and
never imported, under the torch this runs under.

A model of torch.nn classes and classes of a module of the test's own
(`wm_mods`, written to a scratch directory): Sequential, BatchNorm (version
2), ModuleList, ModuleDict, Embedding, a child shared under two names, a
tied weight, a frozen parameter, a None bias and a None attribute, a
non-persistent buffer, a plain tensor attribute; saved as the root, inside a
training dict (with an optimizer state dict), and in the legacy format.

  - `ckpt inspect` needs no flag and lists exactly the keys of
    model.state_dict(), in its order, with its dtypes, shapes and values;
    the state dict says it is a module tree and names the class;
  - `ckpt extract` writes a file that plain torch.load (weights-only where
    the torch has it) reads, that load_state_dict(strict=True) takes into a
    fresh model, whose _metadata is torch's but for the versions of the
    test's own classes (said in a note);
  - `ckpt diff` finds the model and its extract equal, and a changed
    parameter in the module tree different;
  - `ckpt scan` still calls the file unsafe (torch.load would import the
    classes), and a rewrite of the module tree is refused, pointing at
    extract;
  - a class used as anything but a module class still refuses the file.
"""
import json
import os
import sys
import textwrap

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as c  # noqa: E402  (exit 77 without torch)
import torch  # noqa: E402

t = c.Tally()
t.need(c.CKPT, 'CKPT')
TORCH2 = int(torch.__version__.split('.')[0]) >= 2

MODS = textwrap.dedent('''
    import torch, torch.nn as nn

    class Block(nn.Module):
        _version = 3
        def __init__(self):
            super().__init__()
            self.inner = nn.Linear(4, 4)
            self.register_buffer("running", torch.arange(4.0))
            self.register_buffer("scratch", torch.zeros(2), persistent=False)
            self.register_buffer("missing", None)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.seq = nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2), nn.ReLU(), Block())
            self.mlist = nn.ModuleList([nn.Linear(3, 3, bias=False), Block()])
            self.mdict = nn.ModuleDict({"b": nn.Linear(2, 2)})
            self.emb = nn.Embedding(5, 3)
            self.head = nn.Linear(3, 5, bias=False)
            self.tied = nn.Linear(3, 5, bias=False)
            self.tied.weight = self.head.weight
            self.shared = nn.Linear(2, 2)
            self.shared_again = self.shared
            self.maybe = None
            self.register_parameter("frozen", nn.Parameter(torch.ones(2), requires_grad=False))
            self.anchors = torch.tensor([1.0, 2.0])

    class Config:
        pass
''')


def listed(path):
    r = c.ckpt_expect(0, 'inspect', '--json', '--stats', path)
    return json.loads(r.stdout.decode())


def main():
    tmp = c.scratch()
    with open(os.path.join(tmp, 'wm_mods.py'), 'w') as f:
        f.write(MODS)
    sys.path.insert(0, tmp)
    import wm_mods
    torch.manual_seed(0)
    model = wm_mods.Net()
    with torch.no_grad():
        model.seq[1].running_mean.uniform_()
    ref = model.state_dict()
    files = {'root.pt': model, 'training.pt': {
        'epoch': 3, 'model': model,
        'optimizer': torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9).state_dict()}}
    for name, obj in files.items():
        torch.save(obj, os.path.join(tmp, name))
    torch.save(model, os.path.join(tmp, 'legacy.pt'), _use_new_zipfile_serialization=False)

    for name, prefix in (('root.pt', ''), ('training.pt', 'model/'), ('legacy.pt', '')):
        path = os.path.join(tmp, name)
        d = listed(path)
        errs = []
        keys = [x['path'][-1] for x in d['tensors'] if x['path'][:-1] == (['model'] if prefix else [])]
        if keys != list(ref):
            errs.append('keys %s, state_dict() %s' % (keys[:8], list(ref)[:8]))
        got = {x['path'][-1]: x for x in d['tensors']}
        for k, v in ref.items():
            g = got.get(k)
            if g and (g['dtype'], g['shape'], g['crc32']) != (c.dtype_name(v.dtype), list(v.shape),
                                                               c.crc32(v)):
                errs.append('%s: ckpt %s' % (k, (g['dtype'], g['shape'], g['crc32'])))
        sds = [s for s in d['state_dicts'] if s.get('source') == 'module-tree']
        if len(sds) != 1 or sds[0].get('class') != 'wm_mods.Net':
            errs.append('state dicts %s' % d['state_dicts'])
        t.report('%s: inspect lists model.state_dict() (%d keys), no flag needed' % (name, len(ref)),
                 errs)

    for name in ('root.pt', 'training.pt', 'legacy.pt'):
        path, out = os.path.join(tmp, name), os.path.join(tmp, 'x_' + name + '.pth')
        r = c.ckpt_expect(0, 'extract', path, out)
        errs = []
        sd = torch.load(out, weights_only=True)
        if list(sd) != list(ref) or not all(torch.equal(sd[k], ref[k]) for k in ref):
            errs.append('extracted keys or values differ')
        fresh = wm_mods.Net()
        fresh.load_state_dict(sd, strict=True)
        want_meta = {k: v for k, v in ref._metadata.items()}
        got_meta = dict(sd._metadata)
        diff = {k for k in want_meta if want_meta[k] != got_meta.get(k)}
        if list(got_meta) != list(want_meta) or diff != {'seq.3', 'mlist.1'}:
            errs.append('_metadata differs at %s (only the Block versions should)' % sorted(diff))
        if 'wm_mods' not in r.err or '_version' not in r.err:
            errs.append('no note about the classes whose version is unknown: %r' % r.err)
        same = c.ckpt('diff', path if name != 'training.pt' else out, out)
        if same.rc != 0:
            errs.append('diff of the model and its extract: %s' % same.out)
        t.report('%s: extract loads with weights-only torch.load and load_state_dict(strict=True)'
                 % name, errs)

    # a changed parameter inside the module tree is a difference
    with torch.no_grad():
        model.mdict['b'].weight[0, 0] += 1
    changed = os.path.join(tmp, 'changed.pt')
    torch.save(model, changed)
    r = c.ckpt('diff', os.path.join(tmp, 'root.pt'), changed)
    t.report('diff finds a changed parameter inside a module tree',
             [] if r.rc == 1 and 'mdict.b.weight' in r.out else
             ['exit %d: %s' % (r.rc, r.out)])

    r = c.ckpt('scan', os.path.join(tmp, 'root.pt'))
    t.report('scan: still unsafe (torch.load imports the classes)',
             [] if r.rc == 1 and 'wm_mods.Net' in r.out else
             ['exit %d: %s' % (r.rc, r.out[-300:])])

    line = c.refused(3, 'strip-module', os.path.join(tmp, 'root.pt'), os.path.join(tmp, 's.pt'))
    t.report('a key rewrite of a module tree is refused, pointing at extract',
             [] if 'extract' in line else [line])

    # a class that is not a module (plain object state) still refuses the file
    cfg = wm_mods.Config()
    cfg.lr = 0.1
    bad = os.path.join(tmp, 'config.pt')
    torch.save({'w': torch.ones(2), 'cfg': cfg}, bad)
    line = c.refused(3, 'inspect', bad)
    t.report('an object of an unknown class that is not a module is still refused',
             [] if "refused global 'wm_mods.Config'" in line else [line])


main()
sys.exit(t.summary())
