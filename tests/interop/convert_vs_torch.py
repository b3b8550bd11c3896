#!/usr/bin/env python3
"""Interop test: `ckpt convert` against PyTorch and the safetensors package.

Environment:
  CKPT    path of the ckpt binary (default: $srcdir/ckpt)
  srcdir  repository root (default: two levels above this script)

Cases (each prints `ok NAME` or `FAIL NAME: why`):

  chain FIXTURE      pth-zip -> safetensors -> pth-zip -> pth-legacy ->
                     pth-zip, and safetensors -> pth-legacy directly, on
                     dp_mlp, mlp, dtypes (without its complex tensors, which
                     safetensors has no dtype for), bn, keepvars,
                     ae_model_parallel, legacy_mlp, train_ckpt and
                     lightning (--select: the root's scalars go to
                     __metadata__), a generated checkpoint with one state
                     dict and scalars (taken without --select, the scalars
                     in __metadata__), and a generated language model whose
                     output layer is tied to its embedding.  Every file
                     written loads (torch.load(weights_only=True), or
                     safetensors.torch.load_file and safe_open), and holds
                     the original tensors bit for bit (dtype, shape, bytes
                     of the values) under the original names, in the
                     original order (names restored from ckpt.tied may come
                     last: printed as a note, not a failure); tied tensors
                     (two names, one storage, same view) come back as one
                     storage; other views come back contiguous, each with
                     its own storage; storages are tagged `cpu` after
                     safetensors; the state dict loads into its model with
                     strict=True.  The safetensors files are checked byte
                     by byte: 8-byte little-endian header length, a JSON
                     object padded with spaces to a multiple of 8 that ends
                     on a 64-byte boundary, entries {dtype, shape,
                     data_offsets} in the state dict's order, tensors packed
                     back to back to the end of the file in the order
                     ckpt-convert(1) gives (c.st_alignment: each at a
                     multiple of its element size, those of a multiple of 64
                     bytes on a 64-byte boundary), __metadata__ {"format": "pt"} plus
                     "ckpt.tied" (a JSON object alias -> name) and the
                     selected file's scalars; `ckpt inspect --json --stats`
                     of every output agrees (dtype, shape, crc32).
  direct FIXTURE     every fixture of tests/data to pth-zip and to pth-legacy:
                     torch loads the same object (containers, key order,
                     non-tensor values, per tensor class, requires_grad,
                     dtype, shape, stride, offset, location tag, storage
                     bytes, storage sharing); weights_only=True wherever the
                     fixture loads so.
  complex            dtypes.pth to safetensors: exit 3, one line naming
                     complex64, no OUT; to pth-legacy it works.
  no-dedupe          tied tensors written once per name, no ckpt.tied; back
                     in pth they are separate storages.
  theirs             files written by safetensors.torch.save_file (every
                     dtype torch 1.13 and safetensors share, 0-dim, empty,
                     user metadata) and save_model (tied weights): ckpt
                     inspect --json --stats agrees, convert to pth loads
                     equal, convert to safetensors keeps the metadata.
  sharded            a set of shards (safetensors, pth-zip, pth-legacy)
                     with a model.safetensors.index.json: to one pth and to
                     safetensors, equal to the unsharded state dict.
  sharded output     --shard-size to NAME.safetensors.index.json and
                     NAME.index.json: every shard loads (load_file,
                     torch.load) with the tensors the weight_map puts there,
                     total_size right, back to one file equal; tied weights
                     written once and tied again when read back.
  dtype T            --dtype float16 / bfloat16 / float32 on a file of edge
                     values (signed zeros, NaN, infinities, max, lowest,
                     smallest normal, subnormals, halfway cases, values
                     that overflow the target) and random values of every
                     magnitude, in float64/32/16/bfloat16 tensors and views,
                     with int and bool tensors beside them: bit for bit what
                     torch's .to(T) gives, ints and bools untouched; to pth,
                     pth-legacy and safetensors.
  hostile            every tests/bad/st_*.safetensors: safetensors refuses
                     it and so does ckpt (convert exits 3, nothing written);
                     a header of exactly 100,000,000 bytes is read by both,
                     one byte more by neither.
  memory             converting 24 tensors of 8 MiB (to safetensors, to
                     pth-legacy, with --dtype bfloat16, and views that must
                     be gathered) keeps ckpt's peak RSS near one tensor.

Prints `N passed, M failed` last; exits 1 if anything failed, 77 (skip) if
torch or safetensors cannot be imported.

  convert_vs_torch.py [NAME...]    run only the cases whose name starts so
"""
import collections
import functools
import json
import os
import struct
import sys

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as c  # noqa: E402  (exit 77 without torch)

c.need('safetensors', 'safetensors.torch')
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import safetensors  # noqa: E402
import safetensors.torch  # noqa: E402
from safetensors import safe_open  # noqa: E402
import models  # noqa: E402  (tests/fixtures/models.py)

DATA, BAD = c.DATA, c.BAD
refused, Fail = c.refused, c.Fail
ckpt = functools.partial(c.ckpt_expect, 0)    # ckpt ARGS; Fail unless it exits 0
load, sid, raw, crc = c.load_tagged, c.sid, c.raw_bytes, c.crc32
OD = collections.OrderedDict
ST_DTYPES = {
    torch.float64: 'F64', torch.float32: 'F32', torch.float16: 'F16',
    torch.bfloat16: 'BF16', torch.int64: 'I64', torch.int32: 'I32',
    torch.int16: 'I16', torch.int8: 'I8', torch.uint8: 'U8',
    torch.bool: 'BOOL'}
FLOATS = (torch.float64, torch.float32, torch.float16, torch.bfloat16)


def inspect_json(path, *opts):
    r = ckpt('inspect', '--json', '--stats', '--allow-global',
             'argparse.Namespace', *opts, path)
    return json.loads(r.stdout)


# --------------------------------------------------------------------------
# torch's view of a file

NOTES = OD()    # (input names, aliases that moved) -> where seen


def check_order(what, got, want, aliases, errs):
    """GOT (names) are WANT's; in WANT's order, except that the names
    written only as aliases (ckpt.tied) may have moved: noted, not failed."""
    got, want = list(got), list(want)
    if sorted(got) != sorted(want):
        errs.append('%s: names %s, expected %s' % (what, got[:8], want[:8]))
        return
    strip = lambda ks: [k for k in ks if k not in aliases]  # noqa: E731
    if strip(got) != strip(want):
        errs.append('%s: names in the order %s, expected %s'
                    % (what, strip(got), strip(want)))
    elif got != want:
        moved = [k for k in got if k in aliases]
        NOTES.setdefault((tuple(want), tuple(moved)), []).append(what)


def same_values(name, exp, got, errs):
    """GOT holds EXP's values: dtype, shape and the bytes of the values."""
    if not isinstance(got, torch.Tensor):
        errs.append('%s: %s, expected a tensor' % (name, type(got).__name__))
        return
    if got.dtype != exp.dtype or tuple(got.shape) != tuple(exp.shape):
        errs.append('%s: %s %s, expected %s %s' % (
            name, got.dtype, tuple(got.shape), exp.dtype, tuple(exp.shape)))
    elif raw(got) != raw(exp):
        errs.append('%s: the values differ' % name)


