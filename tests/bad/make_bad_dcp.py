#!/usr/bin/env python3
"""make_bad_dcp.py - torch.distributed.checkpoint folders written without torch
(Python's stdlib only), as FileSystemWriter lays them out
(doc/distributed-formats.md section 1): a `.metadata` pickle of the
metadata dataclasses (protocol 4, enum members by getattr as Python 3.11
pickles them) and `__R_0.distcp` files of torch.save zips back to back.

    make_bad_dcp.py OUTDIR            the good folder and every hostile one
    make_bad_dcp.py --scale OUTDIR    1,000 ranks, 100,000 tensors, tiny items

Folders made (tests/cli/dcp.sh runs ckpt on them):
  good/             two ranks; 'model.w' (6, 4) float32 split 4 + 2 rows,
                    'model.b' (3,) on rank 0, 'step' a BYTES item (an int)
  out_of_bounds/    a chunk reaching past the tensor's rows
  overlap/          two chunks sharing row 3
  hole/             row 5 in no chunk
  offset_past_eof/  an item said to lie past its file's end
  escape/           a relative_path of '../x.distcp'
  absolute/         a relative_path of '/etc/passwd'
  unknown_global/   the metadata names evil_module.Payload (not a DCP record)
  unknown_in_item/  the BYTES item 'step' holds an evil_module.Payload
  os_system/        the metadata calls os.system
  truncated_zip/    an item whose zip lost its last bytes (end record)
  missing_rank/     rank 1's data file is gone
  list_index/       planner_data puts model.b at list index 99,999,999
  crc_flip/         one byte of rank 1's tensor data changed (its item's CRC-32 says so)
The values: model.w[i][j] = 10*i + j, model.b = [0.5, 1.5, 2.5], step = 7.
"""
import collections
import io
import os
import pickle
import struct
import sys
import types
import zipfile
import enum

# ---- stand-ins pickled under torch's names ------------------------------------

def module(name):
    m = sys.modules.get(name)
    if m is None:
        m = types.ModuleType(name)
        sys.modules[name] = m
        parent, _, child = name.rpartition(".")
        if parent:
            setattr(module(parent), child, m)
    return m


def defclass(modname, name, base=object, attrs=None):
    cls = type(name, (base,), dict(attrs or {}))
    cls.__module__ = modname
    cls.__qualname__ = name
    setattr(module(modname), name, cls)
    return cls


MD = "torch.distributed.checkpoint.metadata"
FS = "torch.distributed.checkpoint.filesystem"


class Record:
    """A dataclass as pickle sees it: NEWOBJ, then BUILD with its fields."""
    def __init__(self, **kw):
        self.__dict__.update(kw)

    def __reduce_ex__(self, proto):
        return (copyreg_newobj, (type(self),), dict(self.__dict__))


import copyreg
copyreg_newobj = copyreg.__newobj__

Metadata = defclass(MD, "Metadata", Record)
TensorStorageMetadata = defclass(MD, "TensorStorageMetadata", Record)
ChunkStorageMetadata = defclass(MD, "ChunkStorageMetadata", Record)
BytesStorageMetadata = defclass(MD, "BytesStorageMetadata", Record)
MetadataIndex = defclass(MD, "MetadataIndex", Record, {"__hash__": lambda s: hash(s.fqn + repr(getattr(s, "offset", None))),
                                                       "__eq__": lambda a, b: a is b})
StorageInfo = defclass(FS, "_StorageInfo", Record)


class MemFormat(enum.Enum):
    TORCH_CONTIGUOUS_FORMAT = 0
    TORCH_CHANNELS_LAST = 1
    TORCH_PRESERVE_FORMAT = 2

    def __reduce_ex__(self, proto):
        return getattr, (type(self), self.name)  # as torch 2.15's metadata has it


MemFormat.__module__ = MD
MemFormat.__qualname__ = "_MEM_FORMAT_ENCODING"
setattr(module(MD), "_MEM_FORMAT_ENCODING", MemFormat)


def _get_layout(name):
    return name


