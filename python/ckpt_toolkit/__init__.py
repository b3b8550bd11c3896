"""ckpt_toolkit: PyTorch checkpoints read safely, never unpickled.

Python over libckpt (through ctypes) and the bundled ``ckpt`` command:

- ``safe_open(path, framework="pt"|"np", device="cpu", select=None)`` and
  ``load(...)``: a checkpoint's state dict, in safetensors' shape, for every
  input ckpt reads; tensors are zero-copy views of the mapped file where the
  bytes allow;
- ``torch_load(f, map_location=None)``: what ``torch.load(f,
  weights_only=True)`` returns, built by this package's code from a fixed
  table of types, for files torch's weights-only loader refuses too;
- ``inspect``, ``scan``, ``diff``, ``verify`` and the rewrites
  (``strip_module``, ``add_module``, ``unwrap``, ``rename``, ``remap``,
  ``extract``, ``convert``): the commands' results as Python objects;
- ``CheckpointError`` (``exit_status``, ``message``): every failure.

Nothing in a file is ever executed or imported.  man ckpt-python(7).
"""

from __future__ import annotations

from ._commands import (add_module, convert, diff, extract, inspect, remap, rename, scan,
                        strip_module, unwrap, verify)
from ._errors import CheckpointError
from ._native import ckpt_path
from ._safe_open import load, safe_open
from ._torch_load import torch_load

__version__ = "0.1.0"

__all__ = [
    "safe_open", "load", "torch_load", "inspect", "scan", "diff", "verify", "strip_module",
    "add_module", "unwrap", "rename", "remap", "extract", "convert", "CheckpointError",
    "ckpt_path", "__version__",
]
