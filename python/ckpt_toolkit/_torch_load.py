"""torch_load: torch.load(f, weights_only=True)'s object, built from ckpt's value tree.

Nothing in the file is run or imported: libckpt's VM has read the pickle into
a tree of values, and this walks it, building each node from a fixed table of
types (doc/design.md, "Python"): containers, numbers, strings, bytes,
torch.Size, dtypes, devices, argparse.Namespace, numpy arrays, dtypes and
scalars, tensors and parameters; a module tree (a pickled nn.Module, a
TorchScript archive's module) becomes its state dict.  Any other global
raises CheckpointError naming it.  A value the pickle shares (its memo) is
one Python object, and tensors on one storage are views of one buffer, as
torch.load gives them.
"""

from __future__ import annotations

import argparse
import codecs
import collections
import io
import os
import shutil
import tempfile
from ctypes import byref, c_int64
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

import numpy as np

from . import _dtypes
from ._errors import EXIT_BAD_INPUT, EXIT_IO, EXIT_USAGE, CheckpointError
from ._file import (K_BOOL, K_BYTES, K_DICT, K_FLOAT, K_FROZENSET, K_GLOBAL, K_INT, K_LIST,
                    K_NONE, K_OBJECT, K_SET, K_STORAGE, K_STR, K_TENSOR, K_TUPLE, T_DENSE,
                    T_META, T_QUANTIZED, File, Strided, TensorInfo, torch_view, value_int,
                    value_str)
from ._native import CkptPath, QParams, text


class DeviceMissingError(CheckpointError, RuntimeError):
    """A tensor was saved on a device this machine lacks and map_location keeps it
    there, or safe_open was asked for one (torch.load raises RuntimeError then;
    this is both).  Exit status 4, as ckpt gives a device it cannot use."""


def check_device(torch: Any, dev: str, path: str) -> None:
    """DeviceMissingError, in torch.load's words, when DEV is a CUDA device this
    machine lacks."""
    if not dev.startswith("cuda"):
        return
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    idx = int(dev.split(":", 1)[1]) if ":" in dev else 0
    if n == 0:
        raise DeviceMissingError(
            EXIT_IO, "Attempting to deserialize object on a CUDA device but "
            "torch.cuda.is_available() is False. If you are running on a CPU-only "
            "machine, please use torch.load with map_location=torch.device('cpu') to "
            "map your storages to the CPU.", path)
    if idx >= n:
        raise DeviceMissingError(
            EXIT_IO, f"Attempting to deserialize object on CUDA device {idx} "
            f"but torch.cuda.device_count() is {n}. Please use torch.load with "
            "map_location to map your storages to an existing device.", path)


MapLocation = Union[None, str, Any, Dict[str, str], Callable[..., Any]]

# the torch globals that are plain values (dtypes are looked up by name)
_TORCH_VALUES = ("torch.per_tensor_affine", "torch.per_channel_affine",
                 "torch.per_tensor_symmetric", "torch.per_channel_symmetric",
                 "torch.per_channel_affine_float_qparams", "torch.sparse_coo",
                 "torch.sparse_csr", "torch.sparse_csc", "torch.sparse_bsr", "torch.sparse_bsc",
                 "torch.strided")
_NUMPY_RECONSTRUCT = ("numpy.core.multiarray._reconstruct", "numpy._core.multiarray._reconstruct")
_NUMPY_SCALAR = ("numpy.core.multiarray.scalar", "numpy._core.multiarray.scalar")


