"""DeepSpeed ZeRO checkpoint folders (issue 17), under torch 2.x (the
fixtures are torch 2.15 + DeepSpeed 0.19.8 runs on the CPU; torch 1.13
skips): for every DeepSpeed case of tests/fixtures/distributed/MANIFEST.json

  - ckpt convert FOLDER OUT.pth loads with plain torch.load (weights only)
    and load_state_dict(strict=True) into the generator's model;
  - it equals the live model's fp32 state dict (the truth) tensor for tensor
    (dtype, shape, values), always;
  - it equals zero_to_fp32's output (the .ref.pth) tensor for tensor in
    zero_to_fp32's key order wherever zero_to_fp32 works, except where ckpt
    says it differs: stage-1 frozen parameters (zero_to_fp32 drops them) and
    16-bit frozen parameters (zero_to_fp32 leaves them so; ckpt upcasts);
  - --select module equals mp_rank_00's module (.module.pth) at stages 1/2,
    and is refused at stage 3 (empty placeholders);
  - safetensors output, inspect --json (format, source, layout, runs),
    inspect --stats, diff against the live state dict, and scan of the
    folder (every rank file safe);
and a BF16_Optimizer folder (bf16 + ZeRO-1 as DeepSpeed's BF16_Optimizer
saves it: no zero_stage, which zero_to_fp32 refuses) made from the bf16
ZeRO-1 case, whose weights ckpt still gives.

Fixtures: tests/fixtures/make_distributed.py; CKPT_DIST_FIXTURES names
another folder holding MANIFEST.json (and make_distributed.py beside it or
in tests/fixtures).  Skipped (77) when there are none.
"""
import json
import os
import shutil
import sys

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as c  # noqa: E402  (exits 77 without torch)

torch = c.torch
if int(torch.__version__.split('.')[0]) < 2:
    print('torch %s: the DeepSpeed fixtures are torch 2.x runs; skipping' % torch.__version__)
    sys.exit(c.SKIP)

FIX = os.environ.get('CKPT_DIST_FIXTURES') or os.path.join(c.SRCDIR, 'tests', 'fixtures',
                                                            'distributed')
MANIFEST = os.path.join(FIX, 'MANIFEST.json')
if not os.path.exists(MANIFEST):
    print('no %s (tests/fixtures/make_distributed.py makes it): skipping' % MANIFEST)
    sys.exit(c.SKIP)
with open(MANIFEST) as fh:
    CASES = [e for e in json.load(fh)['cases'] if e['kind'] == 'deepspeed']
if not CASES:
    print('no DeepSpeed case in %s: skipping' % MANIFEST)
    sys.exit(c.SKIP)

# the generator's models (DsNet), from beside the manifest or tests/fixtures
for d in (os.path.dirname(os.path.abspath(FIX)), os.path.join(c.SRCDIR, 'tests', 'fixtures')):
    if os.path.exists(os.path.join(d, 'make_distributed.py')):
        sys.path.insert(0, d)
        break
try:
    import make_distributed
    _, DsNet, _ = make_distributed._models()
except Exception as e:  # pragma: no cover
    DsNet = None
    print('the generator\'s models cannot be imported (%s): no strict-load check' % e)

t = c.Tally()
t.need(c.CKPT, 'CKPT')


def fx(rel):
    return os.path.join(FIX, rel)


def tensors_differ(name, a, b, dtype=True):
    """What differs between tensors A and B (dtype unless not DTYPE, shape, values)."""
    if dtype and a.dtype != b.dtype:
        return ['%s: dtype %s, want %s' % (name, a.dtype, b.dtype)]
    if a.shape != b.shape:
        return ['%s: shape %s, want %s' % (name, tuple(a.shape), tuple(b.shape))]
    if not torch.equal(a.to(b.dtype), b):
        return ['%s: values differ' % name]
    return []


def stage_of(case):
    return int(case['name'][4])


def convert(case, out, *extra):
    r = c.ckpt_expect(0, 'convert', '--quiet', *extra, fx(case['path']), out)
    return r


