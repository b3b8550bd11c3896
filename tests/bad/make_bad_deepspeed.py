#!/usr/bin/env python3
"""DeepSpeed ZeRO folders, good and hostile, written without torch or
DeepSpeed (tests/cli/deepspeed.sh runs it into a scratch folder):

    python3 tests/bad/make_bad_deepspeed.py OUTDIR

The pickles are what torch.save / DeepSpeed write (protocol 2, the same
globals and persistent ids, doc/distributed-formats.md section 4),
made by Python's pickler over stand-in modules named torch, torch._utils,
deepspeed.*: nothing of them is imported, and nothing here can run.  The
zips are torch's layout (stored records under a folder named as the file).

Good folders, each with EXPECTED.pth beside it (the fp32 state dict
zero_to_fp32 gives, in its order; same pickler):
  good_zero2/   latest + global_step3/: ZeRO-2, 2 ranks, one group of a (3x2)
                and b (5): partitions of 6 and 5 elements (rank 1's a view of 5
                on a 6-element storage), a buffer, a frozen 2x2 from
                frozen_param_fragments, tied alias c -> a; module holds
                other values (the weights are the optim files')
  good_zero1_fp16/ ZeRO-1 of fp16 training (DynamicLossScaler): module in fp16,
                the frozen fz only there (ZeRO-1 records none), fp32 partitions
  good_zero3/   global_step3/ only (IN is the tag folder): ZeRO-3, 2 ranks,
                a: 3 + 3, b: 3 + 2 (+1 pad), frozen fz: 2 + 2 per rank
Hostile folders (each must be refused: exit 3, one line, no OUT):
  missing_rank        rank 1's optim file is gone
  short_partition     rank 1's partition holds 2 of its 5 elements
  latest_escape       latest says ../x
  latest_missing_tag  latest names a tag folder that is not there
  truncated_optim     rank 1's optim file cut at 60%
  bad_partition_count partition_count [0]
  count_more_ranks    partition_count [3] with 2 optim files
  view_past_storage   rank 0's partition: 6 elements from offset 3 of 6
  padding_overrun     param_alignment_paddings [[9, 0]]: past the partitions
  stage3_unequal      ZeRO-3 rank 1's flat group 2 elements short
  getattr_not_data    zero_stage = getattr(ZeroStageEnum, '__init__')
  not_a_tensor        single_partition_of_fp32_groups[0] is a string
  latest_symlink      the tag folder latest names is a link to a folder outside
                      (_outside/global_step3, a good one)
  big_endian          rank 0's optim file says byteorder big
  crc_flip            a byte of rank 0's partition record flipped (inspect
                      --stats and convert refuse it; plain inspect reads no data)
  crc_flip_padding    a byte of rank 1's partition record flipped in its padding,
                      which no output tensor takes (refused the same: the
                      records check reads what the copy did not)

    python3 tests/bad/make_bad_deepspeed.py --from W.safetensors --stage S --ranks N OUTDIR

writes instead one ZeRO-S folder of N ranks (latest + global_step1/) whose
trainable parameters are the float32 tensors of W.safetensors (one group,
in its order), so that a model's weights can go through a ZeRO folder and
be verified (tests/cli/deepspeed.sh: ckpt verify on the folder).
"""
import collections
import copyreg
import io
import os
import pickle
import shutil
import struct
import sys
import types
import zipfile

# ---- stand-ins for the classes the pickles name ------------------------------------------------


def module(name):
    """A stand-in module NAME (and its parent packages), never a real one."""
    parts = name.split('.')
    for i in range(1, len(parts) + 1):
        sub = '.'.join(parts[:i])
        if sub not in sys.modules:
            sys.modules[sub] = types.ModuleType(sub)
            sys.modules[sub].__path__ = []
            if i > 1:
                setattr(sys.modules['.'.join(parts[:i - 1])], parts[i - 1], sys.modules[sub])
    return sys.modules[name]


torch = module('torch')
tutils = module('torch._utils')
ds_config = module('deepspeed.runtime.zero.config')
ds_loss = module('deepspeed.runtime.fp16.loss_scaler')
ds_frag = module('deepspeed.utils.tensor_fragment')


