"""One opened checkpoint: the libckpt handle, the mapped files, storages as bytes.

Zero copy: a storage whose bytes are one range of one file, stored as this
machine reads them (ckpt_storage_file_range) and aligned for its dtype, is a view of
that file mapped once per handle (mmap.ACCESS_COPY: numpy and torch get a
writable buffer whose writes never reach the file, and nothing is copied
until a page is written).  Any other storage (a compressed record, a DCP
tensor's chunks, a big-endian file) is read on demand through
ckpt_storage_read, which checks what it reads.  Nothing is read before it is
asked for.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import threading
from ctypes import byref, c_char_p, c_int64, c_size_t, c_uint64
from typing import Any, Dict, Iterable, List, Optional, Protocol, Tuple

import numpy as np

from ._errors import CheckpointError
from ._native import CkptPath, lib, text

# enum ckpt_kind
K_NONE, K_BOOL, K_INT, K_FLOAT, K_STR, K_BYTES, K_LIST, K_TUPLE, K_DICT, K_SET, \
    K_FROZENSET, K_GLOBAL, K_OBJECT, K_TENSOR, K_STORAGE = range(15)
# enum ckpt_tensor_kind
T_DENSE, T_QUANTIZED, T_META = 0, 1, 7

# read_ahead: storages under this size ride on the kernel's own readahead
READ_AHEAD_MIN = 1 << 20
# posix_fadvise(WILLNEED) reads at most the device's largest request per call
# (8 MiB measured here): a range is asked for in steps of this size
READ_AHEAD_STEP = 8 << 20


class File:
    """A ckpt_file opened on PATH, with the maps and buffers of what was read."""

    def __init__(self, path: "str | os.PathLike[str]") -> None:
        self._lib = lib()
        self.path = os.fspath(path)
        self._h: Optional[int] = self._lib.ckpt_file_new()
        if not self._h:
            raise MemoryError("ckpt_file_new")
        self._maps: Dict[str, Optional[mmap.mmap]] = {}
        self._ranges: Dict[int, Optional[Tuple[str, int]]] = {}
        self._storages: Dict[int, np.ndarray] = {}
        self._cwd = os.getcwd()
        # keys() reads the index and the pickle only: each record's local
        # header is checked when its tensor is first read (a cold 2 GiB .pth
        # of 10,000 tensors: 10,000 disk reads fewer)
        self._lib.ckpt_file_set_defer_record_checks(self._h, 1)
        if self._lib.ckpt_file_open(self._h, os.fsencode(self.path)) != 0:
            err = self.error()
            self.close()
            raise err
        self._folder = self.format_name() in ("dcp", "deepspeed")

    # ---- the handle ----

    @property
    def h(self) -> int:
        if not self._h:
            raise CheckpointError(2, "the checkpoint is closed", self.path)
        return self._h

    def error(self) -> CheckpointError:
        code = self._lib.ckpt_file_error_code(self._h)
        msg = text(self._lib.ckpt_file_error_message(self._h)) or "failed"
        return CheckpointError.from_status(code or -2, msg, self.path)

    def check(self, rc: int) -> None:
        if rc != 0:
            raise self.error()

    def close(self) -> None:
        """Free the handle; mapped files stay alive as long as tensors view them."""
        if self._h:
            self._lib.ckpt_file_free(self._h)
            self._h = None
        for m in self._maps.values():
            if m is not None:
                try:
                    m.close()
                except BufferError:  # a tensor still views it: it closes with the tensor
                    pass
        self._maps.clear()
        self._storages.clear()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def format_name(self) -> str:
        return text(self._lib.ckpt_format_name(self._lib.ckpt_file_format(self.h))) or "unknown"

    def notices(self) -> List[str]:
        n = self._lib.ckpt_file_notice_count(self.h)
        return [text(self._lib.ckpt_file_notice(self.h, i)) or "" for i in range(n)]

    def root(self) -> int:
        return int(self._lib.ckpt_file_root(self.h))

    def state_dicts(self) -> List[Tuple[str, int, str]]:
        """Every state dict: (its path "a/b", its value, its source)."""
        out = []
        for i in range(self._lib.ckpt_file_state_dict_count(self.h)):
            p = CkptPath()
            v = self._lib.ckpt_file_state_dict(self.h, i, byref(p))
            out.append((format_path(p), v, text(self._lib.ckpt_file_state_dict_source(
                self.h, i)) or ""))
        return out

    # ---- storage bytes ----

    def _mapped(self, file: str) -> Optional[mmap.mmap]:
        if file not in self._maps:
            m = None
            try:
                with open(file, "rb") as fh:
                    size = os.fstat(fh.fileno()).st_size
                    if size:
                        m = mmap.mmap(fh.fileno(), size, access=mmap.ACCESS_COPY)
            except (OSError, ValueError):
                m = None  # read through the library instead
            self._maps[file] = m
        return self._maps[file]

    def _range(self, s: int) -> Optional[Tuple[str, int]]:
        """The file and offset of a storage whose bytes are one range of one file,
        readable as they are (ckpt_storage_file_range), else None."""
        if s in self._ranges:
            return self._ranges[s]
        name, off = c_char_p(), c_uint64()
        rng: Optional[Tuple[str, int]] = None
        if self._lib.ckpt_storage_file_range(self.h, s, byref(name), byref(off)) == 0:
            file = os.fsdecode(name.value or b"")
            if not os.path.isabs(file):
                if self._folder:
                    file = os.path.join(self.path, file)  # relative to the folder
                file = os.path.join(self._cwd, file)  # as opened, whatever chdir since
            rng = (file, off.value)
        self._ranges[s] = rng  # None: read through the library, which says why
        return rng

    def read_ahead(self, storages: Iterable[int]) -> None:
        """Before reading every storage of STORAGES: have the kernel read, in file
        order and from a background thread, those mapped storages (of at least
        READ_AHEAD_MIN bytes) whose first or last page is not in the page cache.
        A caller that then touches its tensors in key order (not the file's: a
        .safetensors file sorts them by dtype) finds their pages read or on the
        way, instead of faulting them in 128 KiB at a time (a cold 2 GiB file:
        2.1 to 1.2 s here).  A file in the page cache costs two probes a storage."""
        L = self._lib
        todo: Dict[str, List[Tuple[int, int]]] = {}
        for s in storages:
            # every range first, the small ones too: a .pth's are found in the local
            # headers, whose reads would otherwise queue behind the read-ahead
            rng = self._range(s)
            n = L.ckpt_storage_nbytes(s)
            if rng is not None and n >= READ_AHEAD_MIN:
                todo.setdefault(rng[0], []).append((rng[1], n))
        for file, ranges in todo.items():
            try:
                fd = os.open(file, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                continue  # the read reports it
            cold = [r for r in sorted(set(ranges)) if not _resident(fd, r[0], r[1])]
            if cold:
                threading.Thread(target=_will_need, args=(fd, cold), daemon=True,
                                 name="ckpt_toolkit read-ahead").start()
            else:
                os.close(fd)

    def is_cast(self, s: int) -> bool:
        """Fewer bytes stored than S's dtype needs: a storage cast on read (the one
        cast a file opened here has: DeepSpeed's upcast to float32)."""
        L = self._lib
        return bool(L.ckpt_storage_read(self.h, s, L.ckpt_storage_nbytes(s), None, 0) != 0)

    def storage_bytes(self, s: int, mapped_only: bool = False) -> Optional[np.ndarray]:
        """Storage S's bytes (this machine's byte order) as a uint8 array, once per
        handle: a view of the mapped file where possible, else read.  None for a
        storage whose dtype is not the one stored (a DeepSpeed folder's frozen
        parameters, upcast to float32 as zero_to_fp32 does): its tensors are read
        one by one (ckpt_tensor_read casts them).  MAPPED_ONLY: None rather than
        read a storage that cannot be mapped (a caller that reads one tensor of it)."""
        idx = self._lib.ckpt_storage_index(s)
        arr = self._storages.get(idx)
        if arr is not None:
            return arr
        L = self._lib
        nbytes = L.ckpt_storage_nbytes(s)
        size = L.ckpt_dtype_size(L.ckpt_storage_dtype(s)) or 1
        arr = None
        rng = self._range(s) if nbytes else None
        if rng is not None:
            file, off = rng
            m = self._mapped(file)
            if m is not None and off + nbytes <= len(m) and off % size == 0:
                arr = np.frombuffer(m, dtype=np.uint8, count=nbytes, offset=off)
        if arr is None:
            if mapped_only or self.is_cast(s):  # a cast one is never a range
                return None
            arr = np.empty(nbytes, dtype=np.uint8)
            if nbytes:
                self.check(L.ckpt_storage_read(self.h, s, 0, arr.ctypes.data, nbytes))
        self._storages[idx] = arr
        return arr

    def tensor_bytes(self, t: int) -> np.ndarray:
        """A tensor's own elements, C order, read alone (a view of a larger storage
        used by nothing else read)."""
        n = self._lib.ckpt_tensor_nbytes(t)
        arr = np.empty(n, dtype=np.uint8)
        if n:
            self.check(self._lib.ckpt_tensor_read(self.h, t, arr.ctypes.data, n))
        return arr


