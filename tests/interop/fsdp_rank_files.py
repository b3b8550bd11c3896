#!/usr/bin/env python3
"""Per-rank FSDP files saved with torch.save (tests/fixtures/distributed,
MANIFEST.json kind "per-rank", written by real 2-rank gloo runs under torch
2.15): FSDP1 SHARDED_STATE_DICT (ShardedTensor), FSDP2 (DTensor) and FSDP1
FULL_STATE_DICT (parameters with _has_been_cloned).

Under torch 2.x (the fixtures' torch; skipped under 1.13):
  - `ckpt inspect --json RANKFILE` gives every sharded tensor a "shard"
    whose box (offsets, sizes), global shape and rank equal what torch
    computed in the run (MANIFEST check.shards); the text form says
    "local shard [a:b] of global [N], rank R";
  - `ckpt convert RANKFILE out.pth` loads with plain torch.load and each
    local tensor equals the live full tensor's slice at that box; a notice
    says they are rank R's shards;
  - `ckpt scan` finds the files safe (known data), while torch.load
    (weights_only) refuses the ShardedTensor files as torch does;
  - DTensors placed Partial or _StridedShard (made here, 1-rank mesh) are
    read with "placement not supported" in place of a box;
  - a hostile variant, getattr(ShardedTensor, '__init_subclass__') in place
    of the one admitted pair, is refused by inspect and found unsafe by scan.
"""
import json
import os
import sys
import zipfile

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as c  # noqa: E402  (exit 77 without torch)
import torch  # noqa: E402

if int(torch.__version__.split('.')[0]) < 2:
    print('torch %s: the per-rank fixtures need torch 2.x: skipped' % torch.__version__)
    sys.exit(c.SKIP)

FIX = os.path.join(c.SRCDIR, 'tests', 'fixtures', 'distributed')
MANIFEST = os.path.join(FIX, 'MANIFEST.json')
cases = []
if os.path.exists(MANIFEST):
    cases = [e for e in json.load(open(MANIFEST))['cases'] if e['kind'] == 'per-rank']
if not cases:
    print('no per-rank cases in %s: skipped' % MANIFEST)
    sys.exit(c.SKIP)

t = c.Tally(uses='fixtures written by tests/fixtures/make_distributed.py (torch 2.15)')
t.need(c.CKPT, 'CKPT')


def box_slice(full, offsets, sizes):
    return full[tuple(slice(o, o + s) for o, s in zip(offsets, sizes))]


def check_file(tmp, entry, rel):
    errs = []
    path = os.path.join(FIX, rel)
    rank = str(int(os.path.basename(rel)[4:-3]))
    want = entry['check']['shards'].get(rank, {})
    live = torch.load(os.path.join(FIX, entry['live']), weights_only=False)

    r = c.ckpt('inspect', '--json', path)
    if r.rc != 0:
        return ['%s: exit %d: %s' % (r.cmd, r.rc, r.err.strip())]
    d = json.loads(r.out)
    got = {}
    for tj in d['tensors']:
        key = '.'.join(str(p) for p in tj['path'])
        if 'shard' in tj:
            got[key] = tj['shard']
    if sorted(got) != sorted(want):
        errs.append('inspect: sharded tensors %s, the run had %s' % (sorted(got), sorted(want)))
    for key, boxes in want.items():
        sh = got.get(key)
        if sh is None:
            continue
        if list(sh['global_shape']) != list(live[key].shape):
            errs.append('%s: global shape %s, live %s' % (key, sh['global_shape'], list(live[key].shape)))
        mine = [{'offsets': ch['offsets'], 'sizes': ch['sizes']} for ch in sh['chunks']]
        theirs = [{'offsets': b['offsets'], 'sizes': b['sizes']} for b in boxes]
        if mine != theirs:
            errs.append('%s: shard boxes %s, torch %s' % (key, mine, theirs))
        if sh['rank'] != int(rank) or sh['unsupported'] is not None:
            errs.append('%s: rank %s, unsupported %r' % (key, sh['rank'], sh['unsupported']))
        if sh['type'] != ('DTensor' if 'dtensor' in entry['name'] else 'ShardedTensor'):
            errs.append('%s: type %s' % (key, sh['type']))
    if want:
        text = c.ckpt('inspect', path)
        first = next((k for k, b in want.items() if b and all(s > 0 for s in b[0]['sizes'])), None)
        if first:
            b = want[first][0]
            line = 'local shard [%s] of global [%s], rank %s' % (
                ', '.join('%d:%d' % (o, o + s) for o, s in zip(b['offsets'], b['sizes'])),
                ', '.join(str(n) for n in b['global']), rank)
            if line not in text.out:
                errs.append('inspect: no %r in the text' % line)
        if "rank %s's shard of a sharded tensor" % rank not in text.err:
            errs.append('inspect: no notice of the shards: %r' % text.err[-300:])

    out = os.path.join(tmp, 'out.pth')
    r = c.ckpt('convert', path, out)
    if r.rc != 0:
        return errs + ['%s: exit %d: %s' % (r.cmd, r.rc, r.err.strip())]
    if want and "rank %s's shard of a sharded tensor" % rank not in r.err:
        errs.append('convert: no notice of the shards: %r' % r.err[-300:])
    sd = torch.load(out)         # plain, weights-only
    if list(sd) != list(live):
        errs.append('convert: keys %s, live %s' % (list(sd), list(live)))
    for key, full in live.items():
        v = sd.get(key)
        if v is None:
            continue
        boxes = want.get(key)
        if boxes is None:                 # a plain tensor (buffers, FULL_STATE_DICT)
            expect = full
        elif not boxes:                   # a rank holding no shard: nothing stored
            if v.numel() != 0:
                errs.append('%s: %d elements where the rank has no shard' % (key, v.numel()))
            continue
        else:
            expect = box_slice(full, boxes[0]['offsets'], boxes[0]['sizes'])
        if v.dtype != expect.dtype or v.shape != expect.shape or not torch.equal(v, expect):
            errs.append('%s: %s %s differs from the live slice %s %s' % (
                key, v.dtype, tuple(v.shape), expect.dtype, tuple(expect.shape)))

    r = c.ckpt('scan', path)
    if r.rc != 0 or 'verdict: safe' not in r.out:
        errs.append('%s: exit %d, not safe: %s' % (r.cmd, r.rc, r.out.strip()[-300:]))
    if 'sharded' in entry['name']:
        try:
            torch.load(path, weights_only=True)
            errs.append('torch.load(weights_only=True) read a ShardedTensor file')
        except Exception:
            pass
        if 'weights-only): refused' not in r.out:
            errs.append('scan: the torch.load verdict does not say refused: %s' % r.out[-300:])
        # the fix it gives torch >= 2.6 users: convert (getattr here is data), not "do not load"
        line = next((ln for ln in r.out.splitlines() if '(2.6+, weights-only)' in ln), '')
        if 'fix: ckpt convert %s OUT.pth' % path not in line or 'do not load' in line:
            errs.append('scan: the 2.6+ fix is not ckpt convert: %s' % line[-300:])
    return errs