class Storage:
    """A storage: persistent id ('storage', torch.<X>Storage, key, 'cpu', numel),
    of float32 VALUES, or of RAW little-endian float32 bytes."""

    def __init__(self, values=(), kind='f', raw=None):
        self.values, self.kind, self.raw = list(values), kind, raw
        self.key = None

    def numel(self):
        return len(self.raw) // 4 if self.raw is not None else len(self.values)

    def data(self):
        if self.raw is not None:
            return self.raw
        return struct.pack('<%d%s' % (len(self.values), self.kind), *self.values)


class FloatStorage:
    pass


FloatStorage.__module__, FloatStorage.__qualname__ = 'torch', 'FloatStorage'
torch.FloatStorage = FloatStorage


class HalfStorage:
    pass


HalfStorage.__module__, HalfStorage.__qualname__ = 'torch', 'HalfStorage'
torch.HalfStorage = HalfStorage


class Size(tuple):
    def __reduce__(self):
        return (Size, (tuple(self),))


Size.__module__, Size.__qualname__ = 'torch', 'Size'
torch.Size = Size


def _rebuild_tensor_v2(*a):
    raise AssertionError('never called')


_rebuild_tensor_v2.__module__, _rebuild_tensor_v2.__qualname__ = 'torch._utils', '_rebuild_tensor_v2'
tutils._rebuild_tensor_v2 = _rebuild_tensor_v2


class Tensor:
    """A view of NUMEL (shape) elements from OFFSET of a storage."""

    def __init__(self, storage, shape, offset=0):
        self.storage, self.shape, self.offset = storage, tuple(shape), offset

    def __reduce__(self):
        stride, acc = [], 1
        for d in reversed(self.shape):
            stride.insert(0, acc)
            acc *= d or 1
        return (_rebuild_tensor_v2, (self.storage, self.offset, self.shape, tuple(stride), False,
                                     collections.OrderedDict()))


class ZeroStageEnum:
    pass


ZeroStageEnum.__module__ = 'deepspeed.runtime.zero.config'
ZeroStageEnum.__qualname__ = 'ZeroStageEnum'
ds_config.ZeroStageEnum = ZeroStageEnum


class Stage:
    """getattr(ZeroStageEnum, NAME): how the enum pickles under Python 3.11+."""

    def __init__(self, name):
        self.name = name

    def __reduce__(self):
        return (getattr, (ZeroStageEnum, self.name))


class LossScaler:
    def __init__(self):
        self.cur_scale, self.dynamic = 1.0, False


LossScaler.__module__, LossScaler.__qualname__ = 'deepspeed.runtime.fp16.loss_scaler', 'LossScaler'
ds_loss.LossScaler = LossScaler


class DynamicLossScaler:
    """fp16 training's scaler (NEWOBJ + BUILD of its attributes)."""

    def __init__(self):
        self.cur_scale, self.cur_iter, self.scale_window = 65536.0, 2, 1000


DynamicLossScaler.__module__ = 'deepspeed.runtime.fp16.loss_scaler'
DynamicLossScaler.__qualname__ = 'DynamicLossScaler'
ds_loss.DynamicLossScaler = DynamicLossScaler


class fragment_address:
    def __init__(self, numel, start):
        self.numel, self.start = numel, start


fragment_address.__module__ = 'deepspeed.utils.tensor_fragment'
fragment_address.__qualname__ = 'fragment_address'
ds_frag.fragment_address = fragment_address


def torch_save(obj, path, byteorder='little'):
    """OBJ as torch.save's zip: stem/data.pkl, stem/data/<key> (stored), version, byteorder."""
    stem = os.path.basename(path).rsplit('.', 1)[0]
    storages = []

    class P(pickle.Pickler):
        def persistent_id(self, o):
            if isinstance(o, Storage):
                if o.key is None:
                    o.key = str(len(storages))
                    storages.append(o)
                return ('storage', HalfStorage if o.kind == 'e' else FloatStorage, o.key, 'cpu',
                        o.numel())
            return None

    buf = io.BytesIO()
    P(buf, protocol=2).dump(obj)
    with zipfile.ZipFile(path, 'w', zipfile.ZIP_STORED) as z:
        z.writestr(stem + '/data.pkl', buf.getvalue())
        z.writestr(stem + '/byteorder', byteorder)
        for s in storages:
            z.writestr(stem + '/data/' + s.key, s.data())
        z.writestr(stem + '/version', '3\n')
    for s in storages:  # a storage saved again gets its key in that file
        s.key = None