def sharing(sd):
    """Groups (sorted lists of keys, 2 or more) of tensors on one storage."""
    g = {}
    for k, t in sd.items():
        if t.storage().size():
            g.setdefault(sid(t), []).append(k)
    return sorted(sorted(v) for v in g.values() if len(v) > 1)


def tied_groups(sd):
    """Groups of keys that are the same view of one storage (same
    storage, offset, shape, stride, dtype), first key first."""
    out = []
    seen = {}
    for k, t in sd.items():
        key = (sid(t), t.storage_offset(), tuple(t.shape), t.stride(),
               t.dtype) if t.storage().size() else ('empty', k)
        if key in seen:
            out[seen[key]].append(k)
        else:
            seen[key] = len(out)
            out.append([k])
    return [g for g in out if len(g) > 1]


# --------------------------------------------------------------------------
# the safetensors files ckpt writes, byte by byte

def md_match(got, want):
    """__metadata__ GOT is WANT, whose values are strings or predicates
    on the string."""
    if sorted(got) != sorted(want):
        return False
    return all(w(got[k]) if callable(w) else got[k] == w
               for k, w in want.items())


def md_text(want):
    return '{%s}' % ', '.join('%s: %s' % (json.dumps(k), v.__doc__ if
                                          callable(v) else json.dumps(v))
                              for k, v in want.items())


def float_text(x):
    """a predicate: the text is a number that reads back as X exactly"""
    def p(text):
        try:
            return float(text) == x
        except ValueError:
            return False
    p.__doc__ = '(text reading back as %r)' % x
    return p


def check_st_file(path, sd, aliases, metadata, errs):
    """PATH is safetensors holding the state dict SD (tensor values), the
    names in ALIASES ({alias: name}) written only as ckpt.tied, and
    __metadata__ METADATA (without ckpt.tied) -- in SD's order, packed and
    aligned."""
    with open(path, 'rb') as f:
        blob = f.read()
    if len(blob) < 8:
        errs.append('file of %d bytes' % len(blob))
        return
    n = struct.unpack('<Q', blob[:8])[0]
    if n % 8:
        errs.append('header length %d is not a multiple of 8' % n)
    if 8 + n > len(blob):
        errs.append('header length %d past the end' % n)
        return
    text = blob[8:8 + n].decode('utf-8')
    if not text.rstrip(' ').endswith('}'):
        errs.append('the header is not a JSON object padded with spaces: '
                    '...%r' % text[-16:])
    if len(text) - len(text.rstrip(' ')) >= 64:
        errs.append('header padded with %d spaces (more than 63)'
                    % (len(text) - len(text.rstrip(' '))))
    errs.extend(c.st_alignment(path)[0])
    hdr = json.loads(text, object_pairs_hook=OD)
    md = hdr.pop('__metadata__', None)
    if md is None:
        errs.append('no __metadata__')
        md = {}
    want_md = OD(metadata)
    if aliases:
        tied = md.get('ckpt.tied')
        try:
            got_tied = json.loads(tied) if isinstance(tied, str) else None
        except ValueError:
            got_tied = None
        if got_tied != aliases:
            errs.append('__metadata__ ckpt.tied %r, expected %s'
                        % (tied, json.dumps(aliases)))
        want_md['ckpt.tied'] = md.get('ckpt.tied')
    elif 'ckpt.tied' in md:
        errs.append('__metadata__ ckpt.tied %r, expected none'
                    % md['ckpt.tied'])
    if not md_match(md, want_md):
        errs.append('__metadata__ %s, expected %s'
                    % (json.dumps(md), md_text(want_md)))
    want_names = [k for k in sd if k not in aliases]
    if list(hdr) != want_names:
        errs.append('header names %s, expected %s (the state dict order)'
                    % (list(hdr)[:6], want_names[:6]))
    data = blob[8 + n:]
    for name, e in hdr.items():
        if set(e) != {'dtype', 'shape', 'data_offsets'}:
            errs.append('%s: header entry keys %s' % (name, sorted(e)))
            continue
        t = sd.get(name)
        if t is None:
            errs.append('%s: not in the state dict' % name)
            continue
        if e['dtype'] != ST_DTYPES.get(t.dtype):
            errs.append('%s: dtype %r, expected %r'
                        % (name, e['dtype'], ST_DTYPES.get(t.dtype)))
        if e['shape'] != list(t.shape):
            errs.append('%s: shape %r, expected %r'
                        % (name, e['shape'], list(t.shape)))
        b, en = e['data_offsets']
        if en - b != t.numel() * t.element_size():
            errs.append('%s: %d bytes by data_offsets, shape needs %d'
                        % (name, en - b, t.numel() * t.element_size()))
        elif data[b:en] != raw(t):
            errs.append('%s: the bytes at data_offsets are not the values'
                        % name)


def check_st_load(path, sd, aliases, metadata, errs):
    """What the safetensors package makes of PATH."""
    got = safetensors.torch.load_file(path)
    want = [k for k in sd if k not in aliases]
    if sorted(got) != sorted(want):
        errs.append('load_file: names %s, expected %s'
                    % (sorted(got)[:6], sorted(want)[:6]))
    for k in want:
        if k in got:
            same_values('load_file %s' % k, sd[k], got[k], errs)
    with safe_open(path, framework='pt') as f:
        md = f.metadata() or {}
        keys = list(f.keys())
        if sorted(keys) != sorted(want):
            errs.append('safe_open keys %s' % keys[:6])
        for k in want[:3]:
            if k in keys:
                same_values('safe_open get_tensor %s' % k, sd[k],
                            f.get_tensor(k), errs)
    md_want = dict(metadata)
    if aliases:
        md_want['ckpt.tied'] = md.get('ckpt.tied')
    if not md_match(md, md_want):
        errs.append('safe_open metadata %s, expected %s'
                    % (json.dumps(md), md_text(md_want)))


def check_inspect(path, sd, fmt_name, errs, storages=None, aliases=()):
    """`ckpt inspect --json --stats PATH` lists SD: names in order, dtype,
    shape, crc32 of the values."""
    doc = inspect_json(path)
    if doc.get('format') != fmt_name:
        errs.append('inspect: format %r, expected %r'
                    % (doc.get('format'), fmt_name))
    names = [t['path'][-1] if len(t['path']) == 1 else tuple(t['path'])
             for t in doc['tensors']]
    check_order('inspect %s' % os.path.basename(path), names, list(sd),
                aliases, errs)
    for t in doc['tensors']:
        k = t['path'][0]
        if len(t['path']) != 1 or k not in sd:
            continue
        w = sd[k]
        g = (t['dtype'], t['shape'], t.get('crc32'))
        e = (c.dtype_name(w.dtype), list(w.shape), crc(w))
        if g != e:
            errs.append('inspect %s: (dtype, shape, crc32) %s, torch %s'
                        % (k, g, e))
    if storages is not None and len(doc['storages']) != storages:
        errs.append('inspect: %d storages, expected %d'
                    % (len(doc['storages']), storages))
    return doc