def _resident(fd: int, off: int, n: int) -> bool:
    """Whether the first and last byte of OFF..OFF+N are in the page cache (a
    read that may not wait: RWF_NOWAIT).  Where the probe is not supported,
    True: nothing is asked of the kernel."""
    one = bytearray(1)
    try:
        for at in (off, off + n - 1):
            os.preadv(fd, [one], at, os.RWF_NOWAIT)
    except BlockingIOError:
        return False
    except (OSError, AttributeError):  # no RWF_NOWAIT here (not Linux, old kernel)
        return True
    return True


def _will_need(fd: int, ranges: List[Tuple[int, int]]) -> None:
    """posix_fadvise(WILLNEED) over RANGES, in order (releases the GIL)."""
    try:
        for off, n in ranges:
            for at in range(off, off + n, READ_AHEAD_STEP):
                os.posix_fadvise(fd, at, min(READ_AHEAD_STEP, off + n - at),
                                 os.POSIX_FADV_WILLNEED)
    except OSError:
        pass  # a hint: the reads fault the pages in anyway
    finally:
        os.close(fd)


def format_path(p: CkptPath) -> str:
    parts = []
    for i in range(p.len):
        e = p.elems[i]
        parts.append(str(e.index) if e.is_int else (text(e.key) or ""))
    return "/".join(parts)


