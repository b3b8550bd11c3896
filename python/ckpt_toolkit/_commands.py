"""The commands: ckpt's engines, run through the bundled ``ckpt`` binary.

Why the CLI and not ctypes here: each command composes several engines (open,
select, rename, write, with the guards of in-place edits and atomic outputs)
in src/cmd_*.c, and one place prints each command's JSON; running that code
keeps the answers identical to the CLI's without a second composition of the
engines in Python.  The data path (safe_open, load, torch_load) is ctypes,
where a subprocess could not hand over mapped memory.

Arguments always go as a list (never through a shell).  Keyword options
become the command's options: ``snake_case`` -> ``--snake-case``, True -> the
flag alone, False/None -> left out, a list or tuple -> the option once per
item, anything else -> ``--option VALUE``.
"""

from __future__ import annotations

import json
import os
import subprocess
from typing import Any, Dict, List, Optional, Sequence, Union

from ._errors import EXIT_IO, EXIT_VERDICT, CheckpointError
from ._native import ckpt_path

PathLike = Union[str, "os.PathLike[str]"]


def _options(opts: Dict[str, Any]) -> List[str]:
    out: List[str] = []
    for k, v in opts.items():
        flag = ("-" if len(k) == 1 else "--") + k.replace("_", "-")
        if v is None or v is False:
            continue
        if v is True:
            out.append(flag)
        elif isinstance(v, (list, tuple)):
            for item in v:
                out += [flag, os.fspath(item) if isinstance(item, os.PathLike) else str(item)]
        else:
            out += [flag, os.fspath(v) if isinstance(v, os.PathLike) else str(v)]
    return out


def _run(cmd: str, args: Sequence[str]) -> "subprocess.CompletedProcess[bytes]":
    return subprocess.run([ckpt_path(), cmd, *args], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, check=False)


def _decode(b: bytes) -> str:
    return b.decode("utf-8", "surrogateescape")


def _error_from_stderr(cmd: str, rc: int, stderr: bytes, files: Sequence[str]) -> CheckpointError:
    """ckpt's message line "ckpt: CMD: FILE: MESSAGE" as the exception."""
    lines = [ln for ln in _decode(stderr).splitlines() if ln.startswith(f"ckpt: {cmd}: ")]
    line = lines[0] if lines else (_decode(stderr).strip() or f"ckpt {cmd} exited {rc}")
    rest = line[len(f"ckpt: {cmd}: "):] if lines else line
    for f in sorted(files, key=len, reverse=True):
        if rest.startswith(f + ": "):
            return CheckpointError(rc, rest[len(f) + 2:], f)
    return CheckpointError(rc, rest)


def _json_command(cmd: str, args: List[str], files: Sequence[str], check: bool,
                  verdict: bool) -> Any:
    p = _run(cmd, ["--json", *args])
    doc: Any = None
    if p.stdout.strip():
        try:
            doc = json.loads(_decode(p.stdout))
        except ValueError:
            doc = None
    if p.returncode == 0 or (verdict and p.returncode == EXIT_VERDICT and not check
                             and doc is not None):
        return doc
    err = doc.get("error") if isinstance(doc, dict) else None
    if isinstance(err, dict) and "message" in err:
        e = CheckpointError(int(err.get("exit", p.returncode)), str(err["message"]),
                            err.get("file"))
        e.document = doc  # type: ignore[attr-defined]
        raise e
    if p.returncode == EXIT_VERDICT and doc is not None:
        e = CheckpointError(EXIT_VERDICT, _verdict_message(cmd, doc))
        e.document = doc  # type: ignore[attr-defined]
        raise e
    raise _error_from_stderr(cmd, p.returncode, p.stderr, files)


def _as_dict(doc: Any) -> Dict[str, Any]:
    if not isinstance(doc, dict):
        raise CheckpointError(EXIT_IO, "ckpt printed no JSON document")
    return doc


def _verdict_message(cmd: str, doc: Any) -> str:
    return {"scan": "unsafe or ambiguous: see the document's files",
            "diff": "the checkpoints differ", "verify": "verification failed"}.get(cmd, cmd)


def inspect(path: PathLike, **opts: Any) -> Dict[str, Any]:
    """``ckpt inspect --json PATH``'s document (ckpt-inspect(1)): every tensor, the
    state dicts, the objects, the torch.load verdicts.  ``stats=True`` reads the
    data too; ``filter="REGEX"``."""
    p = os.fspath(path)
    return _as_dict(_json_command("inspect", [*_options(opts), "--", p], [p], True, False))