_get_layout.__module__ = "torch.serialization"
setattr(module("torch.serialization"), "_get_layout", _get_layout)


class Layout:
    def __reduce__(self):
        return (_get_layout, ("torch.strided",))


class DType:
    def __init__(self, name):
        self.name = name
        self.__module__ = "torch"
        setattr(module("torch"), name, self)

    def __reduce__(self):
        return self.name


float32 = DType("float32")


class Size(tuple):
    def __reduce__(self):
        return (Size, (tuple(self),))


Size.__module__ = "torch"
Size.__qualname__ = "Size"
setattr(module("torch"), "Size", Size)


class TensorProperties:
    """BUILD with a tuple: TensorProperties.__setstate__."""
    def __init__(self, dtype):
        self.dtype = dtype

    def __reduce_ex__(self, proto):
        return (copyreg_newobj, (TensorProperties,),
                (self.dtype, Layout(), False, MemFormat.TORCH_CONTIGUOUS_FORMAT, False, Size()))


TensorProperties.__module__ = MD
setattr(module(MD), "TensorProperties", TensorProperties)


class Call:
    """Any global called with arguments (a hostile metadata's payload)."""
    def __init__(self, mod, name, args):
        self.f = defclass(mod, name) if not hasattr(module(mod), name) else getattr(module(mod), name)
        self.args = args

    def __reduce__(self):
        return (self.f, self.args)


# ---- torch.save zips ------------------------------------------------------------

def _rebuild_tensor_v2(*a):
    return a


_rebuild_tensor_v2.__module__ = "torch._utils"
setattr(module("torch._utils"), "_rebuild_tensor_v2", _rebuild_tensor_v2)
FloatStorage = defclass("torch", "FloatStorage")


class Storage:
    def __init__(self, numel):
        self.numel = numel


class Tensor:
    def __init__(self, shape, storage):
        self.shape, self.storage = shape, storage

    def __reduce__(self):
        stride, acc = [], 1
        for n in reversed(self.shape):
            stride.insert(0, acc)
            acc *= n
        return (_rebuild_tensor_v2, (self.storage, 0, tuple(self.shape), tuple(stride), False,
                                     collections.OrderedDict()))


class SavePickler(pickle.Pickler):
    def persistent_id(self, obj):
        if isinstance(obj, Storage):
            return ("storage", FloatStorage, "0", "cpu", obj.numel)
        return None


def torch_save(value, floats=None):
    """The bytes of torch.save(value) (one float32 storage '0' holding FLOATS)."""
    buf = io.BytesIO()
    SavePickler(buf, protocol=2).dump(value)
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", buf.getvalue())
        z.writestr("archive/byteorder", "little")
        if floats is not None:
            z.writestr("archive/data/0", struct.pack("<%df" % len(floats), *floats))
        z.writestr("archive/version", "3\n")
    return out.getvalue()


def tensor_item(shape, floats):
    return torch_save(Tensor(shape, Storage(len(floats))), floats)


# ---- folders ---------------------------------------------------------------------

