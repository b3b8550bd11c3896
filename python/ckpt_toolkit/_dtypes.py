"""ckpt's dtypes (enum ckpt_dtype, lib/ckpt.h) as numpy and torch dtypes."""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from ._errors import EXIT_BAD_INPUT, CheckpointError

# enum ckpt_dtype, in order (lib/ckpt.h): torch's names
NAMES = [
    "unknown", "float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8",
    "uint8", "bool", "complex128", "complex64", "complex32", "qint8", "quint8", "qint32",
    "quint4x2", "quint2x4", "float8_e5m2", "float8_e4m3fn", "float8_e5m2fnuz",
    "float8_e4m3fnuz", "float8_e8m0fnu", "uint16", "uint32", "uint64", "bits8", "bits16",
    "bits1x8", "bits2x4", "bits4x2", "float4_e2m1fn_x2", "bcomplex32", "float6_e2m3fn",
    "float6_e3m2fn",
]
BFLOAT16 = 4
QUANTIZED = {14: "qint8", 15: "quint8", 16: "qint32", 17: "quint4x2", 18: "quint2x4"}

# numpy's own dtypes; those of ml_dtypes are looked up by name
_NUMPY = {
    "float64": np.float64, "float32": np.float32, "float16": np.float16, "int64": np.int64,
    "int32": np.int32, "int16": np.int16, "int8": np.int8, "uint8": np.uint8, "bool": np.bool_,
    "complex128": np.complex128, "complex64": np.complex64, "uint16": np.uint16,
    "uint32": np.uint32, "uint64": np.uint64,
    # a quantized tensor's integer representation (what int_repr() gives)
    "qint8": np.int8, "quint8": np.uint8, "qint32": np.int32,
}
_ML_DTYPES = {"bfloat16", "float8_e5m2", "float8_e4m3fn", "float8_e5m2fnuz",
              "float8_e4m3fnuz", "float8_e8m0fnu"}


def name(code: int) -> str:
    return NAMES[code] if 0 <= code < len(NAMES) else "unknown"


def numpy_dtype(code: int) -> "np.dtype[Any]":
    """The numpy dtype for ckpt dtype CODE; CheckpointError when numpy has none."""
    n = name(code)
    if n in _NUMPY:
        return np.dtype(_NUMPY[n])
    if n in _ML_DTYPES:
        try:
            import ml_dtypes
        except ImportError:
            raise CheckpointError(EXIT_BAD_INPUT, f"dtype {n} needs the ml_dtypes package for "
                                  "framework='np' (pip install ml_dtypes), or framework='pt'"
                                  ) from None
        dt = getattr(ml_dtypes, n, None)
        if dt is not None:
            out: "np.dtype[Any]" = np.dtype(dt)
            return out
    raise CheckpointError(EXIT_BAD_INPUT, f"dtype {n} has no numpy dtype: use framework='pt'")


def torch_dtype(code: int) -> Any:
    """The torch dtype for ckpt dtype CODE (a quantized one's integer type for its
    representation); CheckpointError when this torch has none."""
    import torch
    n = name(code)
    n = {"qint8": "int8", "quint8": "uint8", "qint32": "int32", "quint4x2": "uint8",
         "quint2x4": "uint8"}.get(n, n)
    dt = getattr(torch, n, None)
    if not isinstance(dt, torch.dtype):
        raise CheckpointError(EXIT_BAD_INPUT, f"dtype {name(code)} is not a dtype of "
                              f"torch {torch.__version__}")
    return dt


def torch_quantized_dtype(code: int) -> Optional[Any]:
    import torch
    return getattr(torch, QUANTIZED[code], None) if code in QUANTIZED else None