OD = collections.OrderedDict

# ---- the good folders ------------------------------------------------------------------------

A = [0.5 * i for i in range(6)]          # a: 3x2
B = [10.0 + i for i in range(5)]         # b: 5
RUNNING = [1.0, 2.0, 3.0]
FZ = [-1.0, -2.0, -3.0, -4.0]            # frozen 2x2


def model_states(stage, rank=0, world=2):
    shapes = [OD([('a', Size((3, 2))), ('b', Size((5,)))])]
    if stage < 3:
        module = OD([('running', Tensor(Storage(RUNNING), (3,))),
                     ('a', Tensor(Storage([9.0] * 6), (3, 2))),   # not the weights
                     ('b', Tensor(Storage([9.0] * 5), (5,))),
                     ('fz', Tensor(Storage(FZ), (2, 2)))])
        module['c'] = module['a']
        frag = OD([('fz', Tensor(Storage(FZ), (2, 2)))])
    else:
        empty = Storage([])
        module = OD([('running', Tensor(Storage(RUNNING), (3,))), ('a', Tensor(empty, (0,))),
                     ('b', Tensor(empty, (0,))), ('fz', Tensor(empty, (0,)))])
        module['c'] = module['a']
        frag = OD([('fz', Tensor(Storage(FZ[2 * rank:2 * rank + 2]), (2,)))])
    return {'module': module, 'buffer_names': ['running'], 'optimizer': None,
            'param_shapes': shapes, 'frozen_param_shapes': OD([('fz', Size((2, 2)))]),
            'shared_params': {'c': 'a'} if rank == 0 else {}, 'frozen_param_fragments': frag,
            'lr_scheduler': None, 'skipped_steps': 0, 'global_steps': 3, 'dp_world_size': world,
            'mp_world_size': 1, 'ds_config': {'train_batch_size': 4}, 'ds_version': '0.19.8'}


def optim_states(stage, rank, flat, paddings=None, count=None, zero_stage=None):
    osd = {'loss_scaler': LossScaler(), 'dynamic_loss_scale': False, 'overflow': False,
           'zero_stage': Stage(zero_stage or {2: 'gradients', 3: 'weights'}[stage])}
    if stage < 3:
        osd.update({'single_partition_of_fp32_groups': flat,
                    'group_paddings': [1 if rank == 1 else 0],
                    'param_alignment_paddings': paddings or [[0, 0]],
                    'partition_count': count or [2],
                    'param_slice_mappings': [OD([('a', fragment_address(6 if rank == 0 else 0, 0))])]})
    else:
        osd.update({'fp32_flat_groups': flat, 'partition_count': count or 2})
    return {'optimizer_state_dict': osd, 'ds_config': {}, 'ds_version': '0.19.8'}


def zero2_flat(rank, short=False):
    full = A + B + [0.0]                  # 11 elements + 1 of padding, 6 a rank
    if rank == 0:
        return [Tensor(Storage(full[:6]), (6,))]
    return [Tensor(Storage(full[6:]), (2 if short else 5,))]  # a view of 5 on 6


def zero3_flat(rank, short=False):
    a = A[3 * rank:3 * rank + 3]
    b = (B + [0.0])[3 * rank:3 * rank + 3]
    vals = a + b
    if short:
        vals = vals[:-2]
    return [Tensor(Storage(vals), (len(vals),))]


def write_folder(path, stage, tag='global_step3', latest=True, **kw):
    g = os.path.join(path, tag)
    os.makedirs(g)
    if latest:
        with open(os.path.join(path, 'latest'), 'w') as f:
            f.write(tag)
    flat = zero2_flat if stage < 3 else zero3_flat
    if stage < 3:
        torch_save(model_states(stage), os.path.join(g, 'mp_rank_00_model_states.pt'))
    for r in range(2):
        if stage == 3:
            torch_save(model_states(3, r), os.path.join(g, 'zero_pp_rank_%d_mp_rank_00_model_states.pt' % r))
        fl = kw.get('flat', {}).get(r) or flat(r)
        torch_save(optim_states(stage, r, fl, kw.get('paddings'), kw.get('count'), kw.get('zero_stage')),
                   os.path.join(g, 'zero_pp_rank_%d_mp_rank_00_optim_states.pt' % r))
    return g


