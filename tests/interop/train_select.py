#!/usr/bin/env python3
"""Interop test: training checkpoints through every key rewrite and output
format, as torch and the safetensors package load the results (issue 27).

Sources: checkpoints saved by the torch running the test (a plain training
dict of a DataParallel model with SGD, as zip and as legacy; a
Lightning-style dict with Adam; a dict of a model, integers and the RNG
state, which torch 1.13's weights-only loader accepts whole) and the
committed fixtures train_ckpt.pth, legacy_train.pth, lightning.pth
(tagged cuda:0, loaded with map_location='cpu') and train/gan.pth (two
models).  For each: strip-module, add-module, unwrap and rename, with and
without --select, to pth-zip (OUT.pth), pth-legacy (--to), safetensors
(OUT.safetensors) and safetensors by --to (OUT.bin); then convert and
extract the same way.  Each output is loaded:

  - a pth that holds the whole checkpoint: with torch.load(weights_only=True)
    wherever the source loads so (the same torch), else as a trusted file;
    equal to the source with the selected state dict's keys (else every
    model's) rewritten, every other value as it was;
  - a pth that holds one state dict (convert --select, extract):
    torch.load(weights_only=True), in 1.13 and 2.x alike (map_location='cpu'
    for the cuda:0 fixtures, as for every load here);
  - safetensors: safetensors.torch.load_file;
and a state dict written alone must equal the source's selected one (the
model's when --select is not given), keys rewritten, values bit for bit.
strip-module and unwrap of a DataParallel model's checkpoint must load
into the bare model with load_state_dict(strict=True).  A file with two
models and no --select is refused for safetensors (exit 2).
"""
import os
import sys

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as c  # noqa: E402  (exit 77 without torch)
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

c.need('safetensors')
from safetensors.torch import load_file  # noqa: E402

t = c.Tally()
t.need(c.CKPT, 'CKPT')


def net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))


def trained_dp(opt_kind):
    m = nn.DataParallel(net())
    opt = (torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) if opt_kind == 'sgd'
           else torch.optim.Adam(m.parameters(), lr=0.01))
    torch.manual_seed(1)
    for _ in range(2):
        opt.zero_grad()
        m(torch.randn(5, 4)).sum().backward()
        opt.step()
    return m, opt


class Lit(nn.Module):
    """A LightningModule's shape: the network as self.model."""

    def __init__(self):
        super().__init__()
        self.model = net()


def sources():
    """name -> (path, the model state dicts' paths, bare model or None:
    the module strip-module's output loads into)."""
    m, opt = trained_dp('sgd')
    plain = {'epoch': 3, 'model_state_dict': m.state_dict(),
             'optimizer_state_dict': opt.state_dict(), 'loss': 0.25}
    lit = Lit()
    lopt = torch.optim.Adam(lit.parameters(), lr=0.01)
    lopt.zero_grad()
    lit.model(torch.randn(5, 4)).sum().backward()
    lopt.step()
    lightning = {'epoch': 2, 'global_step': 100, 'state_dict': lit.state_dict(),
                 'optimizer_states': [lopt.state_dict()], 'lr_schedulers': [],
                 'hyper_parameters': {'lr': 0.01}}
    ints = {'epoch': 3, 'step': 120, 'model': m.state_dict(),
            'rng_state': torch.get_rng_state()}
    d = c.DATA
    return {
        'plain.pth': (c.save(plain, c.scratch('plain.pth')), [['model_state_dict']], net),
        'plain_legacy.pth': (c.save(plain, c.scratch('plain_legacy.pth'), 'legacy'),
                             [['model_state_dict']], net),
        'lightning_style.pth': (c.save(lightning, c.scratch('lightning_style.pth')),
                                [['state_dict']], None),
        'ints.pth': (c.save(ints, c.scratch('ints.pth')), [['model']], net),
        'train_ckpt.pth': (os.path.join(d, 'train_ckpt.pth'), [['model_state_dict']], None),
        'legacy_train.pth': (os.path.join(d, 'legacy_train.pth'), [['model_state_dict']], None),
        'lightning.pth': (os.path.join(d, 'lightning.pth'), [['state_dict']], None),
        'gan.pth': (os.path.join(d, 'train', 'gan.pth'), [['generator'], ['discriminator']],
                    None),
    }


RULES = {
    'strip-module': (['strip-module'], lambda k: k[len('module.'):] if k.startswith('module.') else k),
    'add-module': (['add-module'], lambda k: 'module.' + k),
    'unwrap': (['unwrap'], lambda k: c.WRAP_RE.sub('', k)),
    'rename': (['rename', '-e', r's/\.bias$/.b/'], lambda k: k[:-5] + '.b' if k.endswith('.bias') else k),
    None: ([], lambda k: k),
}

FORMATS = {  # name -> (extra arguments, OUT's name, what it is)
    'pth-zip': ([], 'out.pth', 'pth'),
    'pth-legacy': (['--to', 'pth-legacy'], 'out.pth', 'pth'),
    'safetensors': ([], 'out.safetensors', 'safetensors'),
    'safetensors by --to': (['--to', 'safetensors'], 'out.bin', 'safetensors'),
}


def at(o, path):
    for k in path:
        o = o[k]
    return o


def load(path, weights_only):
    """torch.load on the CPU (the fixtures are tagged cuda:0)."""
    if weights_only:
        return torch.load(path, map_location='cpu', weights_only=True)
    return c.load_trusted(path, map_location='cpu')


