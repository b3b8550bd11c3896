"""``python -m ckpt_toolkit ARGS`` is ``ckpt ARGS``: the bundled command, same
output and exit status (also the ``ckpt`` console script's entry point)."""

from __future__ import annotations

import os
import sys
from typing import List, Optional

from ._errors import CheckpointError
from ._native import ckpt_path


def main(argv: Optional[List[str]] = None) -> int:
    """Run the bundled ckpt with ARGV (default: sys.argv[1:]); exec'd, so it never
    returns on success."""
    args = sys.argv[1:] if argv is None else list(argv)
    try:
        exe = ckpt_path()
    except CheckpointError as e:
        sys.stderr.write(f"ckpt: {e}\n")
        return e.exit_status
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(exe, ["ckpt", *args])
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