def expected(path):
    """zero_to_fp32's dict: buffers, frozen, trainable, aliases (c is a's tensor)."""
    a = Tensor(Storage(A), (3, 2))
    sd = OD([('running', Tensor(Storage(RUNNING), (3,))), ('fz', Tensor(Storage(FZ), (2, 2))),
             ('a', a), ('b', Tensor(Storage(B), (5,))), ('c', a)])
    torch_save(sd, path)


def main(out):
    os.makedirs(out, exist_ok=True)
    for name in os.listdir(out):
        p = os.path.join(out, name)
        shutil.rmtree(p) if os.path.isdir(p) else os.remove(p)
    write_folder(os.path.join(out, 'good_zero2'), 2)
    write_folder(os.path.join(out, 'good_zero3'), 3, latest=False)
    expected(os.path.join(out, 'EXPECTED.pth'))

    # fp16 training at ZeRO-1: module in fp16 (frozen fz only there), fp32 partitions
    g = write_folder(os.path.join(out, 'good_zero1_fp16'), 2)
    ms = model_states(2)
    for k in ('running', 'a', 'b', 'fz'):
        ms['module'][k].storage.kind = 'e'
    ms['module']['c'] = ms['module']['a']
    ms.update(frozen_param_shapes=None, frozen_param_fragments=None)
    torch_save(ms, os.path.join(g, 'mp_rank_00_model_states.pt'))
    for r in range(2):
        o = optim_states(2, r, zero2_flat(r), zero_stage='optimizer_states')
        o['optimizer_state_dict']['loss_scaler'] = DynamicLossScaler()
        o['optimizer_state_dict']['dynamic_loss_scale'] = True
        torch_save(o, os.path.join(g, 'zero_pp_rank_%d_mp_rank_00_optim_states.pt' % r))
    g = write_folder(os.path.join(out, 'missing_rank'), 2)
    os.remove(os.path.join(g, 'zero_pp_rank_1_mp_rank_00_optim_states.pt'))
    write_folder(os.path.join(out, 'short_partition'), 2, flat={1: zero2_flat(1, short=True)})
    write_folder(os.path.join(out, 'latest_escape'), 2)
    with open(os.path.join(out, 'latest_escape', 'latest'), 'w') as f:
        f.write('../x')
    write_folder(os.path.join(out, 'latest_missing_tag'), 2)
    with open(os.path.join(out, 'latest_missing_tag', 'latest'), 'w') as f:
        f.write('global_step9')
    g = write_folder(os.path.join(out, 'truncated_optim'), 2)
    p = os.path.join(g, 'zero_pp_rank_1_mp_rank_00_optim_states.pt')
    data = open(p, 'rb').read()
    open(p, 'wb').write(data[:len(data) * 6 // 10])
    write_folder(os.path.join(out, 'bad_partition_count'), 2, count=[0])
    write_folder(os.path.join(out, 'count_more_ranks'), 2, count=[3])
    write_folder(os.path.join(out, 'view_past_storage'), 2,
                 flat={0: [Tensor(Storage(A), (6,), offset=3)]})
    write_folder(os.path.join(out, 'padding_overrun'), 2, paddings=[[9, 0]])
    write_folder(os.path.join(out, 'stage3_unequal'), 3, flat={1: zero3_flat(1, short=True)})
    write_folder(os.path.join(out, 'getattr_not_data'), 2, zero_stage='__init__')
    write_folder(os.path.join(out, 'not_a_tensor'), 2, flat={0: ['not a tensor']})
    write_folder(os.path.join(out, '_outside'), 2, latest=False)
    os.makedirs(os.path.join(out, 'latest_symlink'))
    with open(os.path.join(out, 'latest_symlink', 'latest'), 'w') as f:
        f.write('global_step3')
    os.symlink(os.path.join('..', '_outside', 'global_step3'),
               os.path.join(out, 'latest_symlink', 'global_step3'))
    g = write_folder(os.path.join(out, 'big_endian'), 2)
    torch_save(optim_states(2, 0, zero2_flat(0)),
               os.path.join(g, 'zero_pp_rank_0_mp_rank_00_optim_states.pt'), byteorder='big')
    g = write_folder(os.path.join(out, 'crc_flip'), 2)
    p = os.path.join(g, 'zero_pp_rank_0_mp_rank_00_optim_states.pt')
    with zipfile.ZipFile(p) as z:
        info = z.getinfo('zero_pp_rank_0_mp_rank_00_optim_states/data/0')
        at = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra)
    data = bytearray(open(p, 'rb').read())
    data[at + 5] ^= 0x40
    open(p, 'wb').write(bytes(data))
    g = write_folder(os.path.join(out, 'crc_flip_padding'), 2)
    p = os.path.join(g, 'zero_pp_rank_1_mp_rank_00_optim_states.pt')
    with zipfile.ZipFile(p) as z:
        info = z.getinfo('zero_pp_rank_1_mp_rank_00_optim_states/data/0')
        at = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra)
    data = bytearray(open(p, 'rb').read())
    data[at + 5 * 4 + 1] ^= 0x40  # element 5 of 6: the padding after the view of 5
    open(p, 'wb').write(bytes(data))