def write_folder(path, tensors, byte_items, meta_extra=None, planner_fix=None):
    """TENSORS: {fqn: (global shape, [(rank, offsets, sizes, floats)])};
    BYTE_ITEMS: {fqn: (rank, value)}.  Returns {(fqn, offsets): StorageInfo}
    after writing, for callers that corrupt them (they rewrite .metadata)."""
    os.makedirs(path, exist_ok=True)
    files = collections.defaultdict(bytearray)
    sdm, storage, planner = {}, {}, {}
    for fqn, (rank, value) in byte_items.items():
        blob = torch_save(value)
        name = "__%d_0.distcp" % rank
        storage[MetadataIndex(fqn=fqn, index=None)] = StorageInfo(
            relative_path=name, offset=len(files[name]), length=len(blob))
        files[name] += blob
        sdm[fqn] = BytesStorageMetadata()
        planner[fqn] = tuple(fqn.split("."))
    for fqn, (shape, chunks) in tensors.items():
        metas = []
        for i, (rank, off, sizes, floats) in enumerate(chunks):
            blob = tensor_item(list(sizes), floats)
            name = "__%d_0.distcp" % rank
            storage[MetadataIndex(fqn=fqn, offset=Size(off), index=i)] = StorageInfo(
                relative_path=name, offset=len(files[name]), length=len(blob))
            files[name] += blob
            metas.append(ChunkStorageMetadata(offsets=Size(off), sizes=Size(sizes)))
        sdm[fqn] = TensorStorageMetadata(properties=TensorProperties(float32), size=Size(shape),
                                         chunks=metas)
        planner[fqn] = tuple(fqn.split("."))
    for name, data in files.items():
        with open(os.path.join(path, name), "wb") as f:
            f.write(data)
    if planner_fix:
        planner_fix(planner)
    md = Metadata(state_dict_metadata=sdm, planner_data=planner, storage_data=storage,
                  storage_meta=None, version="1.0.0")
    if meta_extra:
        md.__dict__.update(meta_extra)
    with open(os.path.join(path, ".metadata"), "wb") as f:
        pickle.dump(md, f, protocol=4)
    return storage


def good_parts():
    w = [[10.0 * i + j for j in range(4)] for i in range(6)]
    flat = lambda rows: [x for r in rows for x in r]
    tensors = {
        "model.w": ([6, 4], [(0, [0, 0], [4, 4], flat(w[0:4])), (1, [4, 0], [2, 4], flat(w[4:6]))]),
        "model.b": ([3], [(0, [0], [3], [0.5, 1.5, 2.5])]),
    }
    return tensors, {"step": (0, 7)}, w, flat


