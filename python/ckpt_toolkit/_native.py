"""libckpt through ctypes, and where the native files are.

The native folder holds ``bin/ckpt`` and ``lib/libckpt.so.0``: the folder
named by the environment variable ``CKPT_TOOLKIT_NATIVE`` (a portable folder,
or a staged build tree: tests/python/native_from_build.sh), else the
package's own ``_native/`` (what the wheel ships).  ctypes rather than a
compiled extension, so that one py3-none wheel serves every CPython.
"""

from __future__ import annotations

import ctypes
import os
from ctypes import (POINTER, Structure, c_char_p, c_double, c_int, c_int64, c_size_t,
                    c_uint8, c_uint64, c_void_p)
from typing import Any, Optional

from ._errors import EXIT_IO, CheckpointError

ENV = "CKPT_TOOLKIT_NATIVE"


def native_dir() -> str:
    """The folder holding bin/ckpt and lib/libckpt.so.0 (not checked)."""
    env = os.environ.get(ENV)
    if env:
        return env
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "_native")


def _native_file(rel: str) -> str:
    path = os.path.join(native_dir(), rel)
    if not os.path.isfile(path):
        where = (f"${ENV}={os.environ[ENV]}" if os.environ.get(ENV)
                 else "the package's _native folder (set $" + ENV + " to a folder with "
                 "bin/ckpt and lib/libckpt.so.0)")
        raise CheckpointError(EXIT_IO, f"ckpt_toolkit's native file {rel} is missing: "
                              f"looked in {where}", path)
    return path


def ckpt_path() -> str:
    """The bundled ``ckpt`` command; CheckpointError when it is missing."""
    return _native_file(os.path.join("bin", "ckpt"))


# ---- the structs of lib/ckpt.h that the binding reads ----

class PathElem(Structure):
    _fields_ = [("is_int", c_int), ("index", c_int64), ("key", c_char_p)]


class CkptPath(Structure):
    _fields_ = [("len", c_size_t), ("elems", POINTER(PathElem))]


class QParams(Structure):
    _fields_ = [("qscheme", c_char_p), ("scale", c_double), ("zero_point", c_int64),
                ("axis", c_int), ("scales", c_void_p), ("zero_points", c_void_p)]


_P = c_void_p  # every handle is opaque

