"""Atomic file writing: a temp file in the target folder, then ``os.replace``.

A reader never sees a half-written artifact, and a failed write leaves the old file untouched.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any


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


def atomic_write_json(path: str | os.PathLike[str], data: Any) -> Path:
    """Write strict JSON (NaN/Inf are refused: callers map them to null first)."""
    text = json.dumps(data, indent=2, allow_nan=False) + "\n"
    return atomic_write_text(path, text)