def check_case(case):
    name, stage = case['name'], stage_of(case)
    folder = fx(case['path'])
    out = c.scratch(name + '.pth')
    r = c.ckpt_expect(0, 'convert', folder, out)
    notes = r.err
    sd = torch.load(out)  # plain torch.load: weights only in torch 2.x
    live = torch.load(fx(case['live']), weights_only=False)

    @t.case('%s: equals the live fp32 state dict (the truth)' % name)
    def _():
        errs = []
        if set(sd) != set(live):
            errs.append('keys %s, want %s' % (sorted(sd), sorted(live)))
        for k in live:
            if k in sd:
                errs += tensors_differ(k, sd[k], live[k])
        assert not errs, '; '.join(errs)

    ref = torch.load(fx(case['reference']), weights_only=False) if case['reference'] else None
    if ref is None:
        @t.case('%s: zero_to_fp32 fails; ckpt reads it and says how it differs' % name)
        def _():
            err = case['reference_error'] or ''
            if 'not a zero checkpoint' in err:  # a BF16_Optimizer checkpoint
                assert 'BF16_Optimizer' in notes and 'zero_to_fp32 refuses it' in notes, notes
            else:
                raise c.Skip('zero_to_fp32 failed: %s' % err)
    else:
        @t.case('%s: equals zero_to_fp32 tensor for tensor, in its order' % name)
        def _():
            errs = []
            dropped = [k for k in sd if k not in ref]
            # ckpt's only extra keys: stage-1 frozen parameters, said in a notice
            if dropped and not (stage == 1 and 'zero_to_fp32 drops them' in notes):
                errs.append('keys zero_to_fp32 lacks, unexplained: %s' % dropped)
            if [k for k in sd if k in ref] != list(ref):
                errs.append('order %s, want %s' % (list(sd), list(ref)))
            for k in ref:
                if k not in sd:
                    errs.append('%s missing' % k)
                    continue
                upcast = (ref[k].dtype in (torch.bfloat16, torch.float16) and
                          sd[k].dtype == torch.float32)
                if upcast and 'zero_to_fp32 leaves them so' not in notes:
                    errs.append('%s: upcast from %s without a notice' % (k, ref[k].dtype))
                errs += tensors_differ(k, sd[k], ref[k], dtype=not upcast)
            # a tied alias is one tensor, as in zero_to_fp32's output
            if 'head.weight' in sd and sd['head.weight'].data_ptr() != sd['emb.weight'].data_ptr():
                errs.append('head.weight is not emb.weight\'s tensor')
            assert not errs, '; '.join(errs)

    if DsNet is not None:
        @t.case('%s: load_state_dict(strict=True) into %s' % (name, case.get('model') or 'DsNet'))
        def _():
            err = c.strict_load_error(DsNet(), sd)
            assert err is None, err

    mod = c.scratch(name + '.module.pth')
    if stage < 3:
        @t.case('%s: --select module equals mp_rank_00\'s module' % name)
        def _():
            convert(case, mod, '--select', 'module')
            got = torch.load(mod)
            want = torch.load(fx(case['module']), weights_only=False)
            errs = [] if list(got) == list(want) else ['keys %s, want %s' % (list(got), list(want))]
            for k in want:
                if k in got:
                    errs += tensors_differ(k, got[k], want[k])
            assert not errs, '; '.join(errs)
    else:
        @t.case('%s: --select module refused (stage 3: empty placeholders)' % name)
        def _():
            r = c.ckpt('convert', '--select', 'module', folder, mod)
            # (the reader's notices come first, then the one error line)
            assert r.rc == 3 and 'placeholders' in r.err.splitlines()[-1], (r.rc, r.err)
            assert not os.path.exists(mod), 'OUT written'

    @t.case('%s: safetensors output equals the pth output' % name)
    def _():
        st = c.scratch(name + '.safetensors')
        convert(case, st, '--no-dedupe')  # the tied alias written under both names
        from safetensors.torch import load_file
        got = load_file(st)
        errs = [] if set(got) == set(sd) else ['keys %s' % sorted(got)]
        for k in sd:
            if k in got:
                errs += tensors_differ(k, got[k], sd[k])
        assert not errs, '; '.join(errs)

    @t.case('%s: inspect --json: format, source, layout, runs by rank' % name)
    def _():
        j = json.loads(c.ckpt_expect(0, 'inspect', '--json', folder).out)
        assert j['format'] == 'deepspeed', j['format']
        assert [s['source'] for s in j['state_dicts']] == ['deepspeed'], j['state_dicts']
        lay = j['layout']
        assert lay['zero_stage'] == stage and lay['world_size'] == case['ranks'], lay
        assert len(lay['rank_files']) == case['ranks'], lay['rank_files']
        byname = {tuple(x['path']): x for x in j['tensors']}
        # a trainable parameter's runs come from the optim files, and at
        # stage 3 from every rank that holds part of it
        vec = byname[('vec',)]
        ranks = [r['rank'] for r in vec['runs']]
        assert all(r is not None for r in ranks), vec['runs']
        if stage == 3:
            assert ranks == list(range(case['ranks'])), ranks  # 35 elements: a slice each
        assert sum(r['nbytes'] for r in vec['runs']) == 35 * 4, vec['runs']

    @t.case('%s: inspect --stats (every record read, CRC-checked) and diff against live' % name)
    def _():
        c.ckpt_expect(0, 'inspect', '--stats', folder)
        c.ckpt_expect(0, 'diff', folder, fx(case['live']))

    @t.case('%s: scan DIR: every rank file safe (DeepSpeed\'s classes are known data)' % name)
    def _():
        j = json.loads(c.ckpt_expect(0, 'scan', '--json', folder).out)
        assert len(j['files']) == len([f for f in os.listdir(os.path.join(
            folder, open(os.path.join(folder, 'latest')).read().strip())) if f.endswith('.pt')]), \
            [f['file'] for f in j['files']]