# name: (restype, argtypes)
_DECLS: "dict[str, tuple[Any, list[Any]]]" = {
    "ckpt_version_number": (c_int, []),
    "ckpt_version_details": (c_char_p, []),
    "ckpt_strerror": (c_char_p, [c_int]),
    "ckpt_dtype_name": (c_char_p, [c_int]),
    "ckpt_dtype_size": (c_size_t, [c_int]),
    "ckpt_format_name": (c_char_p, [c_int]),
    "ckpt_file_new": (_P, []),
    "ckpt_file_free": (None, [_P]),
    "ckpt_file_set_defer_record_checks": (c_int, [_P, c_int]),
    "ckpt_file_open": (c_int, [_P, c_char_p]),
    "ckpt_file_error_code": (c_int, [_P]),
    "ckpt_file_error_message": (c_char_p, [_P]),
    "ckpt_file_notice_count": (c_size_t, [_P]),
    "ckpt_file_notice": (c_char_p, [_P, c_size_t]),
    "ckpt_file_path": (c_char_p, [_P]),
    "ckpt_file_model_folder": (c_char_p, [_P]),
    "ckpt_file_format": (c_int, [_P]),
    "ckpt_file_prefix": (c_char_p, [_P]),
    "ckpt_file_record_count": (c_size_t, [_P]),
    "ckpt_file_record_name": (c_char_p, [_P, c_size_t]),
    "ckpt_file_root": (_P, [_P]),
    "ckpt_file_storage_count": (c_size_t, [_P]),
    "ckpt_file_storage": (_P, [_P, c_size_t]),
    "ckpt_file_state_dict_count": (c_size_t, [_P]),
    "ckpt_file_state_dict": (_P, [_P, c_size_t, POINTER(CkptPath)]),
    "ckpt_file_state_dict_source": (c_char_p, [_P, c_size_t]),
    "ckpt_file_state_dict_class": (c_char_p, [_P, c_size_t]),
    "ckpt_file_pick_state_dict": (c_int, [_P, POINTER(c_size_t)]),
    "ckpt_file_extract": (c_int, [_P, c_char_p]),
    "ckpt_path_format": (c_size_t, [POINTER(CkptPath), c_char_p, c_size_t]),
    "ckpt_value_kind": (c_int, [_P]),
    "ckpt_value_kind_name": (c_char_p, [_P]),
    "ckpt_value_bool": (c_int, [_P]),
    "ckpt_value_int": (c_int, [_P, POINTER(c_int64)]),
    "ckpt_value_bigint": (POINTER(c_uint8), [_P, POINTER(c_size_t)]),
    "ckpt_value_float": (c_double, [_P]),
    "ckpt_value_str": (POINTER(c_uint8), [_P, POINTER(c_size_t)]),
    "ckpt_value_len": (c_size_t, [_P]),
    "ckpt_value_item": (_P, [_P, c_size_t]),
    "ckpt_value_dict_key": (_P, [_P, c_size_t]),
    "ckpt_value_dict_value": (_P, [_P, c_size_t]),
    "ckpt_value_dict_tensor_items": (c_size_t, [_P, c_size_t, c_char_p, c_size_t,
                                                POINTER(c_size_t), POINTER(_P), c_size_t]),
    "ckpt_value_dict_ordered": (c_int, [_P]),
    "ckpt_value_state": (_P, [_P]),
    "ckpt_value_global": (c_char_p, [_P]),
    "ckpt_value_object_args": (_P, [_P]),
    "ckpt_value_tensor": (_P, [_P]),
    "ckpt_value_storage": (_P, [_P]),
    "ckpt_tensor_dtype": (c_int, [_P]),
    "ckpt_tensor_ndim": (c_int, [_P]),
    "ckpt_tensor_shape": (POINTER(c_int64), [_P]),
    "ckpt_tensor_stride": (POINTER(c_int64), [_P]),
    "ckpt_tensor_offset": (c_int64, [_P]),
    "ckpt_tensor_numel": (c_int64, [_P]),
    "ckpt_tensor_nbytes": (c_size_t, [_P]),
    "ckpt_tensor_requires_grad": (c_int, [_P]),
    "ckpt_tensor_is_parameter": (c_int, [_P]),
    "ckpt_tensor_storage": (_P, [_P]),
    "ckpt_tensor_kind_of": (c_int, [_P]),
    "ckpt_tensor_kind_name": (c_char_p, [c_int]),
    "ckpt_tensor_device": (c_char_p, [_P]),
    "ckpt_tensor_qparams": (c_int, [_P, POINTER(QParams)]),
    "ckpt_tensor_sparse_data": (_P, [_P]),
    "ckpt_tensor_read": (c_int, [_P, _P, c_void_p, c_size_t]),
    "ckpt_storage_key": (c_char_p, [_P]),
    "ckpt_storage_dtype": (c_int, [_P]),
    "ckpt_storage_numel": (c_int64, [_P]),
    "ckpt_storage_nbytes": (c_size_t, [_P]),
    "ckpt_storage_device": (c_char_p, [_P]),
    "ckpt_storage_index": (c_size_t, [_P]),
    "ckpt_storage_view_of": (_P, [_P, POINTER(c_int64)]),
    "ckpt_storage_read": (c_int, [_P, _P, c_uint64, c_void_p, c_size_t]),
    "ckpt_storage_file_range": (c_int, [_P, _P, POINTER(c_char_p), POINTER(c_uint64)]),
}

_lib: Optional[ctypes.CDLL] = None


def lib() -> ctypes.CDLL:
    """libckpt, loaded once, every function the binding calls declared."""
    global _lib
    if _lib is None:
        # libzip converts every zip record's DOS time with mktime(), and glibc
        # then stats /etc/localtime once a record while TZ is unset: a third
        # of opening a .pth of 10,000 tensors.  TZ naming that same file is
        # the same zone (UTC where it is missing, as unset), which glibc keeps
        # once read; only a change of the file while this process runs goes
        # unseen.  (The ckpt command pins TZ=UTC: it shows no times.)
        if "TZ" not in os.environ:
            os.environ["TZ"] = ":/etc/localtime"
        path = _native_file(os.path.join("lib", "libckpt.so.0"))
        try:
            handle = ctypes.CDLL(path)
        except OSError as e:
            raise CheckpointError(EXIT_IO, f"cannot load {path}: {e}", path) from None
        for name, (restype, argtypes) in _DECLS.items():
            try:
                fn = getattr(handle, name)
            except AttributeError:
                raise CheckpointError(EXIT_IO, f"{path} lacks {name}: a libckpt older than "
                                      "this package", path) from None
            fn.restype = restype
            fn.argtypes = argtypes
        _lib = handle
    return _lib


def text(b: Optional[bytes]) -> Optional[str]:
    """A C string from the library as str (names that are not UTF-8 kept by surrogateescape)."""
    return None if b is None else b.decode("utf-8", "surrogateescape")


def fsencode(path: "str | os.PathLike[str] | bytes") -> bytes:
    return os.fsencode(path)
