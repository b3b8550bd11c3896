"""The package's one exception, and how library status codes become exit statuses."""

from __future__ import annotations

from typing import Optional

# ckpt's exit statuses (doc/design.md, "Exit status and messages").
EXIT_OK = 0
EXIT_VERDICT = 1      # scan: unsafe; diff: differs; verify: failed
EXIT_USAGE = 2
EXIT_BAD_INPUT = 3
EXIT_IO = 4

# enum ckpt_status (lib/ckpt.h)
CKPT_OK = 0
CKPT_ERR_USAGE = -1
CKPT_ERR_FORMAT = -2
CKPT_ERR_UNSAFE = -3
CKPT_ERR_LIMIT = -4
CKPT_ERR_UNSUPPORTED = -5
CKPT_ERR_IO = -6
CKPT_ERR_NOMEM = -7
CKPT_ERR_DEVICE = -8


def exit_for_status(status: int) -> int:
    """The exit status ckpt gives a library status (src/cli.c's cli_exit_for)."""
    if status == CKPT_OK:
        return EXIT_OK
    if status == CKPT_ERR_USAGE:
        return EXIT_USAGE
    if status in (CKPT_ERR_IO, CKPT_ERR_NOMEM, CKPT_ERR_DEVICE):
        return EXIT_IO
    return EXIT_BAD_INPUT


class CheckpointError(Exception):
    """A checkpoint could not be read, or a command failed.

    ``exit_status`` is the exit status ``ckpt`` gives the same failure (2 usage,
    3 bad input, 4 I/O; see ckpt(1)); ``message`` is its message (what ckpt
    prints after ``ckpt: COMMAND: FILE:``); ``file`` is the file it is about,
    or None; ``status`` is libckpt's status code when the failure came from the
    library (a negative ``ckpt_status``), else None.
    """

    def __init__(self, exit_status: int, message: str, file: Optional[str] = None,
                 status: Optional[int] = None) -> None:
        self.exit_status = int(exit_status)
        self.message = message
        self.file = file
        self.status = status
        super().__init__(f"{file}: {message}" if file else message)

    @classmethod
    def from_status(cls, status: int, message: str,
                    file: Optional[str] = None) -> "CheckpointError":
        """The error for a libckpt status code, exit status as the CLI maps it."""
        return cls(exit_for_status(status), message, file, status)
