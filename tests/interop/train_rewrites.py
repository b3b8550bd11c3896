#!/usr/bin/env python3
"""Interop test: what a key rewrite touches by default (issue 14): model
state dicts only, never an optimizer's per-parameter state nor the training
loop's bookkeeping (doc/design.md, "State dicts").

Real training checkpoints, saved by the torch running the test: plain
dicts with SGD (momentum), Adam and AdamW after two steps; a Lightning-style
dict (state_dict, optimizer_states, lr_schedulers, callbacks with a
ModelCheckpoint-like best_k_models of path -> tensor, loops); an
ultralytics-style dict (model, ema, optimizer, train_args, ...: plain state
dicts).  For each, `add-module` of the plain file, `strip-module` and
`unwrap` of the DataParallel one, without --select; then with torch:
the model state dicts load (strict) into the wrapped / plain model, every
optimizer's state loads into an optimizer over that model's parameters and
one step() runs, and everything but the model state dicts is as saved
(best_k_models' paths, lr_schedulers, loops, train_args).  `ckpt inspect
--json` marks the model state dicts "model": true and the others false.
"""
import copy
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


def net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))


OPTS = {
    'sgd': lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
    'adam': lambda p: torch.optim.Adam(p, lr=0.01),
    'adamw': lambda p: torch.optim.AdamW(p, lr=0.01, weight_decay=0.1),
}


def trained(kind, wrapped):
    m = net()
    if wrapped:
        m = nn.DataParallel(m)
    opt = OPTS[kind](m.parameters())
    torch.manual_seed(1)
    for _ in range(2):
        opt.zero_grad()
        m(torch.randn(5, 4)).sum().backward()
        opt.step()
    return m, opt


# each layout: (build(model, opt) -> object, model state dict paths,
#               optimizer state paths)
def plain(m, opt, kind):
    return {'epoch': 2, 'model_state_dict': m.state_dict(),
            'optimizer_state_dict': opt.state_dict(), 'loss': 0.25}


def lightning(m, opt, kind):
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1)
    return {
        'epoch': 2, 'global_step': 4, 'pytorch-lightning_version': '2.0.0',
        'state_dict': m.state_dict(),
        'loops': {'fit_loop': {'state_dict': {}, 'epoch_progress': {
            'total': {'ready': 2, 'completed': 2}}}},
        'callbacks': {"ModelCheckpoint{'monitor': 'val_loss', 'mode': 'min'}": {
            'monitor': 'val_loss', 'best_model_score': torch.tensor(0.5),
            'best_model_path': '/ckpt/epoch=1.ckpt',
            'best_k_models': {'/ckpt/epoch=1.ckpt': torch.tensor(0.5),
                              '/ckpt/epoch=0.ckpt': torch.tensor(0.7)},
            'kth_best_model_path': '/ckpt/epoch=0.ckpt'}},
        'optimizer_states': [opt.state_dict()],
        'lr_schedulers': [sched.state_dict()],
        'hyper_parameters': {'lr': 0.01},
    }


def ultralytics(m, opt, kind):
    ema = copy.deepcopy(m.state_dict())
    return {'epoch': 2, 'best_fitness': 0.5, 'model': m.state_dict(), 'ema': ema,
            'updates': 4, 'optimizer': opt.state_dict(),
            'train_args': {'model': 'yolov8n.yaml', 'lr0': 0.01, 'epochs': 3},
            'train_metrics': {'metrics/mAP50(B)': 0.1}, 'date': '2024-01-01T00:00:00',
            'version': '8.4.190'}


LAYOUTS = {
    'plain': (plain, [['model_state_dict']], [['optimizer_state_dict']]),
    'lightning': (lightning, [['state_dict']], [['optimizer_states', 0]]),
    'ultralytics': (ultralytics, [['model'], ['ema']], [['optimizer']]),
}


def at(o, path):
    for k in path:
        o = o[k]
    return o


def same(a, b, where='root'):
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        ok = (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and
              a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b))
        return [] if ok else ['%s: tensors differ' % where]
    if isinstance(a, dict):
        if not isinstance(b, dict) or list(a) != list(b):
            return ['%s: keys %r vs %r' % (where, list(a)[:4], list(b)[:4] if isinstance(b, dict) else b)]
        return [e for k in a for e in same(a[k], b[k], '%s/%s' % (where, k))]
    if isinstance(a, (list, tuple)):
        if len(a) != len(b):
            return ['%s: lengths %d vs %d' % (where, len(a), len(b))]
        return [e for i, (x, y) in enumerate(zip(a, b)) for e in same(x, y, '%s/%d' % (where, i))]
    return [] if a == b else ['%s: %r vs %r' % (where, a, b)]


def check(layout, kind, cmd):
    build, models, opts = LAYOUTS[layout]
    wrapped_in = cmd != 'add-module'
    m, opt = trained(kind, wrapped_in)
    src = c.scratch('%s_%s_%s.pth' % (layout, kind, cmd))
    obj = build(m, opt, kind)
    torch.save(obj, src)
    original = torch.load(src, weights_only=False)
    out = src[:-4] + '.out.pth'
    c.ckpt_expect(0, cmd, src, out)
    got = torch.load(out, weights_only=False)
    errs = []
    # the model state dicts: load into the model of the other kind
    for p in models:
        target = nn.DataParallel(net()) if cmd == 'add-module' else net()
        target.load_state_dict(at(got, p), strict=True)
    # the optimizers: load and step over that model
    for p in opts:
        errs += same(at(original, p), at(got, p), '/'.join(map(str, p)))
        target = nn.DataParallel(net()) if cmd == 'add-module' else net()
        target.load_state_dict(at(got, models[0]), strict=True)
        o = OPTS[kind](target.parameters())
        o.load_state_dict(at(got, p))
        o.zero_grad()
        target(torch.randn(5, 4)).sum().backward()
        o.step()  # steps the loaded state in place: compared above
    # everything else as saved
    for k in original:
        if [k] not in models and not any(p[0] == k for p in opts):
            errs += same(original[k], got[k], k)
    # inspect marks which state dicts are a model's
    j = json.loads(c.ckpt_expect(0, 'inspect', '--json', src).out)
    for sd in j['state_dicts']:
        want = sd['path'] in models
        if sd['model'] != want:
            errs.append('inspect: state dict %r "model": %r' % (sd['path'], sd['model']))
    return errs


for layout in LAYOUTS:
    for kind in OPTS:
        for cmd in ('add-module', 'strip-module', 'unwrap'):
            t.run('%s %s: %s, load + optimizer step' % (layout, kind, cmd), check,
                  layout, kind, cmd)

sys.exit(t.summary())