def torch_load(f: Any, map_location: MapLocation = None) -> Any:
    """What ``torch.load(f, weights_only=True, map_location=map_location)`` returns,
    for every file ckpt reads, including those torch's weights-only loader
    refuses but that hold only data (argparse.Namespace, numpy values, a whole
    pickled model: its state dict).

    ``f`` is a path, an os.PathLike or a binary file object (its file when it
    has one, else its bytes from the current position, through a temporary
    file).  ``map_location``: None (each storage where it was saved; a device
    this machine lacks raises, as torch does), a device (str or
    torch.device) for every storage, a dict {saved tag: device}, or a
    callable ``(storage, tag) -> storage or None`` called once per storage
    with its bytes as a CPU untyped storage (None: where it was saved).
    """
    try:
        import torch
    except ImportError:
        raise CheckpointError(EXIT_USAGE, "torch_load builds torch objects: it needs torch, "
                              "which is not importable here (load(path, framework='np') "
                              "reads the state dict as numpy arrays)") from None
    path, tmp = _path_of(f)
    try:
        h = File(path)
        try:
            L = h._lib
            h.read_ahead(L.ckpt_file_storage(h.h, i) for i in range(L.ckpt_file_storage_count(h.h)))
            return _Builder(h, map_location, torch).build()
        finally:
            h.close()
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)


def _path_of(f: Any) -> "tuple[str, Optional[str]]":
    if isinstance(f, (str, bytes, os.PathLike)):
        return os.fsdecode(os.fspath(f)), None
    name = getattr(f, "name", None)
    if isinstance(name, (str, bytes)) and os.path.isfile(name) and _at_start(f):
        return os.fsdecode(name), None
    if not hasattr(f, "read"):
        raise CheckpointError(EXIT_USAGE, f"torch_load takes a path or a binary file "
                              f"object, not {type(f).__name__}")
    tmp = tempfile.mkdtemp(prefix="ckpt_toolkit-")
    path = os.path.join(tmp, "checkpoint")
    with open(path, "wb") as out:
        shutil.copyfileobj(f, out)
    return path, tmp


def _at_start(f: Any) -> bool:
    try:
        return bool(f.tell() == 0)
    except (OSError, io.UnsupportedOperation, AttributeError):
        return False