for case in CASES:
    check_case(case)


# ---- BF16_Optimizer: bf16 + ZeRO-1 as DeepSpeed's BF16_Optimizer saves it ----------------------

def bf16_optimizer():
    base = [e for e in CASES if e['name'] == 'zero1_bf16_2']
    if not base:
        raise c.Skip('no zero1_bf16_2 case')
    c.need('deepspeed')  # the optim pickles name DeepSpeed's classes
    case = base[0]
    folder = c.scratch('bf16_optimizer')
    shutil.copytree(fx(case['path']), folder)
    tag = open(os.path.join(folder, 'latest')).read().strip()
    for f in os.listdir(os.path.join(folder, tag)):
        if f.endswith('_optim_states.pt'):
            p = os.path.join(folder, tag, f)
            sd = torch.load(p, weights_only=False)
            osd = sd['optimizer_state_dict']
            # BF16_Optimizer.state_dict(): no zero_stage, no per-parameter
            # paddings (the fixture may be one already: DeepSpeed picks it
            # for bf16 + ZeRO-1 in some configurations)
            osd.pop('zero_stage', None)
            osd.pop('param_alignment_paddings', None)
            torch.save(sd, p)
    errs = []
    try:
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
        get_fp32_state_dict_from_zero_checkpoint(folder)
        errs.append('zero_to_fp32 read it (the case shows nothing)')
    except ValueError as e:
        if 'not a zero checkpoint' not in str(e):
            errs.append('zero_to_fp32: %s' % e)
    out = c.scratch('bf16_optimizer.pth')
    r = c.ckpt_expect(0, 'convert', folder, out)
    if 'BF16_Optimizer' not in r.err:
        errs.append('no notice that zero_to_fp32 refuses it: %r' % r.err)
    got = torch.load(out)
    live = torch.load(fx(case['live']), weights_only=False)
    if set(got) != set(live):
        errs.append('keys %s, want %s' % (sorted(got), sorted(live)))
    for k in live:
        if k in got:
            errs += tensors_differ(k, got[k], live[k])
    return errs


t.run('BF16_Optimizer folder (zero_to_fp32 refuses it): the live weights', bf16_optimizer)

sys.exit(t.summary())