def make_all(out):
    tensors, items, w, flat = good_parts()
    write_folder(os.path.join(out, "good"), tensors, items)

    t = dict(tensors)
    t["model.w"] = ([6, 4], [(0, [0, 0], [4, 4], flat(w[0:4])), (1, [4, 0], [3, 4], flat(w[3:6]))])
    write_folder(os.path.join(out, "out_of_bounds"), t, items)
    t["model.w"] = ([6, 4], [(0, [0, 0], [4, 4], flat(w[0:4])), (1, [3, 0], [3, 4], flat(w[3:6]))])
    write_folder(os.path.join(out, "overlap"), t, items)
    t["model.w"] = ([6, 4], [(0, [0, 0], [4, 4], flat(w[0:4])), (1, [4, 0], [1, 4], flat(w[4:5]))])
    write_folder(os.path.join(out, "hole"), t, items)

    # the storage entries are objects in the pickle: rewrite the whole metadata
    def variant(name, change_info=None, extra=None):
        p = os.path.join(out, name)
        st = write_folder(p, tensors, items)
        if change_info or extra:
            if change_info:
                change_info(st)
            sdm = {}
            planner = {}
            for fqn, (shape, chunks) in tensors.items():
                sdm[fqn] = TensorStorageMetadata(
                    properties=TensorProperties(float32), size=Size(shape),
                    chunks=[ChunkStorageMetadata(offsets=Size(o), sizes=Size(s))
                            for _, o, s, _ in chunks])
                planner[fqn] = tuple(fqn.split("."))
            for fqn in items:
                sdm = {fqn: BytesStorageMetadata(), **sdm}
                planner[fqn] = (fqn,)
            md = Metadata(state_dict_metadata=sdm, planner_data=planner, storage_data=st,
                          storage_meta=None, version="1.0.0")
            if extra:
                md.__dict__.update(extra)
            with open(os.path.join(p, ".metadata"), "wb") as f:
                pickle.dump(md, f, protocol=4)
        return p

    def info_of(st, fqn, rank=None):
        for k, v in st.items():
            if k.fqn == fqn and (rank is None or v.relative_path == "__%d_0.distcp" % rank):
                return v
        raise KeyError(fqn)

    variant("offset_past_eof", lambda st: setattr(info_of(st, "model.b"), "offset", 100000))
    variant("escape", lambda st: setattr(info_of(st, "model.w", 1), "relative_path", "../x.distcp"))
    variant("absolute", lambda st: setattr(info_of(st, "model.w", 1), "relative_path", "/etc/passwd"))
    evil = defclass("evil_module", "Payload", Record)
    variant("unknown_global", extra={"storage_meta": evil(x=1)})
    variant("os_system", extra={"storage_meta": Call("os", "system", ("true",))})

    p = variant("truncated_zip")
    # cut rank 1's only item short by its end record (the file shrinks too)
    f1 = os.path.join(p, "__1_0.distcp")
    data = open(f1, "rb").read()
    st = write_folder(p, tensors, items)
    info = info_of(st, "model.w", 1)
    with open(f1, "wb") as f:
        f.write(data[:-22])
    info.length -= 22
    # rewrite the metadata with the shorter length
    sdm = {"step": BytesStorageMetadata()}
    planner = {"step": ("step",)}
    for fqn, (shape, chunks) in tensors.items():
        sdm[fqn] = TensorStorageMetadata(
            properties=TensorProperties(float32), size=Size(shape),
            chunks=[ChunkStorageMetadata(offsets=Size(o), sizes=Size(s)) for _, o, s, _ in chunks])
        planner[fqn] = tuple(fqn.split("."))
    variant_md = Metadata(state_dict_metadata=sdm, planner_data=planner, storage_data=st,
                          storage_meta=None, version="1.0.0")
    with open(os.path.join(p, ".metadata"), "wb") as f:
        pickle.dump(variant_md, f, protocol=4)

    write_folder(os.path.join(out, "unknown_in_item"), tensors, {"step": (0, evil(x=1))})
    write_folder(os.path.join(out, "list_index"), tensors, items,
                 planner_fix=lambda p: p.update({"model.b": ("model", "b", 99999999)}))

    p = variant("missing_rank")
    os.unlink(os.path.join(p, "__1_0.distcp"))

    p = variant("crc_flip")
    f1 = os.path.join(p, "__1_0.distcp")
    data = bytearray(open(f1, "rb").read())
    info = zipfile.ZipFile(io.BytesIO(bytes(data))).getinfo("archive/data/0")
    nl, xl = struct.unpack("<HH", data[info.header_offset + 26:info.header_offset + 30])
    data[info.header_offset + 30 + nl + xl + 5] ^= 0x40
    with open(f1, "wb") as f:
        f.write(data)


def make_scale(out, ranks=1000, tensors=100000):
    """RANKS ranks, each saving TENSORS/RANKS one-element tensors: the items
    are the same tiny zip, written once per rank file and shared by its
    tensors' entries (the metadata still lists every one)."""
    os.makedirs(out, exist_ok=True)
    per = tensors // ranks
    blob = tensor_item([1], [1.0])
    sdm, storage, planner = {}, {}, {}
    props = TensorProperties(float32)
    one, zero = Size((1,)), Size((0,))
    for r in range(ranks):
        name = "__%d_0.distcp" % r
        with open(os.path.join(out, name), "wb") as f:
            f.write(blob)
        for i in range(per):
            fqn = "layers.%d.p%d" % (r, i)
            storage[MetadataIndex(fqn=fqn, offset=zero, index=0)] = StorageInfo(
                relative_path=name, offset=0, length=len(blob))
            sdm[fqn] = TensorStorageMetadata(properties=props, size=one,
                                             chunks=[ChunkStorageMetadata(offsets=zero, sizes=one)])
            planner[fqn] = ("layers", str(r), "p%d" % i)
    md = Metadata(state_dict_metadata=sdm, planner_data=planner, storage_data=storage,
                  storage_meta=None, version="1.0.0")
    with open(os.path.join(out, ".metadata"), "wb") as f:
        pickle.dump(md, f, protocol=4)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--scale":
        make_scale(sys.argv[2])
    elif len(sys.argv) == 2:
        make_all(sys.argv[1])
    else:
        sys.exit("usage: make_bad_dcp.py [--scale] OUTDIR")