def scan(*paths: PathLike, check: bool = False, **opts: Any) -> Dict[str, Any]:
    """``ckpt scan --json PATH...``'s document (ckpt-scan(1)).  An unsafe or
    ambiguous file is a verdict, not an error: the document is returned (its
    ``exit`` is 1), unless ``check=True``, which raises CheckpointError
    (exit_status 1, the document in ``.document``).  A file that cannot be read
    raises (exit_status 3 or 4)."""
    ps = [os.fspath(p) for p in paths]
    return _as_dict(_json_command("scan", [*_options(opts), "--", *ps], ps, check, True))


def diff(a: PathLike, b: PathLike, check: bool = False, **opts: Any) -> Dict[str, Any]:
    """``ckpt diff --json A B``'s document (ckpt-diff(1)): ``atol``, ``rtol``,
    ``keys_only``, ``normalize``, ``select``.  Checkpoints that differ are a
    verdict: the document is returned (``equal`` false) unless
    ``check=True``, which raises CheckpointError with exit_status 1."""
    pa, pb = os.fspath(a), os.fspath(b)
    return _as_dict(_json_command("diff", [*_options(opts), "--", pa, pb], [pa, pb], check, True))


def verify(path: PathLike, spec: PathLike, check: bool = False, tf32: bool = False,
           **opts: Any) -> Dict[str, Any]:
    """``ckpt verify --json --model SPEC PATH``'s document (ckpt-verify(1)):
    ``reference``, ``against``, ``atol``, ``rtol``, ``device``, ...  A failed
    verification is a verdict: returned unless ``check=True`` (then
    CheckpointError with exit_status 1).  ``tf32=True`` is ``--tf32``: the GPU
    may use TF32 as torch's ``allow_tf32 = True`` does, and the default
    tolerance widens (strict FP32 without it; nothing changes on the CPU but
    the tolerance, and the document's ``tf32_note`` says so)."""
    p, s = os.fspath(path), os.fspath(spec)
    return _as_dict(_json_command("verify", ["--model", s, *_options({**opts, "tf32": tf32}),
                                             "--", p], [p, s], check, True))


def _rewrite(cmd: str, path: PathLike, out: Optional[PathLike], in_place: bool,
             opts: Dict[str, Any]) -> Dict[str, Any]:
    p = os.fspath(path)
    if in_place:
        if out is not None and os.fspath(out) != p:
            raise CheckpointError(2, f"{cmd}: in_place=True writes over the input: give no out")
        files, pos = [p], ["--in-place", p]
        o = p
    else:
        if out is None:
            raise CheckpointError(2, f"{cmd}: give out=PATH, or in_place=True")
        o = os.fspath(out)
        files, pos = [p, o], ["--", p, o]
    r = _run(cmd, [*_options(opts), *pos])
    if r.returncode != 0:
        raise _error_from_stderr(cmd, r.returncode, r.stderr, files)
    return {"command": cmd, "input": p, "output": o, "dry_run": bool(opts.get("dry_run")),
            "lines": _decode(r.stdout).splitlines(),
            "notices": [ln for ln in _decode(r.stderr).splitlines() if ln]}


_REWRITE_DOC = """``ckpt {cmd} PATH OUT`` (``in_place=True``: ``--in-place PATH``); keyword
options as the command's ({man}).  The rewrites print no JSON: the result is
{{"command", "input", "output", "dry_run", "lines": what ckpt printed (the
keys renamed, "wrote OUT: ..."), "notices": its notes on standard error}}.
A failure raises CheckpointError with ckpt's exit status and message; the
input is then untouched."""


def _make(cmd: str) -> Any:
    def rewrite(path: PathLike, out: Optional[PathLike] = None, in_place: bool = False,
                **opts: Any) -> Dict[str, Any]:
        return _rewrite(cmd, path, out, in_place, opts)
    rewrite.__name__ = rewrite.__qualname__ = cmd.replace("-", "_")
    rewrite.__doc__ = _REWRITE_DOC.format(cmd=cmd, man=f"ckpt-{cmd}(1)")
    return rewrite


strip_module = _make("strip-module")
add_module = _make("add-module")
unwrap = _make("unwrap")
rename = _make("rename")
remap = _make("remap")
extract = _make("extract")
convert = _make("convert")