class TensorInfo:
    """What the pickle says of a tensor (nothing read)."""

    __slots__ = ("t", "dtype", "shape", "stride", "offset", "storage", "kind", "device",
                 "requires_grad", "is_parameter", "nbytes")

    def __init__(self, t: int) -> None:
        L = lib()
        self.t = t
        self.dtype = L.ckpt_tensor_dtype(t)
        nd = L.ckpt_tensor_ndim(t)
        sh, st = L.ckpt_tensor_shape(t), L.ckpt_tensor_stride(t)
        self.shape = tuple(sh[i] for i in range(nd))
        self.stride = tuple(st[i] for i in range(nd))
        self.offset = L.ckpt_tensor_offset(t)
        self.storage = L.ckpt_tensor_storage(t)
        self.kind = L.ckpt_tensor_kind_of(t)
        self.device = text(L.ckpt_tensor_device(t)) or "cpu"
        self.requires_grad = bool(L.ckpt_tensor_requires_grad(t))
        self.is_parameter = bool(L.ckpt_tensor_is_parameter(t))
        self.nbytes = L.ckpt_tensor_nbytes(t)

    def kind_name(self) -> str:
        return text(lib().ckpt_tensor_kind_name(self.kind)) or "?"


def value_str(v: int) -> bytes:
    n = c_size_t()
    p = lib().ckpt_value_str(v, byref(n))
    return ctypes.string_at(p, n.value) if p else b""


def value_int(v: int) -> int:
    L = lib()
    out = c_int64()
    if L.ckpt_value_int(v, byref(out)) == 0:
        return out.value
    n = c_size_t()
    p = L.ckpt_value_bigint(v, byref(n))
    if not p:
        raise CheckpointError(3, "an int that cannot be read")
    return int.from_bytes(ctypes.string_at(p, n.value), "little", signed=True)


class Layout(Protocol):
    """A strided view of a storage, in elements: TensorInfo, or Strided."""

    shape: Tuple[int, ...]
    stride: Tuple[int, ...]
    offset: int


class Strided:
    """A C-contiguous view of SHAPE from element OFFSET."""

    def __init__(self, shape: Tuple[int, ...], offset: int = 0) -> None:
        self.shape, self.offset = tuple(shape), offset
        st: List[int] = []
        acc = 1
        for d in reversed(self.shape):
            st.append(acc)
            acc *= d
        self.stride = tuple(reversed(st))


def numpy_view(buf: np.ndarray, info: Layout, dt: "np.dtype[Any]") -> np.ndarray:
    """INFO's elements as a numpy view of the storage bytes BUF."""
    item = dt.itemsize
    return np.ndarray(info.shape, dtype=dt, buffer=buf, offset=info.offset * item,
                      strides=tuple(s * item for s in info.stride))


def torch_view(base: Any, info: Layout, dtype: Any) -> Any:
    """INFO as a torch view of BASE (a uint8 tensor over the storage's bytes)."""
    import torch
    item = _element_size(torch, dtype)
    n = base.numel() // item
    if n == 0:  # no bytes: nothing to view (as_strided of an empty tensor)
        typed = torch.empty(0, dtype=dtype, device=base.device)
    elif item > 1:
        typed = base[: n * item].view(dtype)
    else:
        typed = base.view(dtype) if dtype != torch.uint8 else base
    # as_strided's offset counts from the start of the storage, and BASE may
    # itself start inside one (a storage view's bytes in its root's)
    return typed.as_strided(info.shape, info.stride, typed.storage_offset() + info.offset)


_SIZES: "Dict[Any, int]" = {}


def _element_size(torch: Any, dtype: Any) -> int:
    if dtype not in _SIZES:
        import warnings
        with warnings.catch_warnings():  # complex32's "experimental" warning
            warnings.simplefilter("ignore")
            _SIZES[dtype] = torch.empty((), dtype=dtype).element_size()
    return _SIZES[dtype]