def check_pth(path, sd, groups, errs, legacy=False, model=None,
              aliases=()):
    """PATH loads with torch (weights_only=True) as a state dict with SD's
    values under SD's names; GROUPS (lists of names) are the only storages
    shared; every storage tagged cpu; views contiguous."""
    with open(path, 'rb') as f:
        head = f.read(4)
    is_zip = head == b'PK\x03\x04'
    if is_zip == legacy:
        errs.append('%s is %s, expected %s' % (
            os.path.basename(path), 'a zip' if is_zip else 'not a zip',
            'pth-legacy' if legacy else 'pth-zip'))
    got, tags = load(path)
    if not isinstance(got, dict):
        errs.append('loads as %s' % type(got).__name__)
        return None
    want_keys = list(sd)
    check_order(os.path.basename(path), got, want_keys, aliases, errs)
    for k in want_keys:
        if k in got:
            same_values(k, sd[k], got[k], errs)
            if isinstance(got[k], torch.Tensor):
                t = got[k]
                if tags.get(sid(t)) != 'cpu':
                    errs.append('%s: tagged %r, expected cpu'
                                % (k, tags.get(sid(t))))
                if not t.is_contiguous() or t.storage_offset():
                    errs.append('%s: stride %s offset %d, expected a whole '
                                'contiguous storage'
                                % (k, t.stride(), t.storage_offset()))
    if sorted(sorted(g) for g in groups) != sharing(got):
        errs.append('shared storages %s, expected %s'
                    % (sharing(got), sorted(sorted(g) for g in groups)))
    if model is not None and not errs:
        try:
            model().load_state_dict(got, strict=True)
        except Exception as e:
            errs.append('load_state_dict(strict=True): %s' % e)
    return got


# --------------------------------------------------------------------------
# the chain

class Chain:
    def __init__(self, name, src, select=None, model=None, metadata=None,
                 make=None, sd_path=None):
        self.name = name
        self.src = src          # fixture name, or a file made by MAKE
        self.select = select    # --select PATH
        self.sd_path = sd_path or select    # where the state dict is
        self.model = model      # callable -> module, for strict loading
        self.metadata = OD([('format', 'pt')] + list(
            (metadata or {}).items()))
        self.make = make        # fn(path): write the source file with torch


def dtypes_no_complex(path):
    d = torch.load(os.path.join(DATA, 'dtypes.pth'))
    for k in ('complex64', 'complex128'):
        del d[k]
    torch.save(d, path)