def read_safetensors(path):
    """The float32 tensors of a safetensors file: [(name, shape, bytes)] in offset order."""
    import json
    with open(path, 'rb') as f:
        n = struct.unpack('<Q', f.read(8))[0]
        head = json.loads(f.read(n))
        data = f.read()
    out = []
    for name, e in head.items():
        if name == '__metadata__':
            continue
        if e['dtype'] != 'F32':
            sys.exit('%s: %s is %s, not F32' % (path, name, e['dtype']))
        a, b = e['data_offsets']
        out.append((a, name, tuple(e['shape']), data[a:b]))
    return [(n, sh, d) for _, n, sh, d in sorted(out)]


def from_weights(path, stage, world, out):
    """A ZeRO-STAGE folder of WORLD ranks holding PATH's tensors as its trainable parameters."""
    ts = read_safetensors(path)
    g = os.path.join(out, 'global_step1')
    os.makedirs(g)
    with open(os.path.join(out, 'latest'), 'w') as f:
        f.write('global_step1')
    shapes = [OD((n, Size(sh)) for n, sh, _ in ts)]
    empty = Storage([])
    ms = {'module': OD((n, Tensor(empty, (0,)) if stage == 3 else Tensor(Storage(raw=d), sh))
                       for n, sh, d in ts),
          'buffer_names': [], 'optimizer': None, 'param_shapes': shapes,
          'frozen_param_shapes': None, 'frozen_param_fragments': None, 'shared_params': {},
          'ds_version': '0.19.8'}
    if stage < 3:
        torch_save(ms, os.path.join(g, 'mp_rank_00_model_states.pt'))
        flat = b''.join(d for _, _, d in ts)
        n = len(flat) // 4
        padded = -(-n // (2 * world)) * 2 * world
        part = padded // world
        flat += b'\0' * 4 * (padded - n)
        for r in range(world):
            size = min(part, max(0, n - r * part))  # the tail padding stripped
            st = Storage(raw=flat[4 * r * part:4 * (r + 1) * part])
            osd = optim_states(stage, r, [Tensor(st, (size,))],
                               paddings=[[0] * len(ts)], count=[world])
            osd['optimizer_state_dict']['group_paddings'] = [part - size]
            torch_save(osd, os.path.join(g, 'zero_pp_rank_%d_mp_rank_00_optim_states.pt' % r))
        return
    for r in range(world):
        chunks = []
        for _, _, d in ts:
            k = len(d) // 4
            p = -(-k // world)
            c = d[4 * r * p:4 * (r + 1) * p]
            chunks.append(c + b'\0' * (4 * p - len(c)))
        flat = b''.join(chunks)
        msr = dict(ms, shared_params={}, frozen_param_shapes=None)
        torch_save(msr, os.path.join(g, 'zero_pp_rank_%d_mp_rank_00_model_states.pt' % r))
        torch_save(optim_states(3, r, [Tensor(Storage(raw=flat), (len(flat) // 4,))], count=world),
                   os.path.join(g, 'zero_pp_rank_%d_mp_rank_00_optim_states.pt' % r))


if __name__ == '__main__':
    args = sys.argv[1:]
    if len(args) == 7 and args[0] == '--from' and args[2] == '--stage' and args[4] == '--ranks':
        from_weights(args[1], int(args[3]), int(args[5]), args[6])
    elif len(args) == 1:
        main(args[0])
    else:
        sys.exit(__doc__)