class _Builder:
    def __init__(self, f: File, map_location: MapLocation, torch: Any,
                 module_trees: bool = True) -> None:
        self.f, self.L, self.torch = f, f._lib, torch
        self.map_location = map_location
        self.memo: Dict[int, Any] = {}
        self.bases: Dict[int, Any] = {}  # storage index -> uint8 tensor on its device
        self.modules: Dict[int, int] = {}  # a module tree's object -> its state dict
        self.detach = 0  # > 0 inside a module tree's state dict
        for path, sd, source in self._state_dict_entries() if module_trees else []:
            if source in ("module-tree", "torchscript"):
                obj = self._resolve(path)
                if obj:
                    self.modules[obj] = sd

    def _state_dict_entries(self) -> "list[tuple[CkptPath, int, str]]":
        out = []
        for i in range(self.L.ckpt_file_state_dict_count(self.f.h)):
            p = CkptPath()
            v = self.L.ckpt_file_state_dict(self.f.h, i, byref(p))
            out.append((p, v, text(self.L.ckpt_file_state_dict_source(self.f.h, i)) or ""))
        return out

    def _resolve(self, p: CkptPath) -> int:
        """The value at path P from the root (0 when the path leads nowhere)."""
        L, v = self.L, self.f.root()
        for i in range(p.len):
            e = p.elems[i]
            kind = L.ckpt_value_kind(v)
            if kind == K_DICT:
                nxt = 0
                for k in range(L.ckpt_value_len(v)):
                    kv = L.ckpt_value_dict_key(v, k)
                    kk = L.ckpt_value_kind(kv)
                    if (e.is_int and kk == K_INT and value_int(kv) == e.index) or (
                            not e.is_int and kk == K_STR and value_str(kv) == e.key):
                        nxt = L.ckpt_value_dict_value(v, k)
                        break
                v = nxt
            elif kind in (K_LIST, K_TUPLE) and e.is_int:
                v = L.ckpt_value_item(v, e.index) if e.index < L.ckpt_value_len(v) else 0
            else:
                return 0
            if not v:
                return 0
        return v

    def build(self) -> Any:
        return self.value(self.f.root())

    # ---- values ----

    def value(self, v: int) -> Any:
        if v in self.memo:
            return self.memo[v]
        if v in self.modules:  # as model.state_dict() holds them: detached tensors
            self.detach += 1
            try:
                out = self.value(self.modules[v])
            finally:
                self.detach -= 1
            self.memo[v] = out
            return out
        L = self.L
        kind = L.ckpt_value_kind(v)
        if kind == K_NONE:
            return None
        if kind == K_BOOL:
            return bool(L.ckpt_value_bool(v))
        if kind == K_INT:
            return value_int(v)
        if kind == K_FLOAT:
            return L.ckpt_value_float(v)
        if kind == K_STR:
            return value_str(v).decode("utf-8", "surrogatepass")
        if kind == K_BYTES:
            return value_str(v)
        if kind == K_LIST:
            out_l: List[Any] = []
            self.memo[v] = out_l
            out_l.extend(self.value(L.ckpt_value_item(v, i)) for i in range(L.ckpt_value_len(v)))
            return out_l
        if kind in (K_TUPLE, K_SET, K_FROZENSET):
            items = [self.value(L.ckpt_value_item(v, i)) for i in range(L.ckpt_value_len(v))]
            out = tuple(items) if kind == K_TUPLE else set(items) if kind == K_SET \
                else frozenset(items)
            self.memo[v] = out
            return out
        if kind == K_DICT:
            return self.dict(v)
        if kind == K_TENSOR:
            try:
                out = self.tensor(TensorInfo(L.ckpt_value_tensor(v)))
            except (ValueError, RuntimeError, OverflowError) as e:
                if isinstance(e, CheckpointError):
                    raise
                raise CheckpointError(EXIT_BAD_INPUT, f"a tensor torch refuses to build: {e}",
                                      self.f.path) from None
            self.memo[v] = out
            return out
        if kind == K_STORAGE:
            out = self.storage(L.ckpt_value_storage(v))
            self.memo[v] = out
            return out
        if kind == K_GLOBAL:
            return self.global_(text(L.ckpt_value_global(v)) or "?")
        if kind == K_OBJECT:
            out = self.object(v, text(L.ckpt_value_global(v)) or "?")
            self.memo[v] = out
            return out
        raise CheckpointError(EXIT_BAD_INPUT, f"a value of kind "
                              f"{text(L.ckpt_value_kind_name(v))} has no Python type here",
                              self.f.path)

    def dict(self, v: int) -> Any:
        L = self.L
        out: Any = collections.OrderedDict() if L.ckpt_value_dict_ordered(v) else {}
        self.memo[v] = out
        for i in range(L.ckpt_value_len(v)):
            out[self.value(L.ckpt_value_dict_key(v, i))] = self.value(
                L.ckpt_value_dict_value(v, i))
        st = L.ckpt_value_state(v)
        if st and isinstance(out, collections.OrderedDict):
            state = self.value(st)
            if isinstance(state, dict):  # BUILD of an OrderedDict: its __dict__ (_metadata)
                out.__dict__.update(state)
        return out

    def global_(self, name: str) -> Any:
        torch = self.torch
        if name.startswith("torch.") and "." not in name[6:]:
            val = getattr(torch, name[6:], None)
            if isinstance(val, (torch.dtype, torch.layout, torch.qscheme)):
                return val
        raise self._refuse(name)

    def _refuse(self, name: str) -> CheckpointError:
        return CheckpointError(EXIT_BAD_INPUT, f"global '{name}' is not in torch_load's table "
                               "of types (doc/design.md, \"Python\"): not built", self.f.path)

    def _args(self, v: int) -> Tuple[Any, ...]:
        a = self.L.ckpt_value_object_args(v)
        return tuple(self.value(a)) if a else ()

    def _state(self, v: int) -> Any:
        st = self.L.ckpt_value_state(v)
        return self.value(st) if st else None

    def object(self, v: int, name: str) -> Any:
        torch = self.torch
        if name == "torch.Size":
            return torch.Size(*self._args(v))
        if name == "torch.device":
            return torch.device(*self._args(v))
        if name == "argparse.Namespace":
            ns = argparse.Namespace(*self._args(v))
            state = self._state(v)
            if isinstance(state, dict):
                ns.__dict__.update(state)
            return ns
        if name in _NUMPY_RECONSTRUCT:
            return self.ndarray(self._state(v))
        if name == "numpy.dtype":
            args = self._args(v)
            dt = np.dtype(args[0])
            state = self._state(v)
            if isinstance(state, tuple) and len(state) > 1 and state[1] in ("<", ">"):
                dt = dt.newbyteorder(state[1])
            return dt
        if name in _NUMPY_SCALAR:
            args = self._args(v)
            raw = args[1] if len(args) > 1 else b""
            if isinstance(raw, str):
                raw = raw.encode("latin1")
            return np.frombuffer(raw, dtype=args[0], count=1)[0]
        if name == "_codecs.encode":  # protocol 2's bytes: encode(text, 'latin1')
            args = self._args(v)
            return codecs.encode(*args)
        if name in ("builtins.set", "builtins.frozenset", "builtins.bytearray",
                    "builtins.complex", "builtins.slice", "builtins.range", "builtins.list",
                    "builtins.tuple", "builtins.dict", "builtins.int", "builtins.float",
                    "builtins.str", "builtins.bool", "builtins.bytes"):
            import builtins
            return getattr(builtins, name[9:])(*self._args(v))
        if name == "collections.OrderedDict":
            return collections.OrderedDict(*self._args(v))
        if name == "collections.Counter":  # torch's weights-only loader builds it too
            c: "collections.Counter[Any]" = collections.Counter(*self._args(v))
            return c
        raise self._refuse(name)

    def ndarray(self, state: Any) -> np.ndarray:
        if not (isinstance(state, tuple) and len(state) == 5):
            raise CheckpointError(EXIT_BAD_INPUT, "a numpy array whose state is not "
                                  "(version, shape, dtype, fortran, data)", self.f.path)
        _, shape, dt, fortran, data = state
        if not isinstance(dt, np.dtype) or dt.hasobject:
            raise CheckpointError(EXIT_BAD_INPUT, "a numpy array of Python objects: not "
                                  "built (its items could be anything)", self.f.path)
        if isinstance(data, str):
            data = data.encode("latin1")
        n = 1
        for d in shape:
            n *= d
        arr = np.frombuffer(bytearray(data), dtype=dt, count=n)
        return arr.reshape(shape, order="F" if fortran else "C")

    # ---- tensors ----

    def _target(self, tag: str) -> str:
        ml = self.map_location
        torch = self.torch
        if ml is None:
            dev = tag
        elif isinstance(ml, dict):
            dev = str(ml.get(tag, tag))
        elif isinstance(ml, (str, torch.device)):
            dev = str(ml)
        else:
            raise CheckpointError(EXIT_USAGE, "map_location must be None, a device, a dict "
                                  f"{{saved: device}} or a callable, not {type(ml).__name__}")
        check_device(torch, dev, self.f.path)
        return dev

    def base(self, s: int) -> Any:
        """Storage S as one uint8 tensor on its device: every tensor on S views it."""
        idx = self.L.ckpt_storage_index(s)
        b = self.bases.get(idx)
        if b is None:
            # a PyTorch 0.3 storage view lies inside its root storage, as in
            # torch: the root's bytes from the view's offset, not a copy
            off = c_int64()
            root = self.L.ckpt_storage_view_of(s, byref(off))
            rb = self.base(root) if root else None
            if rb is not None:
                size = self.L.ckpt_dtype_size(self.L.ckpt_storage_dtype(s)) or 1
                start = off.value * size
                us = (rb.untyped_storage() if hasattr(rb, "untyped_storage")
                      else rb.storage().untyped())  # torch 1.13
                sub = us[start:start + self.L.ckpt_storage_nbytes(s)]
                b = self.torch.empty(0, dtype=self.torch.uint8, device=rb.device).set_(sub)
            else:
                arr = self.f.storage_bytes(s)
                if arr is None:
                    return None
                b = self._to_device(self.torch.from_numpy(arr), s)
            self.bases[idx] = b
        return b

    def _to_device(self, b: Any, s: int) -> Any:
        tag = text(self.L.ckpt_storage_device(s)) or "cpu"
        ml = self.map_location
        if callable(ml):
            # torch's restore_location: ML(storage, tag) with the bytes as a CPU
            # untyped storage; its storage is kept, None means "where it was saved"
            torch = self.torch
            us = b.untyped_storage() if hasattr(b, "untyped_storage") else b.storage().untyped()
            got = ml(us, tag)
            if got is not None:
                got = getattr(got, "_untyped_storage", None) or getattr(got, "_storage", got)
                if not hasattr(got, "nbytes") or not hasattr(got, "device"):
                    raise CheckpointError(EXIT_USAGE, "map_location returned "
                                          f"{type(got).__name__}, not a storage")
                return torch.empty(0, dtype=torch.uint8, device=got.device).set_(got)
            check_device(self.torch, tag, self.f.path)
            return b.to(tag) if tag != "cpu" else b
        dev = self._target(tag)
        return b.to(dev) if dev != "cpu" else b

    def tensor(self, info: TensorInfo) -> Any:
        torch = self.torch
        if info.kind == T_DENSE:
            b = self.base(info.storage)
            if b is None:  # cast on read: this tensor's elements alone
                b = self._to_device(torch.from_numpy(self.f.tensor_bytes(info.t)),
                                    info.storage)
                t = torch_view(b, Strided(info.shape), _dtypes.torch_dtype(info.dtype))
            else:
                t = torch_view(b, info, _dtypes.torch_dtype(info.dtype))
        elif info.kind == T_META:
            t = torch.empty_strided(info.shape, info.stride, dtype=_dtypes.torch_dtype(
                info.dtype), device="meta")
        elif info.kind == T_QUANTIZED:
            t = self.quantized(info)
        elif info.kind in _SPARSE_LAYOUTS:
            t = self.sparse(info)
        else:
            raise CheckpointError(EXIT_BAD_INPUT, f"a {info.kind_name()} tensor: torch_load "
                                  "does not build this kind", self.f.path)
        if self.detach:
            return t
        if info.is_parameter:
            return torch.nn.Parameter(t, requires_grad=info.requires_grad)
        if info.requires_grad:
            t.requires_grad_(True)
        return t

    def quantized(self, info: TensorInfo) -> Any:
        """As torch's _rebuild_qtensor: an empty quantized tensor of the quantizer,
        set_ on the storage (one buffer with every other tensor on it)."""
        torch = self.torch
        q = QParams()
        self.f.check(self.L.ckpt_tensor_qparams(info.t, byref(q)))
        qdt = _dtypes.torch_quantized_dtype(info.dtype)
        scheme = text(q.qscheme) or ""
        if qdt is None:
            raise CheckpointError(EXIT_BAD_INPUT, f"a quantized tensor of dtype "
                                  f"{_dtypes.name(info.dtype)}: not a dtype of torch "
                                  f"{torch.__version__}", self.f.path)
        b = self.base(info.storage)
        if b is None:
            raise CheckpointError(EXIT_BAD_INPUT, "a quantized tensor on a cast storage: "
                                  "not built", self.f.path)
        dev = b.device
        if scheme in ("per_tensor_affine", "per_tensor_symmetric"):
            t = torch._empty_affine_quantized(list(info.shape), scale=q.scale,
                                              zero_point=q.zero_point, dtype=qdt, device=dev)
        elif scheme in ("per_channel_affine", "per_channel_symmetric",
                        "per_channel_affine_float_qparams") and q.scales and q.zero_points:
            scales = self.tensor(TensorInfo(q.scales))
            zps = self.tensor(TensorInfo(q.zero_points))
            t = torch._empty_per_channel_affine_quantized(
                list(info.shape), scales=scales, zero_points=zps, axis=q.axis, dtype=qdt,
                device=dev)
        else:
            raise CheckpointError(EXIT_BAD_INPUT, f"a quantized tensor with qscheme {scheme}: "
                                  "not built", self.f.path)
        t.set_(self._typed(b, qdt), info.offset, list(info.shape), list(info.stride))
        return t

    def sparse(self, info: TensorInfo) -> Any:
        """As torch's _rebuild_sparse_tensor, from the parts as saved, its invariants
        checked (indices in bounds) where torch checks them after the load."""
        torch = self.torch
        data = self.L.ckpt_tensor_sparse_data(info.t)
        parts = self.value(data) if data else None
        layout = getattr(torch, _SPARSE_LAYOUTS[info.kind])
        if not isinstance(parts, tuple):
            raise CheckpointError(EXIT_BAD_INPUT, f"a {info.kind_name()} tensor without its "
                                  "parts", self.f.path)
        if layout == torch.sparse_coo:
            indices, values, size = parts[0], parts[1], parts[2]
            kw = {"check_invariants": True}
            if len(parts) > 3 and parts[3] is not None:
                kw["is_coalesced"] = parts[3]
            try:
                return torch.sparse_coo_tensor(indices, values, size, **kw)
            except TypeError:  # torch 1.13: no such arguments; it checks anyway
                return torch.sparse_coo_tensor(indices, values, size)
        compressed, plain, values, size = parts[:4]
        if hasattr(torch, "sparse_compressed_tensor"):
            try:
                return torch.sparse_compressed_tensor(compressed, plain, values, size,
                                                      layout=layout, check_invariants=True)
            except TypeError:
                return torch.sparse_compressed_tensor(compressed, plain, values, size,
                                                      layout=layout)
        return torch.sparse_csr_tensor(compressed, plain, values, size)

    def _typed(self, b: Any, dtype: Any) -> Any:
        """A TypedStorage of DTYPE over the uint8 tensor B's memory (what set_ takes)."""
        torch = self.torch
        un = b.untyped_storage() if hasattr(b, "untyped_storage") else b.storage().untyped()
        kw = {"_internal": True} if _typed_internal(torch) else {}
        import warnings
        with warnings.catch_warnings():  # "TypedStorage is deprecated": torch makes one too
            warnings.simplefilter("ignore")
            return torch.storage.TypedStorage(wrap_storage=un, dtype=dtype, **kw)

    def storage(self, s: int) -> Any:
        """A bare storage (torch.load gives a TypedStorage of the saved dtype)."""
        b = self.base(s)
        if b is None:
            raise CheckpointError(EXIT_BAD_INPUT, "a bare storage cast on read: not built",
                                  self.f.path)
        return self._typed(b, _dtypes.torch_dtype(self.L.ckpt_storage_dtype(s)))


_SPARSE_LAYOUTS = {2: "sparse_coo", 3: "sparse_csr", 4: "sparse_csc", 5: "sparse_bsr",
                   6: "sparse_bsc"}


def sparse_tensor(f: File, info: TensorInfo) -> Any:
    """A sparse tensor on the CPU, as torch_load builds it (for safe_open)."""
    import torch
    return _Builder(f, "cpu", torch, module_trees=False).sparse(info)


def quantized_tensor(f: File, info: TensorInfo) -> Any:
    """A quantized tensor on the CPU, as torch_load builds it (for safe_open)."""
    import torch
    return _Builder(f, "cpu", torch, module_trees=False).quantized(info)


def _typed_internal(torch: Any) -> bool:
    import inspect
    try:
        params = inspect.signature(torch.storage.TypedStorage.__init__).parameters
        return "_internal" in params
    except (TypeError, ValueError):
        return False


