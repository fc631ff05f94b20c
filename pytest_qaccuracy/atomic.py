"""Atomic file writing: a temp file in the target folder, then ``os.replace``.

A reader never sees a half-written artifact, and a failed write leaves the old file untouched.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from pytest_qaccuracy.errors import InputError
from pytest_qaccuracy.numbers import finite

#: ``os.open`` flags of a fresh temp file: never an existing one, not inherited by child processes.
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)


def temp_name(path: Path) -> Path:
    """A fresh hidden name beside ``path``: ``.<name>.<16 hex digits>.tmp``."""
    return path.parent / f".{path.name}.{secrets.token_hex(8)}.tmp"


def discard(path: Path) -> None:
    """Remove a temp file or folder if it exists. A KeyboardInterrupt meanwhile (a second Ctrl-C) does
    not leave it half removed: the removal finishes, then the interrupt is raised."""
    interrupt: KeyboardInterrupt | None = None
    while True:
        try:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
            break
        except KeyboardInterrupt as exc:
            interrupt = exc
        except OSError as exc:  # Python < 3.11: rmtree interrupted in a finally closes a folder twice
            if not isinstance(exc.__context__, KeyboardInterrupt):
                raise
            interrupt = exc.__context__
    if interrupt is not None:
        raise interrupt


def atomic_write(path: str | os.PathLike[str], write: Callable[[IO[Any]], None], mode: str = "w") -> Path:
    """Call ``write(file)`` on a temp file beside ``path`` and rename it over ``path`` on success.

    Whatever interrupts it (an error, Ctrl-C at any point), ``path`` keeps its old content and no
    temp file is left.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_name(path)  # named before it exists: an interrupt inside os.open still finds it
    try:
        fd = os.open(tmp, _CREATE, 0o666)  # the mode a plain open() gives, not mkstemp's 0600
        with os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except FileExistsError:  # the random name is someone else's file (practically never): not ours to remove
        raise
    except BaseException:
        discard(tmp)
        raise
    return path


def atomic_write_text(path: str | os.PathLike[str], text: str) -> Path:
    return atomic_write(path, lambda handle: handle.write(text))


def finite_json(value: Any) -> Any:
    """``value`` with every NaN/Inf float replaced by None (:func:`~pytest_qaccuracy.numbers.finite`), so
    strict JSON can hold it. Other values, integers included, are left as they are."""
    if isinstance(value, float):
        return finite(value)
    if isinstance(value, dict):
        return {key: finite_json(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [finite_json(item) for item in value]
    return value


def atomic_write_json(path: str | os.PathLike[str], data: Any) -> Path:
    """Write strict JSON: NaN and Inf are written as null (:func:`finite_json`)."""
    text = json.dumps(finite_json(data), indent=2, allow_nan=False) + "\n"
    return atomic_write_text(path, text)


@contextmanager
def write_errors(what: str, path: str | os.PathLike[str]) -> Iterator[None]:
    """An OSError while writing ``path`` (a full disk, a quota, a read-only filesystem) as one
    InputError naming the option; the atomic writers have left any earlier file or folder there as
    it was, so the message says so.

    Raises:
        InputError: the write failed.
    """
    try:
        yield
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise InputError(f"{what} {path}: could not be written ({reason}); left as it was") from None


def _nearest_existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _check_creatable(path: Path, what: str) -> None:
    """``path`` does not exist yet: its nearest existing ancestor must be a writable folder."""
    ancestor = _nearest_existing(path.parent)
    if not ancestor.is_dir():
        raise InputError(f"{what} {path}: cannot be created, {ancestor} is not a directory")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise InputError(f"{what} {path}: cannot be created, {ancestor} is not writable")


def check_file_target(path: str | os.PathLike[str], what: str) -> None:
    """Refuse, before any work, a file path that cannot be written (``what`` names the option).

    Raises:
        InputError: ``path`` is a directory, sits under a file, or its folder is not writable.
    """
    path = Path(path)
    if path.is_dir():
        raise InputError(f"{what} {path}: is a directory, expected a file")
    if path.exists():
        if not os.access(path.parent, os.W_OK | os.X_OK):
            raise InputError(f"{what} {path}: cannot be replaced, {path.parent} is not writable")
    else:
        _check_creatable(path, what)


def check_dir_target(path: str | os.PathLike[str], what: str, names: Iterable[str] = ()) -> None:
    """Refuse, before any work, a folder that cannot hold the files ``names``.

    Raises:
        InputError: ``path`` is a file, cannot be created or written, or one of ``names`` in it is a folder.
    """
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise InputError(f"{what} {path}: is a file, expected a directory")
    if not path.exists():
        _check_creatable(path, what)
        return
    if not os.access(path, os.W_OK | os.X_OK):
        raise InputError(f"{what} {path}: is not writable")
    for name in names:
        if (path / name).is_dir():
            raise InputError(f"{what} {path}: {name} exists there as a directory")
