"""safe_open and load: a checkpoint's state dict, in safetensors' shape."""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import struct
import ctypes
from ctypes import byref, c_size_t, c_void_p
from typing import Any, Dict, Iterator, List, Optional, Set, Tuple, Union

import numpy as np

from . import _dtypes
from ._errors import EXIT_BAD_INPUT, EXIT_USAGE, CheckpointError
from ._file import K_STR, T_DENSE, T_META, T_QUANTIZED, File, Layout, Strided, TensorInfo, numpy_view, \
    torch_view, value_str
from ._native import text

PathLike = Union[str, "os.PathLike[str]"]

# safetensors' names of the dtypes it has (get_dtype() answers with these)
_ST_NAMES = {
    "float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16", "int64": "I64",
    "int32": "I32", "int16": "I16", "int8": "I8", "uint8": "U8", "bool": "BOOL",
    "complex64": "C64", "uint16": "U16", "uint32": "U32", "uint64": "U64",
    "float8_e5m2": "F8_E5M2", "float8_e4m3fn": "F8_E4M3", "float8_e8m0fnu": "E8M0",
    "float4_e2m1fn_x2": "F4", "float6_e2m3fn": "F6_E2M3", "float6_e3m2fn": "F6_E3M2",
}


def _check_framework(framework: str, device: str) -> None:
    if framework not in ("pt", "np", "torch", "numpy"):
        raise CheckpointError(EXIT_USAGE, f"framework must be 'pt' or 'np', not {framework!r}")
    if framework in ("np", "numpy") and str(device) != "cpu":
        raise CheckpointError(EXIT_USAGE, f"framework='np' gives arrays in memory: device "
                              f"must be 'cpu', not {device!r}")


def _need_torch() -> None:
    try:
        importlib.import_module("torch")
    except ImportError:
        raise CheckpointError(EXIT_USAGE, "framework='pt' needs torch, which is not "
                              "importable here: install it, or use framework='np'") from None