def hostile(tmp):
    """getattr(ShardedTensor, '__init_subclass__'): same length as the admitted
    'ProcessGroupState', so only the name differs."""
    entry = next(e for e in cases if e['name'] == 'fsdp1_sharded_pt')
    src = os.path.join(FIX, entry['files'][0])
    bad = os.path.join(tmp, 'hostile.pt')
    with zipfile.ZipFile(src) as zi, zipfile.ZipFile(bad, 'w', zipfile.ZIP_STORED) as zo:
        for info in zi.infolist():
            data = zi.read(info)
            if info.filename.endswith('data.pkl'):
                assert data.count(b'ProcessGroupState') == 1
                data = data.replace(b'ProcessGroupState', b'__init_subclass__')
            zo.writestr(info.filename, data)
    errs = []
    r = c.ckpt('inspect', bad)
    if r.rc == 0 or 'getattr' not in r.err:
        errs.append('%s: exit %d, want a refusal naming getattr: %s' % (r.cmd, r.rc, r.err.strip()))
    r = c.ckpt('scan', bad)
    if r.rc == 0 or 'verdict: safe' in r.out:
        errs.append('%s: exit %d, want unsafe: %s' % (r.cmd, r.rc, r.out.strip()[-300:]))
    # here the getattr is not data: no convert offered
    line = next((ln for ln in r.out.splitlines() if '(2.6+, weights-only)' in ln), '')
    if 'do not load it' not in line:
        errs.append('scan: the 2.6+ fix for a hostile getattr: %s' % line[-300:])
    return errs


def placements(tmp):
    """DTensors on a 1-rank mesh (this process, gloo) whose box is not a
    torch.chunk box: Partial and _StridedShard are shown as such, not refused."""
    import socket
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial, Shard
    from torch.distributed.tensor.placement_types import _StridedShard
    with socket.socket() as sk:
        sk.bind(('127.0.0.1', 0))
        port = sk.getsockname()[1]
    dist.init_process_group('gloo', init_method='tcp://127.0.0.1:%d' % port, rank=0, world_size=1)
    try:
        mesh = init_device_mesh('cpu', (1,))
        sd = {'p': DTensor.from_local(torch.arange(6.).reshape(2, 3), mesh, [Partial()]),
              's': DTensor.from_local(torch.arange(4.), mesh, [_StridedShard(0, split_factor=2)]),
              'ok': DTensor.from_local(torch.arange(5.), mesh, [Shard(0)])}
        path = os.path.join(tmp, 'placements.pt')
        torch.save(sd, path)
    finally:
        dist.destroy_process_group()
    errs = []
    r = c.ckpt('inspect', '--json', path)
    if r.rc != 0:
        return ['%s: exit %d: %s' % (r.cmd, r.rc, r.err.strip())]
    got = {tj['path'][0]: tj['shard'] for tj in json.loads(r.out)['tensors']}
    want = {'p': 'placement not supported: Partial', 's': 'placement not supported: _StridedShard',
            'ok': None}
    for k, why in want.items():
        if got[k]['unsupported'] != why or bool(got[k]['chunks']) != (why is None):
            errs.append('%s: %r' % (k, got[k]))
    if got['ok']['chunks'] != [{'offsets': [0], 'sizes': [5], 'rank': 0}]:
        errs.append('ok: %r' % got['ok'])
    r = c.ckpt('scan', path)
    if r.rc != 0 or 'verdict: safe' not in r.out:
        errs.append('%s: exit %d, not safe' % (r.cmd, r.rc))
    return errs


for entry in cases:
    for rel in entry['files']:
        t.run('%s %s (%s)' % (entry['name'], os.path.basename(rel), entry['what']), check_file,
              entry, rel, tmp=True)
t.run('hostile getattr(ShardedTensor, "__init_subclass__") refused', hostile, tmp=True)
t.run('DTensor placements without a torch.chunk box (Partial, _StridedShard) shown, not refused',
      placements, tmp=True)

sys.exit(t.summary())
