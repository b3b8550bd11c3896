#!/usr/bin/env python3
"""TorchScript archives (torch.jit.save), under the torch this runs under.

A Net of torch.nn modules (Sequential, BatchNorm2d, a None bias, a shared
submodule, a tied weight, a frozen parameter, a non-persistent buffer),
scripted and traced, saved with torch.jit.save (and with extra files):

  - `ckpt inspect` says format "torchscript" and one state dict of source
    "torchscript" whose keys are torch.jit.load(f).state_dict()'s, in its
    order, with its dtypes, shapes and values (CRC-32 of `inspect --stats`);
  - `ckpt extract` writes a pth that plain weights-only torch.load reads,
    equal to that state dict, which load_state_dict(strict=True) takes into
    the eager model once the non-persistent buffer TorchScript includes is
    left out (the one name that differs); to safetensors as well;
  - `ckpt diff` finds the archive and its extract equal;
  - `ckpt scan` says TorchScript archive (text and JSON), lists its globals;
  - key rewrites and convert to pth are refused (exit 3, one line) pointing
    at extract.
"""
import json
import os
import sys

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as c  # noqa: E402  (exit 77 without torch)
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

t = c.Tally()
t.need(c.CKPT, 'CKPT')


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = nn.Linear(4, 4)
        self.register_buffer('running', torch.arange(4.0))
        self.register_buffer('scratch', torch.zeros(2), persistent=False)

    def forward(self, x):
        return self.inner(x) + self.running


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.seq = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.ReLU(), Block())
        self.nobias = nn.Linear(4, 4, bias=False)
        self.head = nn.Linear(4, 4, bias=False)
        self.tied = nn.Linear(4, 4, bias=False)
        self.tied.weight = self.head.weight
        self.shared = nn.Linear(4, 4)
        self.shared_again = self.shared
        self.register_parameter('frozen', nn.Parameter(torch.ones(2), requires_grad=False))

    def forward(self, x):
        y = self.seq(x)
        y = self.nobias(y) + self.head(y) + self.tied(y)
        return self.shared(y) + self.shared_again(y) + self.frozen.sum()


def listed(path):
    r = c.ckpt_expect(0, 'inspect', '--json', '--stats', path)
    return json.loads(r.stdout.decode())


def same_as_jit(j, sd):
    errs = []
    keys = [x['path'][-1] for x in j['tensors']]
    if keys != list(sd):
        errs.append('keys %s, torch.jit.load(f).state_dict() %s' % (keys, list(sd)))
    for x in j['tensors']:
        v = sd.get(x['path'][-1])
        if v is None:
            continue
        if x['dtype'] != c.dtype_name(v.dtype) or x['shape'] != list(v.shape):
            errs.append('%s: %s %s, torch %s %s' % (x['path'][-1], x['dtype'], x['shape'],
                                                    v.dtype, list(v.shape)))
        elif x.get('crc32') != c.crc32(v):
            errs.append('%s: CRC-32 %s, torch %s' % (x['path'][-1], x.get('crc32'),
                                                     c.crc32(v)))
    return errs


def main():
    torch.manual_seed(0)
    tmp = c.scratch()
    net = Net().eval()
    x = torch.randn(3, 4)
    files = {
        'scripted': torch.jit.script(net),
        'traced': torch.jit.trace(net, (x,), check_trace=False),
    }
    for name, m in files.items():
        path = os.path.join(tmp, name + '.pt')
        torch.jit.save(m, path, _extra_files={'meta.json': '{"a":1}'})
        sd = torch.jit.load(path, map_location='cpu').state_dict()

        def inspect_check():
            j = listed(path)
            errs = same_as_jit(j, sd)
            if j['format'] != 'torchscript':
                errs.append('format %s' % j['format'])
            src = [s.get('source') for s in j['state_dicts']]
            if src != ['torchscript']:
                errs.append('state dict sources %s' % src)
            return errs
        t.run('%s: inspect lists torch.jit.load(f).state_dict()' % name, inspect_check)

        def extract_check(d):
            out = os.path.join(d, 'x.pth')
            c.ckpt_expect(0, 'extract', path, out)
            got = torch.load(out, weights_only=True)  # plain, weights-only
            errs = []
            if list(got) != list(sd):
                errs.append('extract keys %s' % list(got))
            errs += ['%s differs' % k for k in sd if k in got and not torch.equal(got[k], sd[k])]
            errs += ['%s requires grad' % k for k, v in got.items() if v.requires_grad]
            # the names differ from the eager model's only by the
            # non-persistent buffer TorchScript lists among its buffers
            eager = Net()
            extra = sorted(set(got) - set(eager.state_dict()))
            if extra != ['seq.3.scratch']:
                errs.append('names beyond the eager state dict: %s' % extra)
            got.pop('seq.3.scratch', None)
            err = c.strict_load_error(eager, got)
            if err:
                errs.append('load_state_dict(strict=True): %s' % err)
            r = c.ckpt_expect(0, 'diff', path, out)
            if '0 differ' not in r.out:
                errs.append('diff: %s' % r.out.strip()[:200])
            st = os.path.join(d, 'x.safetensors')
            c.ckpt_expect(0, 'extract', path, st)
            from safetensors.torch import load_file
            sf = load_file(st)
            # tied names are written once (safetensors shares no storage)
            tied = {'tied.weight', 'shared_again.weight', 'shared_again.bias'}
            if sorted(sf) != sorted(set(sd) - tied) or any(
                    not torch.equal(sf[k], sd[k]) for k in sf):
                errs.append('safetensors extract differs: %s' % sorted(sf))
            return errs
        try:
            import safetensors  # noqa: F401
            t.run('%s: extract loads with plain torch.load, strict into the eager model'
                  % name, extract_check, tmp=True)
        except ImportError:
            t.skip('%s: extract' % name, 'no safetensors module')

        def scan_check():
            r = c.ckpt('scan', path)
            errs = []
            if 'TorchScript archive' not in r.out:
                errs.append('scan text does not say TorchScript: %r' % r.out[:200])
            j = json.loads(c.ckpt('scan', '--json', path).out)['files'][0]
            if j['format'] != 'torchscript':
                errs.append('scan JSON format %s' % j['format'])
            if not any(g['global'].startswith('__torch__.') for g in j['globals']):
                errs.append('scan lists no __torch__ class')
            return errs
        t.run('%s: scan says TorchScript archive' % name, scan_check)

        def refusals(d):
            errs = []
            for args in (('strip-module', path, os.path.join(d, 'a.pth')),
                         ('convert', path, os.path.join(d, 'b.pth'))):
                r = c.ckpt(*args)
                errs += c.refusal_errors(r, 3)
                if 'extract' not in r.err:
                    errs.append('`%s` does not point at extract: %s' % (r.cmd, r.err.strip()))
            return errs
        t.run('%s: rewrites refused, pointing at extract' % name, refusals, tmp=True)
    sys.exit(t.summary())


if __name__ == '__main__':
    main()