class safe_open:
    """A checkpoint's state dict, tensor by tensor, as safetensors' ``safe_open``.

    ``path`` is any input ckpt reads: a .pth (zip, legacy, tar), a
    TorchScript archive, a .safetensors file, a sharded set's index, a
    Hugging Face model folder, a DCP or DeepSpeed folder, a whole pickled
    model (seen as its state dict).  The state dict is the one ``ckpt
    extract`` takes: the root when it is one, else the model's (a module
    tree, the only state dict, the only model state dict); ``select``
    ("a/b", keys joined by '/') names another.  ``framework`` is "pt"
    (torch tensors) or "np" (numpy arrays; bfloat16 and float8 through
    ml_dtypes).  ``device`` ("cpu", "cuda:0") is where torch tensors go.

    Tensors stored uncompressed and aligned are views of the file, mapped
    once per handle (copy on write: writing to a tensor never changes the
    file); the rest are read when asked for; nothing is read before.
    Tensors on one storage share memory as in the file.  Use as a context
    manager, or call ``close()``; tensors already returned stay valid.
    """

    def __init__(self, path: PathLike, framework: str = "pt", device: str = "cpu",
                 select: Optional[str] = None) -> None:
        _check_framework(framework, device)
        self._np = framework in ("np", "numpy")
        self._device = str(device)
        self._select = select
        self._file = File(path)
        try:
            if not self._np:
                _need_torch()
                if self._device != "cpu":
                    import torch
                    from ._torch_load import check_device
                    check_device(torch, str(torch.device(self._device)), self._file.path)
            self._open_state_dict(select)
        except BaseException:
            self._file.close()
            raise

    def _open_state_dict(self, select: Optional[str]) -> None:
        f = self._file
        L = f._lib
        self._sd_path, self._sd_source, self._sd_class = select or "", "mapping", None
        sds = f.state_dicts()
        index: Optional[int] = None
        if select is None:
            i = c_size_t()
            f.check(L.ckpt_file_pick_state_dict(f.h, byref(i)))
            index = i.value
        else:
            index = next((n for n, sd in enumerate(sds) if sd[0] == select), None)
        if index is not None:
            self._sd_path, self._sd_source = sds[index][0], sds[index][2]
            self._sd_class = text(L.ckpt_file_state_dict_class(f.h, index))
        f.check(L.ckpt_file_extract(f.h, None if select is None
                                    else select.encode("utf-8", "surrogateescape")))
        root = f.root()
        # keys and tensor handles only: what the pickle says of each tensor is asked
        # for when the tensor is (opening 10,000 tensors stays cheap)
        self._tensors: Dict[str, int] = {}
        n = L.ckpt_value_len(root)
        # in batches of one call each (four calls a key cost 20 ms for 10,000)
        batch = min(n, 4096) or 1
        lens, tensors = (c_size_t * batch)(), (c_void_p * batch)()
        cap = 256 * batch
        buf = ctypes.create_string_buffer(cap)
        k = 0
        while k < n:
            got = L.ckpt_value_dict_tensor_items(root, k, buf, cap, lens, tensors, batch)
            if got == 0:  # a key longer than the buffer, or not a string
                kv = L.ckpt_value_dict_key(root, k)
                if L.ckpt_value_kind(kv) != K_STR:
                    break
                cap = 2 * cap + len(value_str(kv))
                buf = ctypes.create_string_buffer(cap)
                continue
            sizes = lens[:got]
            raw, at = ctypes.string_at(buf, sum(sizes)), 0
            for j in range(got):
                t = tensors[j]
                if not t:
                    raise CheckpointError(EXIT_BAD_INPUT, f"{self._sd_path or 'the root'} is "
                                          "not a state dict", f.path)
                end = at + sizes[j]
                self._tensors[raw[at:end].decode("utf-8", "surrogateescape")] = t
                at = end
            k += got
        if k < n:
            raise CheckpointError(EXIT_BAD_INPUT, f"{self._sd_path or 'the root'} is not a "
                                  "state dict (a key that is not a string)", f.path)
        self._infos: Dict[str, TensorInfo] = {}
        self._shared_set: Optional[Set[int]] = None

    @property
    def _shared(self) -> Set[int]:
        """The storages more than one tensor of the state dict is on (read whole once,
        so that those tensors share memory)."""
        if self._shared_set is None:
            L = self._file._lib
            uses: Dict[int, int] = {}
            for t in self._tensors.values():
                s = L.ckpt_tensor_storage(t)
                if s:
                    uses[s] = uses.get(s, 0) + 1
            self._shared_set = {s for s, n in uses.items() if n > 1}
        return self._shared_set

    # ---- the context manager ----

    def __enter__(self) -> "safe_open":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Release the handle (tensors already returned stay valid)."""
        self._file.close()

    # ---- safetensors' API ----

    def keys(self) -> List[str]:
        """The state dict's keys, in the file's order."""
        return list(self._tensors)

    def offset_keys(self) -> List[str]:
        """The keys (safetensors has this name too; the order is the file's)."""
        return self.keys()

    def __iter__(self) -> Iterator[str]:
        return iter(self._tensors)

    def __len__(self) -> int:
        return len(self._tensors)

    def __contains__(self, key: object) -> bool:
        return key in self._tensors

    def metadata(self) -> Optional[Dict[str, str]]:
        """For a .safetensors file, its ``__metadata__`` (None when it has none), as
        safetensors gives it.  For any other input, strings saying what was read:
        ``format`` (ckpt's name: "pth-zip", "dcp", ...), ``state_dict`` (its path
        "a/b", "" for the root), ``source`` ("mapping", "module-tree",
        "torchscript", "deepspeed", "dcp") and, for a module tree, ``class``."""
        fmt = self._file.format_name()
        if fmt == "safetensors":
            return _safetensors_metadata(text(self._file._lib.ckpt_file_path(
                self._file.h)) or self._file.path)
        md = {"format": fmt, "state_dict": self._sd_path, "source": self._sd_source}
        if self._sd_class:
            md["class"] = self._sd_class
        return md

    def _info(self, name: str) -> TensorInfo:
        info = self._infos.get(name)
        if info is None:
            t = self._tensors.get(name)
            if t is None:
                raise CheckpointError(EXIT_USAGE, f"no tensor named {name!r}", self._file.path)
            self._file.h  # a closed handle raises
            info = self._infos[name] = TensorInfo(t)
        return info

    def get_tensor(self, name: str) -> Any:
        """The tensor NAME (a torch tensor, or a numpy array with framework='np')."""
        info = self._info(name)
        with _as_checkpoint_error(self._file.path, name):
            return self._finish(tensor_of(self._file, info, self._np,
                                          whole_storage=info.storage in self._shared))

    def get_slice(self, name: str) -> "TensorSlice":
        """A handle on NAME that reads only what ``[...]`` asks for (the rows of
        the first dimension it needs), with ``get_shape()`` and ``get_dtype()``."""
        return TensorSlice(self, name, self._info(name))

    def _finish(self, t: Any) -> Any:
        if not self._np and self._device != "cpu":
            t = t.to(self._device)
        return t


class TensorSlice:
    """One tensor of a safe_open, read in part: ``s[0:2]``, ``s[:, 1]``, ``s[...]``."""

    def __init__(self, owner: safe_open, name: str, info: TensorInfo) -> None:
        self._owner, self._name, self._info = owner, name, info

    def get_shape(self) -> List[int]:
        return list(self._info.shape)

    def get_dtype(self) -> str:
        """safetensors' name of the dtype ("F32", "BF16"), or torch's where safetensors
        has none ("qint8")."""
        n = _dtypes.name(self._info.dtype)
        return _ST_NAMES.get(n, n)

    def __len__(self) -> int:
        return self._info.shape[0] if self._info.shape else 0

    def __getitem__(self, index: Any) -> Any:
        o, info = self._owner, self._info
        if not isinstance(index, tuple):
            index = (index,)
        rows = _first_rows(index, info)
        with _as_checkpoint_error(o._file.path, self._name):
            if rows is None or info.storage in o._shared:
                t = tensor_of(o._file, info, o._np, whole_storage=info.storage in o._shared)
                return o._finish(_copy(t[index], o._np))
            start, stop, rest = rows
            t = rows_of(o._file, info, start, stop, o._np)
        return o._finish(_copy(t[rest], o._np))


@contextlib.contextmanager
def _as_checkpoint_error(path: str, key: str) -> Iterator[None]:
    """numpy's or torch's refusal of a view (one the library let through) as the
    package's error: the file is bad input."""
    try:
        yield
    except (ValueError, RuntimeError, OverflowError) as e:
        if isinstance(e, CheckpointError):
            raise
        raise CheckpointError(EXIT_BAD_INPUT, f"tensor {key!r}: {e}", path) from None


def _copy(t: Any, np_: bool) -> Any:
    """A slice owns its memory (as safetensors' does), not a view of the file."""
    if np_:
        return np.array(t, copy=True) if isinstance(t, np.ndarray) else t
    return t.clone() if hasattr(t, "clone") else t


def _first_rows(index: Tuple[Any, ...], info: TensorInfo) -> Optional[Tuple[int, int, Any]]:
    """For an index whose first item is an int or a slice of a C-contiguous dense
    tensor: the rows [start, stop) of the first dimension it touches, and the
    index to apply to those rows.  None: read the tensor whole."""
    if not info.shape or info.kind != T_DENSE or not index:
        return None
    first = index[0]
    n = info.shape[0]
    expect, contiguous = 1, True
    for d in range(len(info.shape) - 1, -1, -1):
        if info.shape[d] != 1 and info.stride[d] != expect:
            contiguous = False
        expect *= info.shape[d]
    if not contiguous:
        return None
    if isinstance(first, (int, np.integer)) and not isinstance(first, bool):
        i = int(first) + (n if first < 0 else 0)
        if not 0 <= i < n:
            raise IndexError(f"index {first} is out of bounds for dimension 0 with size {n}")
        return i, i + 1, (0,) + index[1:]
    if isinstance(first, slice):
        start, stop, step = first.indices(n)
        if step <= 0:
            return None
        if stop <= start:
            return 0, 0, (slice(0, 0),) + index[1:]
        return start, stop, (slice(0, stop - start, step),) + index[1:]
    return None


def _array_dtype(info: TensorInfo, np_: bool) -> Any:
    if info.kind not in (T_DENSE, T_META):
        raise CheckpointError(EXIT_BAD_INPUT, f"a {info.kind_name()} tensor: not read "
                              "as numpy (framework='pt' builds it)")
    return _dtypes.numpy_dtype(info.dtype) if np_ else _dtypes.torch_dtype(info.dtype)


def tensor_of(f: File, info: TensorInfo, np_: bool, whole_storage: bool = False) -> Any:
    """INFO's tensor: a view of its storage's bytes (mapped, or read whole when
    WHOLE_STORAGE or when the tensor is all of it), else its own elements read."""
    if info.kind == T_QUANTIZED and not np_:  # torch has the kind: built as torch_load does
        from ._torch_load import quantized_tensor
        return quantized_tensor(f, info)
    if info.kind not in (T_DENSE, T_QUANTIZED, T_META) and not np_:  # sparse
        from ._torch_load import sparse_tensor
        return sparse_tensor(f, info)
    dt = _array_dtype(info, np_)
    if info.kind == T_META:
        if np_:
            raise CheckpointError(EXIT_BAD_INPUT, "a meta tensor has no data")
        import torch
        return torch.empty_strided(info.shape, info.stride, dtype=dt, device="meta")
    s = info.storage
    L = f._lib
    view: Layout = info
    buf = f.storage_bytes(s, mapped_only=not (whole_storage or
                                               L.ckpt_storage_nbytes(s) == info.nbytes))
    if buf is None:  # a view of part of a storage nothing else uses, or a cast one
        buf, view = f.tensor_bytes(info.t), Strided(info.shape)
    if np_:
        return numpy_view(buf, view, dt)
    import torch
    return torch_view(torch.from_numpy(buf), view, dt)


def rows_of(f: File, info: TensorInfo, start: int, stop: int, np_: bool) -> Any:
    """Rows [start, stop) of a C-contiguous tensor: only their bytes read (or viewed)."""
    dt = _array_dtype(info, np_)
    L = f._lib
    s = info.storage
    item = L.ckpt_dtype_size(info.dtype)
    row = 1
    for d in info.shape[1:]:
        row *= d
    shape = (stop - start,) + tuple(info.shape[1:])
    if f._range(s) is not None or f.is_cast(s):
        return tensor_of(f, info, np_)[start:stop]  # mapped: a view of those rows
    n = (stop - start) * row * item
    buf = np.empty(n, dtype=np.uint8)
    if n:
        f.check(L.ckpt_storage_read(f.h, s, (info.offset + start * row) * item,
                                    buf.ctypes.data, n))
    view = Strided(shape)
    if np_:
        return numpy_view(buf, view, dt)
    import torch
    return torch_view(torch.from_numpy(buf), view, dt)


def _safetensors_metadata(path: str) -> Optional[Dict[str, str]]:
    with open(path, "rb") as fh:
        n = struct.unpack("<Q", fh.read(8))[0]
        header = json.loads(fh.read(n))
    md = header.get("__metadata__")
    return dict(md) if md is not None else None


def load(path: PathLike, framework: str = "pt", device: str = "cpu",
         select: Optional[str] = None) -> Dict[str, Any]:
    """The state dict of PATH as {name: tensor} (see safe_open for what is read and
    how): zero-copy views where the file allows, shared storages kept."""
    with safe_open(path, framework=framework, device=device, select=select) as f:
        f._file.read_ahead({f._info(k).storage for k in f.keys()} - {0, None})
        return {k: f.get_tensor(k) for k in f.keys()}