def same(a, b, where, rewritten, rule):
    """What differs between A (the source) and B, the mappings at the paths
    REWRITTEN having their keys rewritten by RULE."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        ok = (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and
              a.dtype == b.dtype and a.shape == b.shape and
              c.raw_bytes(a) == c.raw_bytes(b))
        return [] if ok else ['%s: tensors differ' % c.fmt(where)]
    if isinstance(a, dict):
        if not isinstance(b, dict):
            return ['%s: %s, not a dict' % (c.fmt(where), type(b).__name__)]
        keys = [rule(k) for k in a] if where in rewritten else list(a)
        if keys != list(b):
            return ['%s: keys %r, expected %r' % (c.fmt(where), list(b)[:4], keys[:4])]
        return [e for k, nk in zip(a, keys) for e in same(a[k], b[nk], where + [k], rewritten, rule)]
    if isinstance(a, (list, tuple)):
        if not isinstance(b, (list, tuple)) or len(a) != len(b):
            return ['%s: %r vs %r' % (c.fmt(where), type(a).__name__, type(b).__name__)]
        return [e for i, (x, y) in enumerate(zip(a, b)) for e in same(x, y, where + [i], rewritten, rule)]
    if type(a).__module__ == 'argparse':
        return [] if vars(a) == vars(b) else ['%s: %r vs %r' % (c.fmt(where), a, b)]
    return [] if a == b else ['%s: %r vs %r' % (c.fmt(where), a, b)]


def one_sd(sd, src_sd, rule, ordered):
    """A state dict written alone: SRC_SD's keys rewritten by RULE, its
    values bit for bit (in order when ORDERED: a pth keeps it)."""
    want = [rule(k) for k in src_sd]
    got = list(sd)
    if (got if ordered else sorted(got)) != (want if ordered else sorted(want)):
        return ['keys %r, expected %r' % (got, want)]
    return [e for k in src_sd for e in same(src_sd[k], sd[rule(k)], [rule(k)], [], rule)]


def check(src_name, src, models, bare, cmd, rule_name, select, fmt_name):
    """One output of CMD (a key rewrite, convert or extract)."""
    args, rule = RULES[rule_name]
    fargs, out_name, kind = FORMATS[fmt_name]
    out = c.scratch(out_name)
    if os.path.exists(out):
        os.unlink(out)
    sel = ['--select', '/'.join(models[0])] if select else []
    argv = (args if cmd == 'rewrite' else [cmd]) + sel + fargs + \
        ['--allow-global', 'argparse.Namespace', src, out]
    several = len(models) > 1 and not select
    if several and (kind == 'safetensors' or cmd == 'extract'):
        line = c.refused(2, *argv)
        return [] if "'generator', 'discriminator'" in line and '--select' in line else \
            ['the refusal does not name both models and --select: %s' % line]
    r = c.ckpt_expect(0, *argv)
    source_wo, why = c.loads_weights_only(src, map_location='cpu')
    original = load(src, source_wo)
    whole = cmd == 'rewrite' and kind == 'pth' or cmd == 'convert' and kind == 'pth' and not select
    errs = []
    if whole:
        wo, why_out = c.loads_weights_only(out, map_location='cpu')
        if wo != source_wo:
            errs.append('weights_only=True: the source %s, the output %s (%s)' % (
                'loads' if source_wo else 'does not', 'loads' if wo else 'does not', why_out))
        got = load(out, wo)
        rewritten = models[:1] if select or cmd != 'rewrite' else models
        errs += same(original, got, [], rewritten if cmd == 'rewrite' else [], rule)
        sd = at(got, models[0])
    else:
        if kind == 'safetensors':
            sd = load_file(out)
        else:
            # (map_location: the fixtures' cuda:0 tags, on this CPU machine)
            ok, why_out = c.loads_weights_only(out, map_location='cpu')
            if not ok:
                return ['torch.load(weights_only=True) refuses it: %s' % why_out]
            sd = torch.load(out, map_location='cpu', weights_only=True)
        errs += one_sd(sd, at(original, models[0]), rule, kind == 'pth')
    # the stderr line of a safetensors OUT that is one state dict of many
    if kind == 'safetensors' and not (cmd == 'convert' and select) and cmd != 'extract':
        name = '/'.join(models[0])
        want = "safetensors holds tensors only: wrote the %sstate dict '%s'" % (
            '' if select else "model's ", name)
        if want not in r.err:
            errs.append('stderr %r lacks %r' % (r.err.strip(), want))
    if bare and rule_name in ('strip-module', 'unwrap'):
        e = c.strict_load_error(bare(), sd)
        if e:
            errs.append('load_state_dict(strict=True) into the bare model: %s' % e[:200])
    return errs


SOURCES = sources()
for src_name, (src, models, bare) in SOURCES.items():
    for rule_name in ('strip-module', 'add-module', 'unwrap', 'rename'):
        for fmt_name in FORMATS:
            for select in (False, True):
                t.run('%s: %s%s to %s' % (src_name, rule_name, ' --select' if select else '',
                                          fmt_name),
                      check, src_name, src, models, bare, 'rewrite', rule_name, select, fmt_name)
    for cmd in ('convert', 'extract'):
        for fmt_name in FORMATS:
            if cmd == 'extract' and fmt_name == 'pth-legacy':
                continue  # extract writes pth-zip or safetensors
            for select in (False, True):
                t.run('%s: %s%s to %s' % (src_name, cmd, ' --select' if select else '', fmt_name),
                      check, src_name, src, models, bare, cmd, None, select, fmt_name)

sys.exit(t.summary())
