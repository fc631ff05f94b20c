"""Atomic file writing: a temp file in the target folder, then ``os.replace``.

A reader never sees a half-written artifact, and a failed write leaves the old file untouched.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO, Any

from pytest_qaccuracy.errors import InputError


def _file_mode() -> int:
    """The mode a plain ``open()`` would give a new file (mkstemp's own is 0600)."""
    umask = os.umask(0o022)
    os.umask(umask)
    return 0o666 & ~umask


_MODE = _file_mode()


def atomic_write(path: str | os.PathLike[str], write: Callable[[IO[Any]], None], mode: str = "w") -> Path:
    """Call ``write(file)`` on a temp file beside ``path`` and rename it over ``path`` on success."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, _MODE)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def atomic_write_text(path: str | os.PathLike[str], text: str) -> Path:
    return atomic_write(path, lambda handle: handle.write(text))


def finite_json(value: Any) -> Any:
    """``value`` with every NaN/Inf float replaced by None, so strict JSON can hold it."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: finite_json(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [finite_json(item) for item in value]
    return value


def atomic_write_json(path: str | os.PathLike[str], data: Any) -> Path:
    """Write strict JSON: NaN and Inf are written as null (:func:`finite_json`)."""
    text = json.dumps(finite_json(data), indent=2, allow_nan=False) + "\n"
    return atomic_write_text(path, text)


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