class TiedLM(nn.Module):
    """Embedding whose matrix is also the output layer's weight."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(50, 16)
        self.body = nn.Linear(16, 16)
        self.out = nn.Linear(16, 50)
        self.out.weight = self.emb.weight


def tied_lm(path):
    torch.manual_seed(7)
    torch.save(TiedLM().state_dict(), path)


def one_state_dict(path):
    """A checkpoint with one state dict and scalars beside it."""
    sd = torch.load(os.path.join(DATA, 'mlp.pth'), map_location='cpu')
    torch.save({'epoch': 1, 'loss': 0.1, 'best': True, 'name': 'run-1',
                'tags': ['a'], 'none': None, 'state_dict': sd}, path)


def dp_mlp():
    return nn.DataParallel(models.MLP())


CHAINS = [
    Chain('dp_mlp.pth', 'dp_mlp.pth', model=dp_mlp),
    Chain('mlp.pth', 'mlp.pth', model=models.MLP),
    Chain('dtypes.pth (no complex)', 'dtypes_nc.pth', make=dtypes_no_complex),
    Chain('bn.pth', 'bn.pth', model=models.BNNet),
    Chain('keepvars.pth', 'keepvars.pth', model=models.MLP),
    Chain('ae_model_parallel.pth', 'ae_model_parallel.pth',
          model=models.Autoencoder),
    Chain('legacy_mlp.pth', 'legacy_mlp.pth', model=dp_mlp),
    Chain('train_ckpt.pth --select model_state_dict', 'train_ckpt.pth',
          select='model_state_dict', model=dp_mlp,
          metadata={'epoch': '3', 'loss': '0.25'}),
    Chain('lightning.pth --select state_dict', 'lightning.pth',
          select='state_dict',
          metadata={'epoch': '2', 'global_step': '100',
                    'pytorch-lightning_version': '1.9.0'}),
    Chain('tied embedding / output layer', 'tied_lm.pth', make=tied_lm,
          model=TiedLM),
    Chain('one state dict and scalars (no --select needed)', 'one_sd.pth',
          make=one_state_dict, sd_path='state_dict', model=models.MLP,
          metadata={'epoch': '1', 'loss': float_text(0.1), 'best': 'True',
                    'name': 'run-1'}),
]


def source_sd(ch, tmp):
    if ch.make:
        src = os.path.join(tmp, ch.src)
        ch.make(src)
    else:
        src = os.path.join(DATA, ch.src)
    obj, _ = load(src, weights_only=False)
    if ch.sd_path:
        for part in ch.sd_path.split('/'):
            obj = obj[part]
    sd = OD((k, v.detach()) for k, v in obj.items())
    return src, sd


def run_chain(ch, tmp):
    errs = []
    src, sd = source_sd(ch, tmp)
    groups = tied_groups(sd)
    aliases = OD((k, g[0]) for g in groups for k in g[1:])
    sel = ['--select', ch.select] if ch.select else []

    def step(what, fn):
        e = []
        try:
            fn(e)
        except Fail as x:
            e.append(str(x))
        errs.extend('%s: %s' % (what, m) for m in e)

    a = os.path.join(tmp, 'a.safetensors')
    b = os.path.join(tmp, 'b.pth')
    c_ = os.path.join(tmp, 'c.pth')
    d = os.path.join(tmp, 'd.pth')
    e_ = os.path.join(tmp, 'e.pth')

    def to_st(e):
        r = ckpt('convert', *sel, src, a)
        last = r.stdout.decode().splitlines()[-1:]
        if not last or not last[0].startswith('wrote %s: safetensors, %d '
                                              'tensors' % (a, len(sd))):
            e.append('stdout %r' % r.stdout.decode()[-200:])
        check_st_file(a, sd, aliases, ch.metadata, e)
        check_st_load(a, sd, aliases, ch.metadata, e)
        check_inspect(a, sd, 'safetensors', e,
                      storages=len(sd) - len(aliases), aliases=aliases)
    step('pth -> safetensors', to_st)
    if errs and not os.path.exists(a):
        return errs

    def st_to_pth(e):
        ckpt('convert', a, b)
        check_pth(b, sd, groups, e, model=ch.model, aliases=aliases)
        check_inspect(b, sd, 'pth-zip', e, storages=len(sd) - len(aliases),
                      aliases=aliases)
    step('safetensors -> pth', st_to_pth)

    def pth_to_legacy(e):
        r = ckpt('convert', '--to', 'pth-legacy', b, c_)
        if b'pth-legacy' not in r.stdout:
            e.append('stdout %r' % r.stdout.decode())
        check_pth(c_, sd, groups, e, legacy=True, model=ch.model,
                  aliases=aliases)
        check_inspect(c_, sd, 'pth-legacy', e, aliases=aliases)
    step('pth -> pth-legacy', pth_to_legacy)

    def legacy_to_pth(e):
        ckpt('convert', c_, d)
        check_pth(d, sd, groups, e, model=ch.model, aliases=aliases)
    step('pth-legacy -> pth', legacy_to_pth)

    def st_to_legacy(e):
        ckpt('convert', '--to', 'pth-legacy', a, e_)
        check_pth(e_, sd, groups, e, legacy=True, model=ch.model,
                  aliases=aliases)
    step('safetensors -> pth-legacy', st_to_legacy)

    if aliases:
        def tied_back(e):
            got, _ = load(d)
            for alias, name in aliases.items():
                x, y = got[alias], got[name]
                if sid(x) != sid(y) or x.storage_offset() != \
                        y.storage_offset() or x.stride() != y.stride():
                    e.append('%s and %s are not one storage, same view'
                             % (alias, name))
            if ch.model is TiedLM:
                m = TiedLM()
                m.load_state_dict(got, strict=True)
                if m.out.weight is not m.emb.weight:
                    e.append('the model lost its tie')
        step('tied storage back', tied_back)
    return errs


# --------------------------------------------------------------------------
# direct conversions keep everything torch sees

def describe(obj, tags):
    """A comparable description of a loaded checkpoint: structure, values
    (floats by their bits), tensors with storage groups numbered in order
    of first appearance."""
    order = {}

    def d(o):
        if isinstance(o, torch.Tensor):
            k = sid(o)
            order.setdefault(k, len(order))
            return ('tensor', type(o).__name__, bool(o.requires_grad),
                    str(o.dtype), tuple(o.shape), o.stride(),
                    o.storage_offset(), tags.get(k), order[k],
                    c.storage_bytes(o))
        if isinstance(o, dict):
            return (type(o).__name__, [(repr(k), d(v)) for k, v in o.items()],
                    d(getattr(o, '_metadata', None)))
        if isinstance(o, (list, tuple)):
            return (type(o).__name__, [d(v) for v in o])
        if isinstance(o, float):
            return ('float', struct.pack('<d', o))
        if o is None or isinstance(o, (str, bytes, int, bool)):
            return (type(o).__name__, o)
        return (type(o).__module__ + '.' + type(o).__qualname__,
                d(vars(o)) if hasattr(o, '__dict__') else repr(o))
    return d(obj)


def run_direct(fixture, tmp):
    errs = []
    src = os.path.join(DATA, fixture)
    want = describe(*load(src, weights_only=False))
    wo, _ = c.loads_weights_only(src, map_location='cpu')
    for to, ext in (('pth', 'pth'), ('pth-legacy', 'legacy.pth')):
        out = os.path.join(tmp, 'out.' + ext)
        try:
            ckpt('convert', '--to', to, '--allow-global',
                 'argparse.Namespace', src, out)
            got = describe(*load(out, weights_only=wo))
        except Fail as e:
            errs.append('%s: %s' % (to, e))
            continue
        except Exception as e:
            errs.append('%s: torch.load(weights_only=%s): %s: %s'
                        % (to, wo, type(e).__name__, e))
            continue
        with open(out, 'rb') as f:
            is_zip = f.read(4) == b'PK\x03\x04'
        if is_zip != (to == 'pth'):
            errs.append('%s: wrote %s' % (to, 'a zip' if is_zip else
                                          'no zip'))
        if got != want:
            errs.append('%s: torch loads something else: %s'
                        % (to, first_difference(want, got)))
    return errs


def first_difference(a, b, path='root'):
    if type(a) is not type(b):
        return '%s: %r vs %r' % (path, type(a).__name__, type(b).__name__)
    if isinstance(a, (list, tuple)):
        if len(a) != len(b):
            return '%s: %d vs %d items' % (path, len(a), len(b))
        for i, (x, y) in enumerate(zip(a, b)):
            if x != y:
                return first_difference(x, y, '%s[%d]' % (path, i))
    return '%s: %r vs %r' % (path, str(a)[:120], str(b)[:120])


# --------------------------------------------------------------------------
# the other cases

def run_complex(tmp):
    errs = []
    src = os.path.join(DATA, 'dtypes.pth')
    out = os.path.join(tmp, 'x.safetensors')
    line = refused(3, 'convert', src, out)
    if 'complex128' not in line:  # complex64 is C64 (safetensors 0.6+)
        errs.append('the message does not name complex128: %s' % line)
    if os.listdir(tmp):
        errs.append('left behind: %s' % os.listdir(tmp))
    line = refused(3, 'convert', '--to', 'safetensors', '--dtype', 'float16',
                   src, out)
    if 'complex' not in line:
        errs.append('with --dtype, the message does not name complex: %s'
                    % line)
    # complex64 goes to C64, which the safetensors package reads back
    want, _ = load(src)
    part = os.path.join(tmp, 'c64.pth')
    torch.save({'z': want['complex64']}, part)
    st = os.path.join(tmp, 'c64.safetensors')
    ckpt('convert', part, st)
    same_values('complex64', want['complex64'], safetensors.torch.load_file(st)['z'], errs)
    # pth-legacy has the complex storages
    leg = os.path.join(tmp, 'c.pth')
    ckpt('convert', '--to', 'pth-legacy', src, leg)
    got, _ = load(leg)
    want, _ = load(src)
    for k in ('complex64', 'complex128'):
        same_values(k, want[k], got[k], errs)
    return errs


def run_no_dedupe(tmp):
    errs = []
    src = os.path.join(tmp, 'tied_lm.pth')
    tied_lm(src)
    sd = torch.load(src)
    a = os.path.join(tmp, 'nd.safetensors')
    ckpt('convert', '--no-dedupe', src, a)
    check_st_file(a, sd, {}, {'format': 'pt'}, errs)
    check_st_load(a, sd, {}, {'format': 'pt'}, errs)
    b = os.path.join(tmp, 'nd.pth')
    ckpt('convert', a, b)
    check_pth(b, sd, [], errs, model=TiedLM)
    # the default writes emb.weight once
    a2 = os.path.join(tmp, 'd.safetensors')
    ckpt('convert', src, a2)
    if os.path.getsize(a2) + 50 * 16 * 4 > os.path.getsize(a) + 64:
        errs.append('deduplicated file %d bytes, --no-dedupe %d: expected '
                    'one 3200-byte matrix less'
                    % (os.path.getsize(a2), os.path.getsize(a)))
    return errs


def theirs_tensors():
    g = torch.Generator().manual_seed(3)
    return OD([
        ('f64', torch.randn(3, 2, generator=g, dtype=torch.float64)),
        ('f32', torch.randn(4, 5, generator=g)),
        ('f16', torch.tensor([0.0, -0.0, 1.5, 65504, -65504, 6e-8,
                              float('inf'), float('nan')],
                             dtype=torch.float16)),
        ('bf16', torch.tensor([1.0, -2.5, 3e38, -1e-38, float('-inf')],
                              dtype=torch.bfloat16)),
        ('i64', torch.tensor([-2**63, 2**63 - 1, 0, 7])),
        ('i32', torch.tensor([-2**31, 2**31 - 1], dtype=torch.int32)),
        ('i16', torch.tensor([-2**15, 2**15 - 1], dtype=torch.int16)),
        ('i8', torch.tensor([-128, 127, 0], dtype=torch.int8)),
        ('u8', torch.tensor([0, 255, 17], dtype=torch.uint8)),
        ('bool', torch.tensor([True, False, True])),
        ('scalar', torch.tensor(2.75)),
        ('scalar_i', torch.tensor(-5)),
        ('empty', torch.zeros(0, 3)),
        ('empty_i', torch.zeros(2, 0, dtype=torch.int32)),
        ('big.name/with:odd chars ü', torch.arange(6.).reshape(2, 3)),
    ])


def run_theirs(tmp):
    errs = []
    ts = theirs_tensors()
    path = os.path.join(tmp, 'theirs.safetensors')
    safetensors.torch.save_file(ts, path, metadata={'format': 'pt',
                                                    'note': 'from them'})
    # their order is not ours: compare by name
    doc = inspect_json(path)
    if doc.get('format') != 'safetensors':
        errs.append('inspect: format %r' % doc.get('format'))
    got = {t['path'][0]: t for t in doc['tensors']}
    if sorted(got) != sorted(ts):
        errs.append('inspect: names %s' % sorted(got))
    for k, t in ts.items():
        g = got.get(k)
        if g is None:
            continue
        for f, v in (('dtype', c.dtype_name(t.dtype)), ('shape', list(t.shape)),
                     ('stride', list(t.stride()) if t.numel() else
                      g['stride']), ('crc32', crc(t)),
                     ('device', 'cpu'), ('offset', 0),
                     ('nbytes', t.numel() * t.element_size())):
            if g.get(f) != v:
                errs.append('inspect %s: %s %r, expected %r'
                            % (k, f, g.get(f), v))
        if t.dtype in FLOATS and t.numel():
            fin = t.double()[torch.isfinite(t.double())]
            if fin.numel() and g.get('max') != fin.max().item():
                errs.append('inspect %s: max %r, expected %r'
                            % (k, g.get('max'), fin.max().item()))
    # to pth: torch loads the same tensors
    out = os.path.join(tmp, 'theirs.pth')
    ckpt('convert', path, out)
    loaded, _ = load(out)
    if sorted(loaded) != sorted(ts):
        errs.append('pth: names %s' % sorted(loaded))
    for k, t in ts.items():
        if k in loaded:
            same_values('pth %s' % k, t, loaded[k], errs)
    out = os.path.join(tmp, 'theirs_leg.pth')
    ckpt('convert', '--to', 'pth-legacy', path, out)
    loaded, _ = load(out)
    for k, t in ts.items():
        if k in loaded:
            same_values('pth-legacy %s' % k, t, loaded[k], errs)
    # to safetensors again: their metadata is kept, the file loads
    again = os.path.join(tmp, 'again.safetensors')
    ckpt('convert', path, again)
    back = safetensors.torch.load_file(again)
    for k, t in ts.items():
        same_values('again %s' % k, t, back.get(k), errs)
    with safe_open(again, framework='pt') as f:
        md = f.metadata()
    if md != {'format': 'pt', 'note': 'from them'}:
        errs.append('their metadata became %r' % md)
    # --dtype on their file: floats cast, the rest untouched
    half = os.path.join(tmp, 'half.safetensors')
    ckpt('convert', '--dtype', 'float16', path, half)
    back = safetensors.torch.load_file(half)
    for k, t in ts.items():
        w = t.to(torch.float16) if t.dtype in FLOATS else t
        same_values('--dtype float16 %s' % k, w, back.get(k), errs)
    # save_model drops the second name of tied weights; ckpt reads the rest
    m = TiedLM()
    sm = os.path.join(tmp, 'model.safetensors')
    safetensors.torch.save_model(m, sm)
    with safe_open(sm, framework='pt') as f:
        names = sorted(f.keys())
    doc = inspect_json(sm)
    if sorted(t['path'][0] for t in doc['tensors']) != names:
        errs.append('save_model file: ckpt lists %s, safetensors %s'
                    % ([t['path'][0] for t in doc['tensors']], names))
    out = os.path.join(tmp, 'model.pth')
    ckpt('convert', sm, out)
    loaded, _ = load(out)
    ref = safetensors.torch.load_file(sm)
    for k in names:
        same_values('save_model %s' % k, ref[k], loaded.get(k), errs)
    return errs


def run_sharded(tmp):
    errs = []
    src = os.path.join(DATA, 'ae_model_parallel.pth')
    sd = torch.load(src, map_location='cpu')
    keys = list(sd)
    d = os.path.join(tmp, 'set')
    os.mkdir(d)
    parts = [keys[:4], keys[4:8], keys[8:]]
    names = ['model-00001-of-00003.safetensors', 'model-00002-of-00003.bin',
             'model-00003-of-00003.bin']
    safetensors.torch.save_file(OD((k, sd[k]) for k in parts[0]),
                                os.path.join(d, names[0]),
                                metadata={'format': 'pt'})
    torch.save(OD((k, sd[k]) for k in parts[1]), os.path.join(d, names[1]))
    torch.save(OD((k, sd[k]) for k in parts[2]), os.path.join(d, names[2]),
               _use_new_zipfile_serialization=False)
    wm = OD()
    for p, n in zip(parts, names):
        for k in p:
            wm[k] = n
    index = os.path.join(d, 'model.safetensors.index.json')
    with open(index, 'w') as f:
        json.dump({'metadata': {'total_size': sum(
            t.numel() * t.element_size() for t in sd.values())},
            'weight_map': wm}, f, indent=2)
    doc = inspect_json(index)
    if doc.get('format') != 'sharded':
        errs.append('inspect: format %r' % doc.get('format'))
    if sorted(t['path'][0] for t in doc['tensors']) != sorted(keys):
        errs.append('inspect: names %s' % [t['path'] for t in doc['tensors']])
    for t in doc['tensors']:
        k = t['path'][0]
        if k in sd and t.get('crc32') != crc(sd[k]):
            errs.append('inspect %s: crc32 %s, torch %s'
                        % (k, t.get('crc32'), crc(sd[k])))
    one = os.path.join(tmp, 'one.pth')
    ckpt('convert', index, one)
    got, _ = load(one)
    if sorted(got) != sorted(keys):
        errs.append('one.pth: names %s' % list(got))
    for k in keys:
        same_values('one.pth %s' % k, sd[k], got.get(k), errs)
    if not errs:
        models.Autoencoder().load_state_dict(got, strict=True)
    st = os.path.join(tmp, 'one.safetensors')
    ckpt('convert', index, st)
    got = safetensors.torch.load_file(st)
    for k in keys:
        same_values('one.safetensors %s' % k, sd[k], got.get(k), errs)
    leg = os.path.join(tmp, 'one_legacy.pth')
    ckpt('convert', '--to', 'pth-legacy', '--dtype', 'bfloat16', index, leg)
    got, _ = load(leg)
    for k in keys:
        same_values('one_legacy.pth (bfloat16) %s' % k,
                    sd[k].to(torch.bfloat16), got.get(k), errs)
    # the index decides: a shard's extra tensor is not taken
    idx2 = os.path.join(d, 'partial.index.json')
    with open(idx2, 'w') as f:
        json.dump({'weight_map': OD((k, wm[k]) for k in keys[1:])}, f)
    part = os.path.join(tmp, 'partial.pth')
    ckpt('convert', idx2, part)
    got, _ = load(part)
    if sorted(got) != sorted(keys[1:]):
        errs.append('partial index: names %s, expected %s'
                    % (sorted(got), sorted(keys[1:])))
    return errs


def run_shard_out(tmp):
    """--shard-size: a Hugging Face style set that the safetensors package
    (or torch) loads shard by shard, and ckpt back as one file."""
    errs = []
    sd = torch.load(os.path.join(DATA, 'ae_model_parallel.pth'),
                    map_location='cpu')
    total = sum(t.numel() * t.element_size() for t in sd.values())
    for ext, index in (('safetensors', 'ae.safetensors.index.json'),
                       ('bin', 'ae.index.json')):
        d = os.path.join(tmp, ext)
        os.mkdir(d)
        idx = os.path.join(d, index)
        ckpt('convert', '--shard-size', '300K',
             os.path.join(DATA, 'ae_model_parallel.pth'), idx)
        with open(idx) as f:
            doc = json.load(f, object_pairs_hook=OD)
        wm = doc.get('weight_map', {})
        # as transformers' save_pretrained writes it: names sorted
        if list(wm) != sorted(sd):
            errs.append('%s: weight_map names %s' % (index, list(wm)[:4]))
        if list(doc) != ['metadata', 'weight_map'] or \
                doc['metadata'].get('total_parameters') != sum(t.numel() for t in sd.values()):
            errs.append('%s: metadata %s' % (index, doc.get('metadata')))
        if doc.get('metadata', {}).get('total_size') != total:
            errs.append('%s: total_size %r, the tensors take %d'
                        % (index, doc.get('metadata'), total))
        shards = sorted(set(wm.values()))
        want_files = sorted(shards + [index])
        if sorted(os.listdir(d)) != want_files:
            errs.append('%s: files %s, expected %s'
                        % (index, sorted(os.listdir(d)), want_files))
        got = {}
        for sh in shards:
            p = os.path.join(d, sh)
            if not sh.endswith('.' + ext) or not os.path.exists(p):
                errs.append('%s: shard %s' % (index, sh))
                continue
            if os.path.getsize(p) > 300 * 1024 + 4096 and \
                    sum(1 for v in wm.values() if v == sh) > 1:
                errs.append('%s: shard %s of %d bytes has more than one '
                            'tensor' % (index, sh, os.path.getsize(p)))
            part = (safetensors.torch.load_file(p) if ext == 'safetensors'
                    else load(p)[0])
            for k in part:
                if wm.get(k) != sh:
                    errs.append('%s: %s is in %s, the index says %s'
                                % (index, k, sh, wm.get(k)))
            got.update(part)
        for k, t in sd.items():
            same_values('%s %s' % (index, k), t, got.get(k), errs)
        one = os.path.join(tmp, 'one_%s.pth' % ext)
        ckpt('convert', idx, one)
        back, _ = load(one)
        for k, t in sd.items():
            same_values('%s -> one.pth %s' % (index, k), t, back.get(k), errs)
    # tied weights in a sharded set: written once, tied again when read
    src = os.path.join(tmp, 'tied_lm.pth')
    tied_lm(src)
    d = os.path.join(tmp, 'tied')
    os.mkdir(d)
    idx = os.path.join(d, 'lm.safetensors.index.json')
    ckpt('convert', '--shard-size', '2K', src, idx)
    with open(idx) as f:
        doc = json.load(f)
    written = 0
    for sh in set(doc['weight_map'].values()):
        with safe_open(os.path.join(d, sh), framework='pt') as f:
            written += sum(f.get_tensor(k).numel() * 4 for k in f.keys())
    if written != 7688 - 3200:
        errs.append('tied weights in shards: %d bytes of tensors written, '
                    'expected %d (emb.weight once)' % (written, 7688 - 3200))
    back = os.path.join(tmp, 'tied_back.pth')
    ckpt('convert', idx, back)
    got, _ = load(back)
    if sid(got['out.weight']) != sid(got['emb.weight']):
        errs.append('tied weights through a sharded set: out.weight and '
                    'emb.weight come back as two storages')
    return errs


# --------------------------------------------------------------------------
# --dtype

def edge_file(path):
    """Edge values in every floating dtype, views, ints and a bool."""
    specials = [0.0, -0.0, float('nan'), -float('nan'), float('inf'),
                -float('inf'), 1.0, -1.0, 1 / 3, 0.1, 65504.0, 65519.996,
                65520.0, 70000.0, -65520.0, 6.103515625e-05, 6.1e-05,
                5.960464477539063e-08, 2.98e-08, 2.9802322387695312e-08,
                1e-45, 1.401298464324817e-45, 1.1754943508222875e-38,
                1.1754942e-38, 3.4028234663852886e+38, -3.4028234663852886e+38,
                3.3895313892515355e+38, 3.3961775292304e+38,
                1 + 2 ** -11, 1 + 3 * 2 ** -11, 1 + 2 ** -8, 1 + 3 * 2 ** -8,
                1 + 2 ** -8 + 2 ** -20, 1 + 2 ** -24, 1 + 2 ** -24 + 2 ** -40,
                2049.0, 2051.0, 257.0, 259.0, 1e300, -1e300, 1e-300,
                5e-324, 2.0 ** -14 * (1 - 2 ** -11), 2.0 ** -24 * 1.5,
                2.0 ** -25, 2.0 ** -25 * (1 + 2 ** -20), 2.0 ** -133,
                2.0 ** -134, 2.0 ** -126 * (1 - 2 ** -8)]
    # NaNs with payloads, by their bits
    nan32 = torch.tensor([0x7fc00001, 0x7f800001, 0xffc12345 - 2**32,
                          0x7fbfffff], dtype=torch.int32).view(torch.float32)
    nan64 = torch.tensor([0x7ff8000000000001, 0x7ff0000000000001,
                          0xfff8123456789abc - 2**64],
                         dtype=torch.int64).view(torch.float64)
    g = torch.Generator().manual_seed(11)
    # every magnitude: mantissas times 2^[-160, 140]
    wide = torch.randn(20000, generator=g, dtype=torch.float64) * torch.pow(
        2.0, torch.randint(-160, 140, (20000,), generator=g).double())
    bits32 = torch.randint(-2**31, 2**31 - 1, (20000,), generator=g,
                           dtype=torch.int64).to(torch.int32)
    d = OD()
    d['f64'] = torch.cat([torch.tensor(specials, dtype=torch.float64),
                          nan64, wide])
    d['f32'] = torch.cat([torch.tensor(specials, dtype=torch.float32), nan32,
                          wide.float(), bits32.view(torch.float32)])
    d['f16'] = torch.cat([torch.tensor(specials).half(),
                          torch.arange(-32768, 32768, dtype=torch.int32)
                          .to(torch.int16).view(torch.float16)])
    d['bf16'] = torch.cat([torch.tensor(specials).bfloat16(),
                           torch.arange(-32768, 32768, dtype=torch.int32)
                           .to(torch.int16).view(torch.bfloat16)])
    base = torch.randn(6, 8, generator=g) * 1e4
    d['transposed'] = base.t()
    d['strided'] = base[::2, 1::3]
    d['tied_a'] = d['tied_b'] = torch.randn(5, generator=g).double()
    d['i64'] = torch.tensor([-2**63, 2**63 - 1, 5])
    d['i32'] = torch.tensor([-2**31, 7], dtype=torch.int32)
    d['i16'] = torch.tensor([-2**15, 2**15 - 1], dtype=torch.int16)
    d['i8'] = torch.tensor([-128, 127], dtype=torch.int8)
    d['u8'] = torch.tensor([0, 255], dtype=torch.uint8)
    d['bool'] = torch.tensor([True, False])
    d['scalar'] = torch.tensor(65520.0, dtype=torch.float64)
    d['empty'] = torch.zeros(0, 4)
    torch.save(d, path)
    return d


def as_bits(v, signed, width):
    """Unsigned bit patterns (int64) from a signed integer view."""
    b = v.to(torch.int64)
    return torch.where(b < 0, b + (1 << width), b) if signed else b


def from_bits(b, width):
    """A signed int16 / int32 tensor of WIDTH-bit patterns B (int64)."""
    b = torch.where(b >= (1 << (width - 1)), b - (1 << width), b)
    return b.to(torch.int16 if width == 16 else torch.int32)


def ckpt_cast(v, T):
    """V.to(T) as ckpt casts it (lib/core/element.c: torch 2.x's vectorised
    kernels): torch's .to() where that agrees, and the NaNs that ckpt
    documents as differing from some torch: 1.13 drops a payload going to
    float16 (ckpt keeps its top bits: sign | 0x7e00 | float32 mantissa >>
    13); 2.x gives 0x7fffffff for a float16 NaN in the last n % 8 elements
    going to float32 (ckpt: quiet, payload << 13).  The NaNs of this torch's
    .to() must be those values or the documented variant."""
    w = v.to(T)
    if v.dtype == T or v.dtype not in FLOATS or T not in (torch.float16, torch.float32):
        return w
    flat, wf = v.contiguous().flatten(), w.contiguous().flatten()
    nan = torch.isnan(flat)
    if T == torch.float16:
        f = as_bits(flat.float().view(torch.int32), True, 32)  # payload kept to float32
        rule = ((f >> 16) & 0x8000) | 0x7e00 | ((f & 0x7fffff) >> 13)
        got = as_bits(wf.view(torch.int16), True, 16)
        variant = rule & 0xfe00 if torch.__version__.startswith('1.') else rule
        width = 16
    elif v.dtype == torch.float16:
        h = as_bits(flat.view(torch.int16), True, 16)
        rule = ((h & 0x8000) << 16) | 0x7fc00000 | ((h & 0x3ff) << 13)
        got = as_bits(wf.view(torch.int32), True, 32)
        variant = rule if torch.__version__.startswith('1.') \
            else torch.full_like(rule, 0x7fffffff)
        width = 32
    else:
        return w
    odd = nan & (got != rule) & (got != variant)
    if odd.any():
        i = int(odd.nonzero()[0])
        raise Fail('torch %s: %s NaN %#x -> %#x, neither %#x nor the documented %#x'
                   % (torch.__version__, v.dtype, int(as_bits(
                       flat.view({torch.float64: torch.int64, torch.float32: torch.int32}
                                 .get(v.dtype, torch.int16)), True,
                       flat.element_size() * 8)[i]), int(got[i]), int(rule[i]),
                      int(variant[i])))
    out = torch.where(nan, rule, got)
    return from_bits(out, width).view(T).reshape(w.shape)


def run_dtype(target, tmp):
    errs = []
    T = {'float16': torch.float16, 'bfloat16': torch.bfloat16,
         'float32': torch.float32}[target]
    src = os.path.join(tmp, 'edge.pth')
    d = edge_file(src)
    want = OD((k, ckpt_cast(v, T) if v.dtype in FLOATS else v) for k, v in d.items())

    # --dry-run: the casts, one line per source dtype; nothing written
    r = ckpt('convert', '--dry-run', '--dtype', target, src,
             os.path.join(tmp, 'dry.pth'))
    counts = collections.Counter()
    seen = set()
    for v in d.values():
        if v.dtype in FLOATS and v.dtype != T and sid(v) not in seen:
            counts[c.dtype_name(v.dtype)] += 1
        seen.add(sid(v))
    lines = sorted(r.stdout.decode().splitlines())
    exp_lines = sorted('%s -> %s (%d storage%s)' % (k, target, n,
                                                    '' if n == 1 else 's')
                       for k, n in counts.items())
    if lines != exp_lines:
        errs.append('--dry-run printed %s, expected %s' % (lines, exp_lines))
    if os.path.exists(os.path.join(tmp, 'dry.pth')):
        errs.append('--dry-run wrote its OUT')

    for to, name in (('pth', 'cast.pth'), ('pth-legacy', 'cast_leg.pth'),
                     ('safetensors', 'cast.safetensors')):
        out = os.path.join(tmp, name)
        try:
            ckpt('convert', '--to', to, '--dtype', target, src, out)
        except Fail as e:
            errs.append(str(e))
            continue
        if to == 'safetensors':
            check_st_file(out, want, {'tied_b': 'tied_a'}, {'format': 'pt'},
                          errs)
            got = safetensors.torch.load_file(out)
            got['tied_b'] = got.get('tied_a')
        else:
            got, _ = load(out)
            # views and sharing are kept in pth
            for k in ('transposed', 'strided'):
                if got[k].stride() != d[k].stride() or \
                        got[k].storage_offset() != d[k].storage_offset():
                    errs.append('%s %s: stride %s offset %d, expected %s %d'
                                % (to, k, got[k].stride(),
                                   got[k].storage_offset(), d[k].stride(),
                                   d[k].storage_offset()))
            if sid(got['transposed']) != sid(got['strided']) or \
                    sid(got['tied_a']) != sid(got['tied_b']):
                errs.append('%s: shared storages not kept' % to)
        for k, w in want.items():
            g = got.get(k)
            e = []
            same_values(k, w, g, e)
            if e and isinstance(g, torch.Tensor) and g.dtype == w.dtype \
                    and g.shape == w.shape:
                a = w.contiguous().flatten()
                b = g.contiguous().flatten()
                ia = a.view(torch.int16 if a.element_size() == 2 else
                            torch.int32 if a.element_size() == 4 else
                            torch.int64) if a.dtype in FLOATS else a
                ib = b.view(ia.dtype) if b.dtype in FLOATS else b
                bad = (ia != ib).nonzero().flatten()[:3].tolist()
                src_v = d[k].contiguous().flatten()
                e = ['%s: %d elements differ from torch\'s .to(%s), e.g. '
                     '%s' % (k, int((ia != ib).sum()), target, ', '.join(
                         '%r -> ckpt %s, torch %s' % (
                             src_v[i].item(), hex(ib[i].item() & 0xffffffff),
                             hex(ia[i].item() & 0xffffffff)) for i in bad))]
            errs.extend('%s: %s' % (to, m) for m in e)
    return errs


# --------------------------------------------------------------------------
# hostile safetensors: ckpt and the safetensors package agree

def st_refuses(path):
    try:
        safetensors.torch.load_file(path)
        return None
    except Exception as e:
        return '%s: %s' % (type(e).__name__, str(e)[:100])


def run_hostile(tmp):
    errs = []
    files = sorted(f for f in os.listdir(BAD) if f.endswith('.safetensors'))
    if len(files) < 8:
        errs.append('only %d safetensors files in tests/bad' % len(files))
    for f in files:
        p = os.path.join(BAD, f)
        # st_nul_name: a NUL in a name, which safetensors keeps and ckpt
        # refuses rather than cut (ckpt-convert(1), "Reading safetensors")
        if st_refuses(p) is None and f != 'st_nul_name.safetensors':
            errs.append('%s: safetensors loads it (not hostile?)' % f)
        out = os.path.join(tmp, 'out.pth')
        try:
            refused(3, 'convert', p, out)
        except Fail as e:
            errs.append('%s: %s' % (f, e))
        if os.listdir(tmp):
            errs.append('%s: left %s' % (f, os.listdir(tmp)))
            for x in os.listdir(tmp):
                os.unlink(os.path.join(tmp, x))
    # the header limit, 100,000,000 bytes: both read it, one more: neither
    path = os.path.join(tmp, 'limit.safetensors')
    for n, ok in ((100000000, True), (100000001, False)):
        head = b'{"__metadata__":{"format":"pt"},"w":{"dtype":"F32",' \
               b'"shape":[2],"data_offsets":[0,8]}}'
        with open(path, 'wb') as f:
            f.write(struct.pack('<Q', n) + head + b' ' * (n - len(head))
                    + struct.pack('<2f', 1.5, -2.0))
        theirs = st_refuses(path) is None
        r = c.ckpt('inspect', '--stats', path)
        if theirs != ok:
            errs.append('header of %d bytes: safetensors %s it'
                        % (n, 'reads' if theirs else 'refuses'))
        if (r.rc == 0) != ok:
            errs.append('header of %d bytes: ckpt inspect exits %d (%s)' % (
                n, r.rc, r.err.strip()))
        os.unlink(path)
    return errs


# --------------------------------------------------------------------------
# memory: one tensor at a time

RSS_PROBE = r'''
import resource, subprocess, sys
r = subprocess.run(sys.argv[1:], capture_output=True)
sys.stderr.write(r.stderr.decode(errors="replace"))
print(r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
'''


def peak_rss(args):
    r = c.run([sys.executable, '-c', RSS_PROBE, c.CKPT] + args)
    rc, kib = r.out.split()
    if rc != '0':
        raise Fail('`ckpt %s` exited %s: %s' % (' '.join(args), rc,
                                                 r.err.strip()))
    return int(kib) / 1024.0


def sanitized():
    """ckpt is built with AddressSanitizer (its quarantine of freed memory
    makes peak RSS meaningless)."""
    with open(c.CKPT, 'rb') as f:
        return b'__asan_init' in f.read()


def run_memory(tmp):
    errs = []
    if sanitized():
        print('   ckpt is built with AddressSanitizer: peak RSS not checked')
        return errs
    n, numel = 24, 2 * 1024 * 1024          # 24 tensors of 8 MiB
    g = torch.Generator().manual_seed(5)
    sd = OD(('layer%d.weight' % i, torch.randn(numel, generator=g)
             .reshape(1024, 2048)) for i in range(n))
    sd['view.t'] = sd['layer0.weight'].t()   # gathered for safetensors
    src = os.path.join(tmp, 'big.pth')
    torch.save(sd, src)
    tensor_mib = numel * 4 / 2**20
    total = n * tensor_mib
    base = peak_rss(['inspect', src])
    for args in (['--to', 'safetensors'], ['--to', 'pth-legacy'],
                 ['--to', 'pth', '--dtype', 'bfloat16'],
                 ['--to', 'safetensors', '--dtype', 'float16']):
        out = os.path.join(tmp, 'big.out')
        mib = peak_rss(['convert'] + args + [src, out])
        limit = base + 3 * tensor_mib + 16
        if mib > limit:
            errs.append('convert %s: peak RSS %.0f MiB for %.0f MiB of '
                        'tensors of %.0f MiB (limit %.0f MiB)'
                        % (' '.join(args), mib, total, tensor_mib, limit))
        else:
            print('   convert %s: peak RSS %.1f MiB (%.0f MiB of data, '
                  'inspect %.1f MiB)' % (' '.join(args), mib, total, base))
        os.unlink(out)
    st = os.path.join(tmp, 'big.safetensors')
    ckpt('convert', src, st)
    mib = peak_rss(['convert', st, os.path.join(tmp, 'back.pth')])
    if mib > base + 3 * tensor_mib + 16:
        errs.append('safetensors -> pth: peak RSS %.0f MiB' % mib)
    return errs


# --------------------------------------------------------------------------

def cases():
    for ch in CHAINS:
        yield 'chain %s' % ch.name, lambda tmp, ch=ch: run_chain(ch, tmp)
    for f in sorted(os.listdir(DATA)):
        if f.endswith('.pth'):
            yield 'direct %s' % f, lambda tmp, f=f: run_direct(f, tmp)
    yield 'complex', run_complex
    yield 'no-dedupe', run_no_dedupe
    yield 'theirs (safetensors.torch.save_file, save_model)', run_theirs
    yield 'sharded (safetensors + pth + legacy shards)', run_sharded
    yield 'sharded output (--shard-size)', run_shard_out
    for t in ('float16', 'bfloat16', 'float32'):
        yield 'dtype %s' % t, lambda tmp, t=t: run_dtype(t, tmp)
    yield 'hostile (tests/bad/st_*.safetensors, header limit)', run_hostile
    yield 'memory (24 x 8 MiB)', run_memory


def main():
    only = sys.argv[1:]
    t = c.Tally(max_errors=8)
    t.need(c.CKPT, 'CKPT')
    for name, fn in cases():
        if only and not any(name.startswith(o) for o in only):
            continue
        t.run(name, fn, tmp=True)
    for (want, moved), where in NOTES.items():
        print('note: %s come back last (input order %s) in %s'
              % (', '.join(moved), ', '.join(want), ', '.join(where)))
    return t.summary()


if __name__ == '__main__':
    sys.exit(main())
